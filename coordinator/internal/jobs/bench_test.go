package jobs

import (
	"testing"
	"time"
)

// BenchmarkCheckLease measures the fencing predicate alone: the cost the
// writer pays per completion or heartbeat before any I/O.
func BenchmarkCheckLease(b *testing.B) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	j := New(1, 1, "alpha", Document{Name: "a.pdf"}, RetryPolicy{MaxAttempts: 5, BackoffBase: time.Second, BackoffCap: time.Minute}, false, t0)
	j, _ = j.Grant(7, "r-1", t0, 15*time.Second)
	now := t0.Add(time.Second)
	b.Run("Current", func(b *testing.B) {
		for b.Loop() {
			if j.CheckLease(7, "r-1", now) != nil {
				b.Fatal("refused the current token")
			}
		}
	})
	b.Run("Stale", func(b *testing.B) {
		for b.Loop() {
			if j.CheckLease(6, "r-1", now) == nil {
				b.Fatal("accepted a stale token")
			}
		}
	})
	b.Run("NotHolder", func(b *testing.B) {
		for b.Loop() {
			if j.CheckLease(7, "r-2", now) == nil {
				b.Fatal("accepted the current token from another renderer")
			}
		}
	})
}

// BenchmarkComplete measures the pure completion transition, applied and
// refused, without storage.
func BenchmarkComplete(b *testing.B) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	j := New(1, 1, "alpha", Document{Name: "a.pdf"}, RetryPolicy{MaxAttempts: 5, BackoffBase: time.Second, BackoffCap: time.Minute}, false, t0)
	j, _ = j.Grant(7, "r-1", t0, 15*time.Second)
	now := t0.Add(time.Second)
	b.Run("Applied", func(b *testing.B) {
		for b.Loop() {
			if _, _, err := j.Complete(Completion{Token: 7, Renderer: "r-1", Success: true, Digest: "d"}, now, 0.5); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("Rejected", func(b *testing.B) {
		for b.Loop() {
			if _, _, err := j.Complete(Completion{Token: 6, Renderer: "r-0", Success: true, Digest: "d"}, now, 0.5); err == nil {
				b.Fatal("accepted a stale completion")
			}
		}
	})
}
