package e2e

import (
	"strconv"
	"syscall"
	"testing"
	"time"

	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"github.com/leasehold/leasehold/internal/proctest"
)

// TestRendererDrainsOnSIGTERM sends SIGTERM to renderers holding leases:
// one whose renders finish within its drain timeout completes them, one
// whose renders would outlast it hands them back at once (REQUEUED
// HANDED_BACK, no attempt counted) and exits 0, long before the leases'
// TTL; another renderer then completes the handed-back jobs as their first
// counted attempt.
func TestRendererDrainsOnSIGTERM(t *testing.T) {
	t.Parallel()
	coord := startCoordinator(t, "--lease-ttl", "60s")
	alpha := dial(t, coord.Addr, tokenAlpha)
	ctx := testContext(t)

	t.Run("renders that finish within the drain timeout complete", func(t *testing.T) {
		r := startRenderer(t, coord.Addr, "quick", "--capacity", "1", "--latency", "300ms", "--drain-timeout", "30s")
		res, err := alpha.SubmitBatch(ctx, "alpha", "drain-quick", []*leaseholdv1.Document{doc("q.txt", "q")}, nil)
		if err != nil {
			t.Fatalf("SubmitBatch: %v", err)
		}
		id := res.GetBatch().GetJobIds()[0]
		r.WaitFor("lease acquired", "job="+id+" ")
		r.Signal(syscall.SIGTERM)
		if code := r.WaitExit(); code != 0 {
			t.Fatalf("renderer exit status = %d, want 0", code)
		}
		j, err := alpha.GetJob(ctx, id)
		if err != nil {
			t.Fatalf("GetJob: %v", err)
		}
		if j.GetPhase() != leaseholdv1.Phase_PHASE_SUCCEEDED || j.GetArtifact().GetRendererId() != "quick" {
			t.Errorf("job after the drain = %v by %q, want SUCCEEDED by the draining renderer", j.GetPhase(), j.GetArtifact().GetRendererId())
		}
	})

	t.Run("renders that would outlast the drain timeout are handed back uncounted", func(t *testing.T) {
		slow := startRenderer(t, coord.Addr, "slow", "--capacity", "2", "--latency", "1h", "--drain-timeout", "200ms")
		res, err := alpha.SubmitBatch(ctx, "alpha", "drain-slow", []*leaseholdv1.Document{doc("s1.txt", "1"), doc("s2.txt", "2")}, nil)
		if err != nil {
			t.Fatalf("SubmitBatch: %v", err)
		}
		ids := res.GetBatch().GetJobIds()
		for _, id := range ids {
			slow.WaitFor("lease acquired", "job="+id+" ")
		}
		slow.Signal(syscall.SIGTERM)
		if code := slow.WaitExit(); code != 0 {
			t.Fatalf("renderer exit status = %d, want 0", code)
		}
		// The hand-backs were answered before the renderer exited: the jobs
		// are queued again now, with their attempt not counted, although
		// their 60 s leases are far from expiring.
		for _, id := range ids {
			j, err := alpha.GetJob(ctx, id)
			if err != nil {
				t.Fatalf("GetJob(%s): %v", id, err)
			}
			if j.GetPhase() != leaseholdv1.Phase_PHASE_QUEUED || j.GetAttempt() != 0 {
				t.Errorf("%s after the drain = %v attempt %d, want QUEUED attempt 0", id, j.GetPhase(), j.GetAttempt())
			}
			if !hasEvent(j, leaseholdv1.EventKind_EVENT_KIND_REQUEUED, "HANDED_BACK") {
				t.Errorf("%s history lacks REQUEUED HANDED_BACK: %v", id, j.GetEvents())
			}
		}
		startRenderer(t, coord.Addr, "next", "--capacity", "2")
		waitBatchDone(t, alpha, res.GetBatch().GetId())
		for _, id := range ids {
			j, err := alpha.GetJob(ctx, id)
			if err != nil {
				t.Fatalf("GetJob(%s): %v", id, err)
			}
			if j.GetPhase() != leaseholdv1.Phase_PHASE_SUCCEEDED || j.GetAttempt() != 1 {
				t.Errorf("%s = %v attempt %d, want SUCCEEDED on attempt 1", id, j.GetPhase(), j.GetAttempt())
			}
		}
	})
}

