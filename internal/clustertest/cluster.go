package clustertest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"

	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"

	"github.com/leasehold/leasehold/internal/leaderdial"
	"github.com/leasehold/leasehold/internal/proctest"
	"github.com/leasehold/leasehold/internal/stack"
	"github.com/leasehold/leasehold/internal/tcpproxy"
	"github.com/leasehold/leasehold/internal/testbin"
)

// Options are a cluster's settings.
type Options struct {
	// Coordinator is the path of the coordinator binary.
	Coordinator string
	// Nodes is how many voters the cluster has: 3 when 0.
	Nodes int
	// Args are added to every node's command line after the cluster
	// flags, such as --lease-ttl. Without --tokens the nodes get --dev.
	Args []string
	// OperatorToken is the bearer token of an operator of every team,
	// which Quiesce asks each node's raft state with: dev-operator, the
	// development token, when empty.
	OperatorToken string
	// Procs bounds the waits on the processes and sets how many of their
	// last lines a failed test logs.
	Procs proctest.Options
	// Env is added to every node's environment.
	Env []string
	// DataDirs are the nodes' data directories, by index (a filesystem
	// of their own each, to freeze one); a missing or empty one is a new
	// temporary directory.
	DataDirs []string
	// Unexpected, if not nil, is called when a node's process exits before
	// the test stops or kills it (a node that fail-stopped).
	Unexpected func(error)
	// GRPCProxies puts a TCP proxy in front of each node's gRPC listener,
	// which clients and renderers dial (Addrs), so that Blackhole can
	// stall the path to one node's API while its raft traffic flows. The
	// cluster's own health checks go to the listeners directly.
	GRPCProxies bool
	// Metrics gives every node a metrics listener on a free port
	// (MetricsAddr).
	Metrics bool
}

// Node is one voter of a cluster.
type Node struct {
	// ID is its --node-id: n1, n2, ...
	ID string
	// GRPCAddr is its --listen address, which clients and renderers dial
	// unless it is behind a proxy (Options.GRPCProxies; see Addrs).
	GRPCAddr string
	// RaftAddr is the address the peers list names for it (its proxy),
	// and RaftListen its --raft-listen, where the proxy forwards.
	RaftAddr, RaftListen string
	// Dir is its --data-dir.
	Dir string

	paused bool
}

// Cluster is a running cluster of coordinator processes.
type Cluster struct {
	t     testing.TB
	st    *stack.Stack // the processes
	opts  Options
	nodes []*Node
	net   *partition
	conns []*grpc.ClientConn
	// grpc are the proxies in front of the gRPC listeners, by node; nil
	// without Options.GRPCProxies.
	grpc []*tcpproxy.Proxy
}

// Start picks loopback addresses and a data directory for each node,
// opens the raft proxies, starts every node and waits until each listens.
// It does not wait for a leader (see WaitLeader). Everything stops when
// the test ends.
func Start(t testing.TB, o Options) *Cluster {
	t.Helper()
	if o.Nodes == 0 {
		o.Nodes = 3
	}
	if o.OperatorToken == "" {
		o.OperatorToken = "dev-operator"
	}
	if o.Procs.Timeout == 0 {
		o.Procs.Timeout = time.Minute
	}
	c := &Cluster{t: t, opts: o}
	c.st = stack.New(t, stack.Options{Coordinator: o.Coordinator, Nodes: o.Nodes, Args: o.Args, Procs: o.Procs, DataDirs: o.DataDirs,
		Unexpected: o.Unexpected, Env: o.Env, Metrics: o.Metrics})
	var targets []string
	for _, n := range c.st.Coordinators {
		c.nodes = append(c.nodes, &Node{ID: n.ID, GRPCAddr: n.Addr, RaftListen: n.Raft, Dir: n.DataDir})
		targets = append(targets, n.Raft)
	}
	pn, err := newPartition(targets)
	if err != nil {
		t.Fatalf("raft proxies: %v", err)
	}
	c.net = pn
	if o.GRPCProxies {
		c.grpc = c.proxyGRPC()
	}
	for i, nd := range c.nodes {
		nd.RaftAddr = pn.addrs[i]
		c.st.Coordinators[i].RaftPeer = pn.addrs[i]
		conn, err := grpc.NewClient(nd.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			pn.close()
			t.Fatalf("dialing %s: %v", nd.GRPCAddr, err)
		}
		c.conns = append(c.conns, conn)
	}
	// Registered before the nodes' own cleanups, so run after them: the
	// processes are gone before their proxies and connections close.
	t.Cleanup(func() {
		for _, conn := range c.conns {
			conn.Close()
		}
		pn.close()
	})
	for i := range c.nodes {
		c.Restart(i)
	}
	return c
}

