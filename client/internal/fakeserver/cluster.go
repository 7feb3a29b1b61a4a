package fakeserver

import (
	"context"
	"errors"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"

	"github.com/leasehold/leasehold/client/reason"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"github.com/leasehold/leasehold/internal/leaderdial"
)

// staleReads are the reads a follower serves from its own store when the
// call asks for a stale read, as the coordinator's are; every other call
// goes to the leader.
var staleReads = map[string]bool{
	leaseholdv1.JobService_GetJob_FullMethodName:                       true,
	leaseholdv1.JobService_ListJobs_FullMethodName:                     true,
	leaseholdv1.JobService_GetBatch_FullMethodName:                     true,
	leaseholdv1.JobService_GetArtifact_FullMethodName:                  true,
	leaseholdv1.OperatorService_ListRejectedCompletions_FullMethodName: true,
	leaseholdv1.OperatorService_GetAudit_FullMethodName:                true,
	leaseholdv1.OperatorService_Backup_FullMethodName:                  true,
	leaseholdv1.OverviewService_ListBatches_FullMethodName:             true,
}

// Cluster serves one fake as the replicas of a coordinator cluster. Each
// replica is a real gRPC server on its own loopback TCP listener, with a
// real health server. Only the leader reports leaderdial.HealthService SERVING and
// serves calls; the others refuse every call with UNAVAILABLE NOT_LEADER
// naming the leader, as followers do, except a stale read ("leasehold-read:
// stale" on one of the reads a follower may serve), which any replica
// serves with the "leasehold-applied-index" header. The replicas share the
// one Server: its state is what the cluster replicates. Its methods are
// safe for concurrent use.
type Cluster struct {
	t     testing.TB
	s     *Server
	nodes []*clusterNode

	mu     sync.Mutex
	leader int // -1: none
	calls  []Call
	// faults holds, per replica, the errors that replace the answers of
	// its next calls, which are served all the same.
	faults map[int][]error
}

// clusterNode is one replica.
type clusterNode struct {
	addr   string
	srv    *grpc.Server
	health *health.Server
	done   chan struct{}
	// thawed is closed when a frozen replica thaws; nil while it runs.
	thawed atomic.Pointer[chan struct{}]
}

// wait holds a call while the replica is frozen, until it thaws or the
// call ends.
func (n *clusterNode) wait(ctx context.Context) error {
	thawed := n.thawed.Load()
	if thawed == nil {
		return nil
	}
	select {
	case <-*thawed:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Call is one call to the fake's services that a replica took.
type Call struct {
	// Node is the replica's index.
	Node int
	// Method is the call's full method name.
	Method string
	// Stale is set when the call asked for a stale read.
	Stale bool
	// Refused is set when the replica refused it with NOT_LEADER.
	Refused bool
}

// StartCluster serves s on n replicas until the test ends; replica 0 leads.
func StartCluster(t testing.TB, s *Server, n int) *Cluster {
	t.Helper()
	c := &Cluster{t: t, s: s, faults: map[int][]error{}}
	for i := range n {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("listening for replica %d: %v", i, err)
		}
		node := &clusterNode{addr: lis.Addr().String(), health: health.NewServer(), done: make(chan struct{})}
		node.srv = s.newGRPCServer(
			grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
				if err := node.wait(ctx); err != nil {
					return nil, err
				}
				if healthMethod(info.FullMethod) {
					return h(ctx, req)
				}
				fault, err := c.admit(ctx, i, info.FullMethod, grpc.SetHeader)
				if err != nil {
					return nil, err
				}
				if fault == errHang {
					<-ctx.Done()
					return nil, ctx.Err()
				}
				resp, err := h(ctx, req)
				if fault != nil {
					return nil, fault
				}
				return resp, err
			}),
			grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
				if err := node.wait(ss.Context()); err != nil {
					return err
				}
				if healthMethod(info.FullMethod) {
					return h(srv, ss)
				}
				setHeader := func(_ context.Context, md metadata.MD) error { return ss.SetHeader(md) }
				fault, err := c.admit(ss.Context(), i, info.FullMethod, setHeader)
				if err != nil {
					return err
				}
				if fault != nil {
					return fault
				}
				return h(srv, ss)
			}),
		)
		healthpb.RegisterHealthServer(node.srv, node.health)
		node.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
		c.nodes = append(c.nodes, node)
		go func() {
			defer close(node.done)
			_ = node.srv.Serve(lis)
		}()
	}
	t.Cleanup(func() {
		for i := range c.nodes {
			c.Stop(i)
		}
	})
	c.SetLeader(0)
	return c
}

