package failover

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/leasehold/leasehold/client"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"github.com/leasehold/leasehold/internal/clustertest"
	"github.com/leasehold/leasehold/internal/proctest"
	"github.com/leasehold/leasehold/internal/stack"
)

// grant is one lease a renderer recorded receiving.
type grant struct {
	renderer, job string
	token         uint64
}

// evidence is what the campaign read once the load stopped.
type evidence struct {
	acks     []ack
	errs     map[string]int
	jobs     map[string]*leaseholdv1.Job
	grants   []grant
	stuck    []string // jobs not ended within the drain timeout
	drained  time.Duration
	reports  []clustertest.Report
	storeErr error
}

// gather lets every acknowledged job end (within -drain-timeout), stops
// the renderers, reads every job with its history and the grants the
// renderers recorded, and compares the three stores.
func gather(t *testing.T, ctx context.Context, cl *clustertest.Cluster, op *client.Client, ld *load,
	rs []*proctest.Proc, dir string) (*evidence, error) {
	t.Helper()
	ev := &evidence{}
	ev.acks, ev.errs = ld.snapshot()
	start := time.Now()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	deadline := time.Now().Add(*drainWait)
	for {
		open, err := unfinished(ctx, op)
		if err == nil && len(open) == 0 {
			break
		}
		if time.Now().After(deadline) {
			ev.stuck = open
			break
		}
		<-tick.C
	}
	ev.drained = time.Since(start)
	for _, r := range rs {
		r.Signal(syscall.SIGTERM)
	}
	for _, r := range rs {
		if code := r.WaitExit(); code != 0 {
			t.Errorf("a renderer exited %d after SIGTERM", code)
		}
	}
	ev.jobs = map[string]*leaseholdv1.Job{}
	cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for j, err := range op.AllJobs(cctx, &leaseholdv1.ListJobsRequest{Team: team, PageSize: 1000}) {
		if err != nil {
			return nil, fmt.Errorf("listing the jobs: %w", err)
		}
		ev.jobs[j.GetId()] = j
	}
	for i := range rs {
		gs, err := readRecord(filepath.Join(dir, fmt.Sprintf("fo-%d.record", i+1)), fmt.Sprintf("fo-%d", i+1))
		if err != nil {
			return nil, err
		}
		ev.grants = append(ev.grants, gs...)
	}
	ev.reports, ev.storeErr = cl.Digests(ctx)
	return ev, nil
}

// unfinished returns the jobs not yet in a terminal phase. It asks for
// each open phase first, which is cheap while many jobs are open; but the
// three lists are read one after another, and a job may move between
// them meanwhile (a failed render's job from LEASED to QUEUED after the
// QUEUED list was read), so three empty lists are confirmed by one pass
// over every job, in which a job can leave the open ones only by ending.
func unfinished(ctx context.Context, op *client.Client) ([]string, error) {
	var open []string
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for _, ph := range []leaseholdv1.Phase{leaseholdv1.Phase_PHASE_QUEUED, leaseholdv1.Phase_PHASE_LEASED, leaseholdv1.Phase_PHASE_RETRY_WAIT} {
		for j, err := range op.AllJobs(cctx, &leaseholdv1.ListJobsRequest{Team: team, Phase: ph, OmitEvents: true, PageSize: 1000}) {
			if err != nil {
				return open, err
			}
			open = append(open, j.GetId())
		}
	}
	if len(open) > 0 {
		return open, nil
	}
	for j, err := range op.AllJobs(cctx, &leaseholdv1.ListJobsRequest{Team: team, OmitEvents: true, PageSize: 1000}) {
		if err != nil {
			return open, err
		}
		switch j.GetPhase() {
		case leaseholdv1.Phase_PHASE_SUCCEEDED, leaseholdv1.Phase_PHASE_FAILED, leaseholdv1.Phase_PHASE_CANCELLED:
		default:
			open = append(open, j.GetId())
		}
	}
	return open, nil
}

// readRecord reads a renderer's --record file as that renderer's grants.
func readRecord(path, renderer string) ([]grant, error) {
	recs, err := stack.ReadRecord(path)
	out := make([]grant, 0, len(recs))
	for _, r := range recs {
		out = append(out, grant{renderer: renderer, job: r.Job, token: r.Token})
	}
	return out, err
}

