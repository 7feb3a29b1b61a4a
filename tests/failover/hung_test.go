package failover

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/leasehold/leasehold/client"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"github.com/leasehold/leasehold/internal/clustertest"
	"github.com/leasehold/leasehold/internal/frozenfs"
	"github.com/leasehold/leasehold/internal/proctest"
)

// The hung-leader campaign's flags: go test ./tests/failover -run
// HungLeader -stops 20 -freezes 20 -blackholes 20 -follower-stops 20
// -follower-freezes 20 -quiet 10m -burn 4.
var (
	stops      = flag.Int("stops", 1, "hung-leader campaign: leader SIGSTOPs of -hang-for")
	freezes    = flag.Int("freezes", 1, "hung-leader campaign: freezes of the leader's data filesystem for -hang-for (needs root; none without)")
	blackholes = flag.Int("blackholes", 1, "hung-leader campaign: the leader's gRPC path blackholed both ways for -hang-for, raft untouched")
	hangFor    = flag.Duration("hang-for", 10*time.Second, "hung-leader campaign: how long each fault lasts")
	quietFor   = flag.Duration("quiet", 30*time.Second, "hung-leader campaign: the run under load with no fault, in which the leader must not change (0: none)")
	burn       = flag.Int("burn", 0, "hung-leader campaign: busy processes run beside the no-fault run, to load the machine")

	followerStops   = flag.Int("follower-stops", 1, "hung-leader campaign: SIGSTOPs of a follower with a batch open, for -follower-hang-for")
	followerFreezes = flag.Int("follower-freezes", 1, "hung-leader campaign: freezes of a follower's data filesystem with a batch open, for -follower-hang-for (needs root; none without)")
	followerHangFor = flag.Duration("follower-hang-for", 5*time.Second, "hung-leader campaign: how long each follower fault lasts (at least 2 s)")
)

// hungTTL is the hung-leader campaign's lease TTL. A lease outlives a path
// that carries nothing for up to a TTL less a heartbeat interval (the
// last heartbeat may be that old when the path stops): two thirds of 20 s
// is 13.3 s, room for a 10 s blackhole and the session's return.
const hungTTL = 20 * time.Second

// The hung-leader faults.
const (
	faultStop      fault = "sigstop"
	faultFreeze    fault = "freeze"
	faultBlackhole fault = "blackhole"
)

// hungResult is what one hung-leader fault measured. Times are from the
// fault (the SIGSTOP sent, the freeze in place, the path stalled), or,
// for a blackhole, which moves no leadership, from the path's healing.
type hungResult struct {
	kind   fault
	leader int
	// struck is when the fault took effect, healed when it was undone.
	struck, healed time.Time
	// elected: the new leader's "leading" line (0 when none; for a
	// blackhole, any is a failure: moved). firstAck: the first
	// acknowledgement of a submit sent after the fault (after the heal
	// for a blackhole).
	elected, firstAck time.Duration
	moved             bool
	// inFlight are the answers, from the fault, of the calls in flight
	// when it struck.
	inFlight []time.Duration
	// held are the leases held when the fault struck.
	held map[string]uint64
	// left is, for each renderer, how long after the fault its session on
	// the hung leader ended (leader moved, NOT_LEADER, or silence);
	// missing says why one did not.
	left    []time.Duration
	missing []string
	// trail is what the renderers logged of their sessions from the fault
	// to the end of its settling, for a fault whose figures miss their
	// goals.
	trail []string
}

// since returns where r's times count from.
func (r hungResult) since() time.Time {
	if r.kind == faultBlackhole {
		return r.healed
	}
	return r.struck
}

