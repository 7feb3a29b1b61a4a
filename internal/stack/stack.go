// Package stack starts a whole Leasehold deployment as real processes for
// a test: one coordinator or a cluster (of three, or five), renderers against it,
// and clients of it. It is built on package proctest: every process is a
// proctest.Proc, killed when the test ends, its last lines logged when
// the test failed.
//
// A single coordinator listens where Options.Listen says (a port the
// kernel picks by default) and is ready once its health check answers
// SERVING. The nodes of a cluster get ports picked up front
// (testbin.FreeAddr), the contract flags (--node-id, --listen,
// --raft-listen, --peers, --data-dir), and Start returns once one of them
// leads, as its leasehold.v1.Leader health entry says.
package stack

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/leasehold/leasehold/client"
	"github.com/leasehold/leasehold/internal/leaderdial"
	"github.com/leasehold/leasehold/internal/proctest"
	"github.com/leasehold/leasehold/internal/testbin"
)

// DevRendererToken is the development renderer's token, which renderers
// present unless Options.RendererToken names another.
const DevRendererToken = "dev-renderer"

// Options describe a stack.
type Options struct {
	// Coordinator and Renderer are the paths of the binaries.
	Coordinator, Renderer string
	// Procs are the settings of every process (failsafe timeout, tail).
	Procs proctest.Options
	// Nodes is how many coordinators: 1 (the default, a single node) or
	// an odd number from 3 (a cluster).
	Nodes int
	// Args are flags every coordinator gets, after the stack's own.
	Args []string
	// Tokens is a principals file; without one the coordinators start
	// with --dev, unless Args name --tokens or NoDevFlag is set.
	Tokens string
	// NoDevFlag says the coordinator binary has no --dev flag (a build
	// from before it, which uses the development tokens unasked).
	NoDevFlag bool
	// TLS, if not nil, serves the coordinators over TLS.
	TLS *TLS
	// DataDirs are the nodes' data directories, by index; a missing or
	// empty one is a new temporary directory.
	DataDirs []string
	// Listen is a single coordinator's listen address; the default is a
	// loopback port the kernel picks. A cluster's nodes get free loopback
	// ports.
	Listen string
	// Metrics gives every coordinator a metrics listener on a free port;
	// without it they have none.
	Metrics bool
	// Renderers are started once the coordinators serve.
	Renderers []Renderer
	// RendererToken is the renderers' token (DevRendererToken if empty).
	RendererToken string
	// RendererLogLevel is the renderers' --log-level; the default, debug,
	// names every lease and completion.
	RendererLogLevel string
	// Env is added to every coordinator's environment.
	Env []string
	// LogDir, if set, is where every process also appends its output, to
	// a file named for it (see proctest.Spec.Log); a process then keeps
	// only its last lines in memory.
	LogDir string
	// Unexpected, if not nil, is every process's proctest.Spec.Unexpected:
	// called when one exits before it is stopped or killed.
	Unexpected func(error)
}

// TLS are the files of a stack served over TLS.
type TLS struct {
	// Cert and Key are the coordinators' certificate and key.
	Cert, Key string
	// ClientCA, if set, makes the coordinators require client
	// certificates signed by it (mutual TLS).
	ClientCA string
	// CA is what renderers and the health checks trust.
	CA string
	// ClientCert and ClientKey are the renderers' certificate and key,
	// for mutual TLS.
	ClientCert, ClientKey string
	// Config is the TLS configuration of the stack's own health checks
	// and clients; it is required.
	Config *tls.Config
}

// Renderer describes one renderer process.
type Renderer struct {
	// ID is its --id.
	ID string
	// Coordinator is what it dials; the default is every coordinator
	// (Stack.Addrs).
	Coordinator string
	// Record, if set, is its --record file.
	Record string
	// Args are its further flags.
	Args []string
}

// Node is one coordinator.
type Node struct {
	// ID is its --node-id in a cluster, and "coordinator" for a single
	// node.
	ID string
	// Addr is its gRPC address, Raft its raft address (a cluster's), and
	// MetricsAddr its metrics address (with Options.Metrics).
	Addr, Raft, MetricsAddr string
	// RaftPeer, if set, is the address the peers list names for it in
	// place of Raft: a proxy in front of its raft listener. GRPCPeer,
	// likewise, is the address the peers list and Addrs name in place of
	// Addr: a proxy in front of its gRPC listener.
	RaftPeer, GRPCPeer string
	// DataDir is its data directory.
	DataDir string
	// Proc is its current process.
	*proctest.Proc

	args   []string // the flags it starts with after the stack's own
	starts int      // processes started, for the names of their log files
}

// RendererProc is one renderer process.
type RendererProc struct {
	Renderer
	*proctest.Proc
}

