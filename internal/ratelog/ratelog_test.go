package ratelog

import (
	"testing"
	"time"
)

// TestAllow: one event of a kind per interval is let through, the first
// at once; the next says how many of its kind were held back; kinds are
// counted apart.
func TestAllow(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	l := New(time.Minute, func() time.Time { return now })
	want := func(k string, ok bool, held int) {
		t.Helper()
		if gotOK, gotHeld := l.Allow(k); gotOK != ok || gotHeld != held {
			t.Fatalf("Allow(%q) at %v = %v, %d; want %v, %d", k, now.Format(time.TimeOnly), gotOK, gotHeld, ok, held)
		}
	}
	want("a", true, 0)
	for range 5 {
		want("a", false, 0)
	}
	want("b", true, 0)
	now = now.Add(59 * time.Second)
	want("a", false, 0)
	now = now.Add(time.Second)
	want("a", true, 6)
	want("a", false, 0)
	want("b", true, 0)
	now = now.Add(time.Minute)
	want("a", true, 1)
}