// TestHungLeaderCampaign puts a three-node cluster under steady load with
// real renderers and a Go client and hangs its leader: -stops SIGSTOPs,
// -freezes of its data filesystem (an ext4 loop mount of its own, frozen
// with fsfreeze; needs root) and -blackholes of its gRPC path both ways
// (raft untouched), each for -hang-for; and it hangs a follower that
// holds a batch open, -follower-stops SIGSTOPs and -follower-freezes of
// its data filesystem, each for -follower-hang-for (runFollowerHung says
// what each must keep); all in an order the seed shuffles. Before them,
// a run of -quiet under the same load with no fault (with -burn busy
// processes beside it) must see no leader change and no renderer leave
// its leader. Then it checks what the failover campaign checks, and that
// every lease held at a fault was kept or ended by its TTL; a blackhole
// must move no leadership and lose no lease. Timings are printed against
// their goals (docs/failover.md), not asserted.
func TestHungLeaderCampaign(t *testing.T) {
	if testing.Short() {
		t.Skip("the hung-leader campaign runs real processes for tens of seconds; not with -short")
	}
	s := campaignSeed()
	rng := rand.New(rand.NewPCG(s, 3))
	if *followerHangFor < 2*time.Second {
		t.Fatalf("-follower-hang-for %v: at least 2 s, so that the batch it holds open stands out from the others (100 ms and a commit)", *followerHangFor)
	}
	nFreezes, nFollowerFreezes := *freezes, *followerFreezes
	var dirs []string
	if nFreezes+nFollowerFreezes > 0 {
		if err := frozenfs.Usable(); err != nil {
			t.Logf("no freezes: %v", err)
			nFreezes, nFollowerFreezes = 0, 0
		}
		for range 3 {
			if nFreezes+nFollowerFreezes > 0 {
				// Room for raft-wal's 64 MiB segments and two snapshots.
				dirs = append(dirs, frozenfs.Mount(t, 1<<30))
			}
		}
	}
	var schedule []fault
	for _, fn := range []struct {
		f fault
		n int
	}{{faultStop, *stops}, {faultFreeze, nFreezes}, {faultBlackhole, *blackholes},
		{faultFollowerStop, *followerStops}, {faultFollowerFreeze, nFollowerFreezes}} {
		for range fn.n {
			schedule = append(schedule, fn.f)
		}
	}
	rng.Shuffle(len(schedule), func(i, j int) { schedule[i], schedule[j] = schedule[j], schedule[i] })
	t.Logf("seed %d: %d SIGSTOPs, %d freezes, %d blackholes of %v; %d follower SIGSTOPs, %d follower freezes of %v; %v with no fault beside %d busy processes",
		s, *stops, nFreezes, *blackholes, *hangFor, *followerStops, nFollowerFreezes, *followerHangFor, *quietFor, *burn)

	// A node that exits by itself (a fail-stop) ends the campaign at the
	// next step: with two nodes left, a hung leader leaves no quorum.
	var died atomic.Pointer[error]
	unexpected := func(err error) { died.CompareAndSwap(nil, &err) }
	alive := func() {
		if err := died.Load(); err != nil {
			t.Fatalf("a node exited by itself: %v", *err)
		}
	}
	cp := startCampaign(t, clustertest.Options{DataDirs: dirs, GRPCProxies: true, Metrics: true, Unexpected: unexpected,
		Args: []string{"--lease-ttl", hungTTL.String()}}, s)
	cl, rs, op, ld, ctx := cp.cl, cp.rs, cp.op, cp.ld, t.Context()

	var q quietResult
	if *quietFor > 0 {
		q = runQuiet(t, cl, rs, *quietFor, *burn)
		t.Logf("no fault for %v (load %s): %d leader changes, %d renderer sessions left", *quietFor, q.load, len(q.changes), len(q.left))
		for _, line := range q.raft {
			t.Logf("no fault: %s", line)
		}
	}
	var results []hungResult
	var followers []followerResult
	for k, f := range schedule {
		alive()
		if f == faultFollowerStop || f == faultFollowerFreeze {
			for try := 1; try <= followerTries; try++ {
				res := runFollowerHung(t, ctx, cl, ld, dirs, rng, f, k, try)
				followers = append(followers, res)
				logFollower(t, k+1, len(schedule), res)
				if res.held {
					break
				}
				alive()
			}
			continue
		}
		res := runHung(t, ctx, cl, op, ld, rs, dirs, f, k)
		results = append(results, res)
		t.Logf("%3d/%d %-9s n%d: elected after %v, first write %v, in flight answered %v, %d leases held, sessions left after %v %s",
			k+1, len(schedule), f, res.leader+1, res.elected.Round(time.Millisecond), res.firstAck.Round(time.Millisecond),
			rounded(res.inFlight), len(res.held), rounded(res.left), strings.Join(res.missing, "; "))
	}
	alive()
	cp.stopLoad()
	ev, err := gather(t, ctx, cl, op, ld, rs, cp.dir)
	if err != nil {
		t.Fatal(err)
	}
	sum := summarizeHung(results, followers, q, ev)
	var out strings.Builder
	sum.print(&out)
	t.Log("summary (seed " + strconv.FormatUint(s, 10) + "):\n" + out.String())
	if !sum.passed() {
		t.Fatalf("the hung-leader campaign failed (seed %d): see the summary above", s)
	}
}

