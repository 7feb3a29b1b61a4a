package engine

import (
	"sync/atomic"
	"time"

	"github.com/leasehold/leasehold/client/reason"
	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the writer's Prometheus metrics. Gauges are served from a
// snapshot the writer takes after each group, so scrapes never touch the
// writer's own state. Every team that ever had a job appears in the
// per-team gauges and counters, at 0 when it has nothing there, rather
// than vanishing or appearing only once something happens to it.
//
// The job counters count committed history events: they move after the
// commit that makes them durable, so they never count a change a failed
// commit lost. A replayed job counts again in its new cycle.
type metrics struct {
	e          *Engine
	groupSize  prometheus.Histogram
	commit     prometheus.Histogram
	rejections *prometheus.CounterVec
	// unrecorded counts refused completions that changed no record: a
	// repeat of one recorded, or one past the job's cap for the cycle.
	unrecorded *prometheus.CounterVec
	finishedC  *prometheus.CounterVec
	submitted  *prometheus.CounterVec
	succeeded  *prometheus.CounterVec
	failed     *prometheus.CounterVec
	retried    *prometheus.CounterVec
	expired    *prometheus.CounterVec
	cancelled  *prometheus.CounterVec
	purged     *prometheus.CounterVec
	wait       *prometheus.HistogramVec
	snap       atomic.Pointer[snapshot]
	// known are the teams whose counters exist; writer goroutine only.
	known map[string]bool

	depthDesc, inflightDesc, jobsDesc, pausedDesc, capacityDesc *prometheus.Desc
	sizeDesc, freePagesDesc, freeBytesDesc                      *prometheus.Desc
}

type snapshot struct {
	// idle is a writer that does not run (a follower): it exports none of
	// the writer's gauges, so that sums across a cluster's nodes count the
	// leader's alone.
	idle     bool
	teams    []string
	depth    map[string]int
	inflight map[string]int
	counts   map[string]jobs.Counts
	paused   bool
	capacity int
}

// tally is a committed history event the job counters count.
type tally struct {
	team   string
	kind   jobs.EventKind
	reason string
}

// failedReasons are the terminal reasons of a FAILED job.
var failedReasons = []jobs.TerminalReason{jobs.ReasonUnsupportedFormat, jobs.ReasonInvalidDocument, jobs.ReasonAttemptsExhausted}

// Purge kinds, the values of leasehold_purged_total's kind label.
const (
	purgedJobs       = "jobs"
	purgedBatches    = "batches"
	purgedRejections = "rejections"
	purgedAudit      = "audit_records"
)

func newMetrics(reg prometheus.Registerer, e *Engine) *metrics {
	perTeam := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, append([]string{"team"}, labels...))
	}
	m := &metrics{
		e:     e,
		known: map[string]bool{},
		groupSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "leasehold_writer_group_commands", Help: "Commands applied per writer group (one transaction, one fsync); a group of timers alone counts 0.",
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
		unrecorded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "leasehold_rejected_completions_unrecorded_total",
			Help: "Completions refused by the fencing check and not recorded, by reason: a repeat of one recorded, or one past the job's " +
				"32 recorded in its cycle.",
		}, []string{"reason"}),
		finishedC: perTeam("leasehold_jobs_finished_total", "Jobs that reached a terminal phase, by team and terminal reason.", "reason"),
		submitted: perTeam("leasehold_jobs_submitted_total", "Jobs accepted in a batch, by team."),
		succeeded: perTeam("leasehold_jobs_succeeded_total", "Jobs that SUCCEEDED, by team."),
		failed:    perTeam("leasehold_jobs_failed_total", "Jobs that ended FAILED, by team and terminal reason.", "reason"),
		retried:   perTeam("leasehold_jobs_retried_total", "Failed attempts (transient failures and lease expiries) followed by a retry, by team."),
		expired: perTeam("leasehold_jobs_expired_total",
			"Leases whose deadline passed, by team: counted as a failed attempt, or re-queued uncounted when their holder was never heard from."),
		cancelled: perTeam("leasehold_jobs_cancelled_total", "Jobs CANCELLED, by team."),
		purged: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "leasehold_purged_total", Help: "Records deleted by retention, by kind (jobs, batches, rejections, audit_records).",
		}, []string{"kind"}),
		wait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "leasehold_queue_wait_seconds", Help: "Time a job waited in its team's ready queue before a lease, by team.",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 12),
		}, []string{"team"}),
		depthDesc:     prometheus.NewDesc("leasehold_queue_depth", "Ready jobs waiting per team.", []string{"team"}, nil),
		inflightDesc:  prometheus.NewDesc("leasehold_leases_in_flight", "Leases held per team.", []string{"team"}, nil),
		jobsDesc:      prometheus.NewDesc("leasehold_jobs", "Stored (retained) jobs per team and phase.", []string{"team", "phase"}, nil),
		pausedDesc:    prometheus.NewDesc("leasehold_dispatch_paused", "1 while an operator has paused dispatch.", nil, nil),
		capacityDesc:  prometheus.NewDesc("leasehold_live_renderer_capacity", "Sum of the capacity of live renderers, bounded per credential.", nil, nil),
		sizeDesc:      prometheus.NewDesc("leasehold_store_size_bytes", "Size of the bbolt file.", nil, nil),
		freePagesDesc: prometheus.NewDesc("leasehold_store_free_pages", "Free pages in the bbolt file, reused by later writes; compaction returns them to the disk.", nil, nil),
		freeBytesDesc: prometheus.NewDesc("leasehold_store_free_bytes", "Bytes of the bbolt file in free pages.", nil, nil),
	}
	for _, r := range []reason.Reason{reason.StaleLease, reason.LeaseExpired, reason.JobCancelled, reason.NotLeaseHolder, reason.OutcomeMismatch} {
		m.rejections.WithLabelValues(string(r))
		m.unrecorded.WithLabelValues(string(r))
	}
	for _, k := range []string{purgedJobs, purgedBatches, purgedRejections, purgedAudit} {
		m.purged.WithLabelValues(k)
	}
	m.snapshot()
	if reg != nil {
		reg.MustRegister(m.groupSize, m.commit, m.rejections, m.unrecorded, m.finishedC, m.submitted, m.succeeded, m.failed,
			m.retried, m.expired, m.cancelled, m.purged, m.wait, m)
	}
	return m
}

