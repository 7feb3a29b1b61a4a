package e2e

import (
	"testing"

	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
)

// TestRestartKeepsLeasesAndTokens kills the coordinator with SIGKILL while a
// renderer holds leases, restarts it on the same port and data directory,
// and checks that the renderer's leases, still inside their deadlines,
// complete under their original tokens, and that every token granted after
// the restart is larger than every token granted before it.
func TestRestartKeepsLeasesAndTokens(t *testing.T) {
	t.Parallel()
	coord := startCoordinator(t, "--lease-ttl", "20s")
	r := startRenderer(t, coord.Addr, "r1", "--capacity", "2", "--latency", "2s")
	alpha := dial(t, coord.Addr, tokenAlpha)
	ctx := testContext(t)

	// A first batch that completes before the crash, so tokens exist that
	// are not held by any lease.
	first, err := alpha.SubmitBatch(ctx, "alpha", "before-1", []*leaseholdv1.Document{doc("warmup.txt", "warm up")}, nil)
	if err != nil {
		t.Fatalf("SubmitBatch: %v", err)
	}
	waitBatchDone(t, alpha, first.GetBatch().GetId())

	held, err := alpha.SubmitBatch(ctx, "alpha", "before-2", []*leaseholdv1.Document{doc("a.txt", "a"), doc("b.txt", "b")}, nil)
	if err != nil {
		t.Fatalf("SubmitBatch: %v", err)
	}
	heldIDs := held.GetBatch().GetJobIds()
	for _, id := range heldIDs {
		r.WaitFor("lease acquired", "job="+id+" ")
	}
	original := map[string]uint64{}
	var maxBefore uint64
	for _, id := range append(heldIDs, first.GetBatch().GetJobIds()...) {
		j, err := alpha.GetJob(ctx, id)
		if err != nil {
			t.Fatalf("GetJob(%s): %v", id, err)
		}
		for _, ev := range j.GetEvents() {
			maxBefore = max(maxBefore, ev.GetToken())
		}
		if j.GetPhase() == leaseholdv1.Phase_PHASE_LEASED {
			original[id] = j.GetLease().GetToken()
		}
	}
	if len(original) != len(heldIDs) {
		t.Fatalf("leased jobs before the crash = %v, want all of %v leased", original, heldIDs)
	}

	coord = coord.restart(t, "--lease-ttl", "20s")
	alpha = dial(t, coord.Addr, tokenAlpha)
	ctx = testContext(t)

	t.Run("leases granted before the crash complete under their original tokens", func(t *testing.T) {
		r.WaitFor("session ended") // the renderer saw the crash
		waitBatchDone(t, alpha, held.GetBatch().GetId())
		for id, token := range original {
			j, err := alpha.GetJob(ctx, id)
			if err != nil {
				t.Fatalf("GetJob(%s): %v", id, err)
			}
			if j.GetPhase() != leaseholdv1.Phase_PHASE_SUCCEEDED {
				t.Errorf("job %s phase = %v (%s), want PHASE_SUCCEEDED", id, j.GetPhase(), j.GetTerminalMessage())
			}
			if got := j.GetArtifact().GetToken(); got != token {
				t.Errorf("job %s artifact token = %d, want the lease token from before the crash %d", id, got, token)
			}
			if got := j.GetAttempt(); got != 1 {
				t.Errorf("job %s attempt = %d, want 1 (the lease survived the restart)", id, got)
			}
		}
		if lines := r.LinesWith("completion rejected"); len(lines) != 0 {
			t.Errorf("renderer had completions rejected: %q", lines)
		}
	})

	t.Run("tokens granted after the restart are larger than every earlier token", func(t *testing.T) {
		after, err := alpha.SubmitBatch(ctx, "alpha", "after-1", []*leaseholdv1.Document{doc("c.txt", "c"), doc("d.txt", "d")}, nil)
		if err != nil {
			t.Fatalf("SubmitBatch: %v", err)
		}
		waitBatchDone(t, alpha, after.GetBatch().GetId())
		for _, id := range after.GetBatch().GetJobIds() {
			j, err := alpha.GetJob(ctx, id)
			if err != nil {
				t.Fatalf("GetJob(%s): %v", id, err)
			}
			if got := j.GetArtifact().GetToken(); got <= maxBefore {
				t.Errorf("job %s was completed under token %d, want a token larger than %d, the largest before the restart", id, got, maxBefore)
			}
		}
	})
}
