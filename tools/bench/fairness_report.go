package main

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
)

// fairTarget is the largest ratio of beta's completion time to the ideal
// that counts as fair.
const fairTarget = 1.5

// fairResult is one run of the fairness scenario, as printed and as
// written with -json. Durations are in milliseconds.
type fairResult struct {
	Label     string      `json:"label,omitempty"`
	Capacity  int         `json:"capacity"`
	LatencyMS float64     `json:"latency_ms"`
	Alpha     alphaResult `json:"alpha"`
	Beta      betaResult  `json:"beta"`
	Ideal     ideal       `json:"ideal"`
	// Ratio is beta's completion time over the ideal.
	Ratio float64 `json:"ratio"`
	// Realistic is the ideal allowing for what the scenario imposes on any
	// non-preemptive dispatcher, and RealisticRatio the completion time over
	// it. They are for reading the result; the target applies to Ratio.
	Realistic      realistic `json:"realistic"`
	RealisticRatio float64   `json:"realistic_ratio"`
	Target         float64   `json:"target"`
	MeetsTarget    bool      `json:"meets_target"`
}

// alphaResult describes the bulk import beta arrives behind.
type alphaResult struct {
	Documents int `json:"documents"`
	Batches   int `json:"batches"`
	// SubmitMS is how long submitting every batch took.
	SubmitMS float64 `json:"submit_ms"`
	// SaturateMS is how long after the last submission alpha first held
	// every renderer slot.
	SaturateMS float64 `json:"saturate_ms"`
	// Backlog is alpha's unfinished documents just before beta submitted.
	Backlog int `json:"backlog"`
}

// betaResult is what beta's job histories show.
type betaResult struct {
	BatchID   string `json:"batch_id"`
	Documents int    `json:"documents"`
	// Queue wait is SUBMITTED to the first LEASED event of each job;
	// percentiles are nearest-rank.
	WaitP50MS float64 `json:"queue_wait_p50_ms"`
	WaitP99MS float64 `json:"queue_wait_p99_ms"`
	WaitMaxMS float64 `json:"queue_wait_max_ms"`
	// CompletionMS is the batch's SUBMITTED event to its last SUCCEEDED
	// event.
	CompletionMS float64 `json:"completion_ms"`
	// MostLeased is the most of beta's jobs leased at one instant.
	MostLeased int `json:"most_leased"`
	// LeaseP50MS is the median time from a job's first LEASED event to its
	// SUCCEEDED event: the render latency plus upload and completion.
	LeaseP50MS float64 `json:"lease_to_success_p50_ms"`
}

// ideal is beta's completion time had it rendered at its fair share from
// the moment it arrived.
type ideal struct {
	Formula    string  `json:"formula"`
	ShareSlots float64 `json:"fair_share_slots"`
	Rounds     int     `json:"rounds"`
	MS         float64 `json:"ms"`
}

// realistic is the ideal with two costs the plain formula leaves out: when
// beta arrives every slot is busy with alpha, so its first document waits for
// a render to end (at most one per-document time), and each document holds
// its slot for the measured lease-to-success time T (render latency plus
// upload and completion), not just L.
type realistic struct {
	Formula string  `json:"formula"`
	MS      float64 `json:"ms"`
}

// realisticFor returns (1 + rounds) × T for the ideal's rounds and the
// measured per-document time t.
func realisticFor(id ideal, t time.Duration) realistic {
	d := time.Duration(1+id.Rounds) * t
	return realistic{
		Formula: fmt.Sprintf("(1 + ceil(N_beta / (C/2))) × T = %d × %v = %v (T = beta's lease-to-success p50)",
			1+id.Rounds, t.Round(100*time.Microsecond), d.Round(100*time.Microsecond)),
		MS: ms(d),
	}
}

// idealFor returns the ideal completion time of n documents on a fair share
// of capacity slots shared by two teams of equal weight (capacity/2 slots),
// each render taking latency: ceil(n / (capacity/2)) rounds of latency.
func idealFor(n, capacity int, latency time.Duration) ideal {
	share := float64(capacity) / 2
	rounds := int(math.Ceil(float64(n) / share))
	d := time.Duration(rounds) * latency
	return ideal{
		Formula: fmt.Sprintf("ceil(N_beta / (C/2)) × L = ceil(%d / %s) × %v = %v",
			n, trimFloat(share), latency, d),
		ShareSlots: share,
		Rounds:     rounds,
		MS:         ms(d),
	}
}

