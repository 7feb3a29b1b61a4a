package main

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"
	"google.golang.org/protobuf/types/known/timestamppb"

	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

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

func TestPercentile(t *testing.T) {
	t.Parallel()
	var sorted []time.Duration
	for i := 1; i <= 20; i++ {
		sorted = append(sorted, time.Duration(i))
	}
	for _, tt := range []struct {
		p    float64
		want time.Duration
	}{{50, 10}, {99, 20}, {100, 20}, {1, 1}, {0, 1}} {
		if got := percentile(sorted, tt.p); got != tt.want {
			t.Errorf("percentile(1..20, %v) = %v, want %v", tt.p, got, tt.want)
		}
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

func TestParseFlags(t *testing.T) {
	t.Parallel()

	t.Run("Defaults match the scenario", func(t *testing.T) {
		t.Parallel()
		cfg, err := parseFlags([]string{"-capacity", "16", "-latency", "100ms"}, io.Discard)
		if err != nil {
			t.Fatalf("parseFlags: %v", err)
		}
		got := []any{cfg.nAlpha, cfg.alphaBatch, cfg.nBeta, cfg.alphaTeam, cfg.betaTeam, cfg.output, cfg.cancelAlpha}
		want := []any{20000, 500, 20, "alpha", "beta", "text", true}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("defaults mismatch (-want +got):\n%s", diff)
		}
	})

	for _, tt := range []struct {
		name string
		args []string
	}{
		{"Capacity is required", []string{"-latency", "100ms"}},
		{"Latency is required", []string{"-capacity", "16"}},
		{"The output format is text or json", []string{"-capacity", "16", "-latency", "1s", "-o", "yaml"}},
		{"The teams differ", []string{"-capacity", "16", "-latency", "1s", "-beta-team", "alpha"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if _, err := parseFlags(tt.args, io.Discard); err == nil {
				t.Errorf("parseFlags(%q) succeeded, want an error", tt.args)
			}
		})
	}
}

func TestCompare(t *testing.T) {
	t.Parallel()
	fair := result{Label: "fair", Capacity: 16, LatencyMS: 100, Ratio: 1.4, Target: target, MeetsTarget: true,
		Beta:  betaResult{WaitP50MS: 100, CompletionMS: 420},
		Ideal: idealFor(20, 16, 100*time.Millisecond)}
	fifo := result{Label: "fifo", Capacity: 16, LatencyMS: 100, Ratio: 420, Target: target,
		Beta:  betaResult{WaitP50MS: 125000, CompletionMS: 126000},
		Ideal: idealFor(20, 16, 100*time.Millisecond)}
	dir := t.TempDir()
	var paths []string
	for _, r := range []result{fair, fifo} {
		var b bytes.Buffer
		if err := writeJSON(&b, r); err != nil {
			t.Fatalf("writeJSON: %v", err)
		}
		p := filepath.Join(dir, r.Label+".json")
		if err := os.WriteFile(p, b.Bytes(), 0o600); err != nil {
			t.Fatal(err)
		}
		paths = append(paths, p)
	}
	var out bytes.Buffer
	if err := compareFiles(paths, &out); err != nil {
		t.Fatalf("compareFiles: %v", err)
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

func TestWriteText(t *testing.T) {
	t.Parallel()
	id := idealFor(20, 16, 100*time.Millisecond)
	r := result{Label: "fair", Coordinator: "127.0.0.1:7070", Capacity: 16, LatencyMS: 100,
		Beta:  betaResult{Documents: 20, BatchID: "b-41", CompletionMS: 480, LeaseP50MS: 120},
		Ideal: id, Ratio: 1.6, Target: target, Realistic: realisticFor(id, 120*time.Millisecond), RealisticRatio: 1}
	var out bytes.Buffer
	if err := writeText(&out, r); err != nil {
		t.Fatalf("writeText: %v", err)
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
