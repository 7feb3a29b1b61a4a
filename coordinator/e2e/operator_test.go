package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
)

// TestPauseAndResumeDispatch pauses dispatch with the CLI, checks that
// submitted jobs stay QUEUED while renderers poll, and that they complete
// once dispatch resumes.
func TestPauseAndResumeDispatch(t *testing.T) {
	t.Parallel()
	coord := startCoordinator(t, "--lease-ttl", "5s")
	r := startRenderer(t, coord.Addr, "r1")
	alpha := dial(t, coord.Addr, tokenAlpha)
	rs := dialRenderer(t, coord.Addr)
	ctx := testContext(t)

	if res := runCLI(t, coord.Addr, tokenOperator, "pause", "--reason", "rolling out r2"); res.code != 0 {
		t.Fatalf("pause: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	sub, err := alpha.SubmitBatch(ctx, "alpha", "paused", []*leaseholdv1.Document{doc("p1.txt", "1"), doc("p2.txt", "2"), doc("p3.txt", "3")}, nil)
	if err != nil {
		t.Fatalf("SubmitBatch: %v", err)
	}
	batchID := sub.GetBatch().GetId()

	t.Run("paused dispatch grants nothing", func(t *testing.T) {
		for cycle := range 3 {
			// A full long poll: the renderer process polls meanwhile too.
			acq, err := rs.Acquire(ctx, &leaseholdv1.AcquireRequest{RendererId: "prober", MaxLeases: 4, Wait: durationpb.New(500 * time.Millisecond)})
			if err != nil {
				t.Fatalf("Acquire: %v", err)
			}
			if !acq.GetDispatchPaused() || len(acq.GetLeases()) != 0 {
				t.Errorf("cycle %d: Acquire = paused %v with %d leases, want paused with none", cycle, acq.GetDispatchPaused(), len(acq.GetLeases()))
			}
			b, err := alpha.GetBatch(ctx, batchID)
			if err != nil {
				t.Fatalf("GetBatch: %v", err)
			}
			if got := phaseCounts(b); got[leaseholdv1.Phase_PHASE_QUEUED] != 3 || len(got) != 1 {
				t.Errorf("cycle %d: batch counts = %v, want 3 QUEUED", cycle, got)
			}
		}
		if jobs := r.recordedJobs(t); len(jobs) != 0 {
			t.Errorf("renderer was handed %v while dispatch was paused", jobs)
		}
	})

	t.Run("resumed dispatch completes the jobs", func(t *testing.T) {
		if res := runCLI(t, coord.Addr, tokenOperator, "resume", "--reason", "r2 is fine"); res.code != 0 {
			t.Fatalf("resume: exit %d\n%s%s", res.code, res.stdout, res.stderr)
		}
		b := waitBatchDone(t, alpha, batchID)
		if got := phaseCounts(b); got[leaseholdv1.Phase_PHASE_SUCCEEDED] != 3 {
			t.Errorf("batch counts = %v, want 3 SUCCEEDED", got)
		}
	})

	t.Run("the audit trail shows the pause and the resume", func(t *testing.T) {
		res := runCLI(t, coord.Addr, tokenOperator, "audit", "-o", "json")
		if res.code != 0 {
			t.Fatalf("audit: exit %d\n%s", res.code, res.stderr)
		}
		lines := strings.Split(strings.TrimSpace(res.stdout), "\n")
		if len(lines) != 2 || !strings.Contains(lines[0], `"RESUME_DISPATCH"`) || !strings.Contains(lines[1], `"PAUSE_DISPATCH"`) ||
			!strings.Contains(lines[1], `"rolling out r2"`) {
			t.Errorf("audit = %q, want RESUME_DISPATCH then PAUSE_DISPATCH with its reason", lines)
		}
	})
}

// TestReplayFailedJobs fails a batch with a renderer that fails every
// render, then replays it with the CLI: the dry run changes nothing, the
// real run re-queues the jobs that a working renderer then completes, the
// audit trail records it, and an operator scoped to another team touches
// nothing.
func TestReplayFailedJobs(t *testing.T) {
	t.Parallel()
	coord := startCoordinator(t, "--lease-ttl", "5s", "--max-attempts", "1")
	bad := startRenderer(t, coord.Addr, "bad", "--fail-rate", "1")
	alpha := dial(t, coord.Addr, tokenAlpha)
	beta := dial(t, coord.Addr, tokenBeta)
	operatorAlpha := dial(t, coord.Addr, tokenOperatorAlpha)
	ctx := testContext(t)

	alphaBatch, err := alpha.SubmitBatch(ctx, "alpha", "to-replay", []*leaseholdv1.Document{doc("a1.pdf", "1"), doc("a2.pdf", "2"), doc("a3.pdf", "3")}, nil)
	if err != nil {
		t.Fatalf("SubmitBatch: %v", err)
	}
	betaBatch, err := beta.SubmitBatch(ctx, "beta", "out-of-scope", []*leaseholdv1.Document{doc("b1.pdf", "1"), doc("b2.pdf", "2")}, nil)
	if err != nil {
		t.Fatalf("SubmitBatch: %v", err)
	}
	alphaID, betaID := alphaBatch.GetBatch().GetId(), betaBatch.GetBatch().GetId()
	for _, b := range []*leaseholdv1.Batch{waitBatchDone(t, alpha, alphaID), waitBatchDone(t, beta, betaID)} {
		if got := phaseCounts(b); got[leaseholdv1.Phase_PHASE_FAILED] != b.GetJobCount() {
			t.Fatalf("batch %s counts = %v, want all %d FAILED", b.GetId(), got, b.GetJobCount())
		}
	}
	bad.Kill()
	startRenderer(t, coord.Addr, "good")

	t.Run("a dry run changes nothing", func(t *testing.T) {
		res := runCLI(t, coord.Addr, tokenOperator, "replay", "--batch", alphaID, "--reason", "fixed", "-o", "json")
		if res.code != 0 {
			t.Fatalf("replay dry run: exit %d\n%s%s", res.code, res.stdout, res.stderr)
		}
		if !strings.Contains(res.stdout, `"dry_run":true`) || !strings.Contains(res.stdout, `"requeued":3`) {
			t.Errorf("replay dry run output = %q, want a dry run that would requeue 3", res.stdout)
		}
		for _, j := range batchJobs(t, alpha, alphaID) {
			if j.GetPhase() != leaseholdv1.Phase_PHASE_FAILED || j.GetCycle() != 1 {
				t.Errorf("after the dry run job %s = %v in cycle %d, want PHASE_FAILED in cycle 1", j.GetId(), j.GetPhase(), j.GetCycle())
			}
		}
		if res := runCLI(t, coord.Addr, tokenOperator, "audit", "-o", "json"); strings.TrimSpace(res.stdout) != "" {
			t.Errorf("audit after a dry run = %q, want no records", res.stdout)
		}
	})

	t.Run("an operator scoped to another team touches nothing", func(t *testing.T) {
		res := runCLI(t, coord.Addr, tokenOperatorAlpha, "replay", "--batch", betaID, "--reason", "not mine", "--yes", "-o", "json")
		if res.code != 1 || !strings.Contains(res.stderr, "NOT_FOUND BATCH_NOT_FOUND") || strings.Contains(res.stderr, "beta") {
			t.Errorf("replay of another team's batch: exit %d\n%s%s\nwant exit 1, NOT_FOUND BATCH_NOT_FOUND and no team named", res.code, res.stdout, res.stderr)
		}
		var ids []string
		for _, j := range batchJobs(t, beta, betaID) {
			ids = append(ids, j.GetId())
		}
		resp, err := operatorAlpha.ReplayJobs(ctx, &leaseholdv1.ReplayJobsRequest{RequestId: "not-mine", JobIds: ids, Reason: "not mine"})
		if err != nil {
			t.Fatalf("ReplayJobs: %v", err)
		}
		if resp.GetOutOfScope() != 0 || resp.GetRequeued() != 0 || len(resp.GetItems()) != len(ids) {
			t.Errorf("ReplayJobs = %d out of scope, %d requeued, %d items; want 0, 0, %d", resp.GetOutOfScope(), resp.GetRequeued(), len(resp.GetItems()), len(ids))
		}
		for _, it := range resp.GetItems() {
			if it.GetSkipReason() != "JOB_NOT_FOUND" || it.GetTeam() != "" {
				t.Errorf("item %v: want JOB_NOT_FOUND with no team, as for an id that does not exist", it)
			}
		}
		for _, j := range batchJobs(t, beta, betaID) {
			if j.GetPhase() != leaseholdv1.Phase_PHASE_FAILED || j.GetCycle() != 1 {
				t.Errorf("beta job %s = %v in cycle %d, want untouched: PHASE_FAILED in cycle 1", j.GetId(), j.GetPhase(), j.GetCycle())
			}
		}
	})

	t.Run("replay with --yes re-queues the jobs and they succeed", func(t *testing.T) {
		res := runCLI(t, coord.Addr, tokenOperator, "replay", "--batch", alphaID, "--reason", "fixed", "--request-id", "replay-1", "--yes")
		if res.code != 0 {
			t.Fatalf("replay --yes: exit %d\n%s%s", res.code, res.stdout, res.stderr)
		}
		if !strings.Contains(res.stdout, "3 requeued") {
			t.Errorf("replay --yes output = %q, want 3 requeued", res.stdout)
		}
		waitBatchDone(t, alpha, alphaID)
		for _, j := range batchJobs(t, alpha, alphaID) {
			if j.GetPhase() != leaseholdv1.Phase_PHASE_SUCCEEDED || j.GetCycle() != 2 || j.GetAttempt() != 1 {
				t.Errorf("job %s = %v in cycle %d attempt %d, want PHASE_SUCCEEDED in cycle 2 attempt 1", j.GetId(), j.GetPhase(), j.GetCycle(), j.GetAttempt())
			}
		}
	})

	t.Run("the audit trail records the replay", func(t *testing.T) {
		res := runCLI(t, coord.Addr, tokenOperator, "audit", "-o", "json")
		if res.code != 0 {
			t.Fatalf("audit: exit %d\n%s", res.code, res.stderr)
		}
		var replay string
		for line := range strings.Lines(res.stdout) {
			if strings.Contains(line, `"request_id":"replay-1"`) {
				replay = line
			}
		}
		for _, want := range []string{`"action":"REPLAY"`, `"principal":"dev-operator"`, `"reason":"fixed"`, fmt.Sprintf(`"batch_id":%q`, alphaID)} {
			if !strings.Contains(replay, want) {
				t.Errorf("audit record of replay-1 = %q, want it to contain %s\nall records:\n%s", replay, want, res.stdout)
			}
		}
	})
}