// runHung hangs the leader with f for -hang-for, measures, undoes the
// fault and waits until the node is back in the cluster and the load has
// made progress.
func runHung(t *testing.T, ctx context.Context, cl *clustertest.Cluster, op *client.Client, ld *load,
	rs []*proctest.Proc, dirs []string, f fault, k int) hungResult {
	t.Helper()
	leader := cl.WaitLeader()
	res := hungResult{kind: f, leader: leader}
	res.held = leasedJobs(t, ctx, op)
	marks := make([]int, len(rs))
	for i, r := range rs {
		marks[i] = r.Mark()
	}
	nodeMarks := make([]int, cl.N())
	for i := range nodeMarks {
		nodeMarks[i] = cl.Proc(i).Mark()
	}
	// Calls in flight at the fault: submits sent every 5 ms from 50 ms
	// before it until it is in place; those sent last are in flight when
	// it strikes. The 50 ms are the scenario's timing, not a wait.
	burst := ld.burst(ctx, fmt.Sprintf("inflight-%d", k), 5*time.Millisecond)
	time.Sleep(50 * time.Millisecond)
	undo := hang(t, cl, dirs, leader, f)
	res.struck = time.Now()
	burstDone := burst.stop()
	var probed <-chan bool
	if f != faultBlackhole {
		probed = ld.probe(ctx, fmt.Sprintf("probe-%d", k), res.struck, 50*time.Millisecond)
	}
	if f != faultBlackhole {
		res.left, res.missing = sessionsLeft(rs, marks, res.struck, *hangFor)
	}
	// How long the fault lasts is the fault itself, not a wait for
	// anything to happen.
	select {
	case <-ctx.Done():
	case <-time.After(*hangFor - time.Since(res.struck)):
	}
	undo()
	res.healed = time.Now()
	if f == faultBlackhole {
		probed = ld.probe(ctx, fmt.Sprintf("probe-%d", k), res.healed, 50*time.Millisecond)
	}
	if !<-probed {
		t.Fatalf("no submit sent after the %s of n%d was acknowledged", f, leader+1)
	}
	res.firstAck, _ = ld.firstAckSince(res.since())
	res.inFlight = burst.answered(burstDone, res.struck)
	res.elected = electedAfter(cl, leader, nodeMarks, res.struck)
	if f == faultBlackhole {
		res.moved = res.elected > 0 || cl.WaitLeader() != leader
	}
	waitMember(t, ctx, cl, leader)
	n, _ := ld.count()
	if err := ld.waitAcks(ctx, n, *settleAcks); err != nil {
		t.Fatalf("after %s of n%d: %v", f, leader+1, err)
	}
	res.trail = sessionTrail(rs, marks)
	return res
}

