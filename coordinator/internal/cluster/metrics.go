package cluster

import (
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are a replica's Prometheus metrics: leadership, term and
// indexes read from raft at each scrape, the latency of a writer group's
// commit (Committer.Commit: proposal, replication to a quorum, apply) and
// of the state machine's apply (FSM.ApplyBatch), how long the state
// machine's batches stay open and how many entries the open one holds,
// how many entries it committed from the writer's own transaction, and,
// on the leader, each follower's lag and last answer. A single-node
// coordinator has none of them.
type Metrics struct {
	commit prometheus.Histogram
	apply  prometheus.Histogram
	// held is how long each batch of the state machine was open, from
	// its first entry until its commit returned.
	held prometheus.Histogram
	// stuck counts the step-downs of a leader that could not commit.
	stuck prometheus.Counter
	// refused counts the raft listener's refusals by cause.
	refused *prometheus.CounterVec
	// node is the node the gauges read, once StartNode has set it.
	node atomic.Pointer[Node]

	leader, term, commitIndex, appliedIndex, changes, lag, contact, muted, pending, own *prometheus.Desc
}

// NewMetrics returns a node's metrics, registered with reg; give them to
// StartNode in NodeConfig.Metrics.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		commit: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "leasehold_raft_commit_seconds",
			Help:    "Time a writer group takes from its proposal to raft until it is committed by a quorum and applied to the leader's store.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}),
		apply: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "leasehold_raft_apply_seconds",
			Help:    "Time the state machine takes to apply one batch of committed entries to this node's store (one transaction).",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
		}),
		held: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "leasehold_raft_batch_held_seconds",
			Help: "Time a batch of entries stays open in this node's store, from its first entry until its commit (with fsync) returned: " +
				"on a follower up to 100 ms and a commit; longer when the process or its disk stalled with the batch open.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 15),
		}),
		own: prometheus.NewDesc("leasehold_raft_own_entries_total",
			"Entries this node, leading, committed from its writer's evaluated transaction instead of applying their write sets again "+
				"(the rest of the entries it applied, leasehold_raft_applied_index, were applied from their write sets).", nil, nil),
		pending: prometheus.NewDesc("leasehold_raft_batch_open_entries",
			"Entries applied into this node's open batch that its store has not committed yet, its commit included while it runs (0: no batch open).", nil, nil),
		stuck: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "leasehold_raft_stuck_stepdowns_total",
			Help: "Times this node, leading, had a writer group wait for its commit longer than the stuck bound " +
				"(a frozen disk under its store or raft log) and stepped down: Leader health NOT_SERVING, and muted to its peers until raft's leadership ended.",
		}),
		muted: prometheus.NewDesc("leasehold_raft_muted",
			"1 while this node sends nothing to its peers because, leading, it could not commit; else 0.", nil, nil),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "leasehold_raft_connections_refused_total",
			Help: "Connections to the raft port closed, and RPCs on it refused, by cause: total and per_address (too many connections proving " +
				"themselves, in all or from one address), handshake (no proof within 5 s: no TLS handshake, or no first byte), not_a_member " +
				"(a certificate naming no member, an RPC claiming another member or address), established (too many proven connections).",
		}, []string{"cause"}),
		leader: prometheus.NewDesc("leasehold_raft_leader",
			"1 while this node is the raft leader (the writer runs here), else 0.", nil, nil),
		term: prometheus.NewDesc("leasehold_raft_term", "This node's current raft term.", nil, nil),
		commitIndex: prometheus.NewDesc("leasehold_raft_commit_index",
			"The last log index this node knows to be committed.", nil, nil),
		appliedIndex: prometheus.NewDesc("leasehold_raft_applied_index",
			"The last log index raft handed to this node's store, in order.", nil, nil),
		changes: prometheus.NewDesc("leasehold_raft_leader_changes_total",
			"Leaders this node has learnt of since it started (an election won, a transfer), itself included.", nil, nil),
		lag: prometheus.NewDesc("leasehold_raft_follower_lag_entries",
			"On the leader: log entries a follower has yet to store (the leader's last index minus the follower's match index), "+
				"for each follower that has answered it since it began to lead.", []string{"follower"}, nil),
		contact: prometheus.NewDesc("leasehold_raft_follower_last_contact_seconds",
			"On the leader: seconds since a follower last answered it (since it began to lead, for one that has not).", []string{"follower"}, nil),
	}
	for _, c := range []string{causeTotal, causePerAddress, causeHandshake, causeNotAMember, causeEstablished} {
		m.refused.WithLabelValues(c)
	}
	reg.MustRegister(m.commit, m.apply, m.held, m.refused, m.stuck, m)
	return m
}