// analyze computes beta's figures from its jobs' histories. Every job must
// have SUCCEEDED.
func analyze(jobs []*leaseholdv1.Job) (betaResult, error) {
	if len(jobs) == 0 {
		return betaResult{}, errors.New("beta's batch has no jobs")
	}
	var (
		waits, leases []time.Duration
		first, last   time.Time
		edges         []edge
		bad           []string
	)
	for _, j := range jobs {
		if j.GetPhase() != leaseholdv1.Phase_PHASE_SUCCEEDED {
			bad = append(bad, fmt.Sprintf("%s is %s", j.GetId(), j.GetPhase()))
			continue
		}
		var submitted, leased, succeeded time.Time
		evs := j.GetEvents()
		for i, ev := range evs {
			at := ev.GetAt().AsTime()
			switch ev.GetKind() {
			case leaseholdv1.EventKind_EVENT_KIND_SUBMITTED:
				if submitted.IsZero() {
					submitted = at
				}
			case leaseholdv1.EventKind_EVENT_KIND_LEASED:
				if leased.IsZero() {
					leased = at
				}
				// The lease lasts until the job's next event, whatever it is.
				if i+1 < len(evs) {
					edges = append(edges, edge{at, +1}, edge{evs[i+1].GetAt().AsTime(), -1})
				}
			case leaseholdv1.EventKind_EVENT_KIND_SUCCEEDED:
				succeeded = at
			}
		}
		if submitted.IsZero() || leased.IsZero() || succeeded.IsZero() {
			return betaResult{}, fmt.Errorf("job %s's history lacks a SUBMITTED, LEASED or SUCCEEDED event", j.GetId())
		}
		waits = append(waits, leased.Sub(submitted))
		leases = append(leases, succeeded.Sub(leased))
		if first.IsZero() || submitted.Before(first) {
			first = submitted
		}
		if succeeded.After(last) {
			last = succeeded
		}
	}
	if len(bad) > 0 {
		return betaResult{}, fmt.Errorf("not every beta job succeeded: %s", strings.Join(bad, ", "))
	}
	slices.Sort(waits)
	slices.Sort(leases)
	return betaResult{
		Documents:    len(jobs),
		WaitP50MS:    ms(percentile(waits, 50)),
		WaitP99MS:    ms(percentile(waits, 99)),
		WaitMaxMS:    ms(waits[len(waits)-1]),
		CompletionMS: ms(last.Sub(first)),
		MostLeased:   mostAtOnce(edges),
		LeaseP50MS:   ms(percentile(leases, 50)),
	}, nil
}

// edge is a lease starting (+1) or ending (-1) at an instant.
type edge struct {
	at    time.Time
	delta int
}

// mostAtOnce returns the largest number of intervals open at one instant.
// An interval ending at the instant another starts does not overlap it.
func mostAtOnce(edges []edge) int {
	slices.SortFunc(edges, func(a, b edge) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		return a.delta - b.delta // ends before starts
	})
	open, most := 0, 0
	for _, e := range edges {
		open += e.delta
		most = max(most, open)
	}
	return most
}

// fromMS converts milliseconds to a duration.
func fromMS(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }

// trimFloat formats v without trailing zeros.
func trimFloat(v float64) string { return fmt.Sprintf("%g", v) }

// formatMS prints milliseconds readably: "123.4 ms" or "12.35 s".
func formatMS(v float64) string {
	if v < 1000 {
		return fmt.Sprintf("%.1f ms", v)
	}
	return fmt.Sprintf("%.2f s", v/1000)
}

// fairVerdict is the one-line summary of a result.
func fairVerdict(r fairResult) string {
	meets := "meets the target"
	if !r.MeetsTarget {
		meets = "misses the target"
	}
	return fmt.Sprintf("beta last-document completion = %.1f × ideal (target ≤ %g×): %s", r.Ratio, r.Target, meets)
}

