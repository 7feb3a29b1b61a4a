package engine

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/jobs"
)

// failsafe bounds every wait on a channel the engine should close or send
// on. It is generous: it only turns a hang into a failure.
const failsafe = 10 * time.Second

// failure is a renderer's classified failure of the attempt under token.
func failure(job, token uint64, renderer string, class jobs.FailureClass, msg string) CompleteRequest {
	return CompleteRequest{Job: job, Completion: jobs.Completion{Token: token, Renderer: renderer, Class: class, Message: msg}}
}

// acquireAll grants every lease the engine will hand out now and returns
// the granted job ids in grant order.
func (b *testBundle) acquireAll(t *testing.T, renderer string) []uint64 {
	t.Helper()
	var ids []uint64
	for _, g := range b.acquire(t, renderer, 10_000) {
		ids = append(ids, g.Job.ID)
	}
	return ids
}

// tick moves the clock by d and lets the writer expire and re-queue what
// became due.
func (b *testBundle) tick(t *testing.T, d time.Duration) {
	t.Helper()
	b.clock.Advance(d)
	if err := b.e.Tick(context.Background()); err != nil {
		t.Fatalf("Tick: %v", err)
	}
}

// allJobs lists every stored job in id order.
func (b *testBundle) allJobs(t *testing.T) []jobs.Job {
	t.Helper()
	var out []jobs.Job
	var after uint64
	for {
		page, err := b.e.ListJobs(JobFilter{After: after, Limit: 1000})
		if err != nil {
			t.Fatalf("ListJobs: %v", err)
		}
		out = append(out, page...)
		if len(page) < 1000 {
			return out
		}
		after = page[len(page)-1].ID
	}
}

// allAudit lists every audit record, newest first.
func (b *testBundle) allAudit(t *testing.T) []jobs.AuditRecord {
	t.Helper()
	recs, err := b.e.ListAudit(0, 10_000)
	if err != nil {
		t.Fatalf("ListAudit: %v", err)
	}
	return recs
}

// rejections lists the recorded rejections of one job, newest first.
func (b *testBundle) rejections(t *testing.T, job uint64) []jobs.Rejection {
	t.Helper()
	rej, err := b.e.ListRejections(RejectionFilter{Job: job, Limit: 10_000})
	if err != nil {
		t.Fatalf("ListRejections: %v", err)
	}
	return rej
}

// countEvents counts the events of kind in j's history.
func countEvents(j jobs.Job, kind jobs.EventKind) int {
	n := 0
	for _, ev := range j.Events {
		if ev.Kind == kind {
			n++
		}
	}
	return n
}

// terminalEvents counts j's terminal transitions (SUCCEEDED, FAILED,
// CANCELLED events).
func terminalEvents(j jobs.Job) int {
	return countEvents(j, jobs.EventSucceeded) + countEvents(j, jobs.EventFailed) + countEvents(j, jobs.EventCancelled)
}

// assertNotGranted fails when any of ids is among granted.
func assertNotGranted(t *testing.T, granted []uint64, ids ...uint64) {
	t.Helper()
	for _, id := range ids {
		if slices.Contains(granted, id) {
			t.Errorf("job %d was granted (grants %v), want it never dispatched", id, granted)
		}
	}
}

// waitClosed fails unless c is closed within the failsafe timeout.
func waitClosed(t *testing.T, c <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-c:
	case <-time.After(failsafe):
		t.Fatalf("%s: not closed after %v", what, failsafe)
	}
}
