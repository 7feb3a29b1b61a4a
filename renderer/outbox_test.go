package renderer

import (
	"fmt"
	"testing"

	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
)

// TestRequestListsStayWithinCapacity fills the outbox and the receipts with
// more than the renderer's capacity: each request takes at most the
// capacity's items in each list, in order, and the rest go in the next,
// as the coordinator refuses a longer list (TOO_MANY_LEASE_REFS).
func TestRequestListsStayWithinCapacity(t *testing.T) {
	t.Parallel()
	const capacity = 2
	o := &outbox{sent: map[leaseKey]*outgoing{}}
	var refs []*leaseholdv1.LeaseRef
	for i := range 5 {
		key := leaseKey{jobID: fmt.Sprintf("j-%d", i+1), token: 1}
		o.add(key, &completion{msg: &leaseholdv1.SessionCompletion{JobId: key.jobID, Token: key.token}})
		o.add(leaseKey{jobID: fmt.Sprintf("j-%d", i+10), token: 1}, nil)
		refs = append(refs, key.ref())
	}
	var completions, handBacks, receipts []string
	for range 3 {
		req := &leaseholdv1.SessionRequest{}
		z := &sizer{budget: 1 << 20, items: capacity}
		req.Received, refs = z.takeRefs(refs)
		o.take(z, req)
		if len(req.GetCompletions()) > capacity || len(req.GetHandBacks()) > capacity || len(req.GetReceived()) > capacity {
			t.Errorf("a request of %d completions, %d hand-backs, %d receipts; want at most %d each",
				len(req.GetCompletions()), len(req.GetHandBacks()), len(req.GetReceived()), capacity)
		}
		for _, c := range req.GetCompletions() {
			completions = append(completions, c.GetJobId())
		}
		for _, h := range req.GetHandBacks() {
			handBacks = append(handBacks, h.GetJobId())
		}
		for _, r := range req.GetReceived() {
			receipts = append(receipts, r.GetJobId())
		}
	}
	if len(receipts) != 5 || receipts[4] != "j-5" {
		t.Errorf("receipts sent in order = %v, want j-1 to j-5", receipts)
	}
	if fmt.Sprint(completions, handBacks) != "[j-1 j-2 j-3 j-4 j-5] [j-10 j-11 j-12 j-13 j-14]" {
		t.Errorf("outbox items sent = %v and %v, want all in order", completions, handBacks)
	}
}
