package server

import (
	"context"
	"sync"
	"testing"

	"github.com/leasehold/leasehold/coordinator/internal/engine"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"google.golang.org/grpc/codes"
)

// heldReceive is an engine whose Receive, once armed, waits for release
// before it applies the next session message, and which records the
// longest list of lease references each applied message named.
type heldReceive struct {
	Engine
	mu      sync.Mutex
	armed   chan struct{}
	release chan struct{}
	longest []int
}

func (h *heldReceive) Receive(ctx context.Context, conn *engine.Conn, in engine.SessionInput) (engine.SessionResult, error) {
	h.mu.Lock()
	armed := h.armed
	h.armed = nil
	h.longest = append(h.longest, max(len(in.Received), len(in.Heartbeats), len(in.Completions), len(in.HandBacks), len(in.Acks)))
	h.mu.Unlock()
	if armed != nil {
		close(armed)
		<-h.release
	}
	return h.Engine.Receive(ctx, conn, in)
}

// arm makes the next Receive wait for release; the returned channel is
// closed once it is waiting.
func (h *heldReceive) arm() <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.armed = make(chan struct{})
	return h.armed
}

// TestLeaseRefsAreBoundedByCapacity checks the bound on the lease
// references of a renderer's messages: a session's hello, its messages and
// a heartbeat stream's messages name at most the renderer's capacity in
// each list, a longer one is refused whole with INVALID_ARGUMENT
// TOO_MANY_LEASE_REFS and changes nothing, and what a session sends
// faster than the writer applies it reaches the writer in commands within
// the same bound.
func TestLeaseRefsAreBoundedByCapacity(t *testing.T) {
	t.Parallel()

	t.Run("A hello holding more leases than its capacity is refused and registers nothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.submit(t, alpha, "alpha", "r", doc("a.pdf"), doc("b.pdf"))
		g := b.acquire(t, 2)
		before := b.snapshot(t)
		h := hello("r-1", "i-1", 1)
		h.Holding = []*leaseholdv1.LeaseRef{ref(g[0]), ref(g[1])}
		sc := b.startSession(t, renderer, &leaseholdv1.SessionRequest{Hello: h})
		_, err := sc.recv()
		wantError(t, err, codes.InvalidArgument, reasonTooManyLeaseRefs)
		if got := badRequestFields(err); len(got) != 1 || got[0] != "hello.holding" {
			t.Errorf("BadRequest fields = %v, want hello.holding", got)
		}
		if diff := cmpDiff(before, b.snapshot(t)); diff != "" {
			t.Errorf("the refused hello changed the state (-before +after):\n%s", diff)
		}
		// Nothing was registered: another process may use the id.
		b.openSession(t, hello("r-1", "i-2", 2), 0)
	})

	t.Run("A message naming more leases than its capacity is refused whole and ends the stream", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.submit(t, alpha, "alpha", "r", doc("a.pdf"), doc("b.pdf"))
		sc := b.openSession(t, hello("r-1", "i-1", 2), 2)
		sc.untilGrants(2)
		g := sc.grants
		b.clock.Advance(1e9)
		before := b.snapshot(t)
		sc.send(&leaseholdv1.SessionRequest{Heartbeats: []*leaseholdv1.LeaseRef{ref(g[0]), ref(g[1]), ref(g[0])}})
		err := sc.end()
		wantError(t, err, codes.InvalidArgument, reasonTooManyLeaseRefs)
		if got := badRequestFields(err); len(got) != 1 || got[0] != "heartbeats" {
			t.Errorf("BadRequest fields = %v, want heartbeats", got)
		}
		if diff := cmpDiff(before, b.snapshot(t)); diff != "" {
			t.Errorf("the refused message changed the state (-before +after):\n%s", diff)
		}
	})

	t.Run("Messages sent while the writer is busy reach it in commands within the capacity", func(t *testing.T) {
		t.Parallel()
		h := &heldReceive{release: make(chan struct{})}
		b := setup(t, func(o *options) { o.wrap = func(e Engine) Engine { h.Engine = e; return h } })
		b.submit(t, alpha, "alpha", "r", doc("a.pdf"), doc("b.pdf"))
		sc := b.openSession(t, hello("r-1", "i-1", 2), 2)
		sc.untilGrants(2)
		g := sc.grants
		waiting := h.arm()
		const messages = 10
		for range messages {
			sc.send(&leaseholdv1.SessionRequest{Heartbeats: []*leaseholdv1.LeaseRef{ref(g[0]), ref(g[1])}})
		}
		<-waiting
		close(h.release)
		var held int
		sc.until("every heartbeat answered", func() bool {
			held = 0
			for _, a := range sc.answers {
				held += len(a.GetLeases())
			}
			return held >= 2*messages
		})
		h.mu.Lock()
		defer h.mu.Unlock()
		for i, n := range h.longest {
			if n > 2 {
				t.Errorf("command %d named %d leases in one list, more than the capacity 2", i, n)
			}
		}
	})

	t.Run("A heartbeat stream's message naming more leases than its capacity ends the stream", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.submit(t, alpha, "alpha", "r", doc("a.pdf"), doc("b.pdf"))
		g := b.acquire(t, 2)
		before := b.snapshot(t)
		stream, err := b.rend.Heartbeat(as(t, renderer))
		if err != nil {
			t.Fatal(err)
		}
		if err := stream.Send(&leaseholdv1.HeartbeatRequest{RendererId: "r-1", Capacity: 1, Leases: []*leaseholdv1.LeaseRef{ref(g[0]), ref(g[1])}}); err != nil {
			t.Fatal(err)
		}
		_, err = stream.Recv()
		wantError(t, err, codes.InvalidArgument, reasonTooManyLeaseRefs)
		if diff := cmpDiff(before, b.snapshot(t)); diff != "" {
			t.Errorf("the refused message changed the state (-before +after):\n%s", diff)
		}
	})
}
