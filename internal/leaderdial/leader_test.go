package leaderdial_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/leasehold/leasehold/internal/leaderdial"
)

// fakeReplica is a health server that can freeze: while frozen its Check
// blocks until the caller gives up, as a stopped process's would, and the
// updates of its Watch streams wait. It also reports its own name SERVING,
// so that a check of that name tells which replica answered.
type fakeReplica struct {
	*health.Server
	name, addr string

	mu     sync.Mutex
	thawed chan struct{} // nil while not frozen
}

// Check implements healthpb.HealthServer.
func (r *fakeReplica) Check(ctx context.Context, req *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	if err := r.wait(ctx); err != nil {
		return nil, err
	}
	return r.Server.Check(ctx, req)
}

// wait blocks while the replica is frozen.
func (r *fakeReplica) wait(ctx context.Context) error {
	r.mu.Lock()
	thawed := r.thawed
	r.mu.Unlock()
	if thawed == nil {
		return nil
	}
	select {
	case <-thawed:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (r *fakeReplica) freeze() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.thawed == nil {
		r.thawed = make(chan struct{})
	}
}

func (r *fakeReplica) thaw() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.thawed != nil {
		close(r.thawed)
		r.thawed = nil
	}
}

func (r *fakeReplica) lead(leads bool) {
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if leads {
		st = healthpb.HealthCheckResponse_SERVING
	}
	r.SetServingStatus(leaderdial.HealthService, st)
}

// fakeCluster is three fake replicas on loopback, the first leading, and
// a leader channel to them with short poll timings.
type fakeCluster struct {
	replicas []*fakeReplica
	leader   *leaderdial.Leader
	conn     *grpc.ClientConn
}

func startFakeCluster(t *testing.T, silence time.Duration) *fakeCluster {
	t.Helper()
	fc := &fakeCluster{}
	var addrs []string
	for i, name := range []string{"n0", "n1", "n2"} {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		r := &fakeReplica{Server: health.NewServer(), name: name, addr: lis.Addr().String()}
		r.SetServingStatus(name, healthpb.HealthCheckResponse_SERVING)
		r.lead(i == 0)
		srv := grpc.NewServer()
		healthpb.RegisterHealthServer(srv, r)
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = srv.Serve(lis)
		}()
		t.Cleanup(func() {
			r.thaw()
			srv.Stop()
			<-done
		})
		fc.replicas = append(fc.replicas, r)
		addrs = append(addrs, r.addr)
	}
	target, err := leaderdial.Parse(strings.Join(addrs, ","))
	if err != nil {
		t.Fatal(err)
	}
	transport := grpc.WithTransportCredentials(insecure.NewCredentials())
	fc.leader = target.Leader(transport).WithTiming(20*time.Millisecond, 100*time.Millisecond, silence)
	fc.conn, err = grpc.NewClient(fc.leader.DialTarget(), append(fc.leader.DialOptions(), transport)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fc.conn.Close() })
	fc.conn.Connect()
	fc.awaitRoute(t, 0)
	return fc
}

// awaitRoute waits until calls go to replica i (-1: to none).
func (fc *fakeCluster) awaitRoute(t *testing.T, i int) {
	t.Helper()
	want := ""
	if i >= 0 {
		want = fc.replicas[i].addr
	}
	deadline := time.After(20 * time.Second)
	for {
		got, changed := fc.leader.Routed()
		if got == want {
			return
		}
		select {
		case <-changed:
		case <-deadline:
			t.Fatalf("calls go to %q, want %q", got, want)
		}
	}
}

// answeredBy reports which replica answered a call through the channel.
func (fc *fakeCluster) answeredBy(t *testing.T) string {
	t.Helper()
	for _, r := range fc.replicas {
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		_, err := healthpb.NewHealthClient(fc.conn).Check(ctx, &healthpb.HealthCheckRequest{Service: r.name}, grpc.WaitForReady(true))
		cancel()
		if err == nil {
			return r.name
		}
	}
	return ""
}

// watch opens a Watch of replica i's own name through the channel and
// returns the stream once its first status arrived.
func (fc *fakeCluster) watch(t *testing.T, i int) healthpb.Health_WatchClient {
	t.Helper()
	// Bounded, so that a stream never ended fails the test instead of
	// hanging it.
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	t.Cleanup(cancel)
	w, err := healthpb.NewHealthClient(fc.conn).Watch(ctx, &healthpb.HealthCheckRequest{Service: fc.replicas[i].name}, grpc.WaitForReady(true))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Recv(); err != nil {
		t.Fatalf("watching %s: %v", fc.replicas[i].name, err)
	}
	return w
}