// Stack is a running deployment.
type Stack struct {
	// Coordinators are the nodes, in the order of their ids (n1, n2, n3
	// in a cluster).
	Coordinators []*Node
	// Renderers are the renderers started so far.
	Renderers []*RendererProc

	tb   proctest.TB
	opts Options
}

// Start starts the coordinators, waits until they serve (and, for a
// cluster, until one leads), then starts opts.Renderers.
func Start(tb proctest.TB, opts Options) *Stack {
	tb.Helper()
	s := New(tb, opts)
	for i := range s.Coordinators {
		s.StartNode(i)
	}
	if len(s.Coordinators) > 1 {
		s.Leader()
	}
	for _, r := range s.opts.Renderers {
		s.StartRenderer(r)
	}
	return s
}

// New lays out a stack, its nodes' addresses and data directories, and
// starts nothing.
func New(tb proctest.TB, opts Options) *Stack {
	tb.Helper()
	if opts.Nodes == 0 {
		opts.Nodes = 1
	}
	if opts.Nodes < 1 || (opts.Nodes > 1 && opts.Nodes%2 == 0) {
		tb.Fatalf("stack: %d nodes, want 1 or an odd number from 3", opts.Nodes)
	}
	if opts.TLS != nil && opts.TLS.Config == nil {
		tb.Fatalf("stack: TLS without the Config its health checks and clients dial with")
	}
	opts.RendererToken = cmpOr(opts.RendererToken, DevRendererToken)
	s := &Stack{tb: tb, opts: opts}
	for i := range opts.Nodes {
		n := &Node{ID: "coordinator"}
		if i < len(opts.DataDirs) {
			n.DataDir = opts.DataDirs[i]
		}
		if n.DataDir == "" {
			n.DataDir = tb.TempDir()
		}
		if opts.Nodes > 1 {
			n.ID = fmt.Sprintf("n%d", i+1)
			n.Addr, n.Raft = freeAddr(tb), freeAddr(tb)
		} else {
			n.Addr = cmpOr(opts.Listen, "127.0.0.1:0")
		}
		if opts.Metrics {
			n.MetricsAddr = freeAddr(tb)
		}
		n.args = opts.Args
		s.Coordinators = append(s.Coordinators, n)
	}
	return s
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func freeAddr(tb proctest.TB) string {
	tb.Helper()
	addr, err := testbin.FreeAddr()
	if err != nil {
		tb.Fatal(err)
	}
	return addr
}

// Peers is the --peers list of the cluster.
func (s *Stack) Peers() string {
	var items []string
	for _, n := range s.Coordinators {
		items = append(items, n.ID+"="+cmpOr(n.RaftPeer, n.Raft)+"/"+cmpOr(n.GRPCPeer, n.Addr))
	}
	return strings.Join(items, ",")
}

// NodeArgs returns the flags node i starts with: the stack's own, then
// Options.Args (or those RestartWith gave it), then extra.
func (s *Stack) NodeArgs(i int, extra ...string) []string {
	n := s.Coordinators[i]
	args := []string{"--listen", n.Addr, "--data-dir", n.DataDir, "--metrics-listen", n.MetricsAddr}
	if len(s.Coordinators) > 1 {
		args = append([]string{"--node-id", n.ID, "--listen", n.Addr, "--raft-listen", n.Raft, "--peers", s.Peers()}, args[2:]...)
	}
	if s.opts.Tokens != "" {
		args = append(args, "--tokens", s.opts.Tokens)
	}
	if t := s.opts.TLS; t != nil {
		args = append(args, "--tls-cert", t.Cert, "--tls-key", t.Key)
		if t.ClientCA != "" {
			args = append(args, "--tls-client-ca", t.ClientCA)
		}
	}
	args = slices.Concat(args, n.args, extra)
	if s.opts.NoDevFlag {
		return args
	}
	return proctest.CoordinatorPrincipals(args)
}

// StartNode starts node i (again) on its addresses and data directory,
// with NodeArgs(i, extra...), and waits until it listens; a single node
// also until it serves. A node that runs is killed first.
func (s *Stack) StartNode(i int, extra ...string) *Node {
	s.tb.Helper()
	return s.StartNodeWith(i, s.NodeArgs(i, extra...))
}

// StartNodeWith is StartNode with the whole command line args, and env
// added to Options.Env.
func (s *Stack) StartNodeWith(i int, args []string, env ...string) *Node {
	s.tb.Helper()
	n := s.Launch(i, args, env...)
	line := n.WaitFor("coordinator listening")
	if len(s.Coordinators) == 1 {
		if n.Addr = proctest.LogAttr(line, "addr"); n.Addr == "" {
			s.tb.Fatalf("no addr in %q", line)
		}
		if got := s.health(n.Addr, ""); got != healthpb.HealthCheckResponse_SERVING {
			s.tb.Fatalf("health of %s = %v, want SERVING", n.Addr, got)
		}
	}
	return n
}

// Launch starts node i's process with args and env added to Options.Env,
// killing one that runs first, and returns without waiting for it: for a
// caller that times or watches the start itself.
func (s *Stack) Launch(i int, args []string, env ...string) *Node {
	s.tb.Helper()
	n := s.Coordinators[i]
	if n.Proc != nil {
		n.Kill()
	}
	name := "coordinator"
	if len(s.Coordinators) > 1 {
		name += " " + n.ID
	}
	n.starts++
	logName := name
	if n.starts > 1 {
		logName = fmt.Sprintf("%s %d", name, n.starts)
	}
	n.Proc = s.opts.Procs.StartSpec(s.tb, proctest.Spec{Name: name, Path: s.opts.Coordinator, Args: args,
		Env: slices.Concat(s.opts.Env, env), Log: logFile(s.opts, logName), Unexpected: s.opts.Unexpected})
	return n
}

// logFile is the log file of the process name, or "" without a LogDir:
// "coordinator n1 2" logs to coordinator-n1-2.log.
func logFile(opts Options, name string) string {
	if opts.LogDir == "" {
		return ""
	}
	return filepath.Join(opts.LogDir, strings.ReplaceAll(name, " ", "-")+".log")
}

// Restart kills node i with SIGKILL and starts it again as it was.
func (s *Stack) Restart(i int) *Node {
	s.tb.Helper()
	return s.StartNode(i)
}

// RestartWith kills node i with SIGKILL and starts it again with args in
// place of Options.Args, for this start and later ones.
func (s *Stack) RestartWith(i int, args ...string) *Node {
	s.tb.Helper()
	s.Coordinators[i].args = args
	return s.StartNode(i)
}

// Index returns n's index in Coordinators.
func (s *Stack) Index(n *Node) int {
	s.tb.Helper()
	i := slices.Index(s.Coordinators, n)
	if i < 0 {
		s.tb.Fatalf("node %s is not of this stack", n.ID)
	}
	return i
}

// Kill kills node i with SIGKILL and waits until it is gone.
func (s *Stack) Kill(i int) {
	s.tb.Helper()
	s.Coordinators[i].Kill()
}

// Addrs is every coordinator's gRPC address (its GRPCPeer, when set),
// comma-separated, as renderers and clients take them.
func (s *Stack) Addrs() string {
	var a []string
	for _, n := range s.Coordinators {
		a = append(a, cmpOr(n.GRPCPeer, n.Addr))
	}
	return strings.Join(a, ",")
}

// Node returns the node of id.
func (s *Stack) Node(id string) *Node {
	for _, n := range s.Coordinators {
		if n.ID == id {
			return n
		}
	}
	s.tb.Fatalf("no node %s", id)
	return nil
}

// Others returns the nodes but n.
func (s *Stack) Others(n *Node) []*Node {
	var out []*Node
	for _, o := range s.Coordinators {
		if o != n {
			out = append(out, o)
		}
	}
	return out
}

// Leader returns the first of nodes (every node if none are given) whose
// leasehold.v1.Leader health entry is SERVING, watching each. A single
// node leads.
func (s *Stack) Leader(nodes ...*Node) *Node {
	s.tb.Helper()
	if len(s.Coordinators) == 1 {
		return s.Coordinators[0]
	}
	if len(nodes) == 0 {
		nodes = s.Coordinators
	}
	timeout := cmpOrDuration(s.opts.Procs.Timeout)
	ctx, cancel := context.WithTimeout(s.tb.Context(), timeout)
	defer cancel()
	clients := make([]healthpb.HealthClient, len(nodes))
	for i, n := range nodes {
		conn, err := grpc.NewClient(n.Addr, s.dialCreds())
		if err != nil {
			s.tb.Fatalf("dialing %s: %v", n.ID, err)
		}
		defer conn.Close()
		clients[i] = healthpb.NewHealthClient(conn)
	}
	i, err := FirstLeader(ctx, clients)
	if err != nil {
		s.tb.Fatalf("no leader among %d nodes within %v: %v", len(nodes), timeout, err)
	}
	return nodes[i]
}

// FirstLeader watches the leasehold.v1.Leader health entry through each
// of clients and returns the index of the first to say SERVING, or ctx's
// error when none does before it ends. A watch that breaks is opened again
// (see WatchHealth); one that fails otherwise drops out, and the others go
// on.
func FirstLeader(ctx context.Context, clients []healthpb.HealthClient) (int, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	found := make(chan int, len(clients))
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	for i, hc := range clients {
		wg.Go(func() {
			if WatchHealth(ctx, hc, leaderdial.HealthService, healthpb.HealthCheckResponse_SERVING) == nil {
				found <- i
			}
		})
	}
	select {
	case i := <-found:
		return i, nil
	case <-ctx.Done():
		return -1, ctx.Err()
	}
}

func cmpOrDuration(d time.Duration) time.Duration {
	if d == 0 {
		return proctest.DefaultTimeout
	}
	return d
}

// dialCreds are the transport credentials of the stack's own calls.
func (s *Stack) dialCreds() grpc.DialOption {
	if t := s.opts.TLS; t != nil {
		return grpc.WithTransportCredentials(credentials.NewTLS(t.Config))
	}
	return grpc.WithTransportCredentials(insecure.NewCredentials())
}

// health asks addr's health service for service's status, waiting for
// addr to accept connections.
func (s *Stack) health(addr, service string) healthpb.HealthCheckResponse_ServingStatus {
	s.tb.Helper()
	conn, err := grpc.NewClient(addr, s.dialCreds())
	if err != nil {
		s.tb.Fatalf("dialing %s: %v", addr, err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), cmpOrDuration(s.opts.Procs.Timeout))
	defer cancel()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: service}, grpc.WaitForReady(true))
	if err != nil {
		s.tb.Fatalf("health check of %s: %v", addr, err)
	}
	return resp.GetStatus()
}

