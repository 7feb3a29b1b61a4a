//go:build simmutation

package mutation

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

var flagOnly = flag.String("bug", "", "switch on only the bug of this name")

// catcher is a test that must fail while a bug is on: the test binary
// of package pkg (relative to the module's root), run with -test.run run
// and args.
type catcher struct {
	pkg  string
	run  string
	args []string
}

func (c catcher) String() string {
	return strings.TrimSpace(fmt.Sprintf("%s %s %s", c.pkg, c.run, strings.Join(c.args, " ")))
}

// The simulator's runs: seeds fixed, so that a bug caught once is caught
// on every run, and the same seeds pass without it. A change that moves
// the runs (the simulator's draws, the writer's decisions) may move where
// a bug is caught: then pick seeds that catch it again. The long run is
// for a bug a seed shows only in a rare window: a command whose caller
// raced a demotion.
var (
	simNode        = catcher{"coordinator/sim", "^TestSimulation$", []string{"-seed", "7002", "-seeds", "2", "-steps", "10000"}}
	simCluster     = catcher{"coordinator/sim", "^TestSimulation$", []string{"-cluster", "-seed", "7004", "-seeds", "2", "-steps", "10000"}}
	simClusterLong = catcher{"coordinator/sim", "^TestSimulation$", []string{"-cluster", "-seed", "7004", "-seeds", "1", "-steps", "16000"}}
	// simClusterHeard has a deposed leader's raft hear of the new term
	// and apply its entries while the writer's group still waits for its
	// own.
	simClusterHeard = catcher{"coordinator/sim", "^TestSimulation$", []string{"-cluster", "-seed", "7007", "-seeds", "1", "-steps", "10000"}}
)

// caughtBy names, for every bug of the table, the tests that catch it.
var caughtBy = map[Bug][]catcher{
	Fencing:          {simNode},
	CancelKeepsLease: {simNode},

	ApplyIndexApart: {{"coordinator/internal/store", "^TestWriteSet$/^CommitsOnceWithTheAppliedIndex$", nil}},
	Reapply: {{"coordinator/internal/store", "^TestWriteSet$/^IsIdempotentOnReplay$", nil},
		{"coordinator/internal/cluster", "^TestFSM$/^IsIdempotentOnReplay$", nil}},
	BatchAppliedAhead: {{"coordinator/internal/cluster", "^TestFSM$/^AKillMidBatchReplaysWhatTheStoreLacks$", nil}},

	PublishEarly:       {simCluster},
	KeepSoftState:      {simCluster},
	LocalToken:         {simCluster},
	NoExtend:           {simCluster, {"coordinator/internal/cluster", "^TestPromotion$/^ALiveLease", nil}},
	DemoteKeepsStreams: {{"coordinator/internal/engine", "^TestLeadership$/^DemoteEndsSessionsAndWatches$", nil}},
	AdmitEarlierTerm:   {{"coordinator/internal/engine", "^TestLeadership$/^ACommandSentToAnEarlierTermIsRefusedByTheNext$", nil}, simClusterLong},

	PromoteNoExtend:     {{"coordinator/internal/cluster", "^TestPromotion$/^ALiveLease", nil}, simCluster},
	PromoteNoBarrier:    {{"coordinator/internal/cluster", "^TestPromotion$/^NoWriterBeforeTheBarrierApplied$", nil}, simCluster},
	BarrierUnawaited:    {{"coordinator/internal/cluster", "^TestNodeBarrier$", nil}},
	LostIsNotLeader:     {{"coordinator/internal/cluster", "^TestCommitOutcome$", nil}},
	IgnoreStaleBase:     {{"coordinator/internal/cluster", "^TestCommitterRefusesAStaleBase$", nil}},
	PendingForeignEntry: {{"coordinator/internal/cluster", "^TestOwnEntry$/^AnotherEntryFirstRollsThePendingGroupBack$", nil}, simClusterHeard},
	HeartbeatLaterTerm:  {{"coordinator/internal/cluster", "^TestHeartbeatFastPath$", nil}},
	VerifyRaftState: {{"coordinator/internal/cluster", "^TestIsolatedLeaderServesNoLinearizableRead$", nil},
		{"coordinator/internal/cluster", "^TestVerifyLeader$", nil}},
	VerifyWriterState: {{"coordinator/internal/cluster", "^TestIsolatedLeaderServesNoLinearizableRead$", nil},
		{"coordinator/internal/cluster", "^TestVerifyLeader$", nil}},

	StaleRead:    {{"coordinator/internal/server", "^TestEveryReadVerifiesLeadership$", nil}, simCluster},
	ReadTableGap: {{"coordinator/internal/server", "^TestEveryReadVerifiesLeadership$", nil}},
}