// TestLeaderFollowsAFrozenLeadersSuccessor ensures that when the leader
// freezes (its health check never answers) and another replica reports
// itself the leader, calls go to the new one, and that a stream and an
// attempt made under the frozen one end with ErrLeaderMoved rather than
// waiting for it to wake.
func TestLeaderFollowsAFrozenLeadersSuccessor(t *testing.T) {
	t.Parallel()
	fc := startFakeCluster(t, time.Hour)
	if got := fc.answeredBy(t); got != "n0" {
		t.Fatalf("a call went to %q, want the leader n0", got)
	}
	w := fc.watch(t, 0)
	bounded, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	attempt, release := fc.leader.Attempt(bounded)
	defer release()
	inFlight := make(chan error, 1)
	fc.replicas[0].freeze()
	go func() {
		// The frozen replica holds the call; only leaving it ends it.
		_, err := healthpb.NewHealthClient(fc.conn).Check(attempt, &healthpb.HealthCheckRequest{Service: "n0"}, grpc.WaitForReady(true))
		inFlight <- leaderdial.Moved(attempt, err)
	}()
	fc.replicas[0].lead(false) // what it would say, were it running
	fc.replicas[2].lead(true)
	fc.awaitRoute(t, 2)
	if got := fc.answeredBy(t); got != "n2" {
		t.Fatalf("a call went to %q, want the new leader n2", got)
	}
	if _, err := w.Recv(); !errors.Is(err, leaderdial.ErrLeaderMoved) {
		t.Errorf("the watch on the frozen leader ended with %v, want ErrLeaderMoved", err)
	}
	if err := <-inFlight; !errors.Is(err, leaderdial.ErrLeaderMoved) {
		t.Errorf("the attempt on the frozen leader ended with %v, want ErrLeaderMoved", err)
	}
}

// TestLeaderStaysWithASlowLeader ensures that a leader silent for less
// than the silence bound, with no other leader in sight, keeps its
// streams: it takes no new call while silent, and the same stream carries
// its next update once it answers again.
func TestLeaderStaysWithASlowLeader(t *testing.T) {
	t.Parallel()
	fc := startFakeCluster(t, time.Hour)
	w := fc.watch(t, 0)
	epoch, _ := fc.leader.Left()
	fc.replicas[0].freeze()
	fc.awaitRoute(t, -1)
	fc.replicas[0].thaw()
	fc.awaitRoute(t, 0)
	fc.replicas[0].SetServingStatus("n0", healthpb.HealthCheckResponse_NOT_SERVING)
	resp, err := w.Recv()
	if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("the stream on the leader after its pause: %v, %v; want its next update", resp, err)
	}
	if got, _ := fc.leader.Left(); got != epoch {
		t.Errorf("%d leaders left, want none", got-epoch)
	}
}

// TestLeaderLeavesASilentLeader ensures that a leader silent past the
// silence bound is left even with no other leader in sight: its streams
// end, and calls wait for a leader, here the same replica once it answers.
func TestLeaderLeavesASilentLeader(t *testing.T) {
	t.Parallel()
	fc := startFakeCluster(t, 300*time.Millisecond)
	w := fc.watch(t, 0)
	fc.replicas[0].freeze()
	if _, err := w.Recv(); !errors.Is(err, leaderdial.ErrLeaderMoved) {
		t.Errorf("the watch on the silent leader ended with %v, want ErrLeaderMoved", err)
	}
	fc.replicas[0].thaw()
	if got := fc.answeredBy(t); got != "n0" {
		t.Fatalf("a call went to %q, want n0 once it answers again", got)
	}
}

// TestLeaderLeavesOneThatStepsDown ensures that a leader answering
// NOT_SERVING is left at once, and that calls made while no replica leads
// wait for the next one.
func TestLeaderLeavesOneThatStepsDown(t *testing.T) {
	t.Parallel()
	fc := startFakeCluster(t, time.Hour)
	w := fc.watch(t, 0)
	fc.replicas[0].lead(false)
	if _, err := w.Recv(); !errors.Is(err, leaderdial.ErrLeaderMoved) {
		t.Errorf("the watch on the leader that stepped down ended with %v, want ErrLeaderMoved", err)
	}
	fc.awaitRoute(t, -1)
	answered := make(chan string, 1)
	go func() { answered <- fc.answeredBy(t) }()
	fc.replicas[1].lead(true)
	if got := <-answered; got != "n1" {
		t.Fatalf("a call made with no leader went to %q, want the next leader n1", got)
	}
}