// Conn is the test's gRPC connection to node i alone: a call on it is
// answered by that node, whether it leads or not, as a client that does
// not follow the leader would be.
func (c *Cluster) Conn(i int) *grpc.ClientConn { return c.conns[i] }

// proxyGRPC starts a proxy in front of each node's gRPC listener, closed
// when the test ends, and names it in the peers list and Addrs.
func (c *Cluster) proxyGRPC() []*tcpproxy.Proxy {
	c.t.Helper()
	var ps []*tcpproxy.Proxy
	for i, n := range c.st.Coordinators {
		p, err := tcpproxy.Listen(n.Addr, uint64(i))
		if err != nil {
			c.t.Fatalf("gRPC proxy of %s: %v", n.ID, err)
		}
		c.t.Cleanup(func() { _ = p.Close() })
		n.GRPCPeer = p.Addr()
		ps = append(ps, p)
	}
	return ps
}

// Blackhole stalls the path to node i's gRPC listener both ways: its
// proxy delivers nothing and closes nothing, and what was sent waits in
// it (then in the senders' TCP windows) until Unblackhole, as across a
// path that stopped carrying packets. Its raft traffic flows on. It needs
// Options.GRPCProxies, and may be called from any goroutine.
func (c *Cluster) Blackhole(i int) { c.setGRPCPath(i, tcpproxy.Blackhole) }

// Unblackhole lets node i's gRPC path carry what it held, in order, and
// whatever follows.
func (c *Cluster) Unblackhole(i int) { c.setGRPCPath(i, tcpproxy.Forward) }

func (c *Cluster) setGRPCPath(i int, m tcpproxy.Mode) {
	p := c.grpc[i]
	p.Set(tcpproxy.ToServer, m)
	p.Set(tcpproxy.ToClient, m)
}

// MetricsAddr is node i's metrics address (host:port, serving /metrics);
// empty without Options.Metrics.
func (c *Cluster) MetricsAddr(i int) string { return c.st.Coordinators[i].MetricsAddr }

// N is the number of nodes.
func (c *Cluster) N() int { return len(c.nodes) }

// Node returns node i (0-based).
func (c *Cluster) Node(i int) *Node { return c.nodes[i] }

// Proc returns node i's current process, for its log lines.
func (c *Cluster) Proc(i int) *proctest.Proc { return c.st.Coordinators[i].Proc }

// Peers is the --peers value every node gets: id=raft_address/grpc_address.
func (c *Cluster) Peers() string { return c.st.Peers() }

// Addrs is every node's gRPC address (its proxy's, with
// Options.GRPCProxies), comma-separated, as renderers, the CLI and the
// client library take them.
func (c *Cluster) Addrs() string { return c.st.Addrs() }

// Running reports whether node i has a process (paused or not).
func (c *Cluster) Running(i int) bool {
	p := c.Proc(i)
	if p == nil {
		return false
	}
	select {
	case <-p.Exited():
		return false
	default:
		return true
	}
}

// Restart starts node i on its data directory (a first start when the
// directory is empty) and waits until it listens. The node must not be
// running.
func (c *Cluster) Restart(i int) {
	c.t.Helper()
	if c.Running(i) {
		c.t.Fatalf("restarting %s, which is running", c.nodes[i].ID)
	}
	c.st.StartNode(i)
	c.nodes[i].paused = false
}

