package failover

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold/client"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"github.com/leasehold/leasehold/internal/clustertest"
	"github.com/leasehold/leasehold/internal/proctest"
	"github.com/leasehold/leasehold/internal/testbin"
	"google.golang.org/grpc/metadata"
)

// The campaign's flags: go test ./tests/failover -kills 100 -isolations 20
// -pauses 20 (or after -args).
var (
	kills       = flag.Int("kills", 3, "leader SIGKILLs, each followed by a restart of the killed node on its data directory")
	isolations  = flag.Int("isolations", 1, "leader isolations: its raft traffic cut both ways, then healed")
	pauses      = flag.Int("pauses", 1, "leader SIGSTOPs of -pause-for, then SIGCONT")
	pauseFor    = flag.Duration("pause-for", 2*time.Second, "how long a paused leader stays stopped")
	applyCrash  = flag.Int("apply-crashes", 1, "follower crashes inside the replicated apply (a failpoint armed, the follower restarted on its data directory)")
	renderers   = flag.Int("renderers", 2, "renderer processes")
	leaseTTL    = flag.Duration("lease-ttl", 4*time.Second, "the coordinators' lease TTL")
	submitEvery = flag.Duration("submit-every", 25*time.Millisecond, "pace of the submitter: a batch of 1 to 3 documents each tick")
	settleAcks  = flag.Int("settle-acks", 20, "submits acknowledged after a fault is undone before the next fault")
	drainWait   = flag.Duration("drain-timeout", 90*time.Second, "how long every acknowledged job may take to end after the load stops")
	seed        = flag.Uint64("seed", 0, "seed of the fault order and the load (0: from the clock)")
)

var bins struct{ coordinator, renderer string }

func TestMain(m *testing.M) {
	proctest.Main(m, "failover", []string{"coordinator", "renderer"}, func(dir string) {
		bins.coordinator = filepath.Join(dir, "coordinator")
		bins.renderer = filepath.Join(dir, "renderer")
	})
}

// Leader lease timeout of the nodes (raft's default in the coordinator):
// the bound within which a deposed leader's renderer sessions must end.
const leaderLease = 500 * time.Millisecond

// fault is one step of the schedule.
type fault string

const (
	faultKill    fault = "kill"
	faultIsolate fault = "isolate"
	faultPause   fault = "pause"
	// faultApply crashes a follower inside the replicated apply; the
	// leader stays.
	faultApply fault = "apply"
)

// applyFailpoints are the replicated apply's failpoints
// (coordinator/internal/cluster and store, failpoints.go), armed on a
// follower in turn: entries committed in its log and not applied to its
// store; applied in the store's open transaction; committed to the store
// and not reported to raft; reported to raft and held in a batch the store
// has not committed.
var applyFailpoints = []string{"beforeApply", "applyBeforeCommit", "applyCommitted", "batchOpen"}

// faultResult is what one fault measured.
type faultResult struct {
	kind   fault
	leader int
	// failover is the fault (the SIGKILL, the cut, the SIGSTOP) to the
	// first acknowledgement of a submit sent after it.
	failover time.Duration
	// elected is the fault to the new leader's "leading" line: the part
	// of the failover that raft's timeouts and the promotion take.
	elected time.Duration
	// held are the leases held when the fault struck, by job, with their
	// tokens.
	held map[string]uint64
	// notLeader is, for each renderer, how long after the deposed leader
	// could act again (the cut, or the SIGCONT) its session ended with
	// NOT_LEADER; missing says why it did not.
	notLeader []time.Duration
	missing   []string
	// answered are the calls the deposed leader (isolated, or resumed
	// after a pause) answered as the leader; probes names the submits
	// sent to it, none of which may be stored.
	answered []string
	probes   []string
	// failpoint is the failpoint an apply fault armed; its failover is
	// then the time from the follower's restart to its SERVING answer.
	failpoint string
}

