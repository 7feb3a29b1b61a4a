package main

import (
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestPercentile(t *testing.T) {
	t.Parallel()
	var sorted []time.Duration
	for i := 1; i <= 200; i++ {
		sorted = append(sorted, time.Duration(i))
	}
	for _, tt := range []struct {
		p    float64
		want time.Duration
	}{{50, 100}, {99, 198}, {99.9, 200}, {100, 200}, {0.1, 1}, {0, 1}} {
		if got := percentile(sorted, tt.p); got != tt.want {
			t.Errorf("percentile(1..200, %v) = %v, want %v", tt.p, got, tt.want)
		}
	}
	if got := percentile([]time.Duration{7}, 99); got != 7 {
		t.Errorf("percentile of one sample = %v, want 7", got)
	}
}

func TestSummarize(t *testing.T) {
	t.Parallel()
	t.Run("SortsAndReportsNearestRank", func(t *testing.T) {
		t.Parallel()
		got := summarize([]time.Duration{5, 1, 4, 2, 3})
		want := summary{N: 5, P50: 3, P99: 5, Max: 5}
		if got != want {
			t.Errorf("summarize = %+v, want %+v", got, want)
		}
	})
	t.Run("NoSamplesIsTheZeroSummary", func(t *testing.T) {
		t.Parallel()
		if got := summarize(nil); got != (summary{}) {
			t.Errorf("summarize(nil) = %+v, want zero", got)
		}
	})
	t.Run("NegativeSamplesStay", func(t *testing.T) {
		t.Parallel()
		// A grant may be seen before the submitter has read its ack.
		got := summarize([]time.Duration{-1, 2, 3})
		if got.P50 != 2 || got.Max != 3 {
			t.Errorf("summarize = %+v, want p50 2 and max 3", got)
		}
	})
}

func TestRate(t *testing.T) {
	t.Parallel()
	if got := rate(500, 250*time.Millisecond); got != 2000 {
		t.Errorf("rate(500, 250ms) = %v, want 2000", got)
	}
	if got := rate(500, 0); got != 0 {
		t.Errorf("rate(500, 0) = %v, want 0", got)
	}
}
