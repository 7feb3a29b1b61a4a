package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leasehold/leasehold/client"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	lstack "github.com/leasehold/leasehold/internal/stack"
	"github.com/leasehold/leasehold/internal/testbin"
)

// The replica's metrics the cluster figures come from.
const (
	raftCommitMetric  = "leasehold_raft_commit_seconds"
	raftCommitIndex   = "leasehold_raft_commit_index"
	raftAppliedIndex  = "leasehold_raft_applied_index"
	failoverProbeWait = 30 * time.Second
)

// startCluster starts -cluster nodes of one replicated cluster on this
// machine, each with its own data directory, gRPC, metrics and raft
// ports, waits until every one serves and one leads, and points the stack
// (its address, metrics, coord) at the leader. It returns the time from
// the first exec to the moment the leader is known.
func (s *stack) startCluster() (time.Duration, error) {
	s.nodes = s.procs.Coordinators
	started := time.Now()
	for i := range s.nodes {
		n, err := s.launch(i)
		if err != nil {
			return 0, err
		}
		s.followers = append(s.followers, n.Proc)
	}
	for _, n := range s.nodes {
		if _, err := testbin.WaitServing(s.ctx, n.Addr, s.cfg.healthPoll, n.Exited()); err != nil {
			return 0, fmt.Errorf("waiting for %s to serve: %w\n%s", n.ID, err, n.Tail(20))
		}
	}
	n, err := s.waitLeader(s.nodes)
	if err != nil {
		return 0, err
	}
	s.lg.printf("cluster of %d: %s leads at %s", len(s.nodes), n.ID, n.Addr)
	return time.Since(started), nil
}

// waitLeader waits until one of candidates says it leads, and points the
// stack at it.
func (s *stack) waitLeader(candidates []*lstack.Node) (*lstack.Node, error) {
	var n *lstack.Node
	if err := s.prog.Run(func() { n = s.procs.Leader(candidates...) }); err != nil {
		if cause := context.Cause(s.ctx); cause != nil {
			return nil, cause
		}
		return nil, err
	}
	s.lead(n)
	return n, nil
}

// lead points the stack (address, metrics, data, coord and followers) at
// leader, one of its nodes.
func (s *stack) lead(leader *lstack.Node) {
	s.leader = leader
	s.addr, s.metricsAddr, s.data = leader.Addr, leader.MetricsAddr, leader.DataDir
	s.coord = leader.Proc
	s.followers = s.followers[:0]
	for _, o := range s.nodes {
		if o != leader {
			s.followers = append(s.followers, o.Proc)
		}
	}
}

// dialAddr is the address renderers and the load generator dial: every
// node of a cluster, comma-separated, so that they find the leader
// themselves and follow it across a failover; else the coordinator's.
func (s *stack) dialAddr() string { return s.procs.Addrs() }

// raftSample is one scrape of the leader's replication metrics.
type raftSample struct {
	commit histogram
	index  float64
}

// scrapeRaft reads the leader's commit histogram and commit index, or
// returns nil: on a single node, or (saying so) when a cluster's leader
// does not expose them.
func (r *runner) scrapeRaft(ctx context.Context) *raftSample {
	if r.cfg.cluster == 0 {
		return nil
	}
	h, err := scrapeHistogram(ctx, r.st.metricsURL(), raftCommitMetric)
	if err != nil {
		r.lg.printf("warning: %v", err)
		return nil
	}
	index, err := scrapeGauge(ctx, r.st.metricsURL(), raftCommitIndex)
	if err != nil {
		r.lg.printf("warning: %v", err)
		return nil
	}
	return &raftSample{commit: h, index: index}
}

// raftBetween summarizes the replication of docs documents between two
// scrapes of the same leader: a writer group is one raft entry, and the
// commit histogram times each from its proposal to its apply.
func raftBetween(a, b *raftSample, docs int) *raftResult {
	if a == nil || b == nil {
		return nil
	}
	d := b.commit.sub(a.commit)
	res := &raftResult{Entries: int64(d.Count), LogEntries: int64(b.index - a.index)}
	if d.Count > 0 {
		res.DocsPerEntry = float64(docs) / d.Count
		res.CommitP50MS = d.quantile(0.5, 0) * 1000
		res.CommitP99MS = d.quantile(0.99, 0) * 1000
		res.CommitMeanMS = d.Sum / d.Count * 1000
	}
	return res
}

