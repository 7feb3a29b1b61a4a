package lincheck_test

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/clustertest"
	"github.com/leasehold/leasehold/internal/proctest"
	"github.com/leasehold/leasehold/internal/testbin"
)

// procs are the settings of the coordinator processes of a cluster run.
var procs = proctest.Options{Timeout: 60 * time.Second, Tail: 40}

// Binaries for the cluster runs: $LEASEHOLD_BIN's, or built once for the
// package by the first test that needs them and removed by TestMain.
var bins struct {
	once    sync.Once
	dir     string
	err     error
	cleanup func()
}

// coordinatorBin returns the path of the coordinator binary.
func coordinatorBin(t testing.TB) string {
	t.Helper()
	bins.once.Do(func() {
		root, err := testbin.ModuleRoot(".")
		if err != nil {
			bins.err = err
			return
		}
		bins.dir, bins.cleanup, bins.err = testbin.Prepare(root, "coordinator")
	})
	if bins.err != nil {
		t.Fatalf("coordinator binary: %v", bins.err)
	}
	return filepath.Join(bins.dir, "coordinator")
}

// removeBins removes the binaries coordinatorBin built, if any.
func removeBins() {
	if bins.cleanup != nil {
		bins.cleanup()
	}
}

// clusterArgs are the flags every node of a cluster run gets besides the
// cluster's own: the configuration of coordinatorConfig.
func clusterArgs() []string {
	return []string{"--lease-ttl", leaseTTL.String(), "--max-attempts", fmt.Sprint(maxAttempts),
		"--backoff-base", backoffBase.String(), "--backoff-cap", backoffCap.String()}
}

// nodeAddrs returns every node's gRPC address.
func nodeAddrs(c *clustertest.Cluster) []string {
	var out []string
	for i := range c.N() {
		out = append(out, c.Node(i).GRPCAddr)
	}
	return out
}

// faultKind is one fault of a run's schedule.
type faultKind int

const (
	faultKill    faultKind = iota // the leader killed with SIGKILL, then restarted on its data
	faultIsolate                  // the leader cut off from both peers, then healed
	faultPause                    // the leader stopped with SIGSTOP, then continued
)

func (k faultKind) String() string {
	return [...]string{"kill", "isolation", "pause"}[k]
}

// faultHold is how long an isolation or a pause lasts.
const faultHold = 2 * time.Second

// schedule returns the faults in the order they happen, each kind spread
// evenly over the run.
func schedule(kills, isolations, pauses int) []faultKind {
	type at struct {
		pos  float64
		kind faultKind
	}
	var all []at
	for kind, n := range []int{kills, isolations, pauses} {
		for i := range n {
			all = append(all, at{(float64(i) + 0.5 + 0.1*float64(kind)) / float64(n), faultKind(kind)})
		}
	}
	for i := 1; i < len(all); i++ {
		for j := i; j > 0 && all[j].pos < all[j-1].pos; j-- {
			all[j], all[j-1] = all[j-1], all[j]
		}
	}
	out := make([]faultKind, len(all))
	for i, a := range all {
		out[i] = a.kind
	}
	return out
}

// faultLog is what a schedule did.
type faultLog struct {
	done map[faultKind]int
	// failovers are the times from a fault's start to a leader among the
	// other nodes reporting SERVING.
	failovers []time.Duration
}

// inject runs one fault on the current leader and returns once a leader
// among the other nodes serves and the faulted node is back.
func inject(t *testing.T, c *clustertest.Cluster, kind faultKind, log *faultLog) {
	t.Helper()
	l := c.WaitLeader()
	start := time.Now()
	switch kind {
	case faultKill:
		c.Kill(l)
		c.WaitLeader(l)
		log.failovers = append(log.failovers, time.Since(start))
		c.Restart(l)
	case faultIsolate:
		c.Isolate(l)
		c.WaitLeader(l)
		log.failovers = append(log.failovers, time.Since(start))
		// The deposed leader stays reachable by clients meanwhile.
		time.Sleep(faultHold - time.Since(start))
		c.Heal(l)
	case faultPause:
		c.Pause(l)
		_, err := c.AwaitLeader(context.Background(), l)
		log.failovers = append(log.failovers, time.Since(start))
		time.Sleep(faultHold - time.Since(start))
		c.Resume(l)
		if err != nil {
			t.Fatal(err)
		}
	}
	log.done[kind]++
}
