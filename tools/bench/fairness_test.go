package main

import (
	"bytes"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/types/known/timestamppb"

	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
)

// ev is a history event at t0 plus offset.
func ev(kind leaseholdv1.EventKind, offset time.Duration) *leaseholdv1.JobEvent {
	return &leaseholdv1.JobEvent{Kind: kind, At: timestamppb.New(t0.Add(offset))}
}

const (
	submitted = leaseholdv1.EventKind_EVENT_KIND_SUBMITTED
	leased    = leaseholdv1.EventKind_EVENT_KIND_LEASED
	expired   = leaseholdv1.EventKind_EVENT_KIND_LEASE_EXPIRED
	succeeded = leaseholdv1.EventKind_EVENT_KIND_SUCCEEDED
)

// job is a SUCCEEDED job with the given history.
func job(id string, events ...*leaseholdv1.JobEvent) *leaseholdv1.Job {
	return &leaseholdv1.Job{Id: id, Phase: leaseholdv1.Phase_PHASE_SUCCEEDED, Events: events}
}

func TestIdealFor(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		n, slots int
		latency  time.Duration
		want     ideal
	}{
		{
			name: "Twenty documents on half of sixteen slots take three rounds",
			n:    20, slots: 16, latency: 100 * time.Millisecond,
			want: ideal{Formula: "ceil(N_beta / (C/2)) × L = ceil(20 / 8) × 100ms = 300ms", ShareSlots: 8, Rounds: 3, MS: 300},
		},
		{
			name: "A batch that fills the share exactly takes one round per share",
			n:    16, slots: 16, latency: 100 * time.Millisecond,
			want: ideal{Formula: "ceil(N_beta / (C/2)) × L = ceil(16 / 8) × 100ms = 200ms", ShareSlots: 8, Rounds: 2, MS: 200},
		},
		{
			name: "An odd capacity gives a fractional share",
			n:    3, slots: 3, latency: time.Second,
			want: ideal{Formula: "ceil(N_beta / (C/2)) × L = ceil(3 / 1.5) × 1s = 2s", ShareSlots: 1.5, Rounds: 2, MS: 2000},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if diff := cmp.Diff(tt.want, idealFor(tt.n, tt.slots, tt.latency)); diff != "" {
				t.Errorf("idealFor(%d, %d, %v) mismatch (-want +got):\n%s", tt.n, tt.slots, tt.latency, diff)
			}
		})
	}
}

func TestRealisticFor(t *testing.T) {
	t.Parallel()
	got := realisticFor(idealFor(20, 16, 100*time.Millisecond), 125*time.Millisecond)
	want := realistic{
		Formula: "(1 + ceil(N_beta / (C/2))) × T = 4 × 125ms = 500ms (T = beta's lease-to-success p50)",
		MS:      500,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("realisticFor mismatch (-want +got):\n%s", diff)
	}
}

func TestAnalyze(t *testing.T) {
	t.Parallel()
	ms := time.Millisecond

	t.Run("Waits and completion come from the histories", func(t *testing.T) {
		t.Parallel()
		jobs := []*leaseholdv1.Job{
			job("j-1", ev(submitted, 0), ev(leased, 10*ms), ev(succeeded, 110*ms)),
			job("j-2", ev(submitted, 0), ev(leased, 20*ms), ev(succeeded, 140*ms)),
			// Leased once, expired, leased again: the wait ends at the first
			// lease and the job counts as leased during both leases.
			job("j-3", ev(submitted, 0), ev(leased, 110*ms), ev(expired, 150*ms), ev(leased, 160*ms), ev(succeeded, 400*ms)),
			job("j-4", ev(submitted, 0), ev(leased, 130*ms), ev(succeeded, 230*ms)),
		}
		got, err := analyze(jobs)
		if err != nil {
			t.Fatalf("analyze: %v", err)
		}
		want := betaResult{
			Documents:    4,
			WaitP50MS:    20,
			WaitP99MS:    130,
			WaitMaxMS:    130,
			CompletionMS: 400,
			// j-2, j-3 and j-4 overlap from 130 ms to 140 ms; j-1 ends as
			// j-3 starts, which is no overlap.
			MostLeased: 3,
			LeaseP50MS: 100,
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("analyze mismatch (-want +got):\n%s", diff)
		}
	})

	t.Run("A job that did not succeed is an error naming it", func(t *testing.T) {
		t.Parallel()
		failed := job("j-2", ev(submitted, 0))
		failed.Phase = leaseholdv1.Phase_PHASE_FAILED
		_, err := analyze([]*leaseholdv1.Job{job("j-1", ev(submitted, 0), ev(leased, ms), ev(succeeded, 2*ms)), failed})
		if err == nil || !strings.Contains(err.Error(), "j-2 is PHASE_FAILED") {
			t.Errorf("analyze error = %v, want one naming j-2 as PHASE_FAILED", err)
		}
	})

	t.Run("A history without a lease is an error", func(t *testing.T) {
		t.Parallel()
		_, err := analyze([]*leaseholdv1.Job{job("j-1", ev(submitted, 0), ev(succeeded, ms))})
		if err == nil || !strings.Contains(err.Error(), "j-1") {
			t.Errorf("analyze error = %v, want one naming j-1", err)
		}
	})

	t.Run("An empty batch is an error", func(t *testing.T) {
		t.Parallel()
		if _, err := analyze(nil); err == nil {
			t.Error("analyze(nil) succeeded, want an error")
		}
	})
}