// hang strikes node i with f, leader's or follower's: a SIGSTOP, a
// freeze of its data filesystem (dirs[i]), or a blackhole of its gRPC
// path; it returns what undoes the fault.
func hang(t *testing.T, cl *clustertest.Cluster, dirs []string, i int, f fault) (undo func()) {
	t.Helper()
	switch f {
	case faultStop, faultFollowerStop:
		cl.Pause(i)
		return func() { cl.Resume(i) }
	case faultFreeze, faultFollowerFreeze:
		return frozenfs.Freeze(t, dirs[i])
	case faultBlackhole:
		cl.Blackhole(i)
		return func() { cl.Unblackhole(i) }
	}
	t.Fatalf("no fault %q to strike n%d with", f, i+1)
	return nil
}

// sessionTrail returns the lines the renderers logged of their sessions
// since their marks.
func sessionTrail(rs []*proctest.Proc, marks []int) []string {
	var out []string
	for i, r := range rs {
		lines := r.Lines()
		for _, line := range lines[min(marks[i], len(lines)):] {
			for _, m := range []string{"session started", "session ended", "leader moved", "not the leader", "coordinator silent", "rejected", "lease lost"} {
				if strings.Contains(line, m) {
					out = append(out, fmt.Sprintf("fo-%d: %s", i+1, line))
					break
				}
			}
		}
	}
	return out
}

// sessionsLeft waits, up to limit, for each renderer's first line after its
// mark that says its session ended, and returns how long after from each
// one left the hung leader (leader moved, NOT_LEADER, or its silence),
// and for the others why not.
func sessionsLeft(rs []*proctest.Proc, marks []int, from time.Time, limit time.Duration) ([]time.Duration, []string) {
	var got []time.Duration
	var missing []string
	deadline := from.Add(limit)
	for i, r := range rs {
		line, ok := r.Await(marks[i], deadline, []string{"coordinator not the leader"}, []string{`msg="leader moved"`},
			[]string{`msg="coordinator silent"`}, []string{"session ended"})
		if !ok {
			missing = append(missing, fmt.Sprintf("fo-%d: still on the hung leader after %v", i+1, limit))
			continue
		}
		if strings.Contains(line, "session ended") {
			missing = append(missing, fmt.Sprintf("fo-%d: %s", i+1, proctest.LogAttr(line, "err")))
			continue
		}
		at, err := time.Parse(time.RFC3339Nano, proctest.LogAttr(line, "time"))
		if err != nil {
			missing = append(missing, fmt.Sprintf("fo-%d: no time in %q", i+1, line))
			continue
		}
		got = append(got, max(0, at.Sub(from)))
	}
	return got, missing
}

// quietResult is what the run with no fault saw.
type quietResult struct {
	// changes are the "leading" lines of the run (any is a failure), left
	// the renderers' lines that say they left a session, and raft the
	// nodes' lines that say why a leader changed.
	changes, left, raft []string
	// load is the machine's load average as sampled during the run.
	load string
}

// runQuiet lets the load run for d with no fault, with burn busy
// processes beside it, and reports every leader change and every
// renderer session that ended meanwhile.
func runQuiet(t *testing.T, cl *clustertest.Cluster, rs []*proctest.Proc, d time.Duration, burn int) quietResult {
	t.Helper()
	stopBurn := burnCPU(t, burn)
	defer stopBurn()
	nodeMarks := make([]int, cl.N())
	for i := range nodeMarks {
		nodeMarks[i] = cl.Proc(i).Mark()
	}
	marks := make([]int, len(rs))
	for i, r := range rs {
		marks[i] = r.Mark()
	}
	var samples []string
	sample := time.NewTicker(min(d/2, 30*time.Second))
	defer sample.Stop()
	// The run's length is the scenario, not a wait for anything.
	end := time.After(d)
	for done := false; !done; {
		select {
		case <-sample.C:
			samples = append(samples, loadAvg())
		case <-end:
			done = true
		}
	}
	samples = append(samples, loadAvg())
	var q quietResult
	q.load = strings.Join(samples, "; ")
	for i := range cl.N() {
		lines := cl.Proc(i).Lines()
		for _, line := range lines[min(nodeMarks[i], len(lines)):] {
			if strings.Contains(line, "msg=leading ") || strings.Contains(line, "leader cannot commit") {
				q.changes = append(q.changes, fmt.Sprintf("n%d: %s", i+1, line))
			}
			for _, why := range []string{"heartbeat timeout reached", "failed to contact quorum", "writer stalled", "leader cannot commit"} {
				if strings.Contains(line, why) {
					q.raft = append(q.raft, fmt.Sprintf("n%d: %s", i+1, line))
				}
			}
		}
	}
	for i, r := range rs {
		lines := r.Lines()
		for _, line := range lines[min(marks[i], len(lines)):] {
			for _, m := range []string{"coordinator not the leader", `msg="leader moved"`, `msg="coordinator silent"`, "session ended"} {
				if strings.Contains(line, m) {
					q.left = append(q.left, fmt.Sprintf("fo-%d: %s", i+1, line))
				}
			}
		}
	}
	return q
}

