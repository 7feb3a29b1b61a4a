package renderer_test

import (
	"context"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/durationpb"

	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"github.com/leasehold/leasehold/internal/leaderdial"
	"github.com/leasehold/leasehold/renderer"
)

// notLeader is the refusal of a coordinator that does not lead, naming the
// leader's address when given.
func notLeader(t *testing.T, leaderAddr string) error {
	t.Helper()
	var md map[string]string
	if leaderAddr != "" {
		md = map[string]string{"leader_addr": leaderAddr}
	}
	st, err := status.New(codes.Unavailable, "this coordinator is not the leader").WithDetails(&errdetails.ErrorInfo{
		Reason: "NOT_LEADER", Domain: "leasehold.v1", Metadata: md,
	})
	if err != nil {
		t.Fatal(err)
	}
	return st.Err()
}

// TestWorkerNotLeaderReconnectsAtOnce ensures a session that its
// coordinator ends because it stopped leading is reopened at once, not
// after the backoff (an hour here), holding the leases in progress, and
// sends again the completions left unanswered.
func TestWorkerNotLeaderReconnectsAtOnce(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		p := newGated(t)
		p.hold("job-hold")
		var firstSession atomic.Bool
		firstSession.Store(true)
		b := setup(t, renderer.Config{Provider: p, Capacity: 2, BackoffMin: time.Hour, BackoffMax: time.Hour}, func(f *fakeCoordinator) {
			f.answer = func(c *leaseholdv1.SessionCompletion) *leaseholdv1.CompletionResult {
				if firstSession.Load() {
					return nil
				}
				return answerOK(c)
			}
		})
		s := b.session(t)
		s.grantNow(grant("job-hold", 1, pdf("a")), grant("job-done", 2, pdf("b")))
		first := s.waitReq(t, "the completion", func(r *leaseholdv1.SessionRequest) bool { return len(r.GetCompletions()) > 0 })

		firstSession.Store(false)
		s.end <- notLeader(t, "10.0.0.2:7070")
		s2 := b.session(t)
		ev := b.waitLog(t, "coordinator not the leader")
		if ev.attrs["retry_in"] != "0s" || ev.attrs["leader"] != "10.0.0.2:7070" {
			t.Errorf("log attrs = %v, want retry_in 0s and the leader named", ev.attrs)
		}
		if diff := cmp.Diff([]*leaseholdv1.LeaseRef{ref("job-hold", 1)}, s2.hello.GetHello().GetHolding(), protocmp.Transform()); diff != "" {
			t.Errorf("hello.holding after NOT_LEADER (-want +got):\n%s", diff)
		}
		again := s2.waitReq(t, "the completion again", func(r *leaseholdv1.SessionRequest) bool { return len(r.GetCompletions()) > 0 })
		if diff := cmp.Diff(first.GetCompletions(), again.GetCompletions(), protocmp.Transform()); diff != "" {
			t.Errorf("resent completions (-first +again):\n%s", diff)
		}
		if got := b.waitLog(t, "completed").attrs["job"]; got != "job-done" {
			t.Errorf("completed %q, want job-done", got)
		}
		p.stillRendering(t, "the failover")
	})
}

// TestWorkerNotLeaderAgainBacksOff ensures NOT_LEADER answers in a row
// with no welcome between them (a replica that does not lead, reached
// again) are retried at once only the first time, then after a backoff
// from 10 ms doubling (up to Config.BackoffMax).
func TestWorkerNotLeaderAgainBacksOff(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := setup(t, renderer.Config{Provider: newGated(t), BackoffMin: time.Second, BackoffMax: time.Second}, func(f *fakeCoordinator) {
			f.refusals = []error{notLeader(t, ""), notLeader(t, ""), notLeader(t, "")}
		})
		recv(t, b.srv.hellos, "the first hello")
		last := time.Now()
		for i, want := range []time.Duration{0, 10 * time.Millisecond, 20 * time.Millisecond} {
			d := retryIn(t, b.waitLog(t, "coordinator not the leader"))
			if d < want-want/5 || d > want+want/5 {
				t.Errorf("wait %d before reopening = %v, want %v within the 20%% jitter", i, d, want)
			}
			recv(t, b.srv.hellos, "the next hello")
			if got := time.Since(last); got != d {
				t.Errorf("reopened %v after NOT_LEADER, want retry_in %v", got, d)
			}
			last = time.Now()
		}
		b.session(t)
	})
}