// Launch starts node i on its data directory with env added to its
// environment (a failpoint armed, say) and returns without waiting for
// it: the process may die before it listens. The node must not be running.
func (c *Cluster) Launch(i int, env ...string) *proctest.Proc {
	c.t.Helper()
	if c.Running(i) {
		c.t.Fatalf("launching %s, which is running", c.nodes[i].ID)
	}
	c.nodes[i].paused = false
	return c.st.Launch(i, c.st.NodeArgs(i), env...).Proc
}

// Kill ends node i with SIGKILL (a paused node too) and waits until it is
// gone.
func (c *Cluster) Kill(i int) {
	c.t.Helper()
	if p := c.Proc(i); p != nil {
		p.Kill()
	}
	c.nodes[i].paused = false
}

// Stop ends node i with SIGTERM, as an operator stops it (a leader hands
// its leadership over first), and waits for its exit. It fails the test
// when the node exits with an error.
func (c *Cluster) Stop(i int) {
	c.t.Helper()
	nd := c.nodes[i]
	if !c.Running(i) {
		return
	}
	if nd.paused {
		c.Resume(i)
	}
	c.Proc(i).Signal(syscall.SIGTERM)
	if code := c.Proc(i).WaitExit(); code != 0 {
		c.t.Errorf("%s exited %d after SIGTERM", nd.ID, code)
	}
}

// StopAll stops every running node with SIGTERM, one after another.
func (c *Cluster) StopAll() {
	c.t.Helper()
	for i := range c.nodes {
		c.Stop(i)
	}
}

// Pause freezes node i with SIGSTOP: its sockets stay open and nothing
// answers, as a process the kernel does not schedule.
func (c *Cluster) Pause(i int) {
	c.t.Helper()
	c.Proc(i).Signal(syscall.SIGSTOP)
	c.nodes[i].paused = true
}

// Resume lets a paused node i run again with SIGCONT.
func (c *Cluster) Resume(i int) {
	c.t.Helper()
	c.Proc(i).Signal(syscall.SIGCONT)
	c.nodes[i].paused = false
}

// Isolate cuts node i off from every other node's raft traffic, both ways;
// its gRPC listener stays reachable.
func (c *Cluster) Isolate(i int) { c.net.isolate(i) }

// Heal lets node i reach the others again.
func (c *Cluster) Heal(i int) { c.net.heal(i) }

// Wipe empties the data directory of node i, which must not be running:
// restarted, it bootstraps from nothing and catches up from the leader.
func (c *Cluster) Wipe(i int) {
	c.t.Helper()
	if c.Running(i) {
		c.t.Fatalf("wiping %s, which is running", c.nodes[i].ID)
	}
	dir := c.nodes[i].Dir
	if err := os.RemoveAll(dir); err != nil {
		c.t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		c.t.Fatal(err)
	}
}

// leaderStatus asks node i whether it leads, within timeout.
func (c *Cluster) leaderStatus(ctx context.Context, i int) bool {
	resp, err := healthpb.NewHealthClient(c.conns[i]).Check(ctx, &healthpb.HealthCheckRequest{Service: leaderdial.HealthService})
	return err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING
}

// Leader returns the node whose leasehold.v1.Leader health entry is
// SERVING now, asking every running node that is not paused, or -1 when
// none says so within a second. Just after a partition two nodes may both
// say so for a moment; it returns the first in order.
func (c *Cluster) Leader() int {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	found := make([]bool, len(c.nodes))
	var wg sync.WaitGroup
	for i, nd := range c.nodes {
		if !c.Running(i) || nd.paused {
			continue
		}
		wg.Go(func() { found[i] = c.leaderStatus(ctx, i) })
	}
	wg.Wait()
	for i, ok := range found {
		if ok {
			return i
		}
	}
	return -1
}

