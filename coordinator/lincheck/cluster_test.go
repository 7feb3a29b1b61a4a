package lincheck_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/leasehold/leasehold/internal/leaderdial"
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

// clusterNode is one coordinator process of a test cluster.
type clusterNode struct {
	id              string
	grpc, raft, dir string
	peers           string // this node's --peers: its peers' raft addresses are its links to them
	p               *proctest.Proc
}

// testCluster is three coordinator processes on loopback, voters of one
// raft cluster, with the development tokens and the configuration of
// coordinatorConfig (fsync on, as always). Raft traffic from each node to
// each other runs through a link of its own (a TCP proxy), so that a node
// can be cut off from both peers while its clients still reach it: each
// node's --peers names, for every other node, the address of its own link
// to that node. Raft's configuration stays each node's bootstrap entry
// (nothing changes the membership), so each node keeps dialling its links.
type testCluster struct {
	t     *testing.T
	bin   string
	nodes []*clusterNode
	links map[[2]int]*link // by from, to
}

// startCluster starts three coordinator processes from bin and waits for
// a leader.
func startCluster(t *testing.T, bin string) *testCluster {
	t.Helper()
	tc := &testCluster{t: t, bin: bin, links: map[[2]int]*link{}}
	for i := range 3 {
		g, err := testbin.FreeAddr()
		if err != nil {
			t.Fatal(err)
		}
		r, err := testbin.FreeAddr()
		if err != nil {
			t.Fatal(err)
		}
		tc.nodes = append(tc.nodes, &clusterNode{id: fmt.Sprintf("n%d", i+1), grpc: g, raft: r, dir: t.TempDir()})
	}
	for i := range tc.nodes {
		for j, to := range tc.nodes {
			if i != j {
				l, err := listenLink(to.raft)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(l.close)
				tc.links[[2]int{i, j}] = l
			}
		}
	}
	for i, nd := range tc.nodes {
		var peers []string
		for j, o := range tc.nodes {
			raft := o.raft
			if j != i {
				raft = tc.links[[2]int{i, j}].addr()
			}
			peers = append(peers, o.id+"="+raft+"/"+o.grpc)
		}
		nd.peers = strings.Join(peers, ",")
	}
	for i := range tc.nodes {
		tc.start(i)
	}
	tc.leader()
	return tc
}

// addrs returns every node's gRPC address.
func (tc *testCluster) addrs() []string {
	var out []string
	for _, nd := range tc.nodes {
		out = append(out, nd.grpc)
	}
	return out
}

// start starts node i on its data directory and waits until it listens.
func (tc *testCluster) start(i int) {
	tc.t.Helper()
	nd := tc.nodes[i]
	nd.p = procs.Start(tc.t, "coordinator "+nd.id, tc.bin,
		"--dev", "--node-id", nd.id, "--listen", nd.grpc, "--raft-listen", nd.raft, "--peers", nd.peers,
		"--data-dir", nd.dir, "--metrics-listen", "", "--log-format", "text",
		"--lease-ttl", leaseTTL.String(), "--max-attempts", fmt.Sprint(maxAttempts),
		"--backoff-base", backoffBase.String(), "--backoff-cap", backoffCap.String())
	nd.p.WaitFor("coordinator listening")
}

// leader waits until one of among (every node when none) reports its
// leasehold.v1.Leader health entry SERVING, and returns its index.
func (tc *testCluster) leader(among ...int) int {
	tc.t.Helper()
	if len(among) == 0 {
		among = []int{0, 1, 2}
	}
	ctx, cancel := context.WithTimeout(context.Background(), procs.Timeout)
	defer cancel()
	found := make(chan int, len(among))
	var wg sync.WaitGroup
	for _, i := range among {
		wg.Go(func() {
			conn, err := grpc.NewClient(tc.nodes[i].grpc, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				return
			}
			defer conn.Close()
			w, err := healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{Service: leaderdial.HealthService}, grpc.WaitForReady(true))
			if err != nil {
				return
			}
			for {
				resp, err := w.Recv()
				if err != nil {
					return
				}
				if resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
					found <- i
					return
				}
			}
		})
	}
	defer wg.Wait()
	defer cancel()
	select {
	case i := <-found:
		return i
	case <-ctx.Done():
		tc.t.Errorf("no leader among nodes %v within %v", among, procs.Timeout)
		return -1
	}
}

