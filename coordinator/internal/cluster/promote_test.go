package cluster

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"testing"
	"testing/synctest"
	"time"

	"github.com/hashicorp/raft"
	"github.com/leasehold/leasehold/coordinator/internal/engine"
	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	"github.com/leasehold/leasehold/coordinator/internal/store"
	"github.com/leasehold/leasehold/internal/testclock"
)

// TestPromotion drives the leadership's promotion of a real writer over
// a real store.
func TestPromotion(t *testing.T) {
	t.Parallel()
	const (
		ttl    = 10 * time.Second
		extend = 3 * time.Second
	)

	// A lease granted by the writer of one leadership is held through
	// the failover: a renderer that reaches the new leader a whole TTL
	// after the promotion (it noticed the failover late, and found the
	// leader after a few tries) still holds its lease, which expires once
	// the extension has passed too.
	t.Run("ALiveLeaseIsHeldATTLAfterThePromotionAndExpiresAfterTheExtension", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		clock := testclock.New(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
		st, err := store.Open(filepath.Join(t.TempDir(), "leasehold.db"), store.WithoutSync())
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		e, err := engine.New(engine.Config{Store: st, Now: clock.Now, LeaseTTL: ttl, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		defer e.Stop()
		e.Start()
		if _, err := e.Submit(ctx, engine.SubmitRequest{Team: "alpha", RequestID: "r1",
			Docs: []jobs.DocInput{{Document: jobs.Document{Name: "a.pdf", ContentType: "application/pdf"}, Content: []byte("a")}}}); err != nil {
			t.Fatal(err)
		}
		conn, _, err := e.Open(ctx, engine.SessionOpen{Renderer: engine.Renderer{ID: "r-1", Principal: "cred-r-1"}, Instance: "i-1", Capacity: 1, Credits: 1})
		if err != nil {
			t.Fatal(err)
		}
		grants, _, _ := conn.Outbox.Take()
		if len(grants) != 1 {
			t.Fatalf("granted %d leases, want 1", len(grants))
		}
		job := grants[0].Job.ID

		// The leader fails over to this node: its writer is demoted, and
		// the leadership promotes it once raft says it leads.
		e.Demote()
		r := newFakeRaft()
		r.setLeading(true)
		l := &leadership{raft: r, state: fakeState{}, eng: e, health: &fakeHealth{}, log: slog.New(slog.DiscardHandler),
			id: "n2", advertise: "n2:7070", extend: extend}
		if !l.promote(make(chan struct{})) {
			t.Fatal("the promotion failed")
		}
		phase := func() jobs.Phase {
			t.Helper()
			if err := e.Tick(ctx); err != nil {
				t.Fatal(err)
			}
			j, err := e.Job(job)
			if err != nil {
				t.Fatal(err)
			}
			return j.Phase
		}
		clock.Advance(ttl + extend/2)
		if p := phase(); p != jobs.PhaseLeased {
			t.Fatalf("the lease a TTL after the promotion, within the extension: %v, want LEASED", p)
		}
		clock.Advance(extend)
		if p := phase(); p == jobs.PhaseLeased {
			t.Fatal("the lease past the TTL and the extension: still LEASED")
		}
	})

	// The writer evaluates nothing until raft's barrier has applied to
	// the store every entry committed before this leadership: a writer
	// promoted earlier would rebuild its leases, tokens and queues from a
	// store that misses some of them.
	t.Run("NoWriterBeforeTheBarrierApplied", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			r := newFakeRaft()
			hold := make(chan struct{})
			r.barrier = hold
			eng, health := following(t, r)
			leading(r)
			if promoted, _ := eng.counts(); promoted != 0 || health.isLeading() {
				t.Fatalf("promoted %d times, Leader SERVING %v, while the barrier waits; want neither", promoted, health.isLeading())
			}
			close(hold)
			synctest.Wait()
			if promoted, _ := eng.counts(); promoted != 1 || !health.isLeading() || r.barrierCount() != 1 {
				t.Fatalf("after the barrier: promoted %d times with %d barriers, Leader SERVING %v; want once, one, true",
					promoted, r.barrierCount(), health.isLeading())
			}
		})
	})
}

// TestVerifyLeader: a linearizable read is served only after a quorum
// round confirmed that this node leads. A leader cut off from its
// followers, or paused, goes on believing it leads, and its writer goes
// on running, until its leader lease runs out and raft steps down.
func TestVerifyLeader(t *testing.T) {
	t.Parallel()
	r := newFakeRaft()
	r.setLeading(true)
	r.verifyErr = raft.ErrNotLeader
	eng := &fakeEngine{lostC: make(chan struct{})}
	l := &leadership{raft: r, state: fakeState{}, eng: eng, log: slog.New(slog.DiscardHandler)}
	if err := l.verify(context.Background()); !errors.Is(err, engine.ErrNotLeader) {
		t.Fatalf("verify on a leader that no quorum answers: %v, want ErrNotLeader", err)
	}
	r.mu.Lock()
	r.verifyErr = nil
	r.mu.Unlock()
	if err := l.verify(context.Background()); err != nil {
		t.Fatalf("verify on a leader a quorum confirms: %v", err)
	}
	eng.Demote()
	if err := l.verify(context.Background()); !errors.Is(err, engine.ErrNotLeader) {
		t.Fatalf("verify with the writer demoted: %v, want ErrNotLeader", err)
	}
}