// WaitLeader watches the leasehold.v1.Leader health entry of every
// running node but those in exclude and returns the first that is
// SERVING. It fails the test after the processes' timeout.
func (c *Cluster) WaitLeader(exclude ...int) int {
	c.t.Helper()
	i, err := c.AwaitLeader(context.Background(), exclude...)
	if err != nil {
		c.t.Fatal(err)
	}
	return i
}

// AwaitServing waits until node i answers SERVING for the server as a
// whole: up, and part of a cluster that has a leader. It may be called
// from any goroutine.
func (c *Cluster) AwaitServing(ctx context.Context, i int) error {
	ctx, cancel := context.WithTimeout(ctx, c.opts.Procs.Timeout)
	defer cancel()
	err := stack.WatchHealth(ctx, healthpb.NewHealthClient(c.conns[i]), "", healthpb.HealthCheckResponse_SERVING)
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s not SERVING within %v: %w", c.nodes[i].ID, c.opts.Procs.Timeout, err)
}

// AwaitLeader is WaitLeader with an error instead of a failed test, and
// ctx to end it early; it may be called from any goroutine.
func (c *Cluster) AwaitLeader(ctx context.Context, exclude ...int) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, c.opts.Procs.Timeout)
	defer cancel()
	var clients []healthpb.HealthClient
	var index []int
	for i := range c.nodes {
		if !slices.Contains(exclude, i) {
			clients = append(clients, healthpb.NewHealthClient(c.conns[i]))
			index = append(index, i)
		}
	}
	j, err := stack.FirstLeader(ctx, clients)
	if err != nil {
		return -1, fmt.Errorf("no leader among the nodes but %v within %v: %w", exclude, c.opts.Procs.Timeout, err)
	}
	return index[j], nil
}

// StartRenderer starts a renderer process given every node's address
// (--coordinator a,b,c) and id, with args added (its token, capacity,
// --record ...). It is killed when the test ends.
func (c *Cluster) StartRenderer(t testing.TB, bin, id string, args ...string) *proctest.Proc {
	t.Helper()
	return c.opts.Procs.Start(t, "renderer "+id, bin, append([]string{"--coordinator", c.Addrs(), "--id", id}, args...)...)
}

// Report is what "coordinator check --json" found in a stopped node's
// store.
type Report struct {
	Path         string   `json:"path"`
	Jobs         int      `json:"jobs"`
	LastToken    uint64   `json:"last_token"`
	Digest       string   `json:"digest"`
	AppliedIndex uint64   `json:"applied_index"`
	Problems     []string `json:"problems"`
	Omitted      int      `json:"omitted"`
}

// OK reports whether the check found no problem.
func (r Report) OK() bool { return len(r.Problems) == 0 && r.Omitted == 0 }

// Check runs "coordinator check --json" on the store of node i, which
// must not be running. Problems found are in the report; the error is
// for a check that could not run.
func (c *Cluster) Check(i int) (Report, error) {
	var rep Report
	if c.Running(i) {
		return rep, fmt.Errorf("checking %s, which is running", c.nodes[i].ID)
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(c.opts.Coordinator, "check", "--data-dir", c.nodes[i].Dir, "--json")
	cmd.Env = testbin.Env()
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	runErr := cmd.Run()
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
		return rep, fmt.Errorf("coordinator check of %s: %v: %s", c.nodes[i].ID, errors.Join(runErr, err), strings.TrimSpace(stderr.String()))
	}
	return rep, nil
}

// Quiesce waits until every running node has applied the same raft
// index, the leader's commit index, on two answers in a row: with no load
// left, the stores then hold the same entries. It asks GetCluster of
// ClusterService every poll.
func (c *Cluster) Quiesce(ctx context.Context, poll time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, c.opts.Procs.Timeout)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+c.opts.OperatorToken)
	tick := time.NewTicker(poll)
	defer tick.Stop()
	var last uint64
	var lastErr error
	for steady := 0; steady < 2; {
		index, err := c.agreedIndex(ctx)
		switch {
		case err != nil:
			steady, lastErr = 0, err
		case index == last:
			steady++
		default:
			steady, last = 1, index
		}
		if steady == 2 {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the nodes did not agree on an applied index within %v: %w", c.opts.Procs.Timeout, errors.Join(lastErr, ctx.Err()))
		case <-tick.C:
		}
	}
	return nil
}

