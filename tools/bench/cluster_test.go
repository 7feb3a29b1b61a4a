package main

import (
	"bytes"
	"encoding/json"
	"io"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// raftPage is a leader's /metrics excerpt: its commit histogram (buckets
// from 0.5 ms, doubling) and commit index, before and after a phase.
func raftPage(index int, buckets map[string]int, count int, sum float64) string {
	var b strings.Builder
	b.WriteString("# TYPE leasehold_raft_commit_seconds histogram\n")
	for _, le := range []string{"0.0005", "0.001", "0.002", "0.004", "0.008", "0.016", "0.032", "0.064", "+Inf"} {
		b.WriteString(`leasehold_raft_commit_seconds_bucket{le="` + le + `"} ` + strconv.Itoa(buckets[le]) + "\n")
	}
	b.WriteString("leasehold_raft_commit_seconds_sum " + strconv.FormatFloat(sum, 'g', -1, 64) + "\n")
	b.WriteString("leasehold_raft_commit_seconds_count " + strconv.Itoa(count) + "\n")
	b.WriteString("leasehold_raft_commit_index " + strconv.Itoa(index) + "\n")
	b.WriteString("leasehold_raft_applied_index " + strconv.Itoa(index) + "\n")
	return b.String()
}

// parseRaft reads a raftSample from a page as scrapeRaft does.
func parseRaft(t *testing.T, page string) *raftSample {
	t.Helper()
	h, err := parseHistogram(strings.NewReader(page), raftCommitMetric)
	if err != nil {
		t.Fatal(err)
	}
	index, err := parseGauge(strings.NewReader(page), raftCommitIndex)
	if err != nil {
		t.Fatal(err)
	}
	return &raftSample{commit: h, index: index}
}

func TestRaftBetween(t *testing.T) {
	t.Parallel()
	before := parseRaft(t, raftPage(500, map[string]int{
		"0.002": 1, "0.004": 2, "0.008": 2, "0.016": 2, "0.032": 2, "0.064": 2, "+Inf": 2,
	}, 2, 0.005))
	// 100 commits in the phase: 40 in (4, 8] ms, 50 in (8, 16], 9 in
	// (16, 32], 1 in (32, 64]; 1.2 s in all.
	after := parseRaft(t, raftPage(604, map[string]int{
		"0.002": 1, "0.004": 2, "0.008": 42, "0.016": 92, "0.032": 101, "0.064": 102, "+Inf": 102,
	}, 102, 1.205))
	got := raftBetween(before, after, 1000)
	want := &raftResult{
		Entries:    100,
		LogEntries: 104,
		// 1,000 documents in 100 entries.
		DocsPerEntry: 10,
		// Rank 50 lies in (8, 16] ms, which holds ranks 41..90: 8 + 8 × 10/50.
		CommitP50MS: 9.6,
		// Rank 99 is the last of (16, 32] ms, which holds ranks 91..99.
		CommitP99MS:  32,
		CommitMeanMS: 12,
	}
	if diff := cmp.Diff(want, got, cmp.Comparer(func(a, b float64) bool { return math.Abs(a-b) < 1e-9 })); diff != "" {
		t.Errorf("raftBetween (-want +got):\n%s", diff)
	}

	t.Run("NoScrapeNoFigures", func(t *testing.T) {
		t.Parallel()
		if raftBetween(nil, after, 1000) != nil || raftBetween(before, nil, 1000) != nil {
			t.Error("raftBetween without both scrapes is not nil")
		}
	})
	t.Run("NoEntriesGivesZerosNotNaN", func(t *testing.T) {
		t.Parallel()
		got := raftBetween(after, after, 1000)
		if *got != (raftResult{}) {
			t.Errorf("raftBetween of no entries = %+v, want zeros (JSON has no NaN)", got)
		}
		if _, err := json.Marshal(got); err != nil {
			t.Error(err)
		}
	})
}

func TestAckLogFirstAfter(t *testing.T) {
	t.Parallel()
	kill := time.Date(2026, 12, 2, 3, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return kill.Add(time.Duration(ms) * time.Millisecond) }
	var l ackLog
	if _, ok := l.firstAfter(kill); ok {
		t.Error("firstAfter of an empty log found an acknowledgement")
	}
	// Sent before the kill, acknowledged after it (the old leader's answer
	// in flight, or a retry by the client): not the new leader's first.
	l.add(at(-5), at(300))
	l.add(at(10), at(900))
	l.add(at(0), at(700))
	l.add(at(400), at(800))
	got, ok := l.firstAfter(kill)
	if !ok || !got.Equal(at(700)) {
		t.Errorf("firstAfter(kill) = %v, %v; want the acknowledgement 700 ms after it", got.Sub(kill), ok)
	}
	if got, _ := l.firstAfter(at(11)); !got.Equal(at(800)) {
		t.Errorf("firstAfter(kill+11ms) = %v after the kill, want 800 ms", got.Sub(kill))
	}
}

func TestNodesBetween(t *testing.T) {
	t.Parallel()
	a := []nodeSample{{"n1", true, time.Second, 1000}, {"n2", false, time.Second, 500}, {"n3", false, 0, 0}}
	b := []nodeSample{{"n1", true, 3 * time.Second, 41000}, {"n3", false, 500 * time.Millisecond, 20000}, {"n2", false, 2 * time.Second, 30500}}
	got := nodesBetween(a, b, 10000)
	want := []nodeUsage{
		{Node: "n1", Leader: true, CPUMicrosPerDoc: 200, WrittenPerDoc: 4},
		{Node: "n3", CPUMicrosPerDoc: 50, WrittenPerDoc: 2},
		{Node: "n2", CPUMicrosPerDoc: 100, WrittenPerDoc: 3},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("nodesBetween (-want +got):\n%s", diff)
	}
	if got := nodesBetween(a, []nodeSample{{"n4", true, time.Second, 1}}, 10); got != nil {
		t.Errorf("nodesBetween of a node in one sample only = %+v, want none", got)
	}
}

// clusterSample is a cluster's report with the replication figures.
func clusterSample() *report {
	r := sampleReport()
	r.Store = nil
	r.Drain.CPU = &cpuResult{
		Documents: 50000, CoordinatorPer1000: 0.15, FollowersSeconds: 6, FollowersPer1000: 0.12, TotalMicrosPerDoc: 330,
		CoordinatorWrittenPerDoc: 7141, WrittenPerDoc: 21200,
		Nodes: []nodeUsage{{"n2", true, 155, 7141}, {"n1", false, 60, 7080}, {"n3", false, 61, 6982}},
	}
	r.Drain.Raft = &raftResult{Entries: 700, LogEntries: 702, DocsPerEntry: 71.4, CommitP50MS: 23.4, CommitP99MS: 62.7, CommitMeanMS: 26.2}
	r.Steady.Raft = &raftResult{Entries: 124, LogEntries: 124, DocsPerEntry: 70.7, CommitP50MS: 21.8, CommitP99MS: 108, CommitMeanMS: 24.8}
	r.Failover = &failoverResult{
		Kills: 2, InFlightBatches: 8, BatchSize: 100, SamplesMS: []float64{693, 999}, P50MS: 693, MaxMS: 999,
		Leaders: []string{"n3", "n1"}, RejoinP50MS: 288, RejoinMaxMS: 661, CatchUpMaxMS: 1155, Documents: 6102, RefusedSubmits: 1,
	}
	return r
}

func TestWriteTextCluster(t *testing.T) {
	t.Parallel()
	r := clusterSample()
	r.check()
	var buf bytes.Buffer
	if err := writeText(&buf, r); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	t.Log("\n" + out)
	wantLines := map[string][]string{
		"CPU drain":   {"coordinator 0.150 (the leader; its followers 0.120 together)", "per node per doc: n2 (leader) 155 µs, 7141 B written; n1 60 µs, 7080 B written; n3 61 µs, 6982 B written"},
		"raft drain":  {"71.4 docs/entry", "p50 23.4 ms  p99 62.7 ms  mean 26.2 ms", "700 entries (writer groups), commit index +702"},
		"raft steady": {"70.7 docs/entry", "p99 108 ms"},
		"failover":    {"p50 693 ms  max 999 ms", "2 kills under 8 batches of 100 in flight (693 ms, 999 ms; new leaders n3,n1)", "SERVING p50 288 ms max 661 ms, caught up max 1155 ms", "1 submissions given up"},
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
	if strings.Contains(lineStarting(out, "CPU steady  "), "per node") {
		t.Error("the steady CPU line names nodes its sample has none of")
	}
}

func TestClusterJSON(t *testing.T) {
	t.Parallel()
	single, cluster := sampleReport(), clusterSample()
	single.Store, single.Drain.DocsPerSecond = nil, 484.8
	var buf bytes.Buffer
	if err := writeJSON(&buf, clusterReport{Nodes: 3, Single: single, Cluster: cluster, Ratios: clusterRatios(single, cluster)}); err != nil {
		t.Fatal(err)
	}
	var back struct {
		Cluster struct {
			Drain struct {
				Raft raftResult `json:"raft"`
				CPU  cpuResult  `json:"cpu"`
			} `json:"drain"`
			Failover failoverResult `json:"failover"`
		} `json:"cluster"`
		Single struct {
			Failover *failoverResult `json:"failover"`
		} `json:"single_node"`
		Ratios []clusterRatio `json:"cluster_vs_single"`
	}
	if err := json.Unmarshal(buf.Bytes(), &back); err != nil {
		t.Fatalf("the JSON does not parse: %v", err)
	}
	if diff := cmp.Diff(*cluster.Drain.Raft, back.Cluster.Drain.Raft); diff != "" {
		t.Errorf("cluster.drain.raft (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(cluster.Drain.CPU.Nodes, back.Cluster.Drain.CPU.Nodes); diff != "" {
		t.Errorf("cluster.drain.cpu.nodes (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(*cluster.Failover, back.Cluster.Failover); diff != "" {
		t.Errorf("cluster.failover (-want +got):\n%s", diff)
	}
	if back.Single.Failover != nil {
		t.Error("the single node's report has a failover section")
	}
	if len(back.Ratios) == 0 || back.Ratios[1].Figure != figureDrain || back.Ratios[1].Ratio != 0.5 {
		t.Errorf("cluster_vs_single = %+v, want the drain at 242.4 ÷ 484.8 = 0.5 second", back.Ratios)
	}
}

func TestClusterRatiosPairFiguresByName(t *testing.T) {
	t.Parallel()
	single := &report{Steady: &steadyResult{PeakDocsPerSecond: 1000, CPU: &cpuResult{TotalMicrosPerDoc: 100}}}
	// The cluster ran a phase the single node did not: its figures come
	// first, and must not be set against the single node's steady ones.
	cluster := &report{
		Drain:  &drainResult{DocsPerSecond: 9, CPU: &cpuResult{TotalMicrosPerDoc: 9}},
		Steady: &steadyResult{PeakDocsPerSecond: 600, CPU: &cpuResult{TotalMicrosPerDoc: 250}},
	}
	got := clusterRatios(single, cluster)
	want := []clusterRatio{
		{figureSteady, 1000, 600, 0.6},
		{figureSteadyCPU, 100, 250, 2.5},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("clusterRatios (-want +got):\n%s", diff)
	}
}

func TestParseFlagsCluster(t *testing.T) {
	t.Parallel()
	cfg, err := parseFlags([]string{"-cluster", "3", "-json"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(append(allPhases, "failover"), cfg.phases); diff != "" {
		t.Errorf("phases of -cluster (-want +got):\n%s", diff)
	}
	if cfg.failoverKills != 5 {
		t.Errorf("failover kills = %d, want 5", cfg.failoverKills)
	}
	cfg, err = parseFlags([]string{"-cluster", "3", "-phases", "drain"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.has("failover") {
		t.Error("-phases drain with -cluster runs the failover phase")
	}
	for _, args := range [][]string{
		{"-phases", "failover"},
		{"-cluster", "3", "-failover-kills", "0"},
		{"-cluster", "3", "-failover-inflight", "70"},
	} {
		if _, err := parseFlags(args, io.Discard); err == nil {
			t.Errorf("parseFlags(%q): no error", args)
		}
	}
}
