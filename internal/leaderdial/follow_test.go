package leaderdial

import (
	"testing"
	"time"
)

// TestFollow walks the discovery's decisions round by round: where calls
// go, and when the leader is left (which ends its streams).
func TestFollow(t *testing.T) {
	t.Parallel()
	type round struct {
		at      time.Duration // since the start
		answers map[string]answer
		route   string
		left    bool
	}
	order := []string{"a", "b", "c"}
	all := func(a, b, c answer) map[string]answer { return map[string]answer{"a": a, "b": b, "c": c} }
	tests := []struct {
		name   string
		rounds []round
	}{
		{"the replica that answers SERVING takes the calls", []round{
			{0, all(notServing, notServing, notServing), "", false},
			{1, all(notServing, serving, notServing), "b", false},
			{2, all(notServing, serving, notServing), "b", false},
		}},
		{"a silent leader takes no call but is not left within the silence bound", []round{
			{0, all(serving, notServing, notServing), "a", false},
			{time.Second, all(silent, notServing, notServing), "", false},
			{2 * time.Second, all(silent, notServing, notServing), "", false},
			{2500 * time.Millisecond, all(serving, notServing, notServing), "a", false},
			{3 * time.Second, all(silent, notServing, notServing), "", false},
			{5 * time.Second, all(serving, notServing, notServing), "a", false},
		}},
		{"a leader silent past the bound is left", []round{
			{0, all(serving, notServing, notServing), "a", false},
			{time.Second, all(silent, notServing, notServing), "", false},
			{4 * time.Second, all(silent, notServing, notServing), "", false},
			{5 * time.Second, all(silent, notServing, notServing), "", true},
			{6 * time.Second, all(silent, notServing, notServing), "", false},
			{7 * time.Second, all(serving, notServing, notServing), "a", false},
		}},
		{"another replica SERVING while the leader is silent: left at once for it", []round{
			{0, all(serving, notServing, notServing), "a", false},
			{time.Second, all(silent, notServing, notServing), "", false},
			{1200 * time.Millisecond, all(silent, notServing, serving), "c", true},
			{1400 * time.Millisecond, all(serving, notServing, serving), "c", false},
			{1600 * time.Millisecond, all(notServing, notServing, serving), "c", false},
		}},
		{"a leader that says NOT_SERVING is left at once", []round{
			{0, all(notServing, serving, notServing), "b", false},
			{100 * time.Millisecond, all(notServing, notServing, notServing), "", true},
			{200 * time.Millisecond, all(serving, notServing, notServing), "a", false},
		}},
		{"while the leader answers SERVING, another that says so too does not take it over", []round{
			{0, all(serving, notServing, notServing), "a", false},
			{100 * time.Millisecond, all(serving, serving, notServing), "a", false},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := follow{silence: 3 * time.Second}
			start := time.Unix(1000, 0)
			var epoch uint64
			for i, r := range tc.rounds {
				_, left := f.observe(r.answers, order, start.Add(r.at))
				if left {
					epoch++
				}
				if got := f.route(); got != r.route || left != r.left || f.epoch != epoch {
					t.Fatalf("round %d at %v: route %q, left %v, epoch %d; want %q, %v, %d", i, r.at, got, left, f.epoch, r.route, r.left, epoch)
				}
			}
		})
	}
}