// admit decides whether replica node serves a call of method: it records
// the call, refuses it with NOT_LEADER when node does not lead (unless it
// is a stale read, whose applied-index header it sets), and returns the
// fault the call is to answer with instead of its own answer, if any.
func (c *Cluster) admit(ctx context.Context, node int, method string, setHeader func(context.Context, metadata.MD) error) (fault, refusal error) {
	md, _ := metadata.FromIncomingContext(ctx)
	stale := staleReads[method] && slices.ContainsFunc(md.Get("leasehold-read"), func(v string) bool { return strings.EqualFold(v, "stale") })
	c.mu.Lock()
	defer c.mu.Unlock()
	call := Call{Node: node, Method: method, Stale: stale, Refused: !stale && node != c.leader}
	c.calls = append(c.calls, call)
	if call.Refused {
		return nil, c.notLeaderLocked()
	}
	if stale {
		if err := setHeader(ctx, metadata.Pairs("leasehold-applied-index", strconv.Itoa(len(c.calls)))); err != nil {
			return nil, err
		}
	}
	if f := c.faults[node]; len(f) > 0 {
		c.faults[node] = f[1:]
		return f[0], nil
	}
	return nil, nil
}

// NotLeader returns the refusal a follower answers with now:
// UNAVAILABLE NOT_LEADER with the leader's id and address when one leads.
func (c *Cluster) NotLeader() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.notLeaderLocked()
}

func (c *Cluster) notLeaderLocked() error {
	var md map[string]string
	if c.leader >= 0 {
		md = map[string]string{"leader_id": "n" + strconv.Itoa(c.leader), "leader_addr": c.nodes[c.leader].addr}
	}
	return statusError(codes.Unavailable, reason.NotLeader, "this coordinator is not the leader", md)
}

// Addrs returns the replicas' addresses, in order.
func (c *Cluster) Addrs() []string {
	addrs := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		addrs[i] = n.addr
	}
	return addrs
}

// Target returns the replicas' addresses separated by commas.
func (c *Cluster) Target() string { return strings.Join(c.Addrs(), ",") }

// SetLeader moves leadership to replica i (-1: none leads), as a
// coordinator does: the old leader stops serving and reports
// NOT_SERVING first, then the new one serves and reports SERVING.
func (c *Cluster) SetLeader(i int) {
	c.mu.Lock()
	old := c.leader
	c.leader = -1
	c.mu.Unlock()
	if old >= 0 && old != i {
		c.SetHealth(old, false)
	}
	c.mu.Lock()
	c.leader = i
	c.mu.Unlock()
	if i >= 0 {
		c.SetHealth(i, true)
	}
}

// SetServing makes replica i (-1: none) the one that serves calls,
// without touching any replica's health: a replica's health can lag its
// leadership.
func (c *Cluster) SetServing(i int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.leader = i
}

// SetHealth sets replica i's leaderdial.HealthService alone, without moving
// leadership: a replica can look like the leader a little after it stopped
// leading.
func (c *Cluster) SetHealth(i int, serving bool) {
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if serving {
		st = healthpb.HealthCheckResponse_SERVING
	}
	c.nodes[i].health.SetServingStatus(leaderdial.HealthService, st)
}

// FailNext makes replica i answer its next calls (one per error, in order)
// with errs, after serving them: a write whose outcome the client does not
// learn.
func (c *Cluster) FailNext(i int, errs ...error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.faults[i] = append(c.faults[i], errs...)
}

// errHang, among a replica's faults, holds the call until it ends.
var errHang = errors.New("hang")

// HangNext makes replica i hold its next unary call until the call ends,
// answering health checks all the same: a leader whose writer is stuck.
func (c *Cluster) HangNext(i int) {
	c.FailNext(i, errHang)
}

// Freeze makes replica i hold every call it takes from now on, health
// checks included, until Thaw or the call's end: a stopped process, whose
// connections stay open and which answers nothing. The test's end thaws
// it.
func (c *Cluster) Freeze(i int) {
	thawed := make(chan struct{})
	if c.nodes[i].thawed.CompareAndSwap(nil, &thawed) {
		c.t.Cleanup(func() { c.Thaw(i) })
	}
}

// Thaw lets a frozen replica i answer again.
func (c *Cluster) Thaw(i int) {
	if thawed := c.nodes[i].thawed.Swap(nil); thawed != nil {
		close(*thawed)
	}
}

// Stop stops replica i, as a killed process: its connections close and its
// calls in flight fail. It does nothing if the replica is stopped.
func (c *Cluster) Stop(i int) {
	n := c.nodes[i]
	n.srv.Stop()
	<-n.done
}

// Calls returns the calls the replicas took, in order.
func (c *Cluster) Calls() []Call {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.calls)
}

// Served returns the calls of method that a replica served, in order.
func (c *Cluster) Served(method string) []Call {
	var served []Call
	for _, call := range c.Calls() {
		if call.Method == method && !call.Refused {
			served = append(served, call)
		}
	}
	return served
}