func terminal(k leaseholdv1.EventKind) bool {
	return k == leaseholdv1.EventKind_EVENT_KIND_SUCCEEDED || k == leaseholdv1.EventKind_EVENT_KIND_FAILED ||
		k == leaseholdv1.EventKind_EVENT_KIND_CANCELLED
}

// summary is the campaign's verdict and figures.
type summary struct {
	faults     map[fault][]faultResult
	faultsTook time.Duration
	invariants

	held, kept       map[fault]int // leases held at a fault, and those kept
	undelivered      int           // leases at a kill that no renderer had received
	lostLeases       []string
	notLeaderMissing []string
	// deposedAnswers are calls a deposed leader answered as the leader,
	// and probes of it that were stored.
	deposedAnswers []string
	// slow are failovers that took failoverBound or more.
	slow []string
}

// failoverBound is the longest failover the campaign accepts: its goal is
// under 3 s, and a loaded machine (two cores shared with other builds) may
// stretch it, but not past this.
const failoverBound = 10 * time.Second

// keptGoal is the share of the leases held at a fault that must be kept.
const keptGoal = 0.999

// invariants is what every campaign checks of the evidence: the
// guarantees of a failover, whatever the fault.
type invariants struct {
	ev               *evidence
	acked, ackedJobs int
	lost             []string // acknowledged jobs missing or not terminal
	tokensReused     []string
	unpublished      []string // grants a renderer received that the store does not hold
	doubleTerminal   []string
}

// summarize checks the evidence against the guarantees.
func summarize(results []faultResult, ev *evidence) *summary {
	s := &summary{faults: map[fault][]faultResult{}, invariants: checkInvariants(ev)}
	for _, r := range results {
		s.faults[r.kind] = append(s.faults[r.kind], r)
	}
	s.leasesKept(ev)
	probes := map[string]bool{}
	for _, f := range []fault{faultIsolate, faultPause} {
		for _, r := range s.faults[f] {
			for _, m := range r.missing {
				s.notLeaderMissing = append(s.notLeaderMissing, fmt.Sprintf("%s of n%d: %s", f, r.leader+1, m))
			}
			for _, a := range r.answered {
				s.deposedAnswers = append(s.deposedAnswers, fmt.Sprintf("%s of n%d, %s", f, r.leader+1, a))
			}
			for _, p := range r.probes {
				probes[p+".txt"] = true
			}
		}
	}
	for id, j := range ev.jobs {
		if name := j.GetDocument().GetName(); probes[name] {
			s.deposedAnswers = append(s.deposedAnswers, fmt.Sprintf("job %s of the probe %s sent to a deposed leader is stored", id, name))
		}
	}
	for _, r := range results {
		if r.kind != faultApply && r.failover >= failoverBound {
			s.slow = append(s.slow, fmt.Sprintf("%s of n%d: %v", r.kind, r.leader+1, r.failover.Round(time.Millisecond)))
		}
	}
	return s
}

// leasesKept counts the leases held at each fault: those leased when it
// struck that a renderer had received (a grant the dead leader committed
// but never sent is held by no one; it is re-queued once its lease runs
// out, and counted apart). A lease is kept when it ended by its holder's
// own completion, not by expiry or a fenced completion.
func (s *summary) leasesKept(ev *evidence) {
	s.held, s.kept = map[fault]int{}, map[fault]int{}
	received := receivedGrants(ev)
	undelivered := map[grant]bool{}
	for _, f := range []fault{faultKill, faultIsolate, faultPause} {
		for _, r := range s.faults[f] {
			for id, tok := range r.held {
				if !received[grant{job: id, token: tok}] {
					undelivered[grant{job: id, token: tok}] = true
					continue
				}
				s.held[f]++
				if why := leaseEnd(ev.jobs[id], tok); why == "" {
					s.kept[f]++
				} else {
					s.lostLeases = append(s.lostLeases, fmt.Sprintf("job %s token %d (%s of n%d): %s", id, tok, f, r.leader+1, why))
				}
			}
		}
	}
	s.undelivered = len(undelivered)
}

// keptShare is the share of the leases held at any fault that were kept
// (1 when none was held).
func (s *summary) keptShare() float64 {
	held, kept := 0, 0
	for f, n := range s.held {
		held, kept = held+n, kept+s.kept[f]
	}
	if held == 0 {
		return 1
	}
	return float64(kept) / float64(held)
}

