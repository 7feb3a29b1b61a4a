package main

import (
	"math"
	"slices"
	"time"
)

// summary describes a set of latency samples. Percentiles are nearest-rank:
// the smallest sample with at least p% of the samples at or below it, so
// every figure is a value that was observed.
type summary struct {
	N   int           `json:"n"`
	P50 time.Duration `json:"-"`
	P99 time.Duration `json:"-"`
	Max time.Duration `json:"-"`
}

// summarize sorts samples in place and returns their summary; the zero
// summary for none.
func summarize(samples []time.Duration) summary {
	if len(samples) == 0 {
		return summary{}
	}
	slices.Sort(samples)
	return summary{
		N:   len(samples),
		P50: percentile(samples, 50),
		P99: percentile(samples, 99),
		Max: samples[len(samples)-1],
	}
}

// percentile returns the nearest-rank p-th percentile (0 < p <= 100) of
// sorted, which must not be empty: the sample at rank ceil(p/100 × n).
func percentile(sorted []time.Duration, p float64) time.Duration {
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	return sorted[min(max(rank, 1), len(sorted))-1]
}

// rate returns n over d per second, or 0 when d is not positive.
func rate(n int, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(n) / d.Seconds()
}
