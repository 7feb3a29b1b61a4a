package client_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/leasehold/leasehold/client"
	"github.com/leasehold/leasehold/client/internal/fakeserver"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
)

// clusterFailsafe bounds the waits of the cluster tests, so that a client
// that never finds the leader fails the test instead of hanging it.
const clusterFailsafe = 20 * time.Second

const submitMethod = leaseholdv1.JobService_SubmitBatch_FullMethodName

// clusterBundle is a client dialled to every replica of a fake cluster.
type clusterBundle struct {
	fake    *fakeserver.Server
	cluster *fakeserver.Cluster
	client  *client.Client
	// attempts receives the method of every attempt the client sends,
	// retries included.
	attempts chan string
}

// setupCluster starts three replicas with leader leading and dials all of
// them with opts.
func setupCluster(t *testing.T, leader int, opts ...client.Option) *clusterBundle {
	t.Helper()
	b := &clusterBundle{fake: fakeserver.New(), attempts: make(chan string, 1024)}
	b.cluster = fakeserver.StartCluster(t, b.fake, 3)
	b.cluster.SetLeader(leader)
	// Interceptors given by the caller run inside the client's own, so this
	// one sees every attempt.
	observe := grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		select {
		case b.attempts <- method:
		default:
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	})
	opts = append([]client.Option{client.WithToken("s3cret"), client.WithDialOptions(observe)}, opts...)
	c, err := client.Dial(b.cluster.Target(), opts...)
	if err != nil {
		t.Fatalf("Dial(%q): %v", b.cluster.Target(), err)
	}
	t.Cleanup(func() { _ = c.Close() })
	b.client = c
	return b
}

// submit submits one document under request id rid and returns the batch.
func (b *clusterBundle) submit(t *testing.T, rid string) *leaseholdv1.Batch {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), clusterFailsafe)
	defer cancel()
	resp, err := b.client.SubmitBatch(ctx, "team-a", rid, []*leaseholdv1.Document{{Name: rid + ".pdf", Content: []byte("%PDF")}}, nil)
	if err != nil {
		t.Fatalf("SubmitBatch(%s): %v", rid, err)
	}
	return resp.GetBatch()
}

// servedOn returns the replicas that served the calls of method, in order.
func (b *clusterBundle) servedOn(method string) []int {
	var nodes []int
	for _, c := range b.cluster.Served(method) {
		nodes = append(nodes, c.Node)
	}
	return nodes
}

// TestClusterSendsToLeader ensures a client given every replica sends its
// calls to the one whose leasehold.v1.Leader health is SERVING, whatever
// its place in the list, and sends none to the others.
func TestClusterSendsToLeader(t *testing.T) {
	t.Parallel()
	b := setupCluster(t, 1)
	batch := b.submit(t, "r-1")
	if _, err := b.client.GetBatch(t.Context(), batch.GetId()); err != nil {
		t.Fatalf("GetBatch: %v", err)
	}
	for _, c := range b.cluster.Calls() {
		if c.Node != 1 {
			t.Errorf("%s went to replica %d, want the leader, 1", c.Method, c.Node)
		}
	}
	if diff := cmp.Diff([]string{"Bearer s3cret", "Bearer s3cret"}, b.fake.AuthHeaders()); diff != "" {
		t.Errorf("authorization of the calls (-want +got):\n%s", diff)
	}
}

// TestClusterFollowsLeadership ensures that when leadership moves, the
// next call goes to the new leader and no error reaches the caller,
// whether the client learnt of the move before the call or from the old
// leader's NOT_LEADER refusal.
func TestClusterFollowsLeadership(t *testing.T) {
	t.Parallel()
	b := setupCluster(t, 0)
	b.submit(t, "r-0")
	b.cluster.SetLeader(1)
	b.submit(t, "r-1")
	b.cluster.SetLeader(2)
	b.submit(t, "r-2")
	if diff := cmp.Diff([]int{0, 1, 2}, b.servedOn(submitMethod)); diff != "" {
		t.Errorf("replicas that served the submits (-want +got):\n%s", diff)
	}
}