// TestRendererRidesOutACoordinatorOutage keeps the coordinator down for
// longer than a renderer's reconnect backoff used to reach (5 s), then
// starts it again on the same address: the renderer's session comes back,
// lists the lease it still holds, and completes it under its original
// token. How long the renderer took to come back is logged, not asserted.
func TestRendererRidesOutACoordinatorOutage(t *testing.T) {
	t.Parallel()
	const outage = 6 * time.Second
	coord := startCoordinator(t, "--lease-ttl", "30s")
	r := startRenderer(t, coord.Addr, "r1", "--capacity", "1", "--latency", "4s")
	alpha := dial(t, coord.Addr, tokenAlpha)
	ctx := testContext(t)
	res, err := alpha.SubmitBatch(ctx, "alpha", "outage", []*leaseholdv1.Document{doc("o.txt", "o")}, nil)
	if err != nil {
		t.Fatalf("SubmitBatch: %v", err)
	}
	id := res.GetBatch().GetJobIds()[0]
	line := r.WaitFor("lease acquired", "job="+id+" ")
	token := proctest.LogAttr(line, "token")

	down := r.Mark()
	coord.Kill()
	r.WaitFrom(down, "session ended")
	// The outage itself: its length is the fault under test, not a wait
	// for something to happen.
	time.Sleep(outage)
	back := r.Mark()
	coord = startCoordinatorAt(t, coord.Addr, coord.DataDir, "--lease-ttl", "30s")
	up := time.Now()
	r.WaitFrom(back, "session started")
	t.Logf("after a %v outage the renderer's session was back %v after the coordinator served again", outage, time.Since(up))

	alpha = dial(t, coord.Addr, tokenAlpha)
	waitBatchDone(t, alpha, res.GetBatch().GetId())
	j, err := alpha.GetJob(testContext(t), id)
	if err != nil {
		t.Fatalf("GetJob: %v", err)
	}
	if j.GetPhase() != leaseholdv1.Phase_PHASE_SUCCEEDED || j.GetAttempt() != 1 || token == "" ||
		token != strconv.FormatUint(j.GetArtifact().GetToken(), 10) {
		t.Errorf("job = %v attempt %d artifact token %d, want SUCCEEDED on attempt 1 under the original token %s",
			j.GetPhase(), j.GetAttempt(), j.GetArtifact().GetToken(), token)
	}
}

// TestWatchResumesAcrossARestart follows a batch with `leasehold watch`
// while the coordinator is killed and started again: the command carries
// on, ends when the batch is done, and prints each job's outcome once.
func TestWatchResumesAcrossARestart(t *testing.T) {
	t.Parallel()
	coord := startCoordinator(t)
	r := startRenderer(t, coord.Addr, "r1", "--capacity", "1", "--latency", "700ms")
	alpha := dial(t, coord.Addr, tokenAlpha)
	ctx := testContext(t)
	res, err := alpha.SubmitBatch(ctx, "alpha", "watched", []*leaseholdv1.Document{doc("w1.txt", "1"), doc("w2.txt", "2"), doc("w3.txt", "3")}, nil)
	if err != nil {
		t.Fatalf("SubmitBatch: %v", err)
	}
	batchID := res.GetBatch().GetId()
	ids := res.GetBatch().GetJobIds()
	watch := procs.Start(t, "watch", bins.cli, "--addr", coord.Addr, "--token", tokenAlpha, "watch", batchID)
	watch.WaitFor("job " + ids[0] + " SUCCEEDED")

	back := r.Mark()
	coord = coord.restart(t)
	r.WaitFrom(back, "session started")
	if code := watch.WaitExit(); code != 0 {
		t.Fatalf("watch exit status = %d, want 0", code)
	}
	for _, id := range ids {
		if n := len(watch.LinesWith("job " + id + " SUCCEEDED")); n != 1 {
			t.Errorf("lines announcing %s SUCCEEDED = %d, want exactly 1 across the restart", id, n)
		}
	}
}

// hasEvent reports whether j's history has an event of kind with reason.
func hasEvent(j *leaseholdv1.Job, kind leaseholdv1.EventKind, reason string) bool {
	for _, ev := range j.GetEvents() {
		if ev.GetKind() == kind && ev.GetReason() == reason {
			return true
		}
	}
	return false
}