// receivedGrants returns the leases some renderer recorded receiving.
func receivedGrants(ev *evidence) map[grant]bool {
	received := map[grant]bool{}
	for _, g := range ev.grants {
		received[grant{job: g.job, token: g.token}] = true
	}
	return received
}

// checkInvariants checks the evidence against the guarantees every
// failover keeps: no acknowledged job lost, no token reused, no grant
// published before its entry committed, no double terminal transition.
func checkInvariants(ev *evidence) invariants {
	s := invariants{ev: ev}
	// No acknowledged job lost: present, and ended.
	for _, a := range ev.acks {
		s.acked++
		for _, id := range a.jobs {
			s.ackedJobs++
			j := ev.jobs[id]
			switch {
			case j == nil:
				s.lost = append(s.lost, id+" (batch "+a.batch+") is not in the store")
			case !terminal(lastKind(j)):
				s.lost = append(s.lost, fmt.Sprintf("%s ended in phase %s", id, j.GetPhase()))
			}
		}
	}
	// Tokens: unique in the histories, growing within a job, and every
	// grant a renderer received is one the store holds.
	owner := map[uint64]string{}
	stored := map[grant]bool{}
	for id, j := range ev.jobs {
		var last uint64
		terminals := 0
		for _, e := range j.GetEvents() {
			switch {
			case e.GetKind() == leaseholdv1.EventKind_EVENT_KIND_LEASED:
				tok := e.GetToken()
				if o, ok := owner[tok]; ok {
					s.tokensReused = append(s.tokensReused, fmt.Sprintf("token %d leased %s and %s", tok, o, id))
				}
				owner[tok] = id
				if tok <= last {
					s.tokensReused = append(s.tokensReused, fmt.Sprintf("job %s leased under token %d after %d", id, tok, last))
				}
				last = tok
				stored[grant{job: id, token: tok}] = true
			case e.GetKind() == leaseholdv1.EventKind_EVENT_KIND_REPLAYED:
				terminals = 0
			case terminal(e.GetKind()):
				terminals++
				if terminals == 2 {
					s.doubleTerminal = append(s.doubleTerminal, fmt.Sprintf("job %s: event %d is a second %s", id, e.GetSeq(), e.GetKind()))
				}
			}
		}
	}
	seen := map[uint64]string{}
	for _, g := range ev.grants {
		if o, ok := seen[g.token]; ok && o != g.job {
			s.tokensReused = append(s.tokensReused, fmt.Sprintf("token %d granted to renderers for %s and %s", g.token, o, g.job))
		}
		seen[g.token] = g.job
		if !stored[grant{job: g.job, token: g.token}] {
			s.unpublished = append(s.unpublished, fmt.Sprintf("%s received job %s under token %d, which the store never leased", g.renderer, g.job, g.token))
		}
	}
	return s
}

// lastKind is the kind of a job's last terminal event, or of its last
// event when none is terminal.
func lastKind(j *leaseholdv1.Job) leaseholdv1.EventKind {
	evs := j.GetEvents()
	for i := len(evs) - 1; i >= 0; i-- {
		if terminal(evs[i].GetKind()) {
			return evs[i].GetKind()
		}
	}
	if len(evs) == 0 {
		return leaseholdv1.EventKind_EVENT_KIND_UNSPECIFIED
	}
	return evs[len(evs)-1].GetKind()
}

// leaseEnd says how the lease of tok on j ended when not by its holder:
// empty when the holder completed it (success, failure, a retryable
// failure or a hand-back).
func leaseEnd(j *leaseholdv1.Job, tok uint64) string {
	if j == nil {
		return "job not in the store"
	}
	evs := j.GetEvents()
	i := slices.IndexFunc(evs, func(e *leaseholdv1.JobEvent) bool {
		return e.GetKind() == leaseholdv1.EventKind_EVENT_KIND_LEASED && e.GetToken() == tok
	})
	if i < 0 {
		return "no LEASED event of the token"
	}
	for _, e := range evs[i+1:] {
		switch e.GetKind() {
		case leaseholdv1.EventKind_EVENT_KIND_SUCCEEDED, leaseholdv1.EventKind_EVENT_KIND_FAILED,
			leaseholdv1.EventKind_EVENT_KIND_ATTEMPT_FAILED:
			return ""
		case leaseholdv1.EventKind_EVENT_KIND_LEASE_EXPIRED, leaseholdv1.EventKind_EVENT_KIND_REQUEUED,
			leaseholdv1.EventKind_EVENT_KIND_CANCELLED, leaseholdv1.EventKind_EVENT_KIND_LEASED:
			return fmt.Sprintf("%s %s", e.GetKind(), e.GetReason())
		}
	}
	return "still open"
}

