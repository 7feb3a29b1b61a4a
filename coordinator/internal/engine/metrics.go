package engine

import (
	"sync/atomic"
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	"github.com/leasehold/leasehold/coordinator/internal/store"
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the writer's Prometheus metrics. Gauges are served from a
// snapshot the writer takes after each group, so scrapes never touch the
// writer's own state. Every team that ever had a job appears in the
// per-team gauges, at 0 when it has nothing there, rather than vanishing.
type metrics struct {
	e          *Engine
	groupSize  prometheus.Histogram
	commit     prometheus.Histogram
	rejections *prometheus.CounterVec
	finishedC  *prometheus.CounterVec
	wait       *prometheus.HistogramVec
	snap       atomic.Pointer[snapshot]

	depthDesc, inflightDesc, jobsDesc, pausedDesc, capacityDesc *prometheus.Desc
}

type snapshot struct {
	teams    []string
	depth    map[string]int
	inflight map[string]int
	counts   map[string]store.Counts
	paused   bool
	capacity int
}

func newMetrics(reg prometheus.Registerer, e *Engine) *metrics {
	m := &metrics{
		e: e,
		groupSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "leasehold_writer_group_commands", Help: "Commands committed per writer transaction.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 12),
		}),
		commit: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "leasehold_writer_group_seconds", Help: "Time to apply and commit (fsync) one writer group.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
		}),
		rejections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "leasehold_rejected_completions_total",
			Help: "Completions refused by the fencing check and recorded (as listed by ListRejectedCompletions), by reason.",
		}, []string{"reason"}),
		finishedC: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "leasehold_jobs_finished_total", Help: "Jobs that reached a terminal phase, by team and terminal reason.",
		}, []string{"team", "reason"}),
		wait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "leasehold_queue_wait_seconds", Help: "Time a job waited in its team's ready queue before a lease, by team.",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 12),
		}, []string{"team"}),
		depthDesc:    prometheus.NewDesc("leasehold_queue_depth", "Ready jobs waiting per team.", []string{"team"}, nil),
		inflightDesc: prometheus.NewDesc("leasehold_leases_in_flight", "Leases held per team.", []string{"team"}, nil),
		jobsDesc:     prometheus.NewDesc("leasehold_jobs", "Stored jobs per team and phase.", []string{"team", "phase"}, nil),
		pausedDesc:   prometheus.NewDesc("leasehold_dispatch_paused", "1 while an operator has paused dispatch.", nil, nil),
		capacityDesc: prometheus.NewDesc("leasehold_live_renderer_capacity", "Sum of the capacity of live renderers, bounded per credential.", nil, nil),
	}
	for _, r := range []string{"STALE_LEASE", "LEASE_EXPIRED", "JOB_CANCELLED", "NOT_LEASE_HOLDER", "OUTCOME_MISMATCH"} {
		m.rejections.WithLabelValues(r)
	}
	m.snapshot()
	if reg != nil {
		reg.MustRegister(m.groupSize, m.commit, m.rejections, m.finishedC, m.wait, m)
	}
	return m
}

func (m *metrics) group(n int, d time.Duration) {
	m.groupSize.Observe(float64(n))
	m.commit.Observe(d.Seconds())
}

func (m *metrics) rejected(reason string) { m.rejections.WithLabelValues(reason).Inc() }

func (m *metrics) finished(team string, r jobs.TerminalReason) {
	m.finishedC.WithLabelValues(team, r.String()).Inc()
}

func (m *metrics) queueWait(team string, d time.Duration) {
	m.wait.WithLabelValues(team).Observe(max(d, 0).Seconds())
}

// snapshot copies the dispatch gauges; called on the writer goroutine.
func (m *metrics) snapshot() {
	e := m.e
	s := &snapshot{depth: map[string]int{}, inflight: map[string]int{}, counts: map[string]store.Counts{}, paused: e.dispatchSt.Paused}
	for t, c := range e.teamCounts {
		s.teams = append(s.teams, t)
		s.counts[t] = *c
	}
	for _, t := range e.sched.Teams() {
		if _, known := s.counts[t]; !known {
			s.teams = append(s.teams, t)
		}
		s.depth[t] = e.sched.Depth(t)
		s.inflight[t] = e.sched.InFlight(t)
	}
	s.capacity = e.liveCapacity(e.clockMono)
	m.snap.Store(s)
}

// Describe implements prometheus.Collector.
func (m *metrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- m.depthDesc
	ch <- m.inflightDesc
	ch <- m.jobsDesc
	ch <- m.pausedDesc
	ch <- m.capacityDesc
}

// Collect implements prometheus.Collector.
func (m *metrics) Collect(ch chan<- prometheus.Metric) {
	s := m.snap.Load()
	for _, t := range s.teams {
		ch <- prometheus.MustNewConstMetric(m.depthDesc, prometheus.GaugeValue, float64(s.depth[t]), t)
		ch <- prometheus.MustNewConstMetric(m.inflightDesc, prometheus.GaugeValue, float64(s.inflight[t]), t)
		c := s.counts[t]
		for p := jobs.PhaseQueued; p <= jobs.PhaseCancelled; p++ {
			ch <- prometheus.MustNewConstMetric(m.jobsDesc, prometheus.GaugeValue, float64(c[p]), t, p.String())
		}
	}
	paused := 0.0
	if s.paused {
		paused = 1
	}
	ch <- prometheus.MustNewConstMetric(m.pausedDesc, prometheus.GaugeValue, paused)
	ch <- prometheus.MustNewConstMetric(m.capacityDesc, prometheus.GaugeValue, float64(s.capacity))
}
