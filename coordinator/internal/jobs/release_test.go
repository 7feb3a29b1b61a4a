package jobs

import (
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestRelease(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	policy := RetryPolicy{MaxAttempts: 3, BackoffBase: time.Second, BackoffCap: time.Minute}
	queued := New(1, 1, "alpha", Document{Name: "a.pdf"}, policy, false, t0)
	leased, err := queued.Grant(9, "r-1", t0, 15*time.Second)
	if err != nil {
		t.Fatal(err)
	}

	t.Run("An undelivered lease returns the job to QUEUED without counting the attempt", func(t *testing.T) {
		got, err := leased.Release(9, t0.Add(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if got.Phase != PhaseQueued || got.Attempt != 0 || got.Lease != (Lease{}) || !got.EnqueuedAt.Equal(t0.Add(time.Second)) {
			t.Fatalf("released = %v attempt %d lease %+v enqueued %v", got.Phase, got.Attempt, got.Lease, got.EnqueuedAt)
		}
		if err := got.CheckLease(9, t0.Add(time.Second)); !errors.Is(err, ErrStaleLease) {
			t.Fatalf("the released token afterwards: %v, want ErrStaleLease", err)
		}
	})
	t.Run("Another token or another phase is refused and changes nothing", func(t *testing.T) {
		for _, tc := range []struct {
			name  string
			job   Job
			token uint64
		}{{"wrong token", leased, 8}, {"queued job", queued, 9}} {
			got, err := tc.job.Release(tc.token, t0)
			if !errors.Is(err, ErrIllegalTransition) {
				t.Errorf("%s: err = %v, want ErrIllegalTransition", tc.name, err)
			}
			if diff := cmp.Diff(tc.job, got); diff != "" {
				t.Errorf("%s: refused release changed the job:\n%s", tc.name, diff)
			}
		}
	})
}