// Client returns a client of every coordinator authenticated as token,
// closed when the test ends.
func (s *Stack) Client(token string) *client.Client {
	s.tb.Helper()
	return s.ClientOf(s.Addrs(), token)
}

// ClientOf returns a client of addr authenticated as token, closed when
// the test ends.
func (s *Stack) ClientOf(addr, token string) *client.Client {
	s.tb.Helper()
	opts := []client.Option{client.WithToken(token)}
	if t := s.opts.TLS; t != nil {
		opts = append(opts, client.WithTLS(t.Config))
	}
	c, err := client.Dial(addr, opts...)
	if err != nil {
		s.tb.Fatalf("dialing %s: %v", addr, err)
	}
	s.tb.Cleanup(func() { c.Close() })
	return c
}

// StartRenderer starts a renderer against the stack (every coordinator
// unless r names one) and waits for its start line.
func (s *Stack) StartRenderer(r Renderer) *RendererProc {
	s.tb.Helper()
	r.Coordinator = cmpOr(r.Coordinator, s.Addrs())
	rp := StartRenderer(s.tb, s.opts, r)
	s.Renderers = append(s.Renderers, rp)
	return rp
}

// StartRenderer starts a renderer with opts' binary, token, TLS, log
// level and log directory against r.Coordinator, and waits for its start
// line.
func StartRenderer(tb proctest.TB, opts Options, r Renderer) *RendererProc {
	tb.Helper()
	args := []string{"--coordinator", r.Coordinator, "--id", r.ID, "--token", cmpOr(opts.RendererToken, DevRendererToken)}
	if r.Record != "" {
		args = append(args, "--record", r.Record)
	}
	if t := opts.TLS; t != nil {
		args = append(args, "--tls-ca", t.CA)
		if t.ClientCert != "" {
			args = append(args, "--tls-cert", t.ClientCert, "--tls-key", t.ClientKey)
		}
	}
	args = append(append(args, "--log-level", cmpOr(opts.RendererLogLevel, "debug")), r.Args...)
	name := "renderer " + r.ID
	p := opts.Procs.StartSpec(tb, proctest.Spec{Name: name, Path: opts.Renderer, Args: args, Log: logFile(opts, name), Unexpected: opts.Unexpected})
	p.WaitFor("renderer started")
	return &RendererProc{Renderer: r, Proc: p}
}

// Logs returns every process's lines so far, by process name.
func (s *Stack) Logs() map[string][]string {
	out := map[string][]string{}
	for _, n := range s.Coordinators {
		if n.Proc != nil {
			out[n.Name()] = n.Lines()
		}
	}
	for _, r := range s.Renderers {
		out[r.Name()] = r.Lines()
	}
	return out
}

// RecordIn returns a record file named for id in a new temporary
// directory.
func RecordIn(tb proctest.TB, id string) string {
	return filepath.Join(tb.TempDir(), id+".record")
}

// Recorded is one grant a renderer wrote to its --record file.
type Recorded struct {
	Job   string
	Token uint64
}

// ReadRecord reads a renderer's --record file of "job_id token" lines; a
// file the renderer never created holds none.
func ReadRecord(path string) ([]Recorded, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []Recorded
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		job, tok, ok := strings.Cut(sc.Text(), " ")
		n, err := strconv.ParseUint(tok, 10, 64)
		if !ok || err != nil {
			return nil, fmt.Errorf("%s: malformed line %q", path, sc.Text())
		}
		out = append(out, Recorded{Job: job, Token: n})
	}
	return out, sc.Err()
}
