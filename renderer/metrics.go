package renderer

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// metrics are the worker's Prometheus metrics, in a registry of its own so
// that two workers in one process (tests) do not collide.
type metrics struct {
	reg *prometheus.Registry

	leasesHeld prometheus.Gauge
	capacity   prometheus.Gauge
	connected  prometheus.Gauge
	draining   prometheus.Gauge
	renders    *prometheus.CounterVec
	failures   *prometheus.CounterVec
	rejected   *prometheus.CounterVec
	reconnects prometheus.Counter
	handBacks  prometheus.Counter
	// storeRetries counts completions held for the artifact store.
	storeRetries prometheus.Counter
}

func newMetrics(capacity int) *metrics {
	const ns, sub = "leasehold", "renderer"
	gauge := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: name, Help: help})
	}
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: name, Help: help})
	}
	counterVec := func(name, help, label string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: name, Help: help}, []string{label})
	}
	m := &metrics{
		reg:        prometheus.NewRegistry(),
		leasesHeld: gauge("leases_held", "Leases in progress: rendering, uploading or winding down."),
		capacity:   gauge("capacity", "Leases the renderer holds at most."),
		connected:  gauge("connected", "1 while a session is open and welcomed, else 0."),
		draining:   gauge("draining", "1 once the renderer is draining, else 0."),
		renders:    counterVec("renders_total", "Renders ended, by outcome: success, failure or stopped.", "outcome"),
		failures:   counterVec("render_failures_total", "Failed renders, by failure class.", "class"),
		rejected:   counterVec("completions_rejected_total", "Completions the coordinator refused, by reason.", "reason"),
		reconnects: counter("stream_reconnects_total", "Sessions reopened after one ended."),
		handBacks:  counter("hand_backs_total", "Leases handed back unfinished."),
		storeRetries: counter("completions_store_unavailable_total",
			"Completions answered ARTIFACT_STORE_UNAVAILABLE, kept with their lease and sent again."),
	}
	m.reg.MustRegister(m.leasesHeld, m.capacity, m.connected, m.draining, m.renders, m.failures,
		m.rejected, m.reconnects, m.handBacks, m.storeRetries)
	m.capacity.Set(float64(capacity))
	return m
}

// Handler serves the worker's HTTP endpoints:
//
//   - /healthz answers 200 while the process runs;
//   - /readyz answers 200 while the worker can take work (see Ready) and 503
//     otherwise: before the first welcome, while disconnected and while
//     draining;
//   - /metrics serves the worker's Prometheus metrics, named
//     leasehold_renderer_*.
func (w *Worker) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(rw http.ResponseWriter, _ *http.Request) {
		rw.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = rw.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(rw http.ResponseWriter, _ *http.Request) {
		rw.Header().Set("Content-Type", "text/plain; charset=utf-8")
		switch {
		case w.draining.Load():
			rw.WriteHeader(http.StatusServiceUnavailable)
			_, _ = rw.Write([]byte("draining\n"))
		case !w.connected.Load():
			rw.WriteHeader(http.StatusServiceUnavailable)
			_, _ = rw.Write([]byte("not connected\n"))
		default:
			_, _ = rw.Write([]byte("ok\n"))
		}
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(w.metrics.reg, promhttp.HandlerOpts{}))
	return mux
}