// ackLog keeps the submissions of the failover phase: when each was sent
// and acknowledged.
type ackLog struct {
	mu   sync.Mutex
	acks [][2]time.Time
}

// add records one acknowledged submission.
func (l *ackLog) add(sent, ack time.Time) {
	l.mu.Lock()
	l.acks = append(l.acks, [2]time.Time{sent, ack})
	l.mu.Unlock()
}

// firstAfter is the earliest acknowledgement of a submission sent at or
// after t, and whether there is one.
func (l *ackLog) firstAfter(t time.Time) (time.Time, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var first time.Time
	for _, a := range l.acks {
		if !a[0].Before(t) && (first.IsZero() || a[1].Before(first)) {
			first = a[1]
		}
	}
	return first, !first.IsZero()
}

// leaderChange reports whether err is a failure a leader change explains,
// once the client's own retrying across the failover has given up.
func leaderChange(err error) bool {
	return errors.Is(err, client.ErrNotLeader) || errors.Is(err, client.ErrOutcomeUnknown) || errors.Is(err, client.ErrUnavailable)
}

// failover keeps -failover-inflight batches in flight, closed loop, and
// -failover-kills times: lets the load run -failover-gap, kills the leader
// with SIGKILL, times the kill to the first acknowledgement of a
// submission sent after it (a single-document probe sent at once, or a
// batch of the load, whichever is first; the client finds the new leader
// itself), and restarts the killed node on its data directory, timing it
// to SERVING and to applying the leader's commit index of then. The
// renderers and the generator dial every node.
func (r *runner) failover(ctx context.Context) (*failoverResult, error) {
	st := r.st
	kills, inflight := r.cfg.failoverKills, r.cfg.failoverInflight
	r.lg.printf("failover: %d leader kills under %d batches of %d in flight, %v of load before each", kills, inflight, r.cfg.steadyBatch, r.cfg.failoverGap)
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var (
		acks     ackLog
		t        tally
		wg       sync.WaitGroup
		stopping atomic.Bool
		refused  atomic.Int64
		docs     atomic.Int64
	)
	follow := func(b *batch) error {
		return r.gen.followToEnd(ctx, b, func(at time.Time, p leaseholdv1.Phase) {
			docs.Add(1)
			t.add(at, p, b.ack, false)
		})
	}
	worker := func() {
		for !stopping.Load() && ctx.Err() == nil {
			sent := time.Now()
			b, err := r.gen.submit(ctx, "failover", r.cfg.steadyBatch)
			if err != nil && leaderChange(err) && ctx.Err() == nil {
				refused.Add(1)
				continue
			}
			if err == nil {
				acks.add(sent, b.ack)
				err = follow(b)
			}
			if err != nil {
				cancel(err)
				return
			}
		}
	}
	for range inflight {
		wg.Go(worker)
	}
	res := &failoverResult{Kills: kills, InFlightBatches: inflight, BatchSize: r.cfg.steadyBatch}
	var samples, rejoins, catchUps []time.Duration
	for i := range kills {
		if err := sleep(ctx, r.cfg.failoverGap); err != nil {
			break
		}
		old := st.leader
		killed := time.Now()
		old.Kill()
		probe, err := r.probe(ctx)
		if err != nil {
			cancel(err)
			break
		}
		acks.add(killed, probe.ack)
		wg.Go(func() {
			if err := follow(probe); err != nil {
				cancel(err)
			}
		})
		first, _ := acks.firstAfter(killed)
		samples = append(samples, first.Sub(killed))
		leader, err := st.waitLeader(st.procs.Others(old))
		if err != nil {
			cancel(err)
			break
		}
		rejoin, catchUp, err := r.rejoin(ctx, old)
		if err != nil {
			cancel(err)
			break
		}
		rejoins, catchUps = append(rejoins, rejoin), append(catchUps, catchUp)
		st.lead(leader)
		r.lg.printf("failover %d/%d: %s killed, %s leads; first write acknowledged after %v; %s rejoined in %v, caught up in %v",
			i+1, kills, old.ID, leader.ID, first.Sub(killed).Round(time.Millisecond), old.ID, rejoin.Round(time.Millisecond), catchUp.Round(time.Millisecond))
		res.Leaders = append(res.Leaders, leader.ID)
	}
	stopping.Store(true)
	r.lg.printf("failover: waiting for the batches in flight")
	waited := make(chan struct{})
	go func() { wg.Wait(); close(waited) }()
	select {
	case <-waited:
	case <-time.After(2 * time.Minute):
		cancel(errors.New("failover: the batches in flight did not finish within 2 minutes of the last kill"))
		<-waited
	}
	if err := context.Cause(ctx); err != nil {
		return nil, err
	}
	for _, d := range samples {
		res.SamplesMS = append(res.SamplesMS, ms(d))
	}
	s := summarize(samples)
	res.P50MS, res.MaxMS = ms(s.P50), ms(s.Max)
	rj, cu := summarize(rejoins), summarize(catchUps)
	res.RejoinP50MS, res.RejoinMaxMS, res.CatchUpMaxMS = ms(rj.P50), ms(rj.Max), ms(cu.Max)
	res.Documents = int(docs.Load())
	res.RefusedSubmits = int(refused.Load())
	if _, failed, _ := t.snapshot(); failed > 0 {
		res.Failed = failed
		r.lg.printf("warning: failover: not every job succeeded: %s", t.failures())
	}
	return res, nil
}