// passed reports whether every guarantee held, the leases held at a fault
// were kept (keptGoal), and every failover took less than failoverBound.
// The timing goals are printed and compared, not part of the verdict.
func (s *summary) passed() bool {
	return s.invariants.passed() && len(s.notLeaderMissing) == 0 && len(s.deposedAnswers) == 0 &&
		s.keptShare() >= keptGoal && len(s.slow) == 0
}

// passed reports whether the invariants held, and every job ended and
// the stores agree.
func (s *invariants) passed() bool {
	return len(s.lost) == 0 && len(s.tokensReused) == 0 && len(s.unpublished) == 0 && len(s.doubleTerminal) == 0 &&
		len(s.ev.stuck) == 0 && s.ev.storeErr == nil
}

// row prints one check and up to five of what it found.
func row(w io.Writer, name string, bad []string) {
	fmt.Fprintf(w, "%-44s %d", name, len(bad))
	for i, b := range bad {
		if i == 5 {
			fmt.Fprintf(w, "\n    ... %d more", len(bad)-5)
			break
		}
		fmt.Fprintf(w, "\n    %s", b)
	}
	fmt.Fprintln(w)
}

// print writes the invariants' rows and the stores' reports.
func (s *invariants) print(w io.Writer) {
	fmt.Fprintf(w, "%-44s %s\n", "check", "result")
	row(w, "acknowledged jobs lost", s.lost)
	row(w, "tokens reused", s.tokensReused)
	row(w, "grants received but never stored", s.unpublished)
	row(w, "double terminal", s.doubleTerminal)
	row(w, "stuck after quiesce", s.ev.stuck)
	storeNote := "equal digests, coordinator check passes on each"
	if s.ev.storeErr != nil {
		storeNote = s.ev.storeErr.Error()
	}
	fmt.Fprintf(w, "%-44s %s\n", "stores", storeNote)
	for i, r := range s.ev.reports {
		fmt.Fprintf(w, "    n%d: %d jobs, last token %d, applied index %d, digest %.16s\n", i+1, r.Jobs, r.LastToken, r.AppliedIndex, r.Digest)
	}
}

// quantile returns the q-quantile of ds (nearest rank).
func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(q*float64(len(s))+0.999999) - 1
	return s[min(max(i, 0), len(s)-1)]
}

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "MISSED"
}