// initTeam creates a team's counters at 0; writer goroutine.
func (m *metrics) initTeam(team string) {
	if m.known[team] {
		return
	}
	m.known[team] = true
	for _, c := range []*prometheus.CounterVec{m.submitted, m.succeeded, m.retried, m.expired, m.cancelled} {
		c.WithLabelValues(team)
	}
	for _, r := range failedReasons {
		m.failed.WithLabelValues(team, r.String())
		m.finishedC.WithLabelValues(team, r.String())
	}
	m.finishedC.WithLabelValues(team, jobs.ReasonSucceeded.String())
	m.finishedC.WithLabelValues(team, jobs.ReasonCancelled.String())
}

// tally counts a group's committed events; writer goroutine, after the
// commit.
func (m *metrics) tally(ts []tally) {
	for _, t := range ts {
		switch t.kind {
		case jobs.EventSubmitted:
			m.submitted.WithLabelValues(t.team).Inc()
		case jobs.EventSucceeded:
			m.succeeded.WithLabelValues(t.team).Inc()
			m.finishedC.WithLabelValues(t.team, jobs.ReasonSucceeded.String()).Inc()
		case jobs.EventFailed:
			m.failed.WithLabelValues(t.team, t.reason).Inc()
			m.finishedC.WithLabelValues(t.team, t.reason).Inc()
		case jobs.EventCancelled:
			m.cancelled.WithLabelValues(t.team).Inc()
			m.finishedC.WithLabelValues(t.team, jobs.ReasonCancelled.String()).Inc()
		case jobs.EventRetryScheduled:
			m.retried.WithLabelValues(t.team).Inc()
		case jobs.EventLeaseExpired:
			m.expired.WithLabelValues(t.team).Inc()
		case jobs.EventRequeued:
			if t.reason == jobs.ReleaseNeverHeard {
				m.expired.WithLabelValues(t.team).Inc()
			}
		}
	}
}

func (m *metrics) group(n int, d time.Duration) {
	m.groupSize.Observe(float64(n))
	m.commit.Observe(d.Seconds())
}

func (m *metrics) rejected(reason string) { m.rejections.WithLabelValues(reason).Inc() }

// rejectedUnrecorded counts a refused completion that changed no record;
// writer goroutine.
func (m *metrics) rejectedUnrecorded(reason string) { m.unrecorded.WithLabelValues(reason).Inc() }

// purgedN counts records deleted by retention; writer goroutine, after the
// commit.
func (m *metrics) purgedN(r PurgeResult) {
	m.purged.WithLabelValues(purgedJobs).Add(float64(r.Jobs))
	m.purged.WithLabelValues(purgedBatches).Add(float64(r.Batches))
	m.purged.WithLabelValues(purgedRejections).Add(float64(r.Rejections))
	m.purged.WithLabelValues(purgedAudit).Add(float64(r.Audit))
}

func (m *metrics) queueWait(team string, d time.Duration) {
	m.wait.WithLabelValues(team).Observe(max(d, 0).Seconds())
}

// idle publishes the gauges of a writer that does not run.
func (m *metrics) idle() { m.snap.Store(&snapshot{idle: true}) }

// snapshot copies the dispatch gauges and creates the counters of teams
// seen for the first time; called on the writer goroutine.
func (m *metrics) snapshot() {
	e := m.e
	s := &snapshot{depth: map[string]int{}, inflight: map[string]int{}, counts: map[string]jobs.Counts{}, paused: e.dispatchSt.Paused}
	for t, c := range e.teamCounts {
		s.teams = append(s.teams, t)
		s.counts[t] = *c
		m.initTeam(t)
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
	for _, d := range []*prometheus.Desc{m.depthDesc, m.inflightDesc, m.jobsDesc, m.pausedDesc, m.capacityDesc, m.sizeDesc, m.freePagesDesc, m.freeBytesDesc} {
		ch <- d
	}
}

// Collect implements prometheus.Collector. The store gauges are read at
// the scrape, from bbolt's own statistics and a read transaction.
func (m *metrics) Collect(ch chan<- prometheus.Metric) {
	s := m.snap.Load()
	if s.idle {
		m.collectStore(ch)
		return
	}
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
	m.collectStore(ch)
}

// collectStore exports the store's own gauges, which every node has.
func (m *metrics) collectStore(ch chan<- prometheus.Metric) {
	if st, err := m.e.st.Stats(); err == nil {
		ch <- prometheus.MustNewConstMetric(m.sizeDesc, prometheus.GaugeValue, float64(st.Size))
		ch <- prometheus.MustNewConstMetric(m.freePagesDesc, prometheus.GaugeValue, float64(st.FreePages))
		ch <- prometheus.MustNewConstMetric(m.freeBytesDesc, prometheus.GaugeValue, float64(st.FreePages*st.PageSize))
	}
}
