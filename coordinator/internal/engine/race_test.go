package engine

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/jobs"
)

// TestConcurrentCommands fires commands that race in production at the
// writer from many goroutines at once and checks that its order decides
// each race exactly one way.
func TestConcurrentCommands(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("NoJobIsLeasedTwiceWhenRenderersAcquireTogether", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		names := make([]string, 200)
		for i := range names {
			names[i] = fmt.Sprintf("d%03d.pdf", i)
		}
		b.submit(t, "alpha", "r1", names[:100]...)
		b.submit(t, "beta", "r2", names[100:]...)
		const renderers = 16
		start := make(chan struct{})
		grants := make([][]Grant, renderers)
		var wg sync.WaitGroup
		for r := range renderers {
			wg.Go(func() {
				<-start
				for {
					res, err := acquire(ctx, b.e, acquireRequest{Renderer: rend(fmt.Sprintf("r-%d", r)), Max: 3, Capacity: 3})
					if err != nil {
						t.Error(err)
						return
					}
					if len(res.Grants) == 0 {
						return
					}
					grants[r] = append(grants[r], res.Grants...)
				}
			})
		}
		close(start)
		wg.Wait()
		seen := map[uint64]bool{}
		tokens := map[uint64]bool{}
		for _, gs := range grants {
			for _, g := range gs {
				if seen[g.Job.ID] {
					t.Fatalf("job %d leased twice", g.Job.ID)
				}
				if tokens[g.Job.Lease.Token] {
					t.Fatalf("token %d granted twice", g.Job.Lease.Token)
				}
				seen[g.Job.ID], tokens[g.Job.Lease.Token] = true, true
			}
		}
		if len(seen) != 200 {
			t.Fatalf("leased %d distinct jobs, want all 200", len(seen))
		}
	})

	t.Run("ConcurrentSubmitsWithOneRequestIDStoreOneBatch", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		const callers = 12
		ids := make([]uint64, callers)
		replayed := make([]bool, callers)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range callers {
			wg.Go(func() {
				<-start
				res, err := b.e.Submit(ctx, SubmitRequest{Team: "alpha", RequestID: "same", Docs: docs("a.pdf", "b.pdf")})
				if err != nil {
					t.Error(err)
					return
				}
				ids[i], replayed[i] = res.Batch.Batch.ID, res.Replayed
				// A replay in the same group as the first submit still
				// sees its counts.
				if res.Batch.Counts != (jobs.Counts{jobs.PhaseQueued: 2}) || res.Batch.Done {
					t.Errorf("caller %d (replayed %v): counts %v done %v, want 2 QUEUED", i, res.Replayed, res.Batch.Counts, res.Batch.Done)
				}
			})
		}
		close(start)
		wg.Wait()
		first := 0
		for i := range callers {
			if ids[i] != ids[0] {
				t.Fatalf("caller %d got batch %d, caller 0 got %d", i, ids[i], ids[0])
			}
			if !replayed[i] {
				first++
			}
		}
		if first != 1 {
			t.Fatalf("%d callers stored the batch, want exactly 1", first)
		}
		if all := b.allJobs(t); len(all) != 2 {
			t.Fatalf("stored %d jobs, want 2", len(all))
		}
	})

	t.Run("AHeartbeatAfterTheDeadlineLosesEvenBeforeTheTimerFires", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		batch := b.submit(t, "alpha", "r1", "a.pdf")
		g := b.acquire(t, "r-1", 1)[0]
		// No Tick: the writer must expire the lease in order, at the start
		// of the group that carries the late heartbeat.
		b.clock.Advance(15 * time.Second)
		hb, err := heartbeat(ctx, b.e, heartbeatRequest{Renderer: rend("r-1"), Leases: []LeaseRef{{Job: g.Job.ID, Token: g.Job.Lease.Token}}})
		if err != nil {
			t.Fatal(err)
		}
		if st := hb.Leases[0]; st.Held || st.Reason != "LEASE_EXPIRED" {
			t.Fatalf("late heartbeat = %+v, want LOST LEASE_EXPIRED", st)
		}
		if j := b.job(t, batch.FirstJob); j.Phase != jobs.PhaseRetryWait || j.Attempt != 1 {
			t.Fatalf("job = %v attempt %d, want RETRY_WAIT after one attempt", j.Phase, j.Attempt)
		}
		_, err = complete(ctx, b.e, success(g.Job.ID, g.Job.Lease.Token, "r-1", "d"))
		if !errors.Is(err, jobs.ErrLeaseExpired) {
			t.Fatalf("completion after the lost heartbeat: %v, want ErrLeaseExpired", err)
		}
	})
}
