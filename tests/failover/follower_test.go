package failover

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/leasehold/leasehold/internal/clustertest"
)

// The follower faults of the hung-leader campaign: a follower, not the
// leader, hung while its state machine holds a batch of entries open
// (cluster.FSM keeps a follower's store transaction open across raft's
// calls), then resumed.
const (
	faultFollowerStop   fault = "follower-sigstop"
	faultFollowerFreeze fault = "follower-freeze"
)

// followerTries is how many times a follower fault is struck, at most,
// until it strikes a batch the follower holds open: the batch it saw
// begin may commit in the moment between the look and the strike.
const followerTries = 3

// The follower's metrics that say what its state machine holds
// (cluster.Metrics).
const (
	openEntriesMetric = "leasehold_raft_batch_open_entries"
	heldMetric        = "leasehold_raft_batch_held_seconds"
)

// followerResult is what one follower fault measured. Times are from the
// fault (the SIGSTOP sent, the freeze in place), or from its undoing.
type followerResult struct {
	kind             fault
	follower, leader int
	// try counts the strikes of this fault (followerTries).
	try int
	// term is the leader's term when the fault struck.
	term uint64
	// pending are the entries of the batch the follower had just begun
	// when it was struck; held says whether a batch stayed open through
	// the fault: one committed after it that had been open longer than
	// heldOver, which no batch is but one the fault kept open.
	pending  int
	held     bool
	heldOver time.Duration
	// struck is when the fault took effect, resumed when it was undone.
	struck, resumed time.Time
	// firstAck is the first acknowledgement of a submit sent after the
	// fault; ackedHung says whether it came before the fault was undone.
	firstAck  time.Duration
	ackedHung bool
	// commit is the leader's commit index when the follower resumed, and
	// caughtUp how long after the resume the follower had applied it.
	commit   uint64
	caughtUp time.Duration
	// changes are the signs that the leader changed from the fault until
	// the follower had caught up and the load made progress (any is a
	// failure); elections are the nodes' raft lines about an election
	// tried or refused.
	changes, elections []string
}

// runFollowerHung hangs a follower with f, chosen at random among the
// leader's, for -follower-hang-for, struck just after its state machine
// began a batch, and checks what a hung follower may not change: the
// leader keeps leading through the fault and after the resume, a submit
// sent during the fault is acknowledged before its end (the leader and
// the other follower are a quorum), and once resumed the follower
// applies what the leader had committed by then.
func runFollowerHung(t *testing.T, ctx context.Context, cl *clustertest.Cluster, ld *load, dirs []string,
	rng *rand.Rand, f fault, k, try int) followerResult {
	t.Helper()
	leader := cl.WaitLeader()
	// The leader and the follower not struck must be a quorum through
	// the fault: a node still catching up from an earlier fault (a
	// deposed leader rejoining) is not yet one, and the leader would not
	// commit until the struck follower resumed. So every follower first
	// applies what the leader has committed.
	for i := range cl.N() {
		if i != leader {
			caughtUp(t, ctx, cl, i)
		}
	}
	fo := (leader + 1 + rng.IntN(cl.N()-1)) % cl.N()
	res := followerResult{kind: f, follower: fo, leader: leader, try: try}
	st, err := clusterStatus(ctx, cl, leader)
	if err != nil {
		t.Fatalf("the term of the leader n%d: %v", leader+1, err)
	}
	res.term = st.GetTerm()
	nodeMarks := make([]int, cl.N())
	for i := range nodeMarks {
		nodeMarks[i] = cl.Proc(i).Mark()
	}
	before := scrapeHeld(t, ctx, cl.MetricsAddr(fo))
	res.heldOver = before.longestBelow(*followerHangFor)
	res.pending = awaitBatchBegun(t, ctx, cl.MetricsAddr(fo))
	undo := hang(t, cl, dirs, fo, f)
	res.struck = time.Now()
	probed := ld.probe(ctx, fmt.Sprintf("follower-probe-%d-%d", k, try), res.struck, 50*time.Millisecond)
	// How long the fault lasts is the fault itself, not a wait for
	// anything to happen; the probe's answer is taken if it comes first.
	hang := time.NewTimer(*followerHangFor - time.Since(res.struck))
	defer hang.Stop()
	select {
	case <-ctx.Done():
	case ok := <-probed:
		if !ok {
			t.Fatalf("no submit sent after the %s of n%d was acknowledged", f, fo+1)
		}
		probed = nil
		select {
		case <-ctx.Done():
		case <-hang.C:
		}
	case <-hang.C:
	}
	undo()
	res.resumed = time.Now()
	res.commit = caughtUp(t, ctx, cl, fo)
	res.caughtUp = time.Since(res.resumed)
	if probed != nil && !<-probed {
		t.Fatalf("no submit sent after the %s of n%d was acknowledged", f, fo+1)
	}
	var ok bool
	res.firstAck, ok = ld.firstAckSince(res.struck)
	res.ackedHung = ok && res.struck.Add(res.firstAck).Before(res.resumed)
	n, _ := ld.count()
	if err := ld.waitAcks(ctx, n, *settleAcks); err != nil {
		t.Fatalf("after the %s of n%d: %v", f, fo+1, err)
	}
	res.held = scrapeHeld(t, ctx, cl.MetricsAddr(fo)).longer(res.heldOver) > before.longer(res.heldOver)
	res.changes = leaderChanges(ctx, cl, leader, res.term, nodeMarks)
	res.elections = electionLines(cl, nodeMarks)
	return res
}

