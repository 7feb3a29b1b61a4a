package server

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"google.golang.org/protobuf/testing/protocmp"
)

// TestRepliesCarryTheWholeHistoryOrNone checks Job.events in the replies
// that carry a job: the whole history (CancelJob, as GetJob), or none at
// all (Complete, documented), never the events of the call alone.
func TestRepliesCarryTheWholeHistoryOrNone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	g := b.leaseOne(t)
	b.submit(t, alpha, "alpha", "second", doc("queued.pdf"))

	resp, err := b.jobs.CancelJob(as(t, alpha), &leaseholdv1.CancelJobRequest{JobId: g.GetJobId(), Reason: "not needed"})
	if err != nil {
		t.Fatal(err)
	}
	want := b.getJob(t, g.GetJobId()).GetEvents()
	if len(want) < 3 {
		t.Fatalf("history after the cancel = %v, want SUBMITTED, LEASED, CANCELLED", want)
	}
	if diff := cmp.Diff(want, resp.GetJob().GetEvents(), protocmp.Transform()); diff != "" {
		t.Errorf("CancelJob's history differs from GetJob's (-GetJob +CancelJob):\n%s", diff)
	}
	again, err := b.jobs.CancelJob(as(t, alpha), &leaseholdv1.CancelJobRequest{JobId: g.GetJobId()})
	if err != nil || !again.GetAlreadyCancelled() {
		t.Fatalf("second CancelJob = %v, %v", again, err)
	}
	if diff := cmp.Diff(want, again.GetJob().GetEvents(), protocmp.Transform()); diff != "" {
		t.Errorf("a repeated CancelJob's history differs from GetJob's (-GetJob +CancelJob):\n%s", diff)
	}

	g2 := b.acquire(t, 1)[0]
	done, err := b.rend.Complete(as(t, renderer), failure(g2, leaseholdv1.FailureClass_FAILURE_CLASS_INVALID_DOCUMENT))
	if err != nil {
		t.Fatal(err)
	}
	if evs := done.GetJob().GetEvents(); len(evs) != 0 {
		t.Errorf("Complete's job carries %d events, want none (its reply leaves the history out)", len(evs))
	}
}
