package engine

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/leasehold/leasehold/coordinator/internal/jobs"
)

func TestPauseDispatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("PauseStopsGrantsOnlyAndSurvivesARestart", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ids := b.submit(t, "alpha", "r1", "a.pdf", "b.pdf").JobIDs()
		held := b.acquire(t, "r-1", 1)[0]

		b.clock.Advance(time.Second)
		pausedAt := b.clock.Now()
		st, err := b.e.SetPaused(ctx, true, "ops", "rollout 1.2")
		if err != nil {
			t.Fatal(err)
		}
		want := jobs.DispatchState{Paused: true, Since: pausedAt, Principal: "ops", Reason: "rollout 1.2"}
		if diff := cmp.Diff(want, st); diff != "" {
			t.Errorf("SetPaused(true) (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff(want, b.e.DispatchState()); diff != "" {
			t.Errorf("DispatchState (-want +got):\n%s", diff)
		}
		res, err := acquire(ctx, b.e, acquireRequest{Renderer: rend("r-2"), Max: 10, Capacity: 4})
		if err != nil {
			t.Fatal(err)
		}
		if !res.Paused || len(res.Grants) != 0 || res.Waiter != nil {
			t.Fatalf("Acquire while paused = %d grants, paused %v; want none, paused", len(res.Grants), res.Paused)
		}

		// Everything but granting goes on.
		c := b.submit(t, "alpha", "r2", "c.pdf")
		hb, err := heartbeat(ctx, b.e, heartbeatRequest{Renderer: rend("r-1"), Leases: []LeaseRef{{Job: held.Job.ID, Token: held.Job.Lease.Token}}})
		if err != nil || len(hb.Leases) != 1 || !hb.Leases[0].Held {
			t.Fatalf("heartbeat while paused = %+v, %v; want held", hb, err)
		}
		done, err := complete(ctx, b.e, success(held.Job.ID, held.Job.Lease.Token, "r-1", "d"))
		if err != nil || done.Job.Phase != jobs.PhaseSucceeded {
			t.Fatalf("completion while paused = %v, %v; want SUCCEEDED", done.Job.Phase, err)
		}

		b.restart(t)
		if diff := cmp.Diff(want, b.e.DispatchState()); diff != "" {
			t.Errorf("DispatchState after a restart (-want +got):\n%s", diff)
		}
		// A long poll waits through the pause.
		res, err = acquire(ctx, b.e, acquireRequest{Renderer: rend("r-2"), Max: 10, Capacity: 4, Wait: true})
		if err != nil || !res.Paused || len(res.Grants) != 0 || res.Waiter == nil {
			t.Fatalf("Acquire after a restart = %d grants, paused %v, waiter %v, %v; want none, paused, waiting", len(res.Grants), res.Paused, res.Waiter != nil, err)
		}
		b.clock.Advance(time.Second)
		if err := b.e.Tick(ctx); err != nil {
			t.Fatal(err)
		}
		if gs, _, _ := take(res.Waiter); len(gs) != 0 {
			t.Fatalf("a waiter was granted %v while paused", grantedIDs(gs))
		}
		st, err = b.e.SetPaused(ctx, false, "ops", "rollout done")
		if err != nil {
			t.Fatal(err)
		}
		if st.Paused || b.e.DispatchState().Paused {
			t.Errorf("after SetPaused(false): answer %+v, state %+v; want running", st, b.e.DispatchState())
		}
		// The resume grants to the waiter in its own commit, all the
		// waiter asked for, in one delivery.
		granted, err := closeConn(ctx, b.e, res.Waiter, nil, false)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff([]uint64{ids[1], c.FirstJob}, grantedIDs(granted)); diff != "" {
			t.Errorf("grants to the waiter at resume (-want +got):\n%s", diff)
		}

		audit := b.allAudit(t)
		got := make([][3]string, len(audit))
		for i, a := range audit {
			got[i] = [3]string{a.Action, a.Principal, a.Reason}
		}
		wantAudit := [][3]string{{jobs.AuditResume, "ops", "rollout done"}, {jobs.AuditPause, "ops", "rollout 1.2"}}
		if diff := cmp.Diff(wantAudit, got); diff != "" {
			t.Errorf("audit, newest first (-want +got):\n%s", diff)
		}
	})

	t.Run("LeasesStillExpireAndStayFencedWhilePaused", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		id := b.submit(t, "alpha", "r1", "a.pdf").FirstJob
		g := b.acquire(t, "r-1", 1)[0]
		if _, err := b.e.SetPaused(ctx, true, "ops", "hold"); err != nil {
			t.Fatal(err)
		}
		b.tick(t, b.cfg.LeaseTTL)
		j := b.job(t, id)
		if j.Phase != jobs.PhaseRetryWait {
			t.Fatalf("lease past its deadline while paused: phase %v, want RETRY_WAIT", j.Phase)
		}
		if _, err := complete(ctx, b.e, success(id, g.Job.Lease.Token, "r-1", "late")); !errors.Is(err, jobs.ErrLeaseExpired) {
			t.Fatalf("late completion while paused: err = %v, want ErrLeaseExpired", err)
		}
		b.tick(t, j.NextAttemptAt.Sub(b.clock.Now()))
		if p := b.job(t, id).Phase; p != jobs.PhaseQueued {
			t.Fatalf("after the backoff while paused: phase %v, want QUEUED", p)
		}
		if got := b.acquireAll(t, "r-2"); len(got) != 0 {
			t.Fatalf("granted %v while paused", got)
		}
		if _, err := b.e.SetPaused(ctx, false, "ops", "go"); err != nil {
			t.Fatal(err)
		}
		gs := b.acquire(t, "r-2", 1)
		if len(gs) != 1 || gs[0].Job.Lease.Token <= g.Job.Lease.Token || gs[0].Job.Attempt != 2 {
			t.Fatalf("grant after resume = %+v, want attempt 2 under a token above %d", gs, g.Job.Lease.Token)
		}
	})
}