// replicaNode is one coordinator replica of a cluster test: a fake
// RendererService on a loopback TCP listener with a real health server,
// whose checks block while the replica is frozen.
type replicaNode struct {
	fake    *fakeCoordinator
	health  *health.Server
	addr    string
	refused atomic.Int32
	frozen  atomic.Pointer[chan struct{}]
}

// Check implements healthpb.HealthServer: a frozen replica answers when
// thawed, or never.
func (n *replicaNode) Check(ctx context.Context, req *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	if thawed := n.frozen.Load(); thawed != nil {
		select {
		case <-*thawed:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return n.health.Check(ctx, req)
}

// Watch implements healthpb.HealthServer.
func (n *replicaNode) Watch(req *healthpb.HealthCheckRequest, s healthpb.Health_WatchServer) error {
	return n.health.Watch(req, s)
}

// List implements healthpb.HealthServer.
func (n *replicaNode) List(ctx context.Context, req *healthpb.HealthListRequest) (*healthpb.HealthListResponse, error) {
	return n.health.List(ctx, req)
}

// freeze makes the replica's health checks wait until the test ends.
func (n *replicaNode) freeze(t *testing.T) {
	thawed := make(chan struct{})
	n.frozen.Store(&thawed)
	t.Cleanup(func() { close(thawed) })
}

// setLeading sets the replica's Leader health entry.
func (n *replicaNode) setLeading(leads bool) {
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if leads {
		st = healthpb.HealthCheckResponse_SERVING
	}
	n.health.SetServingStatus(leaderdial.HealthService, st)
}

// startReplicas starts three replicas, of which the one leader names
// serves sessions and the others refuse them with NOT_LEADER; replica 1
// reports itself the leader.
func startReplicas(t *testing.T, leader *atomic.Int32) []*replicaNode {
	t.Helper()
	leader.Store(1)
	nodes := make([]*replicaNode, 3)
	for i := range nodes {
		n := &replicaNode{fake: newFakeCoordinator(), health: health.NewServer()}
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		n.addr = lis.Addr().String()
		gs := grpc.NewServer(grpc.StreamInterceptor(func(s any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			if strings.HasPrefix(info.FullMethod, "/grpc.health.v1.Health/") {
				return h(s, ss)
			}
			if err := checkAuth(ss.Context()); err != nil {
				return err
			}
			if int(leader.Load()) != i {
				n.refused.Add(1)
				return notLeader(t, "")
			}
			return h(s, ss)
		}))
		leaseholdv1.RegisterRendererServiceServer(gs, n.fake)
		healthpb.RegisterHealthServer(gs, n)
		n.setLeading(i == 1)
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = gs.Serve(lis)
		}()
		t.Cleanup(func() {
			gs.Stop()
			<-done
		})
		nodes[i] = n
	}
	return nodes
}

// runWorker runs a worker given every replica's address until the test
// ends, and returns its log records.
func runWorker(t *testing.T, nodes []*replicaNode, p renderer.Provider) chan logEvent {
	t.Helper()
	logs := make(chan logEvent, 4096)
	w, err := renderer.New(renderer.Config{
		Coordinator: strings.Join([]string{nodes[0].addr, nodes[1].addr, nodes[2].addr}, ","),
		ID:          testRendererID,
		Token:       testToken,
		Provider:    p,
		Capacity:    2,
		Logger:      newCaptureLogger(logs),
		BackoffMin:  time.Millisecond,
		BackoffMax:  5 * time.Millisecond,
	})
	if err != nil {
		t.Fatalf("renderer.New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	runDone := make(chan error, 1)
	go func() { runDone <- w.Run(ctx) }()
	t.Cleanup(func() {
		w.EndDrain()
		cancel()
		if err := recv(t, runDone, "Run to return"); err != nil {
			t.Errorf("Run returned %v, want nil after cancellation", err)
		}
	})
	return logs
}

// TestWorkerFollowsLeader ensures a worker given every replica opens its
// session on the one that reports itself the leader, sending nothing to
// the others, and when leadership moves and the old leader ends the
// session with NOT_LEADER, reopens it on the new leader holding its
// leases, and sends the unanswered completions there. It runs on the real
// clock, over loopback TCP: the channel's polls of each replica are what
// it tests.
func TestWorkerFollowsLeader(t *testing.T) {
	t.Parallel()
	var leader atomic.Int32
	nodes := startReplicas(t, &leader)
	// Replica 1 never answers completions: they are left for the next
	// leader.
	nodes[1].fake.answer = func(*leaseholdv1.SessionCompletion) *leaseholdv1.CompletionResult { return nil }
	p := newGated(t)
	p.hold("job-hold")
	logs := runWorker(t, nodes, p)

	s1 := recv(t, nodes[1].fake.sessions, "a session on the leader")
	if n0, n2 := nodes[0].refused.Load(), nodes[2].refused.Load(); n0 != 0 || n2 != 0 {
		t.Errorf("followers refused %d and %d calls, want none sent to them", n0, n2)
	}
	s1.grantNow(grant("job-hold", 1, pdf("a")), grant("job-done", 2, pdf("b")))
	first := s1.waitReq(t, "the completion", func(r *leaseholdv1.SessionRequest) bool { return len(r.GetCompletions()) > 0 })

	// Leadership moves to replica 2: the old leader reports NOT_SERVING
	// first, then the new one SERVING, and the old leader ends its
	// sessions with NOT_LEADER.
	leader.Store(-1)
	nodes[1].setLeading(false)
	leader.Store(2)
	nodes[2].setLeading(true)
	s1.end <- notLeader(t, nodes[2].addr)

	s2 := recv(t, nodes[2].fake.sessions, "a session on the new leader")
	if got, want := s2.hello.GetHello().GetInstanceId(), s1.hello.GetHello().GetInstanceId(); got != want {
		t.Errorf("instance id %q on the new leader, want %q", got, want)
	}
	if diff := cmp.Diff([]*leaseholdv1.LeaseRef{ref("job-hold", 1)}, s2.hello.GetHello().GetHolding(), protocmp.Transform()); diff != "" {
		t.Errorf("hello.holding on the new leader (-want +got):\n%s", diff)
	}
	again := s2.waitReq(t, "the completion on the new leader", func(r *leaseholdv1.SessionRequest) bool { return len(r.GetCompletions()) > 0 })
	if diff := cmp.Diff(first.GetCompletions(), again.GetCompletions(), protocmp.Transform()); diff != "" {
		t.Errorf("completions sent again (-first +again):\n%s", diff)
	}
	waitLogOn(t, logs, "completed")
	if n := nodes[0].refused.Load(); n != 0 {
		t.Errorf("replica 0 refused %d calls, want none sent to it", n)
	}
}

// TestWorkerLeavesAFrozenLeader ensures a worker whose leader freezes (its
// health checks go unanswered, its session sends nothing, and it never
// says NOT_LEADER) moves its session to the replica that then reports
// itself the leader, holding its leases, rather than waiting for the
// frozen one to wake.
func TestWorkerLeavesAFrozenLeader(t *testing.T) {
	t.Parallel()
	var leader atomic.Int32
	nodes := startReplicas(t, &leader)
	p := newGated(t)
	p.hold("job-hold")
	logs := runWorker(t, nodes, p)
	s1 := recv(t, nodes[1].fake.sessions, "a session on the leader")
	s1.grantNow(grant("job-hold", 1, pdf("a")))
	recv(t, p.started, "the render")

	nodes[1].freeze(t)
	leader.Store(2)
	nodes[2].setLeading(true)
	s2 := recv(t, nodes[2].fake.sessions, "a session on the new leader")
	if diff := cmp.Diff([]*leaseholdv1.LeaseRef{ref("job-hold", 1)}, s2.hello.GetHello().GetHolding(), protocmp.Transform()); diff != "" {
		t.Errorf("hello.holding on the new leader (-want +got):\n%s", diff)
	}
	if ev := waitLogOn(t, logs, "leader moved"); !strings.Contains(ev.attrs["err"], "leader moved") {
		t.Errorf("log attrs = %v, want the error saying the leader moved", ev.attrs)
	}
}

// newCaptureLogger returns a logger that sends every record on events.
func newCaptureLogger(events chan logEvent) *slog.Logger {
	return slog.New(captureHandler{events: events})
}

// waitLogOn waits for a record with message msg on events.
func waitLogOn(t *testing.T, events <-chan logEvent, msg string) logEvent {
	t.Helper()
	deadline := time.After(failsafe)
	for {
		select {
		case ev := <-events:
			if ev.msg == msg {
				return ev
			}
		case <-deadline:
			t.Fatalf("timed out waiting for log %q", msg)
		}
	}
}

// TestWorkerLeavesASilentCoordinator ensures a session whose coordinator
// sends nothing, not even a keepalive, for three keepalive intervals is
// ended by the worker and opened again at once, holding the leases in
// progress; and that a coordinator quiet but sending its keepalives is
// not left.
func TestWorkerLeavesASilentCoordinator(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		p := newGated(t)
		p.hold("job-hold")
		b := setup(t, renderer.Config{Provider: p, Capacity: 1, BackoffMin: time.Hour, BackoffMax: time.Hour}, func(f *fakeCoordinator) {
			f.welcome.KeepaliveInterval = durationpb.New(time.Second)
		})
		s1 := b.session(t)
		s1.grantNow(grant("job-hold", 1, pdf("a")))
		recv(t, p.started, "the render")
		recv(t, b.srv.hellos, "the first hello")

		// Quiet, with keepalives: kept for ten intervals.
		for range 10 {
			time.Sleep(time.Second)
			s1.push <- &leaseholdv1.SessionResponse{Keepalive: true}
		}
		synctest.Wait()
		select {
		case h := <-b.srv.hellos:
			t.Fatalf("the worker opened another session (%v) on a coordinator sending keepalives", h)
		default:
		}

		// Silent from here.
		last := time.Now()
		ev := b.waitLog(t, "coordinator silent")
		s2 := b.session(t)
		if got := time.Since(last); got != 3*time.Second {
			t.Errorf("left the silent coordinator after %v, want 3 s (three keepalive intervals)", got)
		}
		if ev.attrs["holding"] != "1" {
			t.Errorf("log attrs = %v, want holding=1", ev.attrs)
		}
		if diff := cmp.Diff([]*leaseholdv1.LeaseRef{ref("job-hold", 1)}, s2.hello.GetHello().GetHolding(), protocmp.Transform()); diff != "" {
			t.Errorf("hello.holding after the silence (-want +got):\n%s", diff)
		}
		p.stillRendering(t, "the new session")
	})
}

// stillRendering fails the test if a held render stopped: its lease is
// held across what happened (across). It waits for the bubble to settle.
func (p *gatedProvider) stillRendering(t *testing.T, across string) {
	t.Helper()
	synctest.Wait()
	select {
	case job := <-p.stopped:
		t.Errorf("%s stopped, want it still rendering: the lease is held across %s", job, across)
	default:
	}
}
