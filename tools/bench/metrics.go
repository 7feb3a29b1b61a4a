package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
)

// groupMetric is the coordinator's histogram of commands per writer
// transaction: how well group commit batches.
const groupMetric = "leasehold_writer_group_commands"

// histogram is a Prometheus histogram as exposed: cumulative counts per
// upper bound, in increasing order of bound (the last is +Inf).
type histogram struct {
	Buckets []bucket
	Count   float64
	Sum     float64
}

// bucket is one cumulative bucket: Count observations were at most Le.
type bucket struct {
	Le    float64
	Count float64
}

// scrapeHistogram fetches url (a /metrics page in the Prometheus text
// format) and returns the histogram name.
func scrapeHistogram(ctx context.Context, url, name string) (histogram, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return histogram{}, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return histogram{}, fmt.Errorf("scraping %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return histogram{}, fmt.Errorf("scraping %s: %s", url, resp.Status)
	}
	h, err := parseHistogram(resp.Body, name)
	if err != nil {
		return histogram{}, fmt.Errorf("scraping %s: %w", url, err)
	}
	return h, nil
}

// parseHistogram reads the histogram name from the Prometheus text format.
// Series of the histogram that differ in labels other than le are added
// together. A histogram the page does not expose is an error.
func parseHistogram(r io.Reader, name string) (histogram, error) {
	var h histogram
	byLe := make(map[float64]float64)
	seen := false
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' || !strings.HasPrefix(line, name+"_") {
			continue
		}
		series, labels, value, err := splitSample(line)
		if err != nil {
			return histogram{}, err
		}
		switch series {
		case name + "_bucket":
			le, ok := labelValue(labels, "le")
			if !ok {
				return histogram{}, fmt.Errorf("%s: bucket without le label: %q", name, line)
			}
			bound, err := parseFloat(le)
			if err != nil {
				return histogram{}, fmt.Errorf("%s: le %q: %w", name, le, err)
			}
			byLe[bound] += value
		case name + "_count":
			h.Count += value
		case name + "_sum":
			h.Sum += value
		default:
			continue
		}
		seen = true
	}
	if err := sc.Err(); err != nil {
		return histogram{}, err
	}
	if !seen {
		return histogram{}, fmt.Errorf("no histogram %s exposed", name)
	}
	for le, c := range byLe {
		h.Buckets = append(h.Buckets, bucket{Le: le, Count: c})
	}
	slices.SortFunc(h.Buckets, func(a, b bucket) int { return compareFloat(a.Le, b.Le) })
	return h, nil
}

// splitSample splits `name{labels} value [timestamp]` into its parts.
func splitSample(line string) (name, labels string, value float64, err error) {
	rest := line
	if i := strings.IndexByte(line, '{'); i >= 0 {
		j := strings.LastIndexByte(line, '}')
		if j < i {
			return "", "", 0, fmt.Errorf("unbalanced braces: %q", line)
		}
		name, labels, rest = line[:i], line[i+1:j], line[j+1:]
	} else {
		sp := strings.IndexAny(line, " \t")
		if sp < 0 {
			return "", "", 0, fmt.Errorf("no value: %q", line)
		}
		name, rest = line[:sp], line[sp:]
	}
	f := strings.Fields(rest)
	if len(f) < 1 {
		return "", "", 0, fmt.Errorf("no value: %q", line)
	}
	value, err = parseFloat(f[0])
	if err != nil {
		return "", "", 0, fmt.Errorf("value of %q: %w", line, err)
	}
	return name, labels, value, nil
}

// labelValue finds key="value" in a label list; label values in these
// histograms carry no escaped quotes.
func labelValue(labels, key string) (string, bool) {
	for pair := range strings.SplitSeq(labels, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(pair), "=")
		if ok && k == key {
			return strings.Trim(v, `"`), true
		}
	}
	return "", false
}

// parseFloat parses a sample value or bound, including +Inf, -Inf and NaN.
func parseFloat(s string) (float64, error) {
	switch s {
	case "+Inf", "Inf":
		return math.Inf(1), nil
	case "-Inf":
		return math.Inf(-1), nil
	}
	return strconv.ParseFloat(s, 64)
}

// compareFloat orders two bounds.
func compareFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// sub returns the observations made between an earlier scrape of the same
// histogram, before, and h, bucket by bucket. A histogram's buckets are
// fixed, so a bucket missing from before means before had no observations.
func (h histogram) sub(before histogram) histogram {
	prev := make(map[float64]float64, len(before.Buckets))
	for _, b := range before.Buckets {
		prev[b.Le] = b.Count
	}
	d := histogram{Count: h.Count - before.Count, Sum: h.Sum - before.Sum}
	for _, b := range h.Buckets {
		d.Buckets = append(d.Buckets, bucket{Le: b.Le, Count: b.Count - prev[b.Le]})
	}
	return d
}

// quantile estimates the q-quantile (0 <= q <= 1) as Prometheus's
// histogram_quantile does: find the bucket holding rank q × count and
// interpolate linearly inside it, from the previous bucket's bound to its
// own. The first bucket starts at lowest, the smallest value an observation
// can take, when that is below its bound, else at 0 as in Prometheus (a
// group has at least one command, so its histogram passes 1 and the bucket
// le="1" answers exactly 1). A rank in the +Inf bucket answers the largest
// finite bound. It returns NaN without observations.
func (h histogram) quantile(q, lowest float64) float64 {
	if len(h.Buckets) == 0 {
		return math.NaN()
	}
	total := h.Buckets[len(h.Buckets)-1].Count
	if total <= 0 || math.IsNaN(q) {
		return math.NaN()
	}
	q = min(max(q, 0), 1)
	rank := q * total
	i, _ := slices.BinarySearchFunc(h.Buckets, rank, func(b bucket, r float64) int { return compareFloat(b.Count, r) })
	if i >= len(h.Buckets) {
		i = len(h.Buckets) - 1
	}
	b := h.Buckets[i]
	if math.IsInf(b.Le, 1) {
		if i == 0 {
			return math.NaN()
		}
		return h.Buckets[i-1].Le
	}
	lower, below := 0.0, 0.0
	switch {
	case i > 0:
		lower, below = h.Buckets[i-1].Le, h.Buckets[i-1].Count
	case b.Le <= 0:
		return b.Le
	case lowest > 0 && lowest <= b.Le:
		lower = lowest
	}
	inBucket := b.Count - below
	if inBucket <= 0 {
		return b.Le
	}
	return lower + (b.Le-lower)*(rank-below)/inBucket
}

// errNoSeries is returned by scrapeGauge when the page has no such series.
var errNoSeries = errors.New("no such series")

// scrapeGauge fetches url and returns the sum of the samples of the metric
// name (over all its label sets).
func scrapeGauge(ctx context.Context, url, name string) (float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, fmt.Errorf("scraping %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("scraping %s: %s", url, resp.Status)
	}
	return parseGauge(resp.Body, name)
}

// parseGauge returns the sum of the samples of the metric name in the
// Prometheus text format, or errNoSeries.
func parseGauge(r io.Reader, name string) (float64, error) {
	var sum float64
	seen := false
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' || !strings.HasPrefix(line, name) {
			continue
		}
		series, _, value, err := splitSample(line)
		if err != nil {
			return 0, err
		}
		if series == name {
			sum += value
			seen = true
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	if !seen {
		return 0, fmt.Errorf("%s: %w", name, errNoSeries)
	}
	return sum, nil
}
