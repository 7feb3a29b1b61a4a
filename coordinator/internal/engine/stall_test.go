package engine

import (
	"context"
	"testing"
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	"github.com/leasehold/leasehold/internal/testclock"
)

// stallCmd moves the injected clock by d while the writer applies it: the
// group it is in takes d, as a commit stuck on a frozen disk does.
type stallCmd struct {
	base
	noText
	clock *testclock.Clock
	d     time.Duration
}

func (c *stallCmd) evaluate(*group) error {
	c.clock.Advance(c.d)
	return nil
}

// TestStallDoesNotExpireLeases checks that the writer's own unavailability
// does not count against renderers: a lease that falls due while a group
// is stuck is kept for a grace after it, so that the heartbeats its
// renderer sent meanwhile are applied first; and that the grace is
// bounded, so a renderer that really went away still loses the lease.
func TestStallDoesNotExpireLeases(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const ttl = 15 * time.Second
	// leased returns a bundle whose renderer r1 holds one lease, granted
	// at the clock's start, due after ttl.
	leased := func(t *testing.T) (*testBundle, *Conn, Grant) {
		b := setup(t, func(c *Config) {
			c.StallAfter = 100 * time.Millisecond
			// The writer's own timer then only fires for the lease, whose
			// deadline is seconds away in real time: no group runs while
			// the test moves the clock, which would look like a stall.
			c.OverviewEvery = time.Hour
		})
		conn := b.openSession(t, "r1", 1)
		b.submit(t, "alpha", "req", "a.pdf")
		gs, _, _ := take(conn)
		if len(gs) != 1 {
			t.Fatalf("granted %d leases, want 1", len(gs))
		}
		return b, conn, gs[0]
	}
	// stall holds the writer in one group for d.
	stall := func(t *testing.T, b *testBundle, d time.Duration) {
		if err := b.e.do(ctx, &stallCmd{clock: b.clock, d: d}); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("A heartbeat applied after the stall keeps the lease", func(t *testing.T) {
		t.Parallel()
		b, conn, g := leased(t)
		b.tick(t, ttl-time.Second)
		// The lease falls due one second into a five-second stall.
		stall(t, b, 5*time.Second)
		b.tick(t, 0)
		res := b.send(t, conn, SessionInput{Heartbeats: refs([]Grant{g})})
		if len(res.Heartbeats) != 1 || !res.Heartbeats[0].Held {
			t.Fatalf("heartbeat after the stall = %+v, want the lease held", res.Heartbeats)
		}
		j := b.job(t, g.Job.ID)
		if j.Phase != jobs.PhaseLeased || j.Lease.Token != g.Job.Lease.Token || j.Attempt != 1 {
			t.Errorf("job after the stall = %s token %d attempt %d, want LEASED under token %d, attempt 1",
				j.Phase, j.Lease.Token, j.Attempt, g.Job.Lease.Token)
		}
	})

	t.Run("Without a heartbeat the lease expires when the grace ends", func(t *testing.T) {
		t.Parallel()
		b, _, g := leased(t)
		b.tick(t, ttl-time.Second)
		stall(t, b, 5*time.Second)
		b.tick(t, 0)
		b.tick(t, ttl/2-time.Millisecond)
		if j := b.job(t, g.Job.ID); j.Phase != jobs.PhaseLeased {
			t.Fatalf("job just before the grace ends = %s, want LEASED", j.Phase)
		}
		b.tick(t, time.Millisecond)
		if j := b.job(t, g.Job.ID); j.Phase != jobs.PhaseRetryWait {
			t.Errorf("job when the grace ends = %s, want RETRY_WAIT (expired)", j.Phase)
		}
	})

	t.Run("A short group is no stall", func(t *testing.T) {
		t.Parallel()
		b, _, g := leased(t)
		b.tick(t, ttl-time.Second)
		stall(t, b, 50*time.Millisecond)
		b.tick(t, time.Second)
		if j := b.job(t, g.Job.ID); j.Phase != jobs.PhaseRetryWait {
			t.Errorf("job a second after its deadline = %s, want RETRY_WAIT (expired)", j.Phase)
		}
	})
}
