package server

import (
	"fmt"
	"testing"

	"github.com/leasehold/leasehold/coordinator/internal/engine"
	"github.com/leasehold/leasehold/coordinator/internal/reads"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
)

// TestListJobsScanBudget checks that a page which runs out of its scan
// budget comes back short with a next_page_token, and that following the
// tokens to the end finds every match exactly once.
func TestListJobsScanBudget(t *testing.T) {
	t.Parallel()
	const n = reads.ScanBudget + 10
	b := setup(t, func(o *options) { o.engine = func(c *engine.Config) { c.Limits.MaxDocuments = n } })
	docs := make([]*leaseholdv1.Document, n)
	for i := range docs {
		docs[i] = &leaseholdv1.Document{Name: fmt.Sprintf("d%05d.pdf", i), Content: []byte("x")}
	}
	ids := b.submit(t, alpha, "alpha", "r", docs...).GetJobIds()
	b.submit(t, beta, "beta", "r", doc("other.pdf"))
	last := ids[n-1]
	if _, err := b.jobs.CancelJob(as(t, alpha), &leaseholdv1.CancelJobRequest{JobId: last}); err != nil {
		t.Fatal(err)
	}
	for _, caller := range []struct{ name, token string }{{"operator of every team", operator}, {"submitter", alpha}} {
		t.Run("The "+caller.name+" follows short pages to the one match", func(t *testing.T) {
			var found []string
			pages, token := 0, ""
			for {
				resp, err := b.jobs.ListJobs(as(t, caller.token), &leaseholdv1.ListJobsRequest{Phase: leaseholdv1.Phase_PHASE_CANCELLED, PageSize: 10, PageToken: token, OmitEvents: true})
				if err != nil {
					t.Fatal(err)
				}
				pages++
				for _, j := range resp.GetJobs() {
					found = append(found, j.GetId())
				}
				if token = resp.GetNextPageToken(); token == "" {
					break
				}
				if pages > 10 {
					t.Fatal("more than 10 pages for one match")
				}
			}
			if diff := cmpDiff([]string{last}, found); diff != "" {
				t.Errorf("cancelled jobs (-want +got):\n%s", diff)
			}
			if pages < 2 {
				t.Errorf("%d page(s); the first page cannot reach job %s within its scan budget", pages, last)
			}
		})
	}
}