// writeFairText writes r as a small table and the verdict.
func writeFairText(w io.Writer, r fairResult) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "fairness: %s\n", cmp.Or(r.Label, "one run"))
	fmt.Fprintf(tw, "renderers\tC = %d slots, render latency L = %v\n", r.Capacity, fromMS(r.LatencyMS))
	fmt.Fprintf(tw, "alpha\t%d documents in %d batches, submitted in %s; all slots busy %s later\n",
		r.Alpha.Documents, r.Alpha.Batches, formatMS(r.Alpha.SubmitMS), formatMS(r.Alpha.SaturateMS))
	fmt.Fprintf(tw, "beta\t%d documents (batch %s) behind %d unfinished alpha documents\n", r.Beta.Documents, r.Beta.BatchID, r.Alpha.Backlog)
	fmt.Fprintln(tw)
	fmt.Fprintf(tw, "beta queue wait p50\t%s\n", formatMS(r.Beta.WaitP50MS))
	fmt.Fprintf(tw, "beta queue wait p99\t%s\n", formatMS(r.Beta.WaitP99MS))
	fmt.Fprintf(tw, "beta queue wait max\t%s\n", formatMS(r.Beta.WaitMaxMS))
	fmt.Fprintf(tw, "beta last document done\t%s\n", formatMS(r.Beta.CompletionMS))
	fmt.Fprintf(tw, "beta leases at once, most\t%d of %d slots\n", r.Beta.MostLeased, r.Capacity)
	fmt.Fprintf(tw, "beta lease to success p50\t%s\n", formatMS(r.Beta.LeaseP50MS))
	fmt.Fprintf(tw, "ideal\t%s\n", r.Ideal.Formula)
	fmt.Fprintf(tw, "ideal with overheads\t%s: completion = %.1f × that\n", r.Realistic.Formula, r.RealisticRatio)
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, fairVerdict(r))
	return tw.Flush()
}

// writeFairComparison prints a and b side by side with the ratio b/a of
// each figure.
func writeFairComparison(w io.Writer, a, b fairResult) error {
	an, bn := cmp.Or(a.Label, "first"), cmp.Or(b.Label, "second")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "\t%s\t%s\t%s/%s\t\n", an, bn, bn, an)
	row := func(label string, x, y float64, format func(float64) string) {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t\n", label, format(x), format(y), ratio(x, y))
	}
	count := func(v float64) string { return fmt.Sprintf("%.0f", v) }
	times := func(v float64) string { return fmt.Sprintf("%.1f×", v) }
	row("beta queue wait p50", a.Beta.WaitP50MS, b.Beta.WaitP50MS, formatMS)
	row("beta queue wait p99", a.Beta.WaitP99MS, b.Beta.WaitP99MS, formatMS)
	row("beta queue wait max", a.Beta.WaitMaxMS, b.Beta.WaitMaxMS, formatMS)
	row("beta last document done", a.Beta.CompletionMS, b.Beta.CompletionMS, formatMS)
	row("beta completion / ideal", a.Ratio, b.Ratio, times)
	row("... / ideal with overheads", a.RealisticRatio, b.RealisticRatio, times)
	row("beta lease to success p50", a.Beta.LeaseP50MS, b.Beta.LeaseP50MS, formatMS)
	row("beta leases at once, most", float64(a.Beta.MostLeased), float64(b.Beta.MostLeased), count)
	row("alpha backlog at beta's arrival", float64(a.Alpha.Backlog), float64(b.Alpha.Backlog), count)
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "\nC = %d slots, L = %v, N_alpha = %d, N_beta = %d; ideal %s\n",
		a.Capacity, fromMS(a.LatencyMS), a.Alpha.Documents, a.Beta.Documents, a.Ideal.Formula)
	fmt.Fprintf(w, "%s: %s\n", an, fairVerdict(a))
	fmt.Fprintf(w, "%s: %s\n", bn, fairVerdict(b))
	return nil
}

// ratio formats y/x, or "-" when x is zero.
func ratio(x, y float64) string {
	if x == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f", y/x)
}
