package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// sampleReport is a report with every section, as a run against today's
// binaries might produce.
func sampleReport() *report {
	cpu := &cpuResult{
		Documents: 2000, WallSeconds: 8.4,
		CoordinatorSeconds: 3.19, RenderersSeconds: 4.99, GeneratorSeconds: 0.2,
		CoordinatorPer1000: 1.595, RenderersPer1000: 2.495, GeneratorPer1000: 0.1,
		TotalMicrosPerDoc: 4190,
	}
	return &report{
		Started: time.Date(2026, 12, 1, 2, 11, 54, 0, time.UTC),
		Setup:   setup{Renderers: 4, Capacity: 16, CPUs: 2, Coordinator: "bin/coordinator", Renderer: "bin/renderer", DocumentLen: 160},
		Idle:    &idleResult{Samples: 200, P50MS: 1.46, P99MS: 1.9, MaxMS: 99.5, Method: "m"},
		Drain: &drainResult{
			Documents: 2000, Batches: 4, Succeeded: 2000, SubmitSeconds: 0.133, Seconds: 8.25, DocsPerSecond: 242.4,
			CPU: cpu, Groups: &groupResult{Groups: 900, Commands: 4000, P50: 1.5, P99: 31.9},
		},
		Steady: &steadyResult{
			BatchSize: 100, PeakDocsPerSecond: 240, PeakInFlightBatches: 8, Documents: 1704, CPU: cpu,
			Levels: []steadyLevel{{4, 3, 504, 168}, {8, 3, 720, 240}},
		},
		Latency: &latencyResult{
			TargetDocsPerSecond: 120, Basis: "half the steady peak", AchievedDocsPerSecond: 119,
			Documents: 478, Batches: 307, Samples: 478, P50MS: 143, P99MS: 398, MaxMS: 455,
		},
		Groups:            &groupResult{Groups: 2071, Commands: 7397, P50: 1, P99: 29.4},
		CoordinatorMemory: &memory{RSS: 90 << 20, HWM: 125 << 20},
		Store: &storeResult{
			Jobs: 20000, Succeeded: 10000, Queued: 10000, FillSeconds: 40, ShutdownSeconds: 0.05,
			StartupSeconds: 0.104, HealthPollMS: 2, Memory: &memory{RSS: 100 << 20, HWM: 600 << 20},
			EmptyDrain: &drainResult{Documents: 2000, Seconds: 8, DocsPerSecond: 250, CPU: cpu},
			FullDrain:  &drainResult{Documents: 2000, Seconds: 10.5, DocsPerSecond: 190, CPU: cpu},
			DrainRatio: 0.76,
		},
	}
}

func TestCheck(t *testing.T) {
	t.Parallel()
	r := sampleReport()
	r.check()
	got := make(map[string]bool)
	for _, o := range r.Targets {
		got[o.Figure] = o.Met
	}
	want := map[string]bool{
		figureIdle:        true, // 1.9 < 2
		figureDrain:       false,
		figureDrainCPU:    false,
		figureSteady:      false,
		figureSteadyCPU:   false,
		figureLatency:     false,
		figureStartup:     true,
		figureStoreMemory: false, // VmHWM 600 MiB
		figureStoreDrain:  false, // 0.76× the empty store's
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("targets met (-want +got):\n%s", diff)
	}

	t.Run("OnlyFiguresPresentAreChecked", func(t *testing.T) {
		t.Parallel()
		r := &report{Drain: &drainResult{DocsPerSecond: 16000, CPU: &cpuResult{TotalMicrosPerDoc: 130}}}
		r.check()
		want := []targetOutcome{
			{Figure: figureDrain, Value: 16000, Target: "≥ 15,000 docs/s", Met: true},
			{Figure: figureDrainCPU, Value: 130, Target: "≤ 130 µs/doc", Met: true},
		}
		if diff := cmp.Diff(want, r.Targets); diff != "" {
			t.Errorf("targets (-want +got):\n%s", diff)
		}
	})
}

func TestWriteText(t *testing.T) {
	t.Parallel()
	r := sampleReport()
	r.check()
	var buf bytes.Buffer
	if err := writeText(&buf, r); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	t.Log("\n" + out)
	wantLines := map[string][]string{
		"idle wake-up":       {"p50 1.46 ms  p99 1.90 ms", "ok (< 2 ms)", "200 samples, max 99.5 ms"},
		"drain":              {"242 docs/s", "MISS (≥ 15,000 docs/s)", "2,000 docs in 8.25 s from ResumeDispatch"},
		"steady":             {"240 docs/s", "MISS (≥ 10,000 docs/s)", "4→168, 8→240"},
		"submit→SUCCEEDED":   {"p50 143 ms  p99 398 ms", "MISS (< 50 ms)", "open loop at 120 docs/s (half the steady peak"},
		"writer group size":  {"p50 1.0  p99 29.4", "7,397 commands in 2,071 groups", "drain p50 1.5  p99 31.9"},
		"CPU drain":          {"4190 µs/doc", "MISS (≤ 130 µs/doc)", "coordinator 1.595, renderers 2.495, generator 0.100"},
		"CPU steady":         {"4190 µs/doc", "phase start to last level end"},
		"coordinator memory": {"VmHWM 125.0 MiB  VmRSS 90.0 MiB"},
		"store start-up":     {"0.104 s", "ok (< 2 s)", "polled every 2.00 ms"},
		"store memory":       {"VmHWM 600.0 MiB", "MISS (< 512 MiB)"},
		"store full drain":   {"190 docs/s", "0.76× the empty store's", "MISS (≥ 0.8× the empty store's)"},
	}
	for name, parts := range wantLines {
		line := lineStarting(out, name+"  ")
		if line == "" {
			t.Errorf("no line for %q", name)
			continue
		}
		for _, p := range parts {
			if !strings.Contains(line, p) {
				t.Errorf("line %q lacks %q", line, p)
			}
		}
	}
	if n := strings.Count(out, "\n"); n != 15 {
		t.Errorf("report has %d lines, want 15 (a header and one line per figure)", n)
	}
}

