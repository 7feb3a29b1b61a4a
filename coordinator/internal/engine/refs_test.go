package engine

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/jobs"
)

// TestLeaseRefsAreBoundedByCapacity checks that a session's opening and
// messages name at most its capacity's leases in each list: a longer
// list is refused whole, and nothing of it is applied.
func TestLeaseRefsAreBoundedByCapacity(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("AnOpeningHoldingMoreThanItsCapacityIsRefusedAndRegistersNothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		held := make([]LeaseRef, 3)
		for i := range held {
			held[i] = LeaseRef{Job: uint64(i + 1), Token: 1}
		}
		_, _, err := b.e.Open(ctx, SessionOpen{Renderer: rend("r-1"), Instance: "i-1", Capacity: 2, Holding: held})
		if !errors.Is(err, ErrTooManyLeaseRefs) {
			t.Fatalf("Open holding 3 leases at capacity 2: err = %v, want ErrTooManyLeaseRefs", err)
		}
		// Nothing was registered: another process may take the id.
		if _, _, err := b.e.Open(ctx, SessionOpen{Renderer: rend("r-1"), Instance: "i-2", Capacity: 2, Holding: held[:2]}); err != nil {
			t.Fatalf("Open of another instance afterwards: %v", err)
		}
	})

	t.Run("AMessageNamingMoreThanItsCapacityIsRefusedWholeAndAppliesNothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.submit(t, "alpha", "r", "a.pdf", "b.pdf")
		conn := b.openSession(t, "r-1", 2) // capacity 4
		grants, _, _ := take(conn)
		if len(grants) != 2 {
			t.Fatalf("granted %d, want 2", len(grants))
		}
		before := b.allJobs(t)
		b.tick(t, time.Second)
		held := refs(grants)
		tooMany := append(append(append([]LeaseRef{}, held...), held...), held[0]) // 5 > 4
		for _, in := range []SessionInput{
			{Heartbeats: tooMany},
			{Received: tooMany},
			{HandBacks: tooMany},
			{Acks: tooMany},
			{Completions: []CompleteRequest{failure(held[0].Job, held[0].Token, "r-1", jobs.ClassTransient, "x"),
				failure(held[0].Job, held[0].Token, "r-1", jobs.ClassTransient, "x"), failure(held[0].Job, held[0].Token, "r-1", jobs.ClassTransient, "x"),
				failure(held[0].Job, held[0].Token, "r-1", jobs.ClassTransient, "x"), failure(held[0].Job, held[0].Token, "r-1", jobs.ClassTransient, "x")}},
			{Heartbeats: held, HandBacks: tooMany},
		} {
			if _, err := b.e.Receive(ctx, conn, in); !errors.Is(err, ErrTooManyLeaseRefs) {
				t.Errorf("Receive %+v: err = %v, want ErrTooManyLeaseRefs", in, err)
			}
		}
		after := b.allJobs(t)
		for i := range before {
			if !before[i].Lease.Deadline.Equal(after[i].Lease.Deadline) || before[i].Phase != after[i].Phase {
				t.Errorf("job %d changed under refused messages: %v %v -> %v %v", before[i].ID,
					before[i].Phase, before[i].Lease.Deadline, after[i].Phase, after[i].Lease.Deadline)
			}
		}
		// Within the capacity the same leases are heartbeated.
		res := b.send(t, conn, SessionInput{Heartbeats: append(held, held...)})
		if len(res.Heartbeats) != 4 || !res.Heartbeats[0].Held {
			t.Errorf("heartbeats within the capacity = %+v, want 4 answers, held", res.Heartbeats)
		}
	})

	t.Run("AStreamsBoundFollowsTheCapacityItDeclaresAndElseItsCredentials", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		r := Renderer{ID: "r-1", Principal: "cred", MaxCapacity: 3}
		conn, _, err := b.e.Open(ctx, SessionOpen{Renderer: r})
		if err != nil {
			t.Fatal(err)
		}
		four := []LeaseRef{{Job: 1, Token: 1}, {Job: 2, Token: 1}, {Job: 3, Token: 1}, {Job: 4, Token: 1}}
		if _, err := b.e.Receive(ctx, conn, SessionInput{Heartbeats: four}); !errors.Is(err, ErrTooManyLeaseRefs) {
			t.Errorf("4 heartbeats on a stream without capacity of a credential of max 3: err = %v, want ErrTooManyLeaseRefs", err)
		}
		if _, err := b.e.Receive(ctx, conn, SessionInput{Capacity: 4, Heartbeats: four}); err != nil {
			t.Errorf("4 heartbeats declaring capacity 4: %v", err)
		}
		if _, err := b.e.Receive(ctx, conn, SessionInput{Heartbeats: four}); err != nil {
			t.Errorf("4 heartbeats after declaring capacity 4: %v", err)
		}
	})
}

// TestMaxLeaseRefs checks the bound's arithmetic.
func TestMaxLeaseRefs(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		capacity, maxCapacity, want int
	}{
		{2, 1024, 2},
		{0, 64, 64},
		{0, 0, 1},
		{0, 100000, maxCredit},
		{9000, 0, maxCredit},
	} {
		if got := MaxLeaseRefs(tc.capacity, Renderer{MaxCapacity: tc.maxCapacity}); got != tc.want {
			t.Errorf("MaxLeaseRefs(%d, max %d) = %d, want %d", tc.capacity, tc.maxCapacity, got, tc.want)
		}
	}
}