// TestClusterWaitsForNewLeader ensures a call made while no replica leads
// (the leader was killed, no other is elected yet) waits for the next
// leader instead of failing.
func TestClusterWaitsForNewLeader(t *testing.T) {
	t.Parallel()
	b := setupCluster(t, 0)
	b.submit(t, "r-0")
	drain(b.attempts)
	b.cluster.Stop(0)
	b.cluster.SetLeader(-1)
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), clusterFailsafe)
		defer cancel()
		_, err := b.client.GetBatch(ctx, "b-1")
		done <- err
	}()
	// The first attempt fails at once (no replica is healthy); the second
	// is the retry, which waits for a leader.
	recvT(t, b.attempts, "the first attempt")
	recvT(t, b.attempts, "the retry")
	b.cluster.SetLeader(2)
	if err := recvT(t, done, "GetBatch to return"); err != nil {
		t.Fatalf("GetBatch across the failover: %v", err)
	}
	if diff := cmp.Diff([]int{2}, b.servedOn(leaseholdv1.JobService_GetBatch_FullMethodName)); diff != "" {
		t.Errorf("replicas that served GetBatch (-want +got):\n%s", diff)
	}
}

// TestClusterRetriesNotLeader ensures a call that reaches a replica which
// still looks like the leader but no longer is (it answers its health
// checks SERVING a little after it stopped leading) is refused with
// NOT_LEADER and sent again, to the new leader once the client finds it,
// with no error for the caller.
func TestClusterRetriesNotLeader(t *testing.T) {
	t.Parallel()
	b := setupCluster(t, 0)
	batch := b.submit(t, "r-0")
	drain(b.attempts)
	// Replica 1 leads; replica 0 refuses, still reporting SERVING.
	b.cluster.SetServing(1)
	done := make(chan error, 1)
	go func() {
		_, err := b.client.GetBatch(t.Context(), batch.GetId())
		done <- err
	}()
	recvT(t, b.attempts, "the first attempt")
	// Its health catches up.
	b.cluster.SetHealth(0, false)
	b.cluster.SetHealth(1, true)
	if err := recvT(t, done, "GetBatch to return"); err != nil {
		t.Fatalf("GetBatch: %v", err)
	}
	refused := 0
	for _, c := range b.cluster.Calls() {
		if c.Refused && c.Node == 0 && c.Method == leaseholdv1.JobService_GetBatch_FullMethodName {
			refused++
		}
	}
	if refused == 0 {
		t.Error("no GetBatch was refused by the stale replica 0; the test proves nothing")
	}
	if diff := cmp.Diff([]int{1}, b.servedOn(leaseholdv1.JobService_GetBatch_FullMethodName)); diff != "" {
		t.Errorf("replicas that served GetBatch (-want +got):\n%s", diff)
	}
}

// TestClusterLeavesAFrozenLeader ensures a call in flight on a leader that
// freezes (it answers nothing, health checks included, and keeps its
// connections open) is answered by the replica that then reports itself
// the leader, well before the frozen one would wake (the test's end), and
// well before the attempt's own deadline (a third of the call's minute).
func TestClusterLeavesAFrozenLeader(t *testing.T) {
	t.Parallel()
	b := setupCluster(t, 0)
	b.submit(t, "r-0")
	drain(b.attempts)
	b.cluster.Freeze(0)
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		_, err := b.client.SubmitBatch(ctx, "team-a", "r-1", []*leaseholdv1.Document{{Name: "a.pdf", Content: []byte("%PDF")}}, nil)
		done <- err
	}()
	recvT(t, b.attempts, "the attempt on the frozen leader")
	b.cluster.SetLeader(2)
	if err := recvT(t, done, "SubmitBatch to return"); err != nil {
		t.Fatalf("SubmitBatch across the freeze: %v", err)
	}
	if diff := cmp.Diff([]int{0, 2}, b.servedOn(submitMethod)); diff != "" {
		t.Errorf("replicas that served the submits (-want +got):\n%s", diff)
	}
}

// TestClusterAttemptDeadline ensures an attempt that its replica holds
// while answering its health checks (a leader whose writer is stuck) ends
// at the attempt's own deadline, a third of the call's, and is sent again
// within the call's.
func TestClusterAttemptDeadline(t *testing.T) {
	t.Parallel()
	b := setupCluster(t, 0)
	batch := b.submit(t, "r-0")
	b.cluster.HangNext(0)
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Second)
	defer cancel()
	if _, err := b.client.GetBatch(ctx, batch.GetId()); err != nil {
		t.Fatalf("GetBatch with its first attempt held: %v", err)
	}
	if n := len(b.servedOn(leaseholdv1.JobService_GetBatch_FullMethodName)); n != 2 {
		t.Errorf("replica 0 took GetBatch %d times, want twice: the attempt it held, then the retry", n)
	}
}