// observeCommit records one commit's duration; m may be nil.
func (m *Metrics) observeCommit(d time.Duration) {
	if m != nil {
		m.commit.Observe(d.Seconds())
	}
}

// observeStuck counts one step-down of a leader that could not commit; m
// may be nil.
func (m *Metrics) observeStuck() {
	if m != nil {
		m.stuck.Inc()
	}
}

// observeApply records one apply's duration; m may be nil.
func (m *Metrics) observeApply(d time.Duration) {
	if m != nil {
		m.apply.Observe(d.Seconds())
	}
}

// observeHeld records how long one batch was open; m may be nil.
func (m *Metrics) observeHeld(d time.Duration) {
	if m != nil {
		m.held.Observe(d.Seconds())
	}
}

// refusedConn counts a refusal of the raft listener; m may be nil.
func (m *Metrics) refusedConn(cause string) {
	if m != nil {
		m.refused.WithLabelValues(cause).Inc()
	}
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{m.leader, m.term, m.commitIndex, m.appliedIndex, m.changes, m.lag, m.contact, m.muted, m.pending, m.own} {
		ch <- d
	}
}

// Collect implements prometheus.Collector: nothing before the node starts
// or after it stopped.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	n := m.node.Load()
	if n == nil {
		return
	}
	select {
	case <-n.Done():
		return
	default:
	}
	st, err := n.Status()
	if err != nil {
		return
	}
	leading := 0.0
	if st.Leading {
		leading = 1
	}
	ch <- prometheus.MustNewConstMetric(m.leader, prometheus.GaugeValue, leading)
	ch <- prometheus.MustNewConstMetric(m.term, prometheus.GaugeValue, float64(st.Term))
	ch <- prometheus.MustNewConstMetric(m.commitIndex, prometheus.GaugeValue, float64(st.CommitIndex))
	ch <- prometheus.MustNewConstMetric(m.appliedIndex, prometheus.GaugeValue, float64(st.AppliedIndex))
	ch <- prometheus.MustNewConstMetric(m.changes, prometheus.CounterValue, float64(n.LeaderChangesSeen()))
	muted := 0.0
	if n.muted.Load() {
		muted = 1
	}
	ch <- prometheus.MustNewConstMetric(m.muted, prometheus.GaugeValue, muted)
	ch <- prometheus.MustNewConstMetric(m.pending, prometheus.GaugeValue, float64(n.fsm.Pending()))
	ch <- prometheus.MustNewConstMetric(m.own, prometheus.CounterValue, float64(n.fsm.OwnEntries()))
	if !st.Leading {
		return
	}
	now := time.Now()
	for _, mb := range st.Members {
		if mb.ID == st.NodeID {
			continue
		}
		if mb.Known {
			ch <- prometheus.MustNewConstMetric(m.lag, prometheus.GaugeValue, float64(st.LastIndex-min(mb.Match, st.LastIndex)), mb.ID)
		}
		since := mb.LastContact
		if !mb.Known || since.IsZero() {
			since = st.LeadingSince
		}
		if !since.IsZero() {
			ch <- prometheus.MustNewConstMetric(m.contact, prometheus.GaugeValue, now.Sub(since).Seconds(), mb.ID)
		}
	}
}

var _ prometheus.Collector = (*Metrics)(nil)