func TestParseFairFlags(t *testing.T) {
	t.Parallel()

	t.Run("Defaults match the scenario", func(t *testing.T) {
		t.Parallel()
		cfg, err := parseFairFlags(nil, io.Discard)
		if err != nil {
			t.Fatalf("parseFairFlags: %v", err)
		}
		got := []any{cfg.stack.renderers, cfg.stack.capacity, cfg.slots(), cfg.stack.renderLatency, cfg.nAlpha, cfg.alphaBatch, cfg.nBeta, cfg.timeout}
		want := []any{4, 4, 16, 100 * time.Millisecond, 20000, 500, 20, 15 * time.Minute}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("defaults mismatch (-want +got):\n%s", diff)
		}
	})

	for _, tt := range []struct {
		name string
		args []string
		want string
	}{
		{"The latency is above zero", []string{"-latency", "0"}, "-latency"},
		{"There is a renderer", []string{"-renderers", "0"}, "-renderers"},
		{"Alpha has documents", []string{"-n-alpha", "0"}, "-n-alpha"},
		{"No arguments", []string{"extra"}, "unexpected arguments"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := parseFairFlags(tt.args, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("parseFairFlags(%q) error = %v, want one containing %q", tt.args, err, tt.want)
			}
		})
	}
}

func TestWriteFairComparison(t *testing.T) {
	t.Parallel()
	fair := fairResult{Label: "fair", Capacity: 16, LatencyMS: 100, Ratio: 1.4, Target: fairTarget, MeetsTarget: true,
		Beta:  betaResult{WaitP50MS: 100, CompletionMS: 420},
		Ideal: idealFor(20, 16, 100*time.Millisecond)}
	fifo := fairResult{Label: "fifo", Capacity: 16, LatencyMS: 100, Ratio: 420, Target: fairTarget,
		Beta:  betaResult{WaitP50MS: 125000, CompletionMS: 126000},
		Ideal: idealFor(20, 16, 100*time.Millisecond)}
	var out bytes.Buffer
	if err := writeFairComparison(&out, fair, fifo); err != nil {
		t.Fatalf("writeFairComparison: %v", err)
	}
	if got, want := lineWith(out.String(), "beta queue wait p50"), "100.0 ms 125.00 s 1250.0"; !strings.HasSuffix(strings.Join(strings.Fields(got), " "), want) {
		t.Errorf("queue wait p50 row = %q, want the figures %q", got, want)
	}
	for _, want := range []string{
		"fifo/fair",
		"fair: beta last-document completion = 1.4 × ideal (target ≤ 1.5×): meets the target",
		"fifo: beta last-document completion = 420.0 × ideal (target ≤ 1.5×): misses the target",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("comparison lacks %q:\n%s", want, out.String())
		}
	}
}

// lineWith returns the first line of s that contains substr.
func lineWith(s, substr string) string {
	for line := range strings.Lines(s) {
		if strings.Contains(line, substr) {
			return line
		}
	}
	return ""
}

func TestWriteFairText(t *testing.T) {
	t.Parallel()
	id := idealFor(20, 16, 100*time.Millisecond)
	r := fairResult{Label: "fair", Capacity: 16, LatencyMS: 100,
		Beta:  betaResult{Documents: 20, BatchID: "b-41", CompletionMS: 480, LeaseP50MS: 120},
		Ideal: id, Ratio: 1.6, Target: fairTarget, Realistic: realisticFor(id, 120*time.Millisecond), RealisticRatio: 1}
	var out bytes.Buffer
	if err := writeFairText(&out, r); err != nil {
		t.Fatalf("writeFairText: %v", err)
	}
	// Column widths are the tab writer's business: compare words only.
	words := strings.Join(strings.Fields(out.String()), " ")
	for _, want := range []string{
		"beta last document done 480.0 ms",
		"ideal ceil(N_beta / (C/2)) × L = ceil(20 / 8) × 100ms = 300ms",
		"4 × 120ms = 480ms (T = beta's lease-to-success p50): completion = 1.0 × that",
		"beta last-document completion = 1.6 × ideal (target ≤ 1.5×): misses the target",
	} {
		if !strings.Contains(words, want) {
			t.Errorf("text output lacks %q:\n%s", want, out.String())
		}
	}
}