// TestFailoverCampaign puts a three-node cluster of coordinator processes
// under steady load with real renderers and faults its leader -kills,
// -isolations and -pauses times, in an order the seed shuffles; then it
// quiesces and checks (see the package documentation). The figures are
// printed against their goals; the campaign fails on a broken guarantee,
// on leases held at a fault and lost (more than 0.1%), and on a failover
// of 10 s or more (a bound a loaded machine keeps, against a goal of
// 3 s).
func TestFailoverCampaign(t *testing.T) {
	if testing.Short() {
		t.Skip("the failover campaign runs real processes for tens of seconds; not with -short")
	}
	s := campaignSeed()
	rng := rand.New(rand.NewPCG(s, 2))
	var schedule []fault
	for range *kills {
		schedule = append(schedule, faultKill)
	}
	for range *isolations {
		schedule = append(schedule, faultIsolate)
	}
	for range *pauses {
		schedule = append(schedule, faultPause)
	}
	for range *applyCrash {
		schedule = append(schedule, faultApply)
	}
	rng.Shuffle(len(schedule), func(i, j int) { schedule[i], schedule[j] = schedule[j], schedule[i] })
	t.Logf("seed %d: %d kills, %d isolations, %d pauses of %v, %d follower crashes inside apply", s, *kills, *isolations, *pauses, *pauseFor, *applyCrash)

	root, err := testbin.ModuleRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	withFailpoints, err := testbin.FailpointsCoordinator(t.Context(), root, bins.coordinator, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	cp := startCampaign(t, clustertest.Options{Coordinator: withFailpoints, Args: []string{"--lease-ttl", leaseTTL.String()}}, s)
	cl, rs, op, ld, ctx := cp.cl, cp.rs, cp.op, cp.ld, t.Context()

	started := time.Now()
	var results []faultResult
	applies := 0
	for k, f := range schedule {
		var res faultResult
		if f == faultApply {
			res = crashInApply(t, ctx, cl, ld, rng, applyFailpoints[applies%len(applyFailpoints)])
			applies++
			results = append(results, res)
			t.Logf("%3d/%d %-7s n%d: died at the failpoint %s, SERVING again %v after its restart", k+1, len(schedule), f, res.leader+1,
				res.failpoint, res.failover.Round(time.Millisecond))
			continue
		}
		res = runFault(t, ctx, cl, op, ld, rs, f, k)
		results = append(results, res)
		t.Logf("%3d/%d %-7s n%d: failover %v (elected after %v), %d leases held, NOT_LEADER %v %s", k+1, len(schedule), f, res.leader+1,
			res.failover.Round(time.Millisecond), res.elected.Round(time.Millisecond), len(res.held), rounded(res.notLeader), strings.Join(res.missing, "; "))
	}
	faultsTook := time.Since(started)

	cp.stopLoad()
	ev, err := gather(t, ctx, cl, op, ld, rs, cp.dir)
	if err != nil {
		t.Fatal(err)
	}
	sum := summarize(results, ev)
	sum.faultsTook = faultsTook
	var out strings.Builder
	sum.print(&out)
	t.Log("summary (seed " + strconv.FormatUint(s, 10) + "):\n" + out.String())
	if !sum.passed() {
		t.Fatalf("the campaign failed (seed %d): see the summary above", s)
	}
}

// campaignSeed is -seed, or one from the clock.
func campaignSeed() uint64 {
	if *seed != 0 {
		return *seed
	}
	return uint64(time.Now().UnixNano())
}

// campaign is a cluster under steady load: renderer processes given
// every node, the submitter's load on the client library, and an
// operator's client.
type campaign struct {
	cl *clustertest.Cluster
	rs []*proctest.Proc
	op *client.Client
	ld *load
	// dir holds the renderers' --record files.
	dir string
	// stopLoad stops the load and waits for it; it is safe twice.
	stopLoad func()
}

// startCampaign starts the cluster o describes (the binary, the timeouts,
// and retry backoffs of 20 to 200 ms after o.Args, are the campaign's),
// -renderers renderers (capacity 8, renders of 10 to 50 ms, 5% failing
// as transient), the load and the clients, and returns once the load has
// had -settle-acks submits acknowledged. Everything stops when the test
// ends.
func startCampaign(t *testing.T, o clustertest.Options, seed uint64) *campaign {
	t.Helper()
	o.Coordinator = cmp.Or(o.Coordinator, bins.coordinator)
	o.Procs = proctest.Options{Timeout: time.Minute, Tail: 30}
	o.Args = append(o.Args, "--backoff-base", "20ms", "--backoff-cap", "200ms")
	cp := &campaign{cl: clustertest.Start(t, o), dir: t.TempDir()}
	cp.cl.WaitLeader()
	for i := range *renderers {
		cp.rs = append(cp.rs, cp.cl.StartRenderer(t, bins.renderer, fmt.Sprintf("fo-%d", i+1), "--token", "dev-renderer",
			"--capacity", "8", "--record", filepath.Join(cp.dir, fmt.Sprintf("fo-%d.record", i+1)),
			"--latency", "10ms", "--latency-jitter", "40ms", "--fail-rate", "0.05",
			"--seed", strconv.FormatUint(seed+uint64(i), 10), "--log-level", "info"))
	}
	for _, r := range cp.rs {
		r.WaitFor("session started")
	}
	dial := func(token string) *client.Client {
		c, err := client.Dial(cp.cl.Addrs(), client.WithToken(token))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	cp.op = dial("dev-operator")
	cp.ld = newLoad(dial("dev-alpha"), *submitEvery, seed)
	loadCtx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	wg.Go(func() { cp.ld.run(loadCtx) })
	cp.stopLoad = func() {
		cancel()
		wg.Wait()
	}
	t.Cleanup(cp.stopLoad)
	if err := cp.ld.waitAcks(t.Context(), 0, *settleAcks); err != nil {
		t.Fatal(err)
	}
	return cp
}

// runFault strikes the leader with f, measures the failover, undoes the
// fault (restart, heal, SIGCONT) and waits until the node is back in the
// cluster and the load has made progress.
func runFault(t *testing.T, ctx context.Context, cl *clustertest.Cluster, op *client.Client, ld *load,
	rs []*proctest.Proc, f fault, k int) faultResult {
	t.Helper()
	leader := cl.WaitLeader()
	res := faultResult{kind: f, leader: leader}
	res.held = leasedJobs(t, ctx, op)
	marks := make([]int, len(rs))
	for i, r := range rs {
		marks[i] = r.Mark()
	}
	nodeMarks := make([]int, cl.N())
	for i := range nodeMarks {
		if cl.Running(i) {
			nodeMarks[i] = cl.Proc(i).Mark()
		}
	}
	struck := time.Now()
	switch f {
	case faultKill:
		cl.Kill(leader)
	case faultIsolate:
		cl.Isolate(leader)
	case faultPause:
		cl.Pause(leader)
	}
	// Probes are submits sent after the fault besides the load's; the
	// first acknowledgement of any such submit ends the failover.
	probed := ld.probe(ctx, fmt.Sprintf("probe-%d", k), struck, 50*time.Millisecond)
	switch f {
	case faultKill:
	case faultIsolate:
		// Cut off, the leader can acknowledge nothing: at once, while raft
		// on it still believes it leads, and once it has stepped down.
		// At once, only the submit: raft counts the answer to a heartbeat
		// sent before the cut for a read's quorum round begun after it,
		// so a read there may be confirmed once; it is still linearizable,
		// since no other node can have been elected that soon
		// (cluster.TestIsolatedLeaderServesNoLinearizableRead bounds it).
		res.silent(ctx, cl, leader, ld, k, "at the cut", false)
		res.notLeader, res.missing = sessionEnds(rs, marks, struck, 10*time.Second)
		res.silent(ctx, cl, leader, ld, k, "deposed", true)
	case faultPause:
		// How long the process stays stopped is the fault itself, not a
		// wait for anything to happen.
		select {
		case <-ctx.Done():
		case <-time.After(*pauseFor - time.Since(struck)):
		}
		cl.Resume(leader)
		res.silent(ctx, cl, leader, ld, k, "at the SIGCONT", true)
		// The renderers leave the stopped leader once another answers as
		// the leader, before it resumes (leader moved), or learn it from
		// its NOT_LEADER once it runs again: timed from the SIGSTOP.
		res.notLeader, res.missing = sessionEnds(rs, marks, struck, 10*time.Second)
	}
	if !<-probed {
		t.Fatalf("no submit sent after the %s of n%d was acknowledged", f, leader+1)
	}
	res.failover, _ = ld.firstAckSince(struck)
	res.elected = electedAfter(cl, leader, nodeMarks, struck)
	if res.failover >= 3*time.Second {
		logElection(t, cl, leader, nodeMarks)
	}
	switch f {
	case faultKill:
		cl.Restart(leader)
	case faultIsolate:
		cl.Heal(leader)
	}
	waitMember(t, ctx, cl, leader)
	n, _ := ld.count()
	if err := ld.waitAcks(ctx, n, *settleAcks); err != nil {
		t.Fatalf("after %s of n%d: %v", f, leader+1, err)
	}
	return res
}

// crashInApply restarts a follower with failpoint fp armed, to panic
// after a few passes, and waits for it to die of it under the load: a
// crash inside the replicated apply. Then it restarts the follower on its
// data directory without the failpoint and waits until it is SERVING
// again (raft replays its log onto its store, which must apply what the
// crash left unapplied and skip what it applied, never stopping on it)
// and the load has made progress. The result's leader is the follower.
func crashInApply(t *testing.T, ctx context.Context, cl *clustertest.Cluster, ld *load, rng *rand.Rand, fp string) faultResult {
	t.Helper()
	leader := cl.WaitLeader()
	f := (leader + 1 + rng.IntN(cl.N()-1)) % cl.N()
	res := faultResult{kind: faultApply, leader: f, failpoint: fp}
	cl.Kill(f)
	// The panic names the failpoint: gofail's bare panic says "{}".
	p := cl.Launch(f, fmt.Sprintf("GOFAIL_FAILPOINTS=%s=%d*off->panic(%q)", fp, rng.IntN(20), fp))
	failsafe := time.NewTimer(time.Minute)
	defer failsafe.Stop()
	select {
	case <-p.Exited():
	case <-failsafe.C:
		t.Fatalf("n%d: the failpoint %s armed on a follower under load did not fire within a minute", f+1, fp)
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
	if !strings.Contains(p.LogText(), "failpoint panic: "+fp) {
		t.Fatalf("n%d exited, not at the failpoint %s: %v\n%s", f+1, fp, p.Err(), p.Tail(20))
	}
	restarted := time.Now()
	cl.Restart(f)
	waitMember(t, ctx, cl, f)
	res.failover = time.Since(restarted)
	caughtUp(t, ctx, cl, f)
	n, _ := ld.count()
	if err := ld.waitAcks(ctx, n, *settleAcks); err != nil {
		t.Fatalf("after the crash of n%d at %s: %v", f+1, fp, err)
	}
	return res
}

// caughtUp waits until node i (restarted, or resumed after a hang) has
// applied what the leader had committed when the wait began, asking both
// every 20 ms: the replay of its log, or what it missed, is done, and it
// did not stop on it. It returns that commit index. A node that exits
// meanwhile fails the test, and so does one that has not caught up
// within a minute.
func caughtUp(t *testing.T, ctx context.Context, cl *clustertest.Cluster, i int) uint64 {
	t.Helper()
	leader, err := clusterStatus(ctx, cl, cl.WaitLeader())
	if err != nil {
		t.Fatalf("the leader's commit index: %v", err)
	}
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	deadline := time.Now().Add(time.Minute)
	for {
		if !cl.Running(i) {
			t.Fatalf("n%d stopped while it applied the log: %v\n%s", i+1, cl.Proc(i).Err(), cl.Proc(i).Tail(10))
		}
		if own, err := clusterStatus(ctx, cl, i); err == nil && own.GetAppliedIndex() >= leader.GetCommitIndex() {
			return leader.GetCommitIndex()
		}
		if time.Now().After(deadline) {
			t.Fatalf("n%d did not apply the leader's commit index %d within a minute", i+1, leader.GetCommitIndex())
		}
		select {
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-tick.C:
		}
	}
}

// clusterStatus asks node i alone, as an operator, for its view of the
// cluster (its term, commit and applied indexes, whether it leads).
func clusterStatus(ctx context.Context, cl *clustertest.Cluster, i int) (*leaseholdv1.GetClusterResponse, error) {
	c, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer dev-operator"), 5*time.Second)
	defer cancel()
	return leaseholdv1.NewClusterServiceClient(cl.Conn(i)).GetCluster(c, &leaseholdv1.GetClusterRequest{})
}

// silent sends node i, the deposed leader, a submit and (with read) a
// linearizable read of the last acknowledged batch on a connection to it
// alone: it may answer neither as the leader would (a success). The submit's
// documents are named for the probe: none of them may be stored, even
// when it was answered OUTCOME_UNKNOWN, since no quorum can take an entry
// of the deposed leader's term.
func (r *faultResult) silent(ctx context.Context, cl *clustertest.Cluster, i int, ld *load, k int, when string, read bool) {
	jobs := leaseholdv1.NewJobServiceClient(cl.Conn(i))
	cctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer dev-alpha"), 5*time.Second)
	defer cancel()
	// The read first: the submit waits until raft on the node steps down.
	if batch, ok := ld.lastBatch(); ok && read {
		if _, err := jobs.GetBatch(cctx, &leaseholdv1.GetBatchRequest{BatchId: batch}); err == nil {
			r.answered = append(r.answered, fmt.Sprintf("%s: linearizable read of %s served", when, batch))
		}
	}
	req := fmt.Sprintf("silence-%d-%d", k, len(r.probes))
	r.probes = append(r.probes, req)
	if _, err := jobs.SubmitBatch(cctx, &leaseholdv1.SubmitBatchRequest{Team: team, RequestId: req,
		Documents: []*leaseholdv1.Document{{Name: req + ".txt", ContentType: "text/plain", Content: []byte(req)}}}); err == nil {
		r.answered = append(r.answered, fmt.Sprintf("%s: submit %s acknowledged", when, req))
	}
}

// electedAfter returns how long after struck a node other than the old
// leader logged that it leads, reading each node's lines after its mark;
// 0 when none did.
func electedAfter(cl *clustertest.Cluster, old int, marks []int, struck time.Time) time.Duration {
	for i := range cl.N() {
		if i == old || !cl.Running(i) {
			continue
		}
		lines := cl.Proc(i).Lines()
		for _, line := range lines[min(marks[i], len(lines)):] {
			if !strings.Contains(line, "msg=leading ") {
				continue
			}
			if at, err := time.Parse(time.RFC3339Nano, proctest.LogAttr(line, "time")); err == nil {
				return at.Sub(struck)
			}
		}
	}
	return 0
}

// logElection logs the raft lines the nodes other than the old leader
// wrote since their marks: what a slow failover spent its time on.
func logElection(t *testing.T, cl *clustertest.Cluster, old int, marks []int) {
	t.Helper()
	for i := range cl.N() {
		if i == old || !cl.Running(i) {
			continue
		}
		lines := cl.Proc(i).Lines()
		for _, line := range lines[min(marks[i], len(lines)):] {
			if strings.Contains(line, "raft: ") || strings.Contains(line, "msg=leading ") || strings.Contains(line, "writer promoted") {
				t.Logf("slow failover, n%d: %s", i+1, line)
			}
		}
	}
}

// leasedJobs returns the jobs leased now, with their tokens, as the leader
// answers.
func leasedJobs(t *testing.T, ctx context.Context, op *client.Client) map[string]uint64 {
	t.Helper()
	held := map[string]uint64{}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for j, err := range op.AllJobs(cctx, &leaseholdv1.ListJobsRequest{Team: team, Phase: leaseholdv1.Phase_PHASE_LEASED, OmitEvents: true, PageSize: 1000}) {
		if err != nil {
			t.Fatalf("listing the leased jobs: %v", err)
		}
		held[j.GetId()] = j.GetLease().GetToken()
	}
	return held
}

// sessionEnds waits, up to limit, for each renderer's first line after its
// mark that says its session ended, and returns how long after from each
// ended with NOT_LEADER or by leaving a leader its polls found gone
// ("leader moved"), and for the others why not.
func sessionEnds(rs []*proctest.Proc, marks []int, from time.Time, limit time.Duration) ([]time.Duration, []string) {
	var got []time.Duration
	var missing []string
	deadline := time.Now().Add(limit)
	for i, r := range rs {
		line, ok := r.Await(marks[i], deadline, []string{"coordinator not the leader"}, []string{"msg=\"leader moved\""}, []string{"session ended"})
		switch {
		case !ok:
			missing = append(missing, fmt.Sprintf("fo-%d: no session end within %v", i+1, limit))
		case !strings.Contains(line, "coordinator not the leader") && !strings.Contains(line, "leader moved"):
			missing = append(missing, fmt.Sprintf("fo-%d: %s", i+1, proctest.LogAttr(line, "err")))
		default:
			at, err := time.Parse(time.RFC3339Nano, proctest.LogAttr(line, "time"))
			if err != nil {
				missing = append(missing, fmt.Sprintf("fo-%d: no time in %q", i+1, line))
				continue
			}
			got = append(got, max(0, at.Sub(from)))
		}
	}
	return got, missing
}

// waitMember waits until node i says it is up and part of a cluster that
// has a leader (the overall health status SERVING).
func waitMember(t *testing.T, ctx context.Context, cl *clustertest.Cluster, i int) {
	t.Helper()
	if err := cl.AwaitServing(ctx, i); err != nil {
		t.Fatal(err)
	}
}

func rounded(ds []time.Duration) []time.Duration {
	out := make([]time.Duration, len(ds))
	for i, d := range ds {
		out[i] = d.Round(time.Millisecond)
	}
	return out
}