// print writes the summary table.
func (s *summary) print(w io.Writer) {
	ms := func(d time.Duration) string { return fmt.Sprintf("%.0f ms", float64(d)/float64(time.Millisecond)) }
	fmt.Fprintf(w, "faults: %d kills, %d isolations, %d pauses, %d follower crashes inside apply in %v\n", len(s.faults[faultKill]),
		len(s.faults[faultIsolate]), len(s.faults[faultPause]), len(s.faults[faultApply]), s.faultsTook.Round(time.Second))
	for _, r := range s.faults[faultApply] {
		fmt.Fprintf(w, "    n%d died at %s, and was SERVING %v after its restart\n", r.leader+1, r.failpoint, r.failover.Round(time.Millisecond))
	}
	fmt.Fprintf(w, "load: %d submits acknowledged (%d jobs), retried refusals %v; drained in %v\n", s.acked, s.ackedJobs,
		s.ev.errs, s.ev.drained.Round(time.Millisecond))
	s.invariants.print(w)
	row(w, "deposed leader's sessions without NOT_LEADER", s.notLeaderMissing)
	row(w, "deposed leader's answers as the leader", s.deposedAnswers)
	row(w, fmt.Sprintf("failovers of %v or more", failoverBound), s.slow)
	held, kept := 0, 0
	for f, n := range s.held {
		held, kept = held+n, kept+s.kept[f]
	}
	fmt.Fprintf(w, "%-44s %d of %d = %.2f%% (>= %.1f%%: %s)\n", "leases held at a fault kept", kept, held,
		100*s.keptShare(), 100*keptGoal, verdict(s.keptShare() >= keptGoal))
	for _, f := range []fault{faultKill, faultIsolate, faultPause} {
		fmt.Fprintf(w, "    at a%s %-7s %d of %d\n", map[bool]string{true: "n", false: ""}[f == faultIsolate], f, s.kept[f], s.held[f])
	}
	fmt.Fprintf(w, "%-44s %d\n", "leased at a kill, never received by a renderer", s.undelivered)
	for i, l := range s.lostLeases {
		if i == 5 {
			fmt.Fprintf(w, "    ... %d more\n", len(s.lostLeases)-5)
			break
		}
		fmt.Fprintf(w, "    %s\n", l)
	}
	fmt.Fprintf(w, "\n%-8s %5s %9s %9s %9s   %s\n", "failover", "n", "p50", "p99", "max", "goals p50 <= 1.2 s, p99 <= 2.5 s, max < 3 s")
	for _, f := range []fault{faultKill, faultIsolate, faultPause} {
		var ds []time.Duration
		for _, r := range s.faults[f] {
			ds = append(ds, r.failover)
		}
		if len(ds) == 0 {
			continue
		}
		p50, p99, mx := quantile(ds, 0.5), quantile(ds, 0.99), quantile(ds, 1)
		fmt.Fprintf(w, "%-8s %5d %9s %9s %9s   p50 %s, p99 %s, max %s\n", f, len(ds), ms(p50), ms(p99), ms(mx),
			verdict(p50 <= 1200*time.Millisecond), verdict(p99 <= 2500*time.Millisecond), verdict(mx < 3*time.Second))
	}
	fmt.Fprintf(w, "%-8s %5s %9s %9s %9s   %s\n", "elected", "n", "p50", "p99", "max", "the fault to the new leader's \"leading\" line")
	for _, f := range []fault{faultKill, faultIsolate, faultPause} {
		var ds []time.Duration
		for _, r := range s.faults[f] {
			if r.elected > 0 {
				ds = append(ds, r.elected)
			}
		}
		if len(ds) > 0 {
			fmt.Fprintf(w, "%-8s %5d %9s %9s %9s\n", f, len(ds), ms(quantile(ds, 0.5)), ms(quantile(ds, 0.99)), ms(quantile(ds, 1)))
		}
	}
	fmt.Fprintf(w, "\n%-8s %5s %9s %9s %9s   %s\n", "sessions", "n", "p50", "p99", "max", "a deposed leader's renderer sessions ended")
	for _, f := range []fault{faultIsolate, faultPause} {
		var ds []time.Duration
		for _, r := range s.faults[f] {
			ds = append(ds, r.notLeader...)
		}
		if len(ds) == 0 {
			continue
		}
		mx := quantile(ds, 1)
		goal := "from the SIGSTOP, leaving the stopped leader or told NOT_LEADER after the SIGCONT"
		if f == faultIsolate {
			goal = "NOT_LEADER from the cut; goal within the leader lease (" + leaderLease.String() + "): " + verdict(mx <= leaderLease)
		}
		fmt.Fprintf(w, "%-10s %3d %9s %9s %9s   %s\n", f, len(ds), ms(quantile(ds, 0.5)), ms(quantile(ds, 0.99)), ms(mx), goal)
	}
	printCPU(w, len(s.ev.jobs))
}

// printCPU writes the CPU time spent per 1,000 of n documents, in the
// child processes and in the test itself.
func printCPU(w io.Writer, n int) {
	var self, children syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &self)
	_ = syscall.Getrusage(syscall.RUSAGE_CHILDREN, &children)
	cpu := func(r syscall.Rusage) float64 {
		return float64(r.Utime.Sec+r.Stime.Sec) + float64(r.Utime.Usec+r.Stime.Usec)/1e6
	}
	if n > 0 {
		fmt.Fprintf(w, "\ncpu: %d documents; %.2f CPU-s per 1,000 documents in the processes (coordinators, renderers, checks), %.2f in the test's load\n",
			n, 1000*cpu(children)/float64(n), 1000*cpu(self)/float64(n))
	}
}