// loadAvg returns the 1-minute load average, or why it cannot be read.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return err.Error()
	}
	return strings.Fields(string(b))[0]
}

// burnCPU starts n processes that only spin, so that the machine is
// loaded as a busy host is, and returns what stops them; they are killed
// when the test ends too.
func burnCPU(t *testing.T, n int) (stop func()) {
	t.Helper()
	var cmds []*exec.Cmd
	for range n {
		cmd := exec.Command("sh", "-c", "while :; do :; done")
		if err := cmd.Start(); err != nil {
			t.Fatalf("starting a CPU burner: %v", err)
		}
		cmds = append(cmds, cmd)
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			for _, cmd := range cmds {
				_ = cmd.Process.Signal(syscall.SIGKILL)
				_ = cmd.Wait()
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// inFlightCall is one submit of a burst: when it was sent and answered.
type inFlightCall struct {
	sent, answered time.Time
}

// burst sends submits, each under a request id of its own (resent until
// acknowledged, as the load's are), every tick until stop.
type burst struct {
	stopC chan struct{}
	done  chan struct{}
	calls chan inFlightCall
}

// burst starts sending one-document submits every tick, until stop.
func (l *load) burst(ctx context.Context, name string, tick time.Duration) *burst {
	b := &burst{stopC: make(chan struct{}), done: make(chan struct{}), calls: make(chan inFlightCall, 1024)}
	go func() {
		defer close(b.done)
		var wg sync.WaitGroup
		defer wg.Wait()
		t := time.NewTicker(tick)
		defer t.Stop()
		for i := 0; ; i++ {
			wg.Go(func() {
				sent := time.Now()
				if l.submit(ctx, fmt.Sprintf("%s-%d", name, i), 1) {
					b.calls <- inFlightCall{sent: sent, answered: time.Now()}
				}
			})
			select {
			case <-b.stopC:
				return
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return b
}

// stop sends no more and returns a channel closed once every call sent
// has been answered.
func (b *burst) stop() <-chan struct{} {
	close(b.stopC)
	return b.done
}

// answered waits until every call of the burst was answered and returns,
// for those in flight when the fault struck (sent before, answered
// after), how long after it they were answered.
func (b *burst) answered(done <-chan struct{}, struck time.Time) []time.Duration {
	<-done
	close(b.calls)
	var out []time.Duration
	for c := range b.calls {
		if c.sent.Before(struck) && c.answered.After(struck) {
			out = append(out, c.answered.Sub(struck))
		}
	}
	return out
}

// hungSummary is the hung-leader campaign's verdict and figures.
type hungSummary struct {
	invariants
	faults map[fault][]hungResult
	quiet  quietResult
	// firstDoc is, by fault, how long after it the first document was
	// completed (on the new leader; after the heal for a blackhole).
	firstDoc map[fault][]time.Duration
	// leases held at a fault: kept by their holder, ended by their TTL,
	// or neither (broken); kept at a blackhole must be all of them.
	held, kept, expired map[fault]int
	broken, moved       []string
	sessionsMissing     []string
	// slow are the faults whose first document came 3 s or more after
	// them, with what the renderers logged meanwhile.
	slow []string
	// followers are the follower faults, and what they found wrong.
	followers []followerResult
	followerVerdict
}

// summarizeHung checks the evidence of the hung-leader campaign.
func summarizeHung(results []hungResult, followers []followerResult, q quietResult, ev *evidence) *hungSummary {
	s := &hungSummary{invariants: checkInvariants(ev), faults: map[fault][]hungResult{}, quiet: q,
		firstDoc: map[fault][]time.Duration{}, held: map[fault]int{}, kept: map[fault]int{}, expired: map[fault]int{},
		followers: followers, followerVerdict: judgeFollowers(followers)}
	received := receivedGrants(ev)
	for _, r := range results {
		s.faults[r.kind] = append(s.faults[r.kind], r)
		if d, ok := firstSucceeded(ev, r.since()); ok {
			s.firstDoc[r.kind] = append(s.firstDoc[r.kind], d)
			if d >= 3*time.Second {
				s.slow = append(s.slow, fmt.Sprintf("%s of n%d at %s: first document after %v; the renderers' sessions:\n        %s",
					r.kind, r.leader+1, r.struck.Format(time.RFC3339Nano), d.Round(time.Millisecond), strings.Join(r.trail, "\n        ")))
			}
		}
		if r.moved {
			s.moved = append(s.moved, fmt.Sprintf("blackhole of n%d moved leadership", r.leader+1))
		}
		for _, m := range r.missing {
			s.sessionsMissing = append(s.sessionsMissing, fmt.Sprintf("%s of n%d: %s", r.kind, r.leader+1, m))
		}
		for id, tok := range r.held {
			if !received[grant{job: id, token: tok}] {
				continue
			}
			s.held[r.kind]++
			switch why := leaseEnd(ev.jobs[id], tok); {
			case why == "":
				s.kept[r.kind]++
			case endedByTTL(why) && r.kind != faultBlackhole:
				s.expired[r.kind]++
			default:
				s.broken = append(s.broken, fmt.Sprintf("job %s token %d (%s of n%d): %s", id, tok, r.kind, r.leader+1, why))
			}
		}
	}
	return s
}

// endedByTTL reports whether a lease's end (leaseEnd's) is its TTL: it
// expired, or it was re-queued unheard of at its deadline.
func endedByTTL(why string) bool {
	return strings.HasPrefix(why, leaseholdv1.EventKind_EVENT_KIND_LEASE_EXPIRED.String()) ||
		why == leaseholdv1.EventKind_EVENT_KIND_REQUEUED.String()+" LEASE_NEVER_HEARD"
}

// firstSucceeded returns how long after from the first job succeeded,
// by the history's time of its SUCCEEDED event.
func firstSucceeded(ev *evidence, from time.Time) (time.Duration, bool) {
	var first time.Time
	for _, j := range ev.jobs {
		for _, e := range j.GetEvents() {
			at := e.GetAt().AsTime()
			if e.GetKind() == leaseholdv1.EventKind_EVENT_KIND_SUCCEEDED && !at.Before(from) && (first.IsZero() || at.Before(first)) {
				first = at
			}
		}
	}
	return first.Sub(from), !first.IsZero()
}

// passed reports whether every guarantee held: the invariants, no lease
// held at a fault lost otherwise than by its TTL (none at all at a
// blackhole), no blackhole that moved leadership, every renderer off a
// hung leader within the fault, no leader change or renderer leaving
// in the run with no fault, and every follower fault's checks
// (followerVerdict).
func (s *hungSummary) passed() bool {
	return s.invariants.passed() && len(s.broken) == 0 && len(s.moved) == 0 && len(s.sessionsMissing) == 0 &&
		len(s.quiet.changes) == 0 && len(s.quiet.left) == 0 && s.followerVerdict.passed()
}

// print writes the summary table.
func (s *hungSummary) print(w io.Writer) {
	ms := func(d time.Duration) string { return fmt.Sprintf("%.0f ms", float64(d)/float64(time.Millisecond)) }
	fmt.Fprintf(w, "faults: %d SIGSTOPs, %d freezes, %d blackholes of %v; %d strikes of a follower of %v\n", len(s.faults[faultStop]),
		len(s.faults[faultFreeze]), len(s.faults[faultBlackhole]), *hangFor, len(s.followers), *followerHangFor)
	fmt.Fprintf(w, "load: %d submits acknowledged (%d jobs), retried refusals %v; drained in %v\n", s.acked, s.ackedJobs,
		s.ev.errs, s.ev.drained.Round(time.Millisecond))
	s.invariants.print(w)
	row(w, "leases held at a fault lost otherwise", s.broken)
	row(w, "blackholes that moved leadership", s.moved)
	row(w, "renderers left on a hung leader", s.sessionsMissing)
	row(w, "no fault: leader changes", s.quiet.changes)
	row(w, "no fault: renderer sessions left", s.quiet.left)
	row(w, "follower faults: leader changes", s.followerVerdict.changes)
	row(w, "follower faults: no write while hung", s.followerVerdict.unacked)
	row(w, "follower faults: no batch held through", s.followerVerdict.unheld)
	fmt.Fprintf(w, "%-44s %s\n", "no fault: load average", s.quiet.load)
	for _, slow := range s.slow {
		fmt.Fprintf(w, "slow: %s\n", slow)
	}
	for _, f := range []fault{faultStop, faultFreeze, faultBlackhole} {
		if s.held[f] > 0 {
			fmt.Fprintf(w, "%-44s %d of %d kept, %d ended by their TTL\n", "leases held at a "+string(f), s.kept[f], s.held[f], s.expired[f])
		}
	}
	fmt.Fprintf(w, "\n%-20s %5s %9s %9s %9s   %s\n", "from the fault", "n", "p50", "p99", "max", "goal")
	line := func(name string, ds []time.Duration, goal string, met bool) {
		if len(ds) == 0 {
			return
		}
		v := ""
		if goal != "" {
			v = goal + ": " + verdict(met)
		}
		fmt.Fprintf(w, "%-20s %5d %9s %9s %9s   %s\n", name, len(ds), ms(quantile(ds, 0.5)), ms(quantile(ds, 0.99)), ms(quantile(ds, 1)), v)
	}
	for _, f := range []fault{faultStop, faultFreeze, faultBlackhole} {
		var elected, acked, left, inFlight []time.Duration
		for _, r := range s.faults[f] {
			if r.elected > 0 {
				elected = append(elected, r.elected)
			}
			acked = append(acked, r.firstAck)
			left = append(left, r.left...)
			inFlight = append(inFlight, r.inFlight...)
		}
		if len(s.faults[f]) == 0 {
			continue
		}
		docs := s.firstDoc[f]
		fmt.Fprintf(w, "%s:\n", f)
		if f == faultBlackhole {
			line("  first write", acked, "after the heal, p99 <= 1 s", quantile(acked, 0.99) <= time.Second)
			line("  first document", docs, "after the heal, p99 <= 1 s", quantile(docs, 0.99) <= time.Second)
			line("  in-flight answered", inFlight, "", true)
			continue
		}
		line("  elected", elected, "", true)
		line("  first write", acked, "", true)
		line("  first document", docs, "p99 <= 2.5 s, max < 3 s", quantile(docs, 0.99) <= 2500*time.Millisecond && quantile(docs, 1) < 3*time.Second)
		line("  in-flight answered", inFlight, "p99 <= 3 s", quantile(inFlight, 0.99) <= 3*time.Second)
		line("  renderers left", left, "", true)
	}
	for _, f := range []fault{faultFollowerStop, faultFollowerFreeze} {
		var acked, caught []time.Duration
		for _, r := range s.followers {
			if r.kind == f {
				acked, caught = append(acked, r.firstAck), append(caught, r.caughtUp)
			}
		}
		if len(acked) == 0 {
			continue
		}
		fmt.Fprintf(w, "%s:\n", f)
		line("  first write", acked, "before the resume", len(s.followerVerdict.unacked) == 0)
		line("  caught up (resume)", caught, "", true)
	}
	printCPU(w, len(s.ev.jobs))
}