// TestClusterRetriesOutcomeUnknown ensures a write answered OUTCOME_UNKNOWN
// (leadership lost with it proposed) is sent again, and that the answer
// the caller gets is the one the idempotent write gives: the batch stored
// once, the same on both attempts.
func TestClusterRetriesOutcomeUnknown(t *testing.T) {
	t.Parallel()
	b := setupCluster(t, 0)
	b.cluster.FailNext(0, unavailable(t, "OUTCOME_UNKNOWN", nil))
	resp, err := b.client.SubmitBatch(t.Context(), "team-a", "r-1", []*leaseholdv1.Document{{Name: "a.pdf", Content: []byte("%PDF")}}, nil)
	if err != nil {
		t.Fatalf("SubmitBatch: %v", err)
	}
	subs := b.fake.Submits()
	if len(subs) != 2 || subs[0].GetRequestId() != "r-1" || subs[1].GetRequestId() != "r-1" {
		t.Fatalf("submits = %v, want r-1 twice (the lost answer, then the retry)", subs)
	}
	if !resp.GetReplayed() || resp.GetBatch().GetId() != "b-1" {
		t.Errorf("answer = batch %s replayed %v, want b-1 replayed: the write the first attempt applied",
			resp.GetBatch().GetId(), resp.GetReplayed())
	}
}

// TestClusterErrorsThatSurface ensures what is not a failover is returned
// at once, and a failover that outlasts the wait returns its last error.
func TestClusterErrorsThatSurface(t *testing.T) {
	t.Parallel()

	t.Run("a refusal other than a failover is returned at once", func(t *testing.T) {
		t.Parallel()
		b := setupCluster(t, 0)
		b.cluster.FailNext(0, unavailable(t, "STORAGE_UNAVAILABLE", nil))
		_, err := b.client.SubmitBatch(t.Context(), "team-a", "r-1", []*leaseholdv1.Document{{Name: "a.pdf"}}, nil)
		if !errors.Is(err, client.ErrStorageUnavailable) {
			t.Errorf("SubmitBatch = %v, want ErrStorageUnavailable", err)
		}
		if n := len(b.fake.Submits()); n != 1 {
			t.Errorf("the replica took %d submits, want 1: STORAGE_UNAVAILABLE is not retried", n)
		}
	})

	t.Run("with no leader the wait runs out with UNAVAILABLE", func(t *testing.T) {
		t.Parallel()
		b := setupCluster(t, -1, client.WithFailoverWait(100*time.Millisecond))
		_, err := b.client.GetJob(t.Context(), "j-1")
		if !errors.Is(err, client.ErrUnavailable) || errors.Is(err, client.ErrNotLeader) {
			t.Errorf("GetJob = %v, want ErrUnavailable from the transport", err)
		}
	})

	t.Run("with a replica that refuses as a follower the wait runs out with NOT_LEADER", func(t *testing.T) {
		t.Parallel()
		b := setupCluster(t, -1, client.WithFailoverWait(100*time.Millisecond))
		b.cluster.SetHealth(2, true)
		_, err := b.client.GetJob(t.Context(), "j-1")
		if !errors.Is(err, client.ErrNotLeader) {
			t.Errorf("GetJob = %v, want ErrNotLeader", err)
		}
	})

	t.Run("a wait of zero retries nothing", func(t *testing.T) {
		t.Parallel()
		b := setupCluster(t, 0, client.WithFailoverWait(0))
		b.cluster.FailNext(0, unavailable(t, "OUTCOME_UNKNOWN", nil))
		_, err := b.client.SubmitBatch(t.Context(), "team-a", "r-1", []*leaseholdv1.Document{{Name: "a.pdf"}}, nil)
		if !errors.Is(err, client.ErrOutcomeUnknown) {
			t.Errorf("SubmitBatch = %v, want ErrOutcomeUnknown", err)
		}
	})

	t.Run("a negative wait is refused", func(t *testing.T) {
		t.Parallel()
		if _, err := client.Dial("127.0.0.1:1,127.0.0.1:2", client.WithFailoverWait(-time.Second)); err == nil {
			t.Error("Dial with a negative failover wait succeeded")
		}
	})
}

