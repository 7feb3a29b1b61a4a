package renderer

import (
	"net"
	"net/http"
	"time"

	"github.com/leasehold/leasehold/internal/connlimit"
	"github.com/leasehold/leasehold/internal/ratelog"
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
	// httpRefused counts the HTTP endpoints' refused connections, by
	// cause (ListenHTTP).
	httpRefused *prometheus.CounterVec
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
		httpRefused: counterVec("http_connections_refused_total",
			"Connections to the HTTP endpoints closed at once by their limits, by cause: total (the listener was full) or "+
				"per_address (the source address held its share).", "cause"),
	}
	for _, cause := range []string{connlimit.CauseTotal, connlimit.CausePerAddress} {
		m.httpRefused.WithLabelValues(cause)
	}
	m.reg.MustRegister(m.leasesHeld, m.capacity, m.connected, m.draining, m.renders, m.failures,
		m.rejected, m.reconnects, m.handBacks, m.storeRetries, m.httpRefused)
	m.capacity.Set(float64(capacity))
	return m
}

// The limits of the HTTP endpoints. They serve the kubelet's probes and
// Prometheus's scrapes, a few connections at a time, so 64 leaves room
// for both and for a person's curl; one source address may hold an eighth
// of them (connlimit's default share), so that a peer that opens
// connections and holds them leaves the probes theirs, and the renderer
// its descriptors for the coordinator and the artifact store. A kept-alive
// connection idle for a minute is closed: Prometheus dials again at its
// next scrape.
const (
	httpMaxConns   = 64
	httpReadHeader = 5 * time.Second
	httpRead       = 10 * time.Second
	httpWrite      = 30 * time.Second
	httpIdle       = time.Minute
	// httpRefusalLogEvery is how often each cause of refusal is logged at
	// most.
	httpRefusalLogEvery = time.Minute
)

// ListenHTTP returns lis, the listener of the worker's HTTP endpoints
// (Handler), with their connection limits: at most 64 open at once, 8
// from one source address. A connection past either is closed at once,
// counted in leasehold_renderer_http_connections_refused_total{cause} and
// logged, each cause at most once a minute.
func (w *Worker) ListenHTTP(lis net.Listener) net.Listener {
	logged := ratelog.New(httpRefusalLogEvery, nil)
	conns := connlimit.New(connlimit.Limits{Max: httpMaxConns, Refused: func(cause string, remote net.Addr) {
		w.metrics.httpRefused.WithLabelValues(cause).Inc()
		if due, held := logged.Allow(cause); due {
			w.log.Warn("connection refused by the HTTP endpoints' limits", "cause", cause, "remote", remote.String(), "unlogged", held)
		}
	}})
	return conns.Listen(lis)
}

// HTTPServer returns the server of the worker's HTTP endpoints (Handler),
// with timeouts on every phase of a request and on idle connections.
func (w *Worker) HTTPServer() *http.Server {
	return &http.Server{Handler: w.Handler(), ReadHeaderTimeout: httpReadHeader, ReadTimeout: httpRead,
		WriteTimeout: httpWrite, IdleTimeout: httpIdle}
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