// leaderChanges returns the signs that leader, which led at term, did not
// lead throughout since the nodes' marks: a node's "leading" line, a
// node at another term, or leader no longer leading. A follower resumed
// after a hang finds raft's heartbeat timer long run out, and stands for
// election at once. hashicorp/raft (v1.8.0) asks for a pre-vote first,
// enabled unless Config.PreVoteDisabled and offered by the cluster's
// transport (cluster.observe keeps RequestPreVote): the candidate asks
// for the next term without taking it, every node that has a leader (the
// leader too) refuses, and the leader's next append, of the term the
// candidate still holds, makes it a follower again. Without the pre-vote
// the candidate would take the next term at once, answer the leader's
// appends with it, and the leader would step down on that answer.
func leaderChanges(ctx context.Context, cl *clustertest.Cluster, leader int, term uint64, marks []int) []string {
	var out []string
	for i := range cl.N() {
		lines := cl.Proc(i).Lines()
		for _, line := range lines[min(marks[i], len(lines)):] {
			if strings.Contains(line, "msg=leading ") {
				out = append(out, fmt.Sprintf("n%d: %s", i+1, line))
			}
		}
		st, err := clusterStatus(ctx, cl, i)
		switch {
		case err != nil:
			out = append(out, fmt.Sprintf("n%d: its term: %v", i+1, err))
		case st.GetTerm() != term:
			out = append(out, fmt.Sprintf("n%d at term %d, the leader n%d led at %d", i+1, st.GetTerm(), leader+1, term))
		case i == leader && !st.GetFromLeader():
			out = append(out, fmt.Sprintf("n%d no longer leads", i+1))
		}
	}
	return out
}

// electionLines returns the nodes' raft lines since their marks that
// say an election was tried or refused: a resumed follower standing,
// and the others refusing its pre-vote.
func electionLines(cl *clustertest.Cluster, marks []int) []string {
	var out []string
	for i := range cl.N() {
		lines := cl.Proc(i).Lines()
		for _, line := range lines[min(marks[i], len(lines)):] {
			for _, m := range []string{"heartbeat timeout reached", "entering candidate state", "pre-vote", "election", "vote request"} {
				if strings.Contains(line, m) {
					out = append(out, fmt.Sprintf("n%d: %s", i+1, line))
					break
				}
			}
		}
	}
	return out
}

// awaitBatchBegun watches the follower's count of entries in its open
// batch, every 2 ms, until it sees a batch begin (none open, then one)
// and returns its entries: struck at once, the follower holds a batch
// that is at most a few milliseconds old, which commits only 25 ms after
// raft last handed it entries or 100 ms after it began. It fails the test
// when it sees none begin within a minute.
func awaitBatchBegun(t *testing.T, ctx context.Context, addr string) int {
	t.Helper()
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	deadline := time.Now().Add(time.Minute)
	empty := false
	for time.Now().Before(deadline) {
		mfs, err := scrape(ctx, addr)
		if err != nil {
			t.Fatal(err)
		}
		switch n := int(gauge(mfs, openEntriesMetric)); {
		case n == 0:
			empty = true
		case empty:
			return n
		}
		select {
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-tick.C:
		}
	}
	t.Fatalf("the follower at %s began no batch within a minute (%s)", addr, openEntriesMetric)
	return 0
}

