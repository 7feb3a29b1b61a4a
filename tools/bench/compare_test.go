package main

import (
	"strings"
	"testing"
)

func TestVerdict(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		lo, hi float64
		higher bool
		want   string
	}{
		{1.05, 1.10, true, "better"},
		{1.05, 1.10, false, "worse"},
		{0.90, 0.95, true, "worse"},
		{0.90, 0.95, false, "better"},
		{0.97, 1.05, true, "within noise"},
		{0.99, 1.01, false, "within noise"},
	} {
		if got := verdict(c.lo, c.hi, c.higher); got != c.want {
			t.Errorf("verdict(%v, %v, higher %v) = %q, want %q", c.lo, c.hi, c.higher, got, c.want)
		}
	}
}

func TestWriteComparison(t *testing.T) {
	t.Parallel()
	round := func(drain, cpu float64) []figure {
		return []figure{{figureDrain, drain, true}, {figureDrainCPU, cpu, false}}
	}
	runs := [2][][]figure{
		{round(10000, 100), round(11000, 110), round(9000, 90)},
		{round(12000, 80), round(13200, 88), round(10800, 72)},
	}
	var sb strings.Builder
	if err := writeComparison(&sb, config{rounds: 3, bin: "bin", compare: "old", renderers: 4, capacity: 64}, runs); err != nil {
		t.Fatal(err)
	}
	out := sb.String()
	for _, want := range []string{"drain docs/s      10000", "1.200", "1.200–1.200", "better", "0.800"} {
		if !strings.Contains(out, want) {
			t.Errorf("the comparison lacks %q:\n%s", want, out)
		}
	}
}

// TestClusterFigures: a cluster's round gives its rate over the single
// node's, the leader's and the followers' mean CPU and bytes per
// document, and documents per entry.
func TestClusterFigures(t *testing.T) {
	t.Parallel()
	single := &report{Drain: &drainResult{DocsPerSecond: 20000}}
	cl := &report{Drain: &drainResult{DocsPerSecond: 14000, Raft: &raftResult{DocsPerEntry: 70},
		CPU: &cpuResult{Nodes: []nodeUsage{
			{Node: "n1", Leader: true, CPUMicrosPerDoc: 80, WrittenPerDoc: 900},
			{Node: "n2", CPUMicrosPerDoc: 20, WrittenPerDoc: 500},
			{Node: "n3", CPUMicrosPerDoc: 30, WrittenPerDoc: 700},
		}}}}
	got := map[string]float64{}
	for _, f := range clusterFigures(single, cl) {
		got[f.name] = f.value
	}
	for name, want := range map[string]float64{
		"cluster drain docs/s": 14000, "cluster drain ÷ single": 0.7,
		"cluster drain leader CPU µs/doc": 80, "cluster drain leader bytes written/doc": 900,
		"cluster drain follower CPU µs/doc (mean)": 25, "cluster drain follower bytes written/doc (mean)": 600,
		"cluster drain docs/entry": 70,
	} {
		if v, ok := got[name]; !ok || v != want {
			t.Errorf("%s = %v (present %v), want %v", name, v, ok, want)
		}
	}
}