// probe submits one document right after a kill, again as long as the
// client gives up with a leader-change error, for at most
// failoverProbeWait.
func (r *runner) probe(ctx context.Context) (*batch, error) {
	ctx, cancel := context.WithTimeout(ctx, failoverProbeWait)
	defer cancel()
	for {
		b, err := r.gen.submit(ctx, "failover-probe", 1)
		switch {
		case err == nil:
			return b, nil
		case ctx.Err() != nil:
			return nil, fmt.Errorf("failover: no submission acknowledged within %v of the kill: %w", failoverProbeWait, err)
		case !leaderChange(err):
			return nil, err
		}
	}
}

// rejoin restarts a killed node on its data directory and waits until it
// serves (it is part of a cluster with a leader), then until it has
// applied the leader's commit index of that moment. It returns both times
// from the exec.
func (r *runner) rejoin(ctx context.Context, n *lstack.Node) (serving, caughtUp time.Duration, err error) {
	if _, err := r.st.launch(r.st.procs.Index(n)); err != nil {
		return 0, 0, err
	}
	at, err := testbin.WaitServing(ctx, n.Addr, r.cfg.healthPoll, n.Exited())
	if err != nil {
		return 0, 0, fmt.Errorf("waiting for %s to serve again: %w\n%s", n.ID, err, n.Tail(20))
	}
	serving = at.Sub(n.Started())
	target, err := scrapeGauge(ctx, r.st.metricsURL(), raftCommitIndex)
	if err != nil {
		return 0, 0, err
	}
	url := "http://" + n.MetricsAddr + "/metrics"
	for {
		applied, err := scrapeGauge(ctx, url, raftAppliedIndex)
		if err == nil && applied >= target {
			return serving, time.Since(n.Started()), nil
		}
		if err != nil && !errors.Is(err, errNoSeries) {
			return 0, 0, err
		}
		if err := sleep(ctx, 10*time.Millisecond); err != nil {
			return 0, 0, err
		}
	}
}

// sampleNodes reads each cluster node's CPU time and bytes written, the
// leader first; nil on a single node.
func (r *runner) sampleNodes() ([]nodeSample, error) {
	st := r.st
	if st.leader == nil {
		return nil, nil
	}
	out := []nodeSample{{id: st.leader.ID, leader: true}}
	for _, n := range st.procs.Others(st.leader) {
		out = append(out, nodeSample{id: n.ID})
	}
	for i := range out {
		pid := st.procs.Node(out[i].id).Pid()
		var err error
		if out[i].cpu, err = cpuTime(pid); err != nil {
			return nil, fmt.Errorf("reading %s's CPU time: %w", out[i].id, err)
		}
		if out[i].written, err = writeBytes(pid); err != nil {
			return nil, fmt.Errorf("reading the bytes %s wrote: %w", out[i].id, err)
		}
	}
	return out, nil
}

// nodesBetween is each node's CPU and bytes written per document from a to
// b, for the nodes in both (by id; a node restarted between them would
// count from zero, so the phases that sample them move no leadership).
func nodesBetween(a, b []nodeSample, docs int) []nodeUsage {
	var out []nodeUsage
	for _, y := range b {
		for _, x := range a {
			if x.id == y.id {
				out = append(out, nodeUsage{
					Node:            y.id,
					Leader:          y.leader,
					CPUMicrosPerDoc: float64((y.cpu - x.cpu).Microseconds()) / float64(docs),
					WrittenPerDoc:   float64(y.written-x.written) / float64(docs),
				})
			}
		}
	}
	return out
}
