package e2e

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
)

// TestPoisonDocumentExhaustsItsAttempts renders a batch holding a document
// that crashes every renderer that touches it. The test restarts crashed
// renderers, as a pod supervisor would; the poison job must end FAILED
// (ATTEMPTS_EXHAUSTED) after exactly the maximum number of attempts while
// the other document succeeds.
func TestPoisonDocumentExhaustsItsAttempts(t *testing.T) {
	t.Parallel()
	coord := startCoordinator(t, "--lease-ttl", "1s", "--max-attempts", "3", "--backoff-base", "10ms", "--backoff-cap", "50ms")
	alpha := dial(t, coord.Addr, tokenAlpha)
	ctx := testContext(t)

	// capacity 1: a crash takes down only the poison lease.
	args := []string{"--capacity", "1", "--crash-on", "poison"}
	ids := []string{"r1", "r2"}
	renderers := make([]*renderer, len(ids))
	exits := make(chan int, 32) // index of a renderer that exited; buffered past the restart bound
	watchExit := func(i int) {
		p := renderers[i].Proc
		go func() {
			<-p.Exited()
			exits <- i
		}()
	}
	for i, id := range ids {
		renderers[i] = startRenderer(t, coord.Addr, id, args...)
		watchExit(i)
	}

	sub, err := alpha.SubmitBatch(ctx, "alpha", "poison", []*leaseholdv1.Document{doc("poison.txt", "crashes the renderer"), doc("normal.txt", "fine")}, nil)
	if err != nil {
		t.Fatalf("SubmitBatch: %v", err)
	}
	poisonID, normalID := sub.GetBatch().GetJobIds()[0], sub.GetBatch().GetJobIds()[1]
	done := make(chan error, 1)
	go func() {
		done <- alpha.WatchBatch(ctx, sub.GetBatch().GetId(), func(*leaseholdv1.WatchBatchResponse) error { return nil })
	}()

	// Supervise: restart every renderer that exits, until the batch is done.
	const maxRestarts = 10
	crashes := 0
supervise:
	for {
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("watching the batch: %v", err)
			}
			break supervise
		case i := <-exits:
			if code := renderers[i].WaitExit(); code != 3 {
				t.Errorf("renderer %s exited with %d, want 3 (the crash-on exit)", ids[i], code)
			}
			crashes++
			if crashes > maxRestarts {
				t.Fatalf("renderers crashed %d times; the batch never finished", crashes)
			}
			renderers[i] = startRendererRecording(t, coord.Addr, ids[i], renderers[i].record, args...)
			watchExit(i)
		}
	}

	poison, err := alpha.GetJob(ctx, poisonID)
	if err != nil {
		t.Fatalf("GetJob: %v", err)
	}
	if poison.GetPhase() != leaseholdv1.Phase_PHASE_FAILED || poison.GetTerminalReason() != leaseholdv1.TerminalReason_TERMINAL_REASON_ATTEMPTS_EXHAUSTED {
		t.Errorf("poison job = %v %v, want PHASE_FAILED TERMINAL_REASON_ATTEMPTS_EXHAUSTED", poison.GetPhase(), poison.GetTerminalReason())
	}
	if got := poison.GetAttempt(); got != 3 {
		t.Errorf("poison job attempts = %d, want 3", got)
	}
	var leased, expired int
	for _, ev := range poison.GetEvents() {
		switch ev.GetKind() {
		case leaseholdv1.EventKind_EVENT_KIND_LEASED:
			leased++
		case leaseholdv1.EventKind_EVENT_KIND_LEASE_EXPIRED:
			expired++
		}
	}
	if diff := cmp.Diff([2]int{3, 3}, [2]int{leased, expired}); diff != "" {
		t.Errorf("poison job LEASED, LEASE_EXPIRED events (-want +got):\n%s", diff)
	}
	if crashes != 3 {
		t.Errorf("renderer crashes = %d, want 3, one per attempt", crashes)
	}
	normal, err := alpha.GetJob(ctx, normalID)
	if err != nil {
		t.Fatalf("GetJob: %v", err)
	}
	if normal.GetPhase() != leaseholdv1.Phase_PHASE_SUCCEEDED {
		t.Errorf("normal job = %v (%s), want PHASE_SUCCEEDED", normal.GetPhase(), normal.GetTerminalMessage())
	}
}

// TestUnsupportedFormatFailsAtSubmission submits a macro-enabled document
// next to a plain one and checks that it ends FAILED (UNSUPPORTED_FORMAT)
// at once and that no renderer is ever handed it.
func TestUnsupportedFormatFailsAtSubmission(t *testing.T) {
	t.Parallel()
	coord := startCoordinator(t, "--lease-ttl", "5s")
	renderers := []*renderer{startRenderer(t, coord.Addr, "r1"), startRenderer(t, coord.Addr, "r2")}
	alpha := dial(t, coord.Addr, tokenAlpha)
	ctx := testContext(t)

	sub, err := alpha.SubmitBatch(ctx, "alpha", "macros", []*leaseholdv1.Document{doc("x.docm", "macro"), doc("fine.pdf", "fine")}, nil)
	if err != nil {
		t.Fatalf("SubmitBatch: %v", err)
	}
	macroID, fineID := sub.GetBatch().GetJobIds()[0], sub.GetBatch().GetJobIds()[1]
	if got := phaseCounts(sub.GetBatch())[leaseholdv1.Phase_PHASE_FAILED]; got != 1 {
		t.Errorf("SubmitBatch counts = %v, want 1 FAILED at once", sub.GetBatch().GetCounts())
	}
	waitBatchDone(t, alpha, sub.GetBatch().GetId())

	macro, err := alpha.GetJob(ctx, macroID)
	if err != nil {
		t.Fatalf("GetJob: %v", err)
	}
	if macro.GetPhase() != leaseholdv1.Phase_PHASE_FAILED || macro.GetTerminalReason() != leaseholdv1.TerminalReason_TERMINAL_REASON_UNSUPPORTED_FORMAT || macro.GetAttempt() != 0 {
		t.Errorf("x.docm job = %v %v after %d attempts, want PHASE_FAILED TERMINAL_REASON_UNSUPPORTED_FORMAT after 0",
			macro.GetPhase(), macro.GetTerminalReason(), macro.GetAttempt())
	}
	fine, err := alpha.GetJob(ctx, fineID)
	if err != nil {
		t.Fatalf("GetJob: %v", err)
	}
	if fine.GetPhase() != leaseholdv1.Phase_PHASE_SUCCEEDED {
		t.Errorf("fine.pdf job = %v, want PHASE_SUCCEEDED", fine.GetPhase())
	}
	for _, r := range renderers {
		if jobs := r.recordedJobs(t); jobs[macroID] {
			t.Errorf("renderer %s was handed the unsupported job %s", r.id, macroID)
		}
	}
	if !renderers[0].recordedJobs(t)[fineID] && !renderers[1].recordedJobs(t)[fineID] {
		t.Errorf("no renderer recorded %s, which succeeded; the record files are not being written", fineID)
	}
}