// TestSingleAddressUnchanged ensures one plain address is dialled as
// before: no health checking (the call goes to the replica named, leader
// or not) and no retry (its NOT_LEADER is the caller's, with the leader's
// address).
func TestSingleAddressUnchanged(t *testing.T) {
	t.Parallel()
	fake := fakeserver.New()
	cl := fakeserver.StartCluster(t, fake, 2)
	cl.SetLeader(1)
	c, err := client.Dial(cl.Addrs()[0], client.WithToken("s3cret"))
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	defer c.Close()
	_, err = c.GetJob(t.Context(), "j-1")
	if !errors.Is(err, client.ErrNotLeader) || !errors.Is(err, client.ErrUnavailable) {
		t.Fatalf("GetJob on a follower = %v, want ErrNotLeader", err)
	}
	if ce, ok := errors.AsType[*client.Error](err); !ok || ce.Metadata["leader_addr"] != cl.Addrs()[1] {
		t.Errorf("NOT_LEADER error %v, want leader_addr %s in its metadata", err, cl.Addrs()[1])
	}
	if n := len(cl.Calls()); n != 1 {
		t.Errorf("the follower took %d calls, want 1 (no retry)", n)
	}
}

// TestDialAddresses ensures malformed lists are refused by Dial, and a
// token in plaintext is refused when any listed replica is on another
// host.
func TestDialAddresses(t *testing.T) {
	t.Parallel()
	for _, addr := range []string{"127.0.0.1:1,", "127.0.0.1:1,,127.0.0.1:2", "127.0.0.1:1,127.0.0.1", "127.0.0.1:1,dns:///x:2", "127.0.0.1:1,127.0.0.1:1"} {
		if c, err := client.Dial(addr); err == nil {
			c.Close()
			t.Errorf("Dial(%q) succeeded, want an error", addr)
		}
	}
	if _, err := client.Dial("127.0.0.1:7070,10.0.0.5:7070", client.WithToken("t")); !errors.Is(err, client.ErrPlaintextToken) {
		t.Errorf("Dial with a plaintext token and a replica on another host = %v, want ErrPlaintextToken", err)
	}
	if _, err := client.Dial("dns:///coordinator.prod:7070", client.WithToken("t")); !errors.Is(err, client.ErrPlaintextToken) {
		t.Errorf("Dial with a plaintext token to a dns name = %v, want ErrPlaintextToken", err)
	}
	c, err := client.Dial("127.0.0.1:7070, localhost:7071,[::1]:7072", client.WithToken("t"))
	if err != nil {
		t.Fatalf("Dial to replicas on loopback: %v", err)
	}
	c.Close()
}

// TestClusterStaleReads ensures WithStaleReads sends the reads a follower
// may serve with "leasehold-read: stale" to any replica, so that they are
// answered while no replica leads, with the applied index in the header;
// writes and leader-only reads still go to the leader.
func TestClusterStaleReads(t *testing.T) {
	t.Parallel()
	b := setupCluster(t, 0, client.WithStaleReads())
	batch := b.submit(t, "r-0")
	b.cluster.SetLeader(-1)
	ctx, cancel := context.WithTimeout(t.Context(), clusterFailsafe)
	defer cancel()
	var header metadata.MD
	resp, err := b.client.Jobs.GetBatch(ctx, &leaseholdv1.GetBatchRequest{BatchId: batch.GetId()}, grpc.Header(&header))
	if err != nil {
		t.Fatalf("stale GetBatch with no leader: %v", err)
	}
	if resp.GetBatch().GetId() != batch.GetId() {
		t.Errorf("GetBatch answered %s, want %s", resp.GetBatch().GetId(), batch.GetId())
	}
	if got := header.Get(client.AppliedIndexKey); len(got) != 1 {
		t.Errorf("header %s = %q, want one value", client.AppliedIndexKey, got)
	}
	served := b.cluster.Served(leaseholdv1.JobService_GetBatch_FullMethodName)
	if len(served) != 1 || !served[0].Stale {
		t.Errorf("GetBatch calls served = %+v, want one stale read", served)
	}
	for _, c := range b.cluster.Served(submitMethod) {
		if c.Stale || c.Node != 0 {
			t.Errorf("submit served as %+v, want by the leader, not stale", c)
		}
	}

	b.cluster.SetLeader(1)
	if _, err := b.client.GetOverview(ctx, ""); err != nil {
		t.Fatalf("GetOverview: %v", err)
	}
	for _, c := range b.cluster.Served(leaseholdv1.OverviewService_GetOverview_FullMethodName) {
		if c.Stale || c.Node != 1 {
			t.Errorf("GetOverview served as %+v, want by the leader, not stale: only the leader has it", c)
		}
	}
}

