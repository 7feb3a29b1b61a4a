package main

import (
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// page is a /metrics excerpt as the coordinator exposes it.
const page = `# HELP leasehold_writer_group_commands Commands committed per writer transaction.
# TYPE leasehold_writer_group_commands histogram
leasehold_writer_group_commands_bucket{le="1"} 10
leasehold_writer_group_commands_bucket{le="2"} 30
leasehold_writer_group_commands_bucket{le="4"} 70
leasehold_writer_group_commands_bucket{le="8"} 100
leasehold_writer_group_commands_bucket{le="+Inf"} 100
leasehold_writer_group_commands_sum 321
leasehold_writer_group_commands_count 100
# HELP leasehold_writer_group_seconds Time to apply and commit (fsync) one writer group.
leasehold_writer_group_seconds_bucket{le="0.0001"} 3
leasehold_writer_group_seconds_count 100
`

func TestParseHistogram(t *testing.T) {
	t.Parallel()
	t.Run("ReadsBucketsCountAndSum", func(t *testing.T) {
		t.Parallel()
		got, err := parseHistogram(strings.NewReader(page), groupMetric)
		if err != nil {
			t.Fatal(err)
		}
		want := histogram{
			Buckets: []bucket{{1, 10}, {2, 30}, {4, 70}, {8, 100}, {math.Inf(1), 100}},
			Count:   100,
			Sum:     321,
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("parseHistogram (-want +got):\n%s", diff)
		}
	})
	t.Run("AddsSeriesWithOtherLabels", func(t *testing.T) {
		t.Parallel()
		in := `h_bucket{team="a",le="1"} 1
h_bucket{le="1",team="b"} 2 1700000000000
h_bucket{team="a",le="+Inf"} 3
h_bucket{team="b",le="+Inf"} 4
h_count{team="a"} 3
h_count{team="b"} 4
`
		got, err := parseHistogram(strings.NewReader(in), "h")
		if err != nil {
			t.Fatal(err)
		}
		want := histogram{Buckets: []bucket{{1, 3}, {math.Inf(1), 7}}, Count: 7}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("parseHistogram (-want +got):\n%s", diff)
		}
	})
	t.Run("AbsentHistogramIsAnError", func(t *testing.T) {
		t.Parallel()
		if _, err := parseHistogram(strings.NewReader(page), "leasehold_nothing"); err == nil {
			t.Error("parseHistogram of an absent name: no error")
		}
	})
	t.Run("MalformedValueIsAnError", func(t *testing.T) {
		t.Parallel()
		if _, err := parseHistogram(strings.NewReader(`h_bucket{le="1"} many`), "h"); err == nil {
			t.Error("parseHistogram of a bad value: no error")
		}
	})
}

func TestHistogramQuantile(t *testing.T) {
	t.Parallel()
	h, err := parseHistogram(strings.NewReader(page), groupMetric)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		h      histogram
		q      float64
		lowest float64
		want   float64
	}{
		// Rank 50 lies in (2, 4], which holds ranks 31..70: 2 + 2 × 20/40.
		{"MedianInterpolatesInsideItsBucket", h, 0.5, 0, 3},
		// Rank 99 lies in (4, 8], holding 71..100: 4 + 4 × 29/30.
		{"P99", h, 0.99, 0, 4 + 4*29.0/30},
		// Rank 5 lies in the first bucket, interpolated from 0.
		{"FirstBucketStartsAtZero", h, 0.05, 0, 0.5},
		// Nothing is below 1, so the bucket le="1" holds only 1s.
		{"FirstBucketStartsAtTheLowestValue", h, 0.05, 1, 1},
		{"LowestAboveTheFirstBoundIsIgnored", h, 0.05, 3, 0.5},
		{"AllOfIt", h, 1, 1, 8},
		{
			"RankInTheInfBucketAnswersTheLargestFiniteBound",
			histogram{Buckets: []bucket{{1, 1}, {2, 2}, {math.Inf(1), 10}}},
			0.99, 0, 2,
		},
		{"NoObservationsIsNaN", histogram{Buckets: []bucket{{1, 0}, {math.Inf(1), 0}}}, 0.5, 0, math.NaN()},
		{"NoBucketsIsNaN", histogram{}, 0.5, 0, math.NaN()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := tt.h.quantile(tt.q, tt.lowest)
			if math.IsNaN(tt.want) {
				if !math.IsNaN(got) {
					t.Errorf("quantile(%v) = %v, want NaN", tt.q, got)
				}
				return
			}
			if math.Abs(got-tt.want) > 1e-9 {
				t.Errorf("quantile(%v) = %v, want %v", tt.q, got, tt.want)
			}
		})
	}
}

func TestHistogramSub(t *testing.T) {
	t.Parallel()
	before := histogram{Buckets: []bucket{{1, 5}, {2, 5}, {4, 5}, {math.Inf(1), 5}}, Count: 5, Sum: 5}
	after := histogram{Buckets: []bucket{{1, 5}, {2, 15}, {4, 20}, {math.Inf(1), 20}}, Count: 20, Sum: 50}
	got := after.sub(before)
	want := histogram{Buckets: []bucket{{1, 0}, {2, 10}, {4, 15}, {math.Inf(1), 15}}, Count: 15, Sum: 45}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("sub (-want +got):\n%s", diff)
	}
	// Between the scrapes, 10 groups of 2 and 5 of 3 or 4: the median is in (1, 2].
	if q := got.quantile(0.5, 1); q <= 1 || q > 2 {
		t.Errorf("median of the difference = %v, want in (1, 2]", q)
	}
}

func TestParseGauge(t *testing.T) {
	t.Parallel()
	in := `# TYPE leasehold_live_renderer_capacity gauge
leasehold_live_renderer_capacity 64
leasehold_live_renderer_capacity_other 5
leasehold_leases_in_flight{team="alpha"} 3
leasehold_leases_in_flight{team="beta"} 4
`
	for name, want := range map[string]float64{"leasehold_live_renderer_capacity": 64, "leasehold_leases_in_flight": 7} {
		got, err := parseGauge(strings.NewReader(in), name)
		if err != nil || got != want {
			t.Errorf("parseGauge(%s) = %v, %v; want %v", name, got, err, want)
		}
	}
	if _, err := parseGauge(strings.NewReader(in), "leasehold_queue_depth"); !errors.Is(err, errNoSeries) {
		t.Errorf("parseGauge of an absent gauge: error %v, want errNoSeries", err)
	}
}