// heldHistogram is a follower's leasehold_raft_batch_held_seconds.
type heldHistogram struct{ h *dto.Histogram }

// scrapeHeld reads the follower's histogram of how long its batches were
// open, failing the test when it cannot.
func scrapeHeld(t *testing.T, ctx context.Context, addr string) heldHistogram {
	t.Helper()
	mfs, err := scrape(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	mf := mfs[heldMetric]
	if mf == nil || len(mf.GetMetric()) == 0 {
		t.Fatalf("%s exports no %s", addr, heldMetric)
	}
	return heldHistogram{mf.GetMetric()[0].GetHistogram()}
}

// longestBelow returns the largest bucket bound below d: a batch open
// longer was open for about d.
func (h heldHistogram) longestBelow(d time.Duration) time.Duration {
	var out time.Duration
	for _, b := range h.h.GetBucket() {
		if bd := time.Duration(b.GetUpperBound() * float64(time.Second)); bd < d {
			out = max(out, bd)
		}
	}
	return out
}

// longer returns how many batches were open longer than d, a bucket
// bound.
func (h heldHistogram) longer(d time.Duration) uint64 {
	for _, b := range h.h.GetBucket() {
		if time.Duration(b.GetUpperBound()*float64(time.Second)) == d {
			return h.h.GetSampleCount() - b.GetCumulativeCount()
		}
	}
	return h.h.GetSampleCount()
}

// scrape reads a node's /metrics.
func scrape(ctx context.Context, addr string) (map[string]*dto.MetricFamily, error) {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(cctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scraping %s: %w", addr, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scraping %s: %s", addr, resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("scraping %s: %w", addr, err)
	}
	return mfs, nil
}

// gauge returns the value of the unlabelled gauge name, 0 when absent.
func gauge(mfs map[string]*dto.MetricFamily, name string) float64 {
	mf := mfs[name]
	if mf == nil || len(mf.GetMetric()) == 0 {
		return 0
	}
	return mf.GetMetric()[0].GetGauge().GetValue()
}

// followerVerdict is what the follower faults found wrong, by check.
type followerVerdict struct {
	// changes: the leader changed; unacked: no submit sent during the
	// fault was acknowledged before its end; unheld: no strike of the
	// fault held a batch open through it.
	changes, unacked, unheld []string
}

// judgeFollowers checks the follower faults' results. A fault struck
// again because its batch committed before the strike counts once, by
// its last strike; every strike's leader and writes are checked.
func judgeFollowers(results []followerResult) followerVerdict {
	var v followerVerdict
	for i, r := range results {
		name := fmt.Sprintf("%s of n%d (try %d)", r.kind, r.follower+1, r.try)
		for _, c := range r.changes {
			v.changes = append(v.changes, name+": "+c)
		}
		if !r.ackedHung {
			v.unacked = append(v.unacked, fmt.Sprintf("%s: first write acknowledged %v after the fault, which lasted %v",
				name, r.firstAck.Round(time.Millisecond), r.resumed.Sub(r.struck).Round(time.Millisecond)))
		}
		last := i == len(results)-1 || results[i+1].try == 1
		if last && !r.held {
			v.unheld = append(v.unheld, fmt.Sprintf("%s: no batch open longer than %v committed after it", name, r.heldOver))
		}
	}
	return v
}

// passed reports whether every follower fault kept its leader, took
// writes while it lasted, and struck a batch held open.
func (v followerVerdict) passed() bool {
	return len(v.changes) == 0 && len(v.unacked) == 0 && len(v.unheld) == 0
}

// logFollower logs one follower fault's figures.
func logFollower(t *testing.T, n, of int, r followerResult) {
	t.Helper()
	t.Logf("%3d/%d %-16s n%d (try %d; leader n%d, term %d): entries in its open batch at the strike %d, a batch held over %v after it: %v; "+
		"first write %v (during the fault: %v); caught up to index %d %v after the resume; leader changes %d; election lines %d",
		n, of, r.kind, r.follower+1, r.try, r.leader+1, r.term, r.pending, r.heldOver, r.held, r.firstAck.Round(time.Millisecond),
		r.ackedHung, r.commit, r.caughtUp.Round(time.Millisecond), len(r.changes), len(r.elections))
	for _, c := range r.changes {
		t.Logf("    leader change: %s", c)
	}
	for _, e := range r.elections {
		t.Logf("    %s", e)
	}
}