// others returns the indexes of the nodes but i.
func others(i int) []int {
	var out []int
	for j := range 3 {
		if j != i {
			out = append(out, j)
		}
	}
	return out
}

// kill kills node i with SIGKILL.
func (tc *testCluster) kill(i int) { tc.nodes[i].p.Kill() }

// signal sends sig to node i.
func (tc *testCluster) signal(i int, sig syscall.Signal) { tc.nodes[i].p.Signal(sig) }

// isolate cuts every raft link from and to node i, or heals them; its
// clients still reach it.
func (tc *testCluster) isolate(i int, cut bool) {
	for k, l := range tc.links {
		if k[0] == i || k[1] == i {
			l.setCut(cut)
		}
	}
}

// link is a TCP proxy from one node's raft transport to another's raft
// listener, which can be cut (every connection closed, new ones refused)
// and healed.
type link struct {
	lis    net.Listener
	target string
	wg     sync.WaitGroup

	mu    sync.Mutex
	cut   bool
	conns map[net.Conn]bool
}

// listenLink opens a link to target on a free loopback port.
func listenLink(target string) (*link, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	l := &link{lis: lis, target: target, conns: map[net.Conn]bool{}}
	l.wg.Go(l.serve)
	return l, nil
}

func (l *link) addr() string { return l.lis.Addr().String() }

// setCut cuts or heals the link.
func (l *link) setCut(cut bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.cut = cut
	if cut {
		for c := range l.conns {
			c.Close()
		}
	}
}

// track registers c, or closes it and reports false when the link is cut.
func (l *link) track(c net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.cut {
		c.Close()
		return false
	}
	l.conns[c] = true
	return true
}

func (l *link) untrack(c net.Conn) {
	l.mu.Lock()
	delete(l.conns, c)
	l.mu.Unlock()
	c.Close()
}

func (l *link) serve() {
	for {
		in, err := l.lis.Accept()
		if err != nil {
			return
		}
		if !l.track(in) {
			continue
		}
		l.wg.Go(func() {
			defer l.untrack(in)
			out, err := net.DialTimeout("tcp", l.target, time.Second)
			if err != nil || !l.track(out) {
				return
			}
			defer l.untrack(out)
			done := make(chan struct{}, 2)
			pipe := func(dst, src net.Conn) {
				_, _ = io.Copy(dst, src)
				done <- struct{}{}
			}
			go pipe(out, in)
			go pipe(in, out)
			<-done
			// One direction ended: close both, so that the other ends too.
			in.Close()
			out.Close()
			<-done
		})
	}
}

// close stops the link and waits for its goroutines.
func (l *link) close() {
	l.lis.Close()
	l.setCut(true)
	l.wg.Wait()
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

// inject runs one fault on the current leader: it returns once a leader
// among the other nodes serves and the faulted node is back.
func (tc *testCluster) inject(kind faultKind, log *faultLog) error {
	tc.t.Helper()
	l := tc.leader()
	if l < 0 {
		return errors.New("no leader to fault")
	}
	start := time.Now()
	switch kind {
	case faultKill:
		tc.kill(l)
		if tc.leader(others(l)...) < 0 {
			return errors.New("no new leader after a kill")
		}
		log.failovers = append(log.failovers, time.Since(start))
		tc.start(l)
	case faultIsolate:
		tc.isolate(l, true)
		if tc.leader(others(l)...) < 0 {
			return errors.New("no new leader after an isolation")
		}
		log.failovers = append(log.failovers, time.Since(start))
		// The deposed leader stays reachable by clients a while longer.
		time.Sleep(faultHold - time.Since(start))
		tc.isolate(l, false)
	case faultPause:
		tc.signal(l, syscall.SIGSTOP)
		next := tc.leader(others(l)...)
		log.failovers = append(log.failovers, time.Since(start))
		time.Sleep(faultHold - time.Since(start))
		tc.signal(l, syscall.SIGCONT)
		if next < 0 {
			return errors.New("no new leader during a pause")
		}
	}
	log.done[kind]++
	return nil
}