// TestEveryMutationIsCaught builds the test binary of every package that
// catches a bug once (this build's tag, simmutation, compiles the switch
// in), runs each catching test without any bug, which must pass, then
// switches each bug of the table on in turn (LEASEHOLD_MUTATION) and runs
// the tests that must catch it: each must fail. It lists every bug with
// what caught it. Run it with
//
//	go test -tags simmutation -run TestEveryMutationIsCaught -v ./coordinator/internal/mutation
func TestEveryMutationIsCaught(t *testing.T) {
	for _, in := range Table {
		if len(caughtBy[in.Bug]) == 0 {
			t.Errorf("bug %q has no test that catches it", in.Name)
		}
	}
	root := moduleRoot(t)
	bins := buildTests(t, root)

	// Without a bug every catching test passes: else a failure under a
	// bug would show nothing.
	var clean []catcher
	for _, in := range Table {
		for _, c := range caughtBy[in.Bug] {
			if !slices.ContainsFunc(clean, func(o catcher) bool { return o.String() == c.String() }) {
				clean = append(clean, c)
			}
		}
	}
	start := time.Now()
	errs := make([]error, len(clean))
	inParallel(len(clean), func(i int) {
		if out, err := run(bins[clean[i].pkg], root, clean[i], ""); err != nil {
			errs[i] = fmt.Errorf("without a bug, %s fails: %v\n%s", clean[i], err, tail(out))
		}
	})
	for _, err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	t.Logf("%d catching tests pass without a bug (%v)", len(clean), time.Since(start).Round(time.Millisecond))

	// Each bug on in turn: every test that catches it fails.
	type trial struct {
		in     Info
		c      catcher
		caught bool
		why    string
	}
	var trials []trial
	for _, in := range Table {
		if *flagOnly == "" || in.Name == *flagOnly {
			for _, c := range caughtBy[in.Bug] {
				trials = append(trials, trial{in: in, c: c})
			}
		}
	}
	start = time.Now()
	inParallel(len(trials), func(i int) {
		tr := &trials[i]
		out, err := run(bins[tr.c.pkg], root, tr.c, tr.in.Name)
		tr.caught, tr.why = err != nil, firstFailure(out)
	})
	bugs, caught := 0, 0
	for i := 0; i < len(trials); {
		in := trials[i].in
		var by, missed []string
		for ; i < len(trials) && trials[i].in.Bug == in.Bug; i++ {
			if tr := trials[i]; tr.caught {
				by = append(by, fmt.Sprintf("%s: %s", tr.c, tr.why))
			} else {
				missed = append(missed, tr.c.String())
			}
		}
		bugs++
		if len(missed) > 0 {
			t.Errorf("bug %q (%s: %s) survived %s", in.Name, in.Where, in.Breaks, strings.Join(missed, "; "))
			continue
		}
		caught++
		t.Logf("caught %s (%s)\n\t%s", in.Name, in.Where, strings.Join(by, "\n\t"))
	}
	t.Logf("%d of %d bugs caught (%v)", caught, bugs, time.Since(start).Round(time.Millisecond))
}

// inParallel calls f with every index below n, two at a time (the
// machines this runs on have two cores).
func inParallel(n int, f func(int)) {
	var wg sync.WaitGroup
	sem := make(chan struct{}, 2)
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			f(i)
		}()
	}
	wg.Wait()
}

// moduleRoot returns the module's directory.
func moduleRoot(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}").Output()
	if err != nil {
		t.Fatalf("go list -m: %v", err)
	}
	return strings.TrimSpace(string(out))
}

// buildTests builds, once, the test binary of every package that holds a
// catching test, with the simmutation tag, and returns them by package.
func buildTests(t *testing.T, root string) map[string]string {
	t.Helper()
	dir := t.TempDir()
	bins := map[string]string{}
	for _, cs := range caughtBy {
		for _, c := range cs {
			bins[c.pkg] = filepath.Join(dir, strings.ReplaceAll(c.pkg, "/", "_")+".test")
		}
	}
	start := time.Now()
	for pkg, bin := range bins {
		cmd := exec.Command("go", "test", "-c", "-tags", "simmutation", "-o", bin, "./"+pkg)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("building the tests of %s: %v\n%s", pkg, err, out)
		}
	}
	t.Logf("built the tests of %d packages (%v)", len(bins), time.Since(start).Round(time.Millisecond))
	return bins
}

// run runs catcher c's test binary bin in its package's directory, with
// bug switched on ("" for none), and returns its output; the error is
// the test's failure.
func run(bin, root string, c catcher, bug string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	args := append([]string{"-test.run", c.run, "-test.count", "1", "-test.timeout", "2m"}, c.args...)
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = filepath.Join(root, c.pkg)
	cmd.Env = append(os.Environ(), Env+"="+bug)
	out, err := cmd.CombinedOutput()
	if err == nil && bytes.Contains(out, []byte("no tests to run")) {
		err = fmt.Errorf("%s matches no test", c.run)
	}
	return out, err
}

// firstFailure is the first line that says what failed in a test's
// output: the first message after a "--- FAIL" (but the simulator's line
// naming its seeds, which it logs first), or a panic.
func firstFailure(out []byte) string {
	failed := false
	for line := range strings.Lines(string(out)) {
		line = strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(line, "--- FAIL"):
			failed = true
			continue
		case strings.HasPrefix(line, "panic:"):
		case !failed || !strings.Contains(line, "_test.go:") || strings.Contains(line, ": seeds from "):
			continue
		}
		if len(line) > 240 {
			line = line[:240] + "..."
		}
		return line
	}
	return "failed"
}

// tail is the end of a test's output.
func tail(out []byte) string {
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return strings.Join(lines[max(0, len(lines)-20):], "\n")
}