// TestClusterFollowBatchAcrossFailover ensures FollowBatch rides out a
// watch lost to a failover and watches again on the new leader, from the
// last event seen, each job's success yielded once: a watch ended by
// NOT_LEADER (its leader stepped down), and one on a leader that freezes
// in the middle of it (its stream and its health checks go silent, and it
// never says NOT_LEADER), which the client leaves once another replica
// reports itself the leader.
func TestClusterFollowBatchAcrossFailover(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		// fault is what the leader's watch meets after its first message.
		fault func(ctx context.Context, c *fakeserver.Cluster) error
		// want is what lost the watch; served the replicas that served
		// the watches.
		want   error
		served []int
	}{
		{"a watch ended by NOT_LEADER", func(_ context.Context, c *fakeserver.Cluster) error {
			c.SetLeader(1)
			return c.NotLeader()
		}, client.ErrNotLeader, []int{0, 1}},
		{"a leader frozen in the middle of a watch", func(ctx context.Context, c *fakeserver.Cluster) error {
			c.Freeze(0)
			c.SetLeader(2)
			<-ctx.Done() // the stream stops with the process
			return ctx.Err()
		}, client.ErrUnavailable, []int{0, 2}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setupCluster(t, 0)
			resp, err := b.client.SubmitBatch(t.Context(), "team-a", "r-0",
				[]*leaseholdv1.Document{{Name: "a.pdf"}, {Name: "b.pdf"}, {Name: "c.pdf"}}, nil)
			if err != nil {
				t.Fatalf("SubmitBatch: %v", err)
			}
			b.fake.WatchFault = func(ctx context.Context, call, msg int) error {
				if call == 0 && msg == 1 {
					return tc.fault(ctx, b.cluster)
				}
				return nil
			}
			if err := b.followToTheEnd(t, resp.GetBatch().GetId()); !errors.Is(err, tc.want) {
				t.Errorf("the watch was lost with %v, want %v", err, tc.want)
			}
			if diff := cmp.Diff(tc.served, b.servedOn(leaseholdv1.JobService_WatchBatch_FullMethodName)); diff != "" {
				t.Errorf("replicas that served the watches (-want +got):\n%s", diff)
			}
		})
	}
}

// followToTheEnd follows the batch of three jobs until it is done, checks
// that each job's success was yielded once, and returns the error that
// lost the last stream FollowBatch watched again after.
func (b *clusterBundle) followToTheEnd(t *testing.T, batchID string) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), clusterFailsafe)
	defer cancel()
	seen := map[string]int{}
	var reconnectErr error
	opts := client.FollowOptions{OnReconnect: func(err error, _ time.Duration) { reconnectErr = err }}
	for u, err := range b.client.FollowBatch(ctx, batchID, opts) {
		if err != nil {
			t.Fatalf("FollowBatch: %v", err)
		}
		if u.Phase == leaseholdv1.Phase_PHASE_SUCCEEDED {
			seen[u.JobID]++
		}
	}
	if diff := cmp.Diff(map[string]int{"j-1": 1, "j-2": 1, "j-3": 1}, seen); diff != "" {
		t.Errorf("jobs seen succeeding (-want +got):\n%s", diff)
	}
	return reconnectErr
}

// unavailable is an UNAVAILABLE refusal with reason, as the coordinator
// sends it.
func unavailable(t *testing.T, reason string, md map[string]string) error {
	t.Helper()
	st, err := status.New(codes.Unavailable, reason).WithDetails(&errdetails.ErrorInfo{Reason: reason, Domain: client.ErrorDomain, Metadata: md})
	if err != nil {
		t.Fatal(err)
	}
	return st.Err()
}

// recvT waits for a value on ch or fails the test.
func recvT[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(clusterFailsafe):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

// drain empties ch.
func drain[T any](ch chan T) {
	for {
		select {
		case <-ch:
		default:
			return
		}
	}
}
