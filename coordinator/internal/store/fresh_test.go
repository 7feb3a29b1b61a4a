package store_test

import (
	"testing"

	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	"github.com/leasehold/leasehold/coordinator/internal/store"
)

// TestHoldsRecords checks that a new file holds nothing, that reopening it
// writes nothing, and that any record, the dispatch switch as much as a
// job, counts.
func TestHoldsRecords(t *testing.T) {
	t.Parallel()
	b := setup(t)
	holds := func(when string, want bool) {
		t.Helper()
		if got, err := b.st.HoldsRecords(); err != nil || got != want {
			t.Errorf("HoldsRecords %s = %v, %v; want %v", when, got, err, want)
		}
	}
	holds("on a new file", false)
	b.close(t)
	b.open(t)
	holds("after reopening it", false)
	b.update(t, func(tx *store.Tx) error { return tx.PutDispatchState(jobs.DispatchState{Paused: true, Reason: "r"}) })
	holds("after the dispatch switch was written", true)
}
