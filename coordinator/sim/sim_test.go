package sim

import (
	"crypto/sha256"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

var (
	flagSeed    = flag.Uint64("seed", 0, "first seed to run (0: a random one, printed)")
	flagSeeds   = flag.Int("seeds", 2, "how many seeds to run, from -seed on")
	flagSteps   = flag.Int("steps", 1500, "scheduler steps of each run's faulty phase")
	flagBudget  = flag.Duration("budget", 0, "run seeds until this much wall-clock time has passed (-seeds, if given, is then a maximum)")
	flagWorkers = flag.Int("workers", runtime.GOMAXPROCS(0), "seeds run at once")
	flagSync    = flag.Bool("sync", false, "fsync every commit (the default opens bbolt with NoSync)")
	flagTrace   = flag.Bool("trace", false, "log every step (for one seed)")
	flagShadow  = flag.Bool("shadow", false, "replicate every group's write set onto a shadow store and compare digests after each")
	flagCluster = flag.Bool("cluster", false, "run three replicated nodes under a seeded consensus oracle")
)

// TestMain runs the tests, with the garbage collector at the coordinator's
// default target (GOGC=400) unless GOGC says otherwise, and a leak check.
func TestMain(m *testing.M) {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(400)
	}
	goleak.VerifyTestMain(m)
}

// seedRange returns the first seed and how many to run, at most.
func seedRange(t *testing.T) (uint64, int) {
	first := *flagSeed
	if first == 0 {
		first = rand.Uint64N(1<<32) + 1
	}
	n := *flagSeeds
	if *flagBudget > 0 {
		n = 1 << 30
		flag.Visit(func(f *flag.Flag) {
			if f.Name == "seeds" {
				n = *flagSeeds
			}
		})
	}
	t.Logf("seeds from %d", first)
	return first, n
}

// runSeed runs one seed of -steps steps in a directory of its own,
// removed afterwards.
func runSeed(t *testing.T, seed uint64, trace func(string, ...any)) (Result, error) {
	return runSeedSteps(t, seed, *flagSteps, trace)
}

func runSeedSteps(t *testing.T, seed uint64, steps int, trace func(string, ...any)) (Result, error) {
	return runConfig(t, Config{Seed: seed, Steps: steps, Sync: *flagSync, Shadow: *flagShadow, Cluster: *flagCluster, Trace: trace})
}

// runConfig runs cfg in a directory of its own, removed afterwards.
func runConfig(t *testing.T, cfg Config) (Result, error) {
	dir, err := os.MkdirTemp("", "leasehold-sim-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	cfg.Dir = dir
	return Run(cfg)
}

// TestSimulation runs seeds through the simulator, several at once, and
// fails with the seed of the first broken invariant; -seed N -seeds 1
// replays it, and -trace shows its steps. It reports simulated job
// lifecycles per wall-clock minute.
func TestSimulation(t *testing.T) {
	first, n := seedRange(t)
	var trace func(string, ...any)
	if *flagTrace {
		trace = t.Logf
	}
	var (
		next   atomic.Int64
		mu     sync.Mutex
		total  Result
		seeds  int
		failed []error
		wg     sync.WaitGroup
	)
	start := time.Now()
	for range max(*flagWorkers, 1) {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(n) || (*flagBudget > 0 && time.Since(start) > *flagBudget) {
					return
				}
				mu.Lock()
				stop := len(failed) > 0
				mu.Unlock()
				if stop {
					return
				}
				res, err := runSeed(t, first+uint64(i), trace)
				mu.Lock()
				total.Add(res)
				seeds++
				if err != nil {
					failed = append(failed, err)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	for _, err := range failed {
		var f *Failure
		if errors.As(err, &f) {
			t.Errorf("%v\nreplay: go test ./coordinator/sim -run 'TestSimulation$' -seed %d -seeds 1 -steps %d -trace", f, f.Seed, *flagSteps)
		} else {
			t.Error(err)
		}
	}
	t.Logf("%d seeds in %v (%d at once, fsync %v): %d steps, %d groups, %d jobs, %d lifecycles, %d restarts (%d storage faults), %d rejected and %d replayed completions, %v simulated",
		seeds, elapsed.Round(time.Millisecond), *flagWorkers, *flagSync, total.Steps, total.Groups, total.Jobs, total.Lifecycles,
		total.Restarts, total.StorageFaults, total.Rejected, total.Replayed, total.SimTime.Round(time.Second))
	if *flagCluster {
		t.Logf("cluster: %d elections, %d groups with their outcome unknown (%d committed by a later leader, %d vanished), %d not committed, %d second proposer's entries refused by the base guard, %d reads served (%d refused as not verifiably the leader), %d crashes lost a follower's open batch (%d entries applied again)",
			total.Elections, total.Unknown, total.LateCommits, total.Vanished, total.NotCommitted, total.Injected, total.Reads, total.StaleRefused, total.BatchesLost, total.BatchEntriesLost)
	}
	t.Logf("%.0f simulated job lifecycles per wall-clock minute", float64(total.Lifecycles)/elapsed.Minutes())
	if *flagShadow {
		t.Logf("shadow replication: %d groups applied to a second store; every key each wrote read the same on both, and the whole stores matched at every full check and at the end", total.Shadowed)
	}
}

// TestSameSeedSameRun checks that a seed replays exactly, on a single
// node and in cluster mode: two runs of one seed take the same steps in
// the same order.
func TestSameSeedSameRun(t *testing.T) {
	first, _ := seedRange(t)
	for _, cluster := range []bool{false, true} {
		t.Run(map[bool]string{false: "SingleNode", true: "Cluster"}[cluster], func(t *testing.T) {
			digest := func() ([32]byte, Result) {
				h := sha256.New()
				res, err := runConfig(t, Config{Seed: first, Steps: *flagSteps, Sync: *flagSync, Shadow: *flagShadow && !cluster, Cluster: cluster,
					Trace: func(format string, args ...any) { fmt.Fprintf(h, format+"\n", args...) }})
				if err != nil {
					t.Fatal(err)
				}
				var sum [32]byte
				h.Sum(sum[:0])
				return sum, res
			}
			d1, r1 := digest()
			d2, r2 := digest()
			if d1 != d2 || r1 != r2 {
				t.Errorf("seed %d ran differently twice: %+v, then %+v", first, r1, r2)
			}
		})
	}
}
