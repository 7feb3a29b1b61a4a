package server

import (
	"strings"
	"testing"

	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"google.golang.org/grpc/codes"
)

// TestDeniedCancelsAreAggregated has an operator of team alpha cancel a
// job of team beta twenty times: each is refused as a job that does not
// exist, the first is audited at once, and the rest cost the writer
// nothing until their window ends, when one record counts them.
func TestDeniedCancelsAreAggregated(t *testing.T) {
	t.Parallel()
	b := setup(t)
	batch := b.submit(t, beta, "beta", "r", doc("b.pdf"))
	job := batch.GetJobIds()[0]
	denied := func() []*leaseholdv1.AuditRecord {
		t.Helper()
		resp, err := b.ops.GetAudit(as(t, operator), &leaseholdv1.GetAuditRequest{})
		if err != nil {
			t.Fatal(err)
		}
		var out []*leaseholdv1.AuditRecord
		for _, r := range resp.GetRecords() {
			if r.GetAction() == jobs.AuditDenied {
				out = append(out, r)
			}
		}
		return out
	}
	for i := range 20 {
		_, err := b.jobs.CancelJob(as(t, opAlpha), &leaseholdv1.CancelJobRequest{JobId: job, Reason: "attempt"})
		wantError(t, err, codes.NotFound, reasonJobNotFound)
		if i == 0 && len(denied()) != 1 {
			t.Fatalf("after the first refused cancel: %d DENIED records, want 1", len(denied()))
		}
	}
	if got := denied(); len(got) != 1 {
		t.Fatalf("after 20 refused cancels within the window: %d DENIED records, want 1", len(got))
	}
	b.services.Jobs.denied.flushAll() // the window's end
	got := denied()
	if len(got) != 2 {
		t.Fatalf("once the window ended: %d DENIED records, want 2", len(got))
	}
	if r := got[0]; !strings.Contains(r.GetReason(), "19 more cancels out of scope refused") || r.GetPrincipal() != "dev-operator-alpha" {
		t.Errorf("the window's record = %q by %s, want the 19 refusals after the first, by dev-operator-alpha", r.GetReason(), r.GetPrincipal())
	}
	b.services.Jobs.denied.flushAll()
	if n := len(denied()); n != 2 {
		t.Errorf("a window without refusals added records: %d, want 2", n)
	}
}