// agreedIndex returns the index every running node has applied, which
// must be the leader's commit index, or an error saying how they differ.
func (c *Cluster) agreedIndex(ctx context.Context) (uint64, error) {
	var applied []uint64
	var commit uint64
	leaders := 0
	for i, conn := range c.conns {
		if !c.Running(i) {
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		resp, err := leaseholdv1.NewClusterServiceClient(conn).GetCluster(cctx, &leaseholdv1.GetClusterRequest{})
		cancel()
		if err != nil {
			return 0, fmt.Errorf("GetCluster on %s: %w", c.nodes[i].ID, err)
		}
		applied = append(applied, resp.GetAppliedIndex())
		if resp.GetFromLeader() {
			leaders++
			commit = resp.GetCommitIndex()
		}
	}
	if leaders != 1 {
		return 0, fmt.Errorf("%d nodes answer as the leader", leaders)
	}
	for _, a := range applied {
		if a != commit {
			return 0, fmt.Errorf("applied indexes %v, the leader's commit index %d", applied, commit)
		}
	}
	return commit, nil
}

// Digests quiesces the cluster (see Quiesce), freezes every node at once
// with SIGSTOP and kills them, then checks each store. A write the leader
// commits between the last answer and the freeze (its own timers write
// too) can leave one node an entry behind the others; then the nodes are
// started again on their directories and it tries once more, up to five
// times. It returns the reports by node, and an error naming what is
// wrong when the cluster would not quiesce, a check found a problem, or
// the stores' digests or applied indexes differ. The nodes can be
// restarted afterwards.
func (c *Cluster) Digests(ctx context.Context) ([]Report, error) {
	c.t.Helper()
	var reps []Report
	var err error
	for try := 0; try < 5; try++ {
		if try > 0 {
			for i := range c.nodes {
				c.Restart(i)
			}
		}
		if reps, err = c.freezeAndCheck(ctx); err != nil {
			return reps, err
		}
		if sameIndex(reps) {
			break
		}
	}
	var errs []error
	for i, rep := range reps {
		if !rep.OK() {
			errs = append(errs, fmt.Errorf("%s: coordinator check found %d problems: %q", c.nodes[i].ID, len(rep.Problems)+rep.Omitted, rep.Problems))
		}
	}
	for i := 1; i < len(reps); i++ {
		if reps[i].Digest != reps[0].Digest || reps[i].AppliedIndex != reps[0].AppliedIndex {
			errs = append(errs, fmt.Errorf("%s has digest %.12s at applied index %d, %s has %.12s at %d",
				c.nodes[i].ID, reps[i].Digest, reps[i].AppliedIndex, c.nodes[0].ID, reps[0].Digest, reps[0].AppliedIndex))
		}
	}
	return reps, errors.Join(errs...)
}

// sameIndex reports whether every report has the same applied index.
func sameIndex(reps []Report) bool {
	for _, r := range reps[1:] {
		if r.AppliedIndex != reps[0].AppliedIndex {
			return false
		}
	}
	return true
}

// freezeAndCheck quiesces, freezes and kills every node and checks each
// store; the error is for a cluster that would not quiesce or a check
// that could not run.
func (c *Cluster) freezeAndCheck(ctx context.Context) ([]Report, error) {
	c.t.Helper()
	if err := c.Quiesce(ctx, 50*time.Millisecond); err != nil {
		return nil, err
	}
	for i := range c.nodes {
		if c.Running(i) && !c.nodes[i].paused {
			c.Pause(i)
		}
	}
	for i := range c.nodes {
		c.Kill(i)
	}
	reps := make([]Report, len(c.nodes))
	for i := range c.nodes {
		rep, err := c.Check(i)
		if err != nil {
			return nil, err
		}
		reps[i] = rep
	}
	return reps, nil
}