func TestWriteTextLeavesOutPhasesNotRun(t *testing.T) {
	t.Parallel()
	r := &report{Drain: &drainResult{Documents: 10, DocsPerSecond: 5, CPU: &cpuResult{}}}
	r.check()
	var buf bytes.Buffer
	if err := writeText(&buf, r); err != nil {
		t.Fatal(err)
	}
	for _, absent := range []string{"idle", "steady", "submit→", "store", "writer group"} {
		if strings.Contains(buf.String(), absent) {
			t.Errorf("report without that phase mentions %q:\n%s", absent, buf.String())
		}
	}
}

func TestWriteJSON(t *testing.T) {
	t.Parallel()
	r := sampleReport()
	r.check()
	var buf bytes.Buffer
	if err := writeJSON(&buf, r); err != nil {
		t.Fatal(err)
	}
	var back map[string]any
	if err := json.Unmarshal(buf.Bytes(), &back); err != nil {
		t.Fatalf("the JSON does not parse: %v", err)
	}
	for _, key := range []string{"setup", "idle_wakeup", "drain", "steady", "submit_to_succeeded", "writer_group_commands", "coordinator_memory", "store", "targets"} {
		if _, ok := back[key]; !ok {
			t.Errorf("JSON lacks %q", key)
		}
	}
	drain := back["drain"].(map[string]any)
	if got := drain["docs_per_second"]; got != 242.4 {
		t.Errorf("drain.docs_per_second = %v, want 242.4", got)
	}
	if got := drain["cpu"].(map[string]any)["total_us_per_doc"]; got != 4190.0 {
		t.Errorf("drain.cpu.total_us_per_doc = %v, want 4190", got)
	}
}

func TestCount(t *testing.T) {
	t.Parallel()
	for n, want := range map[int]string{0: "0", 999: "999", 1000: "1,000", 50000: "50,000", 1234567: "1,234,567", -1500: "-1,500"} {
		if got := count(n); got != want {
			t.Errorf("count(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestCPUBetween(t *testing.T) {
	t.Parallel()
	a := cpuSample{coordinator: time.Second, renderers: 2 * time.Second, generator: 0}
	b := cpuSample{coordinator: 3 * time.Second, renderers: 3 * time.Second, generator: 500 * time.Millisecond}
	got := cpuBetween(a, b, 10000, 5*time.Second)
	want := &cpuResult{
		Documents: 10000, WallSeconds: 5,
		CoordinatorSeconds: 2, RenderersSeconds: 1, GeneratorSeconds: 0.5,
		CoordinatorPer1000: 0.2, RenderersPer1000: 0.1, GeneratorPer1000: 0.05,
		TotalMicrosPerDoc: 350,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("cpuBetween (-want +got):\n%s", diff)
	}
	if z := cpuBetween(a, b, 0, time.Second); z.TotalMicrosPerDoc != 0 || z.CoordinatorPer1000 != 0 {
		t.Errorf("cpuBetween of no documents = %+v, want zero rates", z)
	}
}

func TestGroupsBetween(t *testing.T) {
	t.Parallel()
	a := &histogram{Buckets: []bucket{{1, 10}, {2, 10}, {4, 10}, {8, 10}}, Count: 10, Sum: 10}
	b := &histogram{Buckets: []bucket{{1, 10}, {2, 10}, {4, 110}, {8, 110}}, Count: 110, Sum: 410}
	got := groupsBetween(a, b)
	if got.Groups != 100 || got.Commands != 400 || got.P50 != 3 {
		t.Errorf("groupsBetween = %+v, want 100 groups, 400 commands, p50 3", got)
	}
	if groupsBetween(nil, b) != nil {
		t.Error("groupsBetween without a first scrape is not nil")
	}
	if g := groupsBetween(a, a); g.Groups != 0 || g.P50 != 0 {
		t.Errorf("groupsBetween of no groups = %+v, want zeros (JSON has no NaN)", g)
	}
}

// lineStarting returns the first line of s that starts with prefix.
func lineStarting(s, prefix string) string {
	for l := range strings.SplitSeq(s, "\n") {
		if strings.HasPrefix(l, prefix) {
			return l
		}
	}
	return ""
}
