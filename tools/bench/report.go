package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// report is everything one run measured: printed one figure per line, or
// as one JSON object with -json. Phases not run are absent.
type report struct {
	Started           time.Time       `json:"started"`
	Setup             setup           `json:"setup"`
	Idle              *idleResult     `json:"idle_wakeup,omitempty"`
	Drain             *drainResult    `json:"drain,omitempty"`
	Steady            *steadyResult   `json:"steady,omitempty"`
	Latency           *latencyResult  `json:"submit_to_succeeded,omitempty"`
	Groups            *groupResult    `json:"writer_group_commands,omitempty"`
	CoordinatorMemory *memory         `json:"coordinator_memory,omitempty"`
	Store             *storeResult    `json:"store,omitempty"`
	DoS               *dosResult      `json:"dos,omitempty"`
	Failover          *failoverResult `json:"failover,omitempty"`
	Targets           []targetOutcome `json:"targets"`
}

// setup describes what was measured.
type setup struct {
	Renderers   int    `json:"renderers"`
	Capacity    int    `json:"capacity_per_renderer"`
	CPUs        int    `json:"cpus"`
	Coordinator string `json:"coordinator_binary"`
	Renderer    string `json:"renderer_binary"`
	DocumentLen int    `json:"document_bytes"`
	// PreviewBytes is the renderers' --preview-bytes (0: the mock's own).
	PreviewBytes int `json:"preview_bytes,omitempty"`
	// LoadBefore and LoadAfter are the one-minute load averages when the
	// run started and ended: other work on the machine skews every figure.
	LoadBefore float64 `json:"load_average_before"`
	LoadAfter  float64 `json:"load_average_after"`
}

// idleResult is the idle wake-up: SubmitBatch acknowledgement to the
// grant's arrival at a renderer, for single documents.
type idleResult struct {
	Samples int     `json:"samples"`
	P50MS   float64 `json:"p50_ms"`
	P99MS   float64 `json:"p99_ms"`
	MaxMS   float64 `json:"max_ms"`
	Failed  int     `json:"failed"`
	Method  string  `json:"method"`
}

// drainResult is one drain of a backlog submitted while dispatch was
// paused.
type drainResult struct {
	Documents int `json:"documents"`
	Batches   int `json:"batches"`
	Succeeded int `json:"succeeded"`
	Failed    int `json:"failed"`
	// SubmitSeconds is how long submitting the backlog took.
	SubmitSeconds float64 `json:"submit_seconds"`
	// Seconds is from the ResumeDispatch call to the last SUCCEEDED's
	// arrival.
	Seconds       float64 `json:"seconds"`
	DocsPerSecond float64 `json:"docs_per_second"`
	// CPU covers the whole phase, submission included.
	CPU *cpuResult `json:"cpu"`
	// SubmitCPU is CPU's share up to ResumeDispatch: submitting the
	// backlog and opening the watches (per document of the backlog).
	SubmitCPU *cpuResult   `json:"submit_cpu,omitempty"`
	Groups    *groupResult `json:"writer_group_commands,omitempty"`
	Raft      *raftResult  `json:"raft,omitempty"`
}

// steadyResult is the closed-loop phase.
type steadyResult struct {
	BatchSize           int           `json:"batch_size"`
	Levels              []steadyLevel `json:"levels"`
	PeakDocsPerSecond   float64       `json:"peak_docs_per_second"`
	PeakInFlightBatches int           `json:"peak_in_flight_batches"`
	// Documents finished from the phase's start to the end of its last
	// level, the window of CPU.
	Documents int          `json:"documents"`
	Failed    int          `json:"failed"`
	CPU       *cpuResult   `json:"cpu"`
	Groups    *groupResult `json:"writer_group_commands,omitempty"`
	Raft      *raftResult  `json:"raft,omitempty"`
}

// steadyLevel is one level of the steady phase, after its warm-up.
type steadyLevel struct {
	InFlightBatches int     `json:"in_flight_batches"`
	Seconds         float64 `json:"seconds"`
	Documents       int     `json:"documents"`
	DocsPerSecond   float64 `json:"docs_per_second"`
}

// latencyResult is the open-loop phase: SubmitBatch acknowledgement to the
// arrival of each job's terminal update.
type latencyResult struct {
	TargetDocsPerSecond   float64 `json:"target_docs_per_second"`
	Basis                 string  `json:"basis"`
	AchievedDocsPerSecond float64 `json:"submitted_docs_per_second"`
	Documents             int     `json:"documents"`
	Batches               int     `json:"batches"`
	Samples               int     `json:"samples"`
	P50MS                 float64 `json:"p50_ms"`
	P99MS                 float64 `json:"p99_ms"`
	MaxMS                 float64 `json:"max_ms"`
	Failed                int     `json:"failed"`
}

// groupResult summarizes the writer's groups between two scrapes of
// leasehold_writer_group_commands.
type groupResult struct {
	Groups   int64   `json:"groups"`
	Commands int64   `json:"commands"`
	P50      float64 `json:"p50"`
	P99      float64 `json:"p99"`
}

// cpuResult is the CPU time each side used over a window, from
// /proc/<pid>/stat.
type cpuResult struct {
	Documents          int     `json:"documents"`
	WallSeconds        float64 `json:"wall_seconds"`
	CoordinatorSeconds float64 `json:"coordinator_seconds"`
	RenderersSeconds   float64 `json:"renderers_seconds"`
	GeneratorSeconds   float64 `json:"generator_seconds"`
	CoordinatorPer1000 float64 `json:"coordinator_seconds_per_1000_docs"`
	RenderersPer1000   float64 `json:"renderers_seconds_per_1000_docs"`
	GeneratorPer1000   float64 `json:"generator_seconds_per_1000_docs"`
	// FollowersSeconds and FollowersPer1000 are a cluster's other nodes
	// together (-cluster); Coordinator* is then its leader.
	FollowersSeconds  float64 `json:"followers_seconds,omitempty"`
	FollowersPer1000  float64 `json:"followers_seconds_per_1000_docs,omitempty"`
	TotalMicrosPerDoc float64 `json:"total_us_per_doc"`
	// CoordinatorWrittenPerDoc and WrittenPerDoc are the bytes written to
	// storage (/proc/<pid>/io write_bytes) per document, by the
	// coordinator and by every process.
	CoordinatorWrittenPerDoc float64 `json:"coordinator_written_bytes_per_doc"`
	WrittenPerDoc            float64 `json:"written_bytes_per_doc"`
	// Nodes are a cluster's nodes one by one, the leader first.
	Nodes []nodeUsage `json:"nodes,omitempty"`
	// StoreSeconds, StorePer1000 and StoreWrittenPerDoc are the
	// S3-compatible artifact store server's (-cluster), counted in
	// TotalMicrosPerDoc too; a single node's directory store is the
	// coordinator's own I/O.
	StoreSeconds       float64 `json:"store_server_seconds,omitempty"`
	StorePer1000       float64 `json:"store_server_seconds_per_1000_docs,omitempty"`
	StoreWrittenPerDoc float64 `json:"store_server_written_bytes_per_doc,omitempty"`
}

// nodeUsage is one cluster node's share of a CPU window.
type nodeUsage struct {
	Node            string  `json:"node"`
	Leader          bool    `json:"leader"`
	CPUMicrosPerDoc float64 `json:"cpu_us_per_doc"`
	WrittenPerDoc   float64 `json:"written_bytes_per_doc"`
}

// raftResult is a phase's replication, from the leader's
// leasehold_raft_commit_seconds histogram (one observation per writer
// group, which is one raft entry) and leasehold_raft_commit_index, scraped
// before and after.
type raftResult struct {
	// Entries are the writer groups committed; LogEntries the commit
	// index's advance, which also counts raft's own entries.
	Entries      int64   `json:"entries"`
	LogEntries   int64   `json:"log_entries"`
	DocsPerEntry float64 `json:"documents_per_entry"`
	// The commit latency, proposal to apply on the leader: p50 and p99
	// interpolated in the histogram's buckets, and the mean.
	CommitP50MS  float64 `json:"commit_p50_ms"`
	CommitP99MS  float64 `json:"commit_p99_ms"`
	CommitMeanMS float64 `json:"commit_mean_ms"`
}

// failoverResult is the failover phase: SIGKILL of the leader under load
// to the first acknowledgement of a submission sent after the kill.
type failoverResult struct {
	Kills           int       `json:"kills"`
	InFlightBatches int       `json:"in_flight_batches"`
	BatchSize       int       `json:"batch_size"`
	SamplesMS       []float64 `json:"samples_ms"`
	P50MS           float64   `json:"p50_ms"`
	MaxMS           float64   `json:"max_ms"`
	// Leaders are the nodes that took over, kill by kill.
	Leaders []string `json:"new_leaders"`
	// Rejoin is a killed node's restart on its data directory, exec to
	// SERVING; CatchUp exec to applying the leader's commit index of then.
	RejoinP50MS  float64 `json:"rejoin_p50_ms"`
	RejoinMaxMS  float64 `json:"rejoin_max_ms"`
	CatchUpMaxMS float64 `json:"catch_up_max_ms"`
	// Documents finished during the phase; RefusedSubmits are submissions
	// the client gave up on with a leader-change error (sent again).
	Documents      int `json:"documents"`
	RefusedSubmits int `json:"refused_submits"`
	Failed         int `json:"failed"`
}

// storeResult is the -store mode.
type storeResult struct {
	Jobs      int `json:"jobs"`
	Succeeded int `json:"succeeded"`
	Queued    int `json:"queued"`
	// FillSeconds is the time to fill the store, the empty drain excluded.
	FillSeconds float64 `json:"fill_seconds"`
	// ShutdownSeconds is SIGTERM to exit of the full coordinator.
	ShutdownSeconds float64 `json:"shutdown_seconds"`
	// StartupSeconds is exec to the first SERVING health answer.
	StartupSeconds float64 `json:"startup_seconds"`
	HealthPollMS   float64 `json:"health_poll_ms"`
	// Memory is the coordinator's right after it answered SERVING.
	Memory *memory `json:"memory_after_startup,omitempty"`
	// Overview times GetOverview (operator, every team) over gRPC right
	// after start-up, with every stored job counted.
	Overview *readsResult `json:"overview_after_startup,omitempty"`
	// CancelSeconds is the time to cancel the queued half before the drain.
	CancelSeconds float64      `json:"cancel_seconds"`
	EmptyDrain    *drainResult `json:"empty_store_drain"`
	FullDrain     *drainResult `json:"full_store_drain"`
	// DrainRatio is the full store's drain rate over the empty store's.
	DrainRatio float64 `json:"drain_ratio"`
}

// targetOutcome is one figure against its target.
type targetOutcome struct {
	Figure string  `json:"figure"`
	Value  float64 `json:"value"`
	Target string  `json:"target"`
	Met    bool    `json:"met"`
}

// The speed targets.
const (
	targetDrain       = 15000 // documents/s, at least
	targetSteady      = 10000 // documents/s, at least
	targetCPU         = 130   // µs per document, at most
	targetIdleP99     = 2     // ms, below
	targetLatencyP99  = 50    // ms, below
	targetStartup     = 2     // s, below, with 1,000,000 stored jobs
	targetStoreMemory = 512   // MiB, below
	targetOverviewP99 = 50    // ms, below: GetOverview with the full store
	// targetStartupHuge is the start-up target from hugeStore stored jobs on.
	targetStartupHuge = 5 // s, below
	hugeStore         = 10_000_000
	// targetStoreDrainRatio is the full-store drain over the empty store's,
	// at least: within 20%.
	targetStoreDrainRatio = 0.8
)

// newReport starts the report of a run.
func newReport(cfg config, bins binaries) *report {
	load, _ := loadAverage()
	return &report{
		Started: time.Now().UTC().Truncate(time.Second),
		Setup: setup{
			Renderers:    cfg.renderers,
			Capacity:     cfg.capacity,
			CPUs:         numCPU,
			Coordinator:  bins.coordinator,
			Renderer:     bins.renderer,
			DocumentLen:  documentSize,
			LoadBefore:   load,
			PreviewBytes: cfg.previewBytes,
		},
	}
}

// check fills in Targets from the figures present.
func (r *report) check() {
	r.Targets = nil
	atLeast := func(figure string, v float64, target float64, unit string) {
		r.Targets = append(r.Targets, targetOutcome{Figure: figure, Value: v, Target: fmt.Sprintf("≥ %s %s", count(int(target)), unit), Met: v >= target})
	}
	atMost := func(figure string, v float64, target float64, unit string) {
		r.Targets = append(r.Targets, targetOutcome{Figure: figure, Value: v, Target: fmt.Sprintf("≤ %s %s", count(int(target)), unit), Met: v <= target})
	}
	below := func(figure string, v float64, target float64, unit string) {
		r.Targets = append(r.Targets, targetOutcome{Figure: figure, Value: v, Target: fmt.Sprintf("< %s %s", count(int(target)), unit), Met: v < target})
	}
	if r.Idle != nil {
		below(figureIdle, r.Idle.P99MS, targetIdleP99, "ms")
	}
	if r.Drain != nil {
		atLeast(figureDrain, r.Drain.DocsPerSecond, targetDrain, "docs/s")
		atMost(figureDrainCPU, r.Drain.CPU.TotalMicrosPerDoc, targetCPU, "µs/doc")
	}
	if r.Steady != nil {
		atLeast(figureSteady, r.Steady.PeakDocsPerSecond, targetSteady, "docs/s")
		atMost(figureSteadyCPU, r.Steady.CPU.TotalMicrosPerDoc, targetCPU, "µs/doc")
	}
	if r.Latency != nil {
		below(figureLatency, r.Latency.P99MS, targetLatencyP99, "ms")
	}
	if s := r.Store; s != nil {
		startup := float64(targetStartup)
		if s.Jobs >= hugeStore {
			startup = targetStartupHuge
		}
		below(figureStartup, s.StartupSeconds, startup, "s")
		if s.Memory != nil && s.Jobs < hugeStore {
			below(figureStoreMemory, mib(s.Memory.HWM), targetStoreMemory, "MiB")
		}
		if s.Overview != nil {
			below(figureOverview, s.Overview.P99MS, targetOverviewP99, "ms")
		}
		if s.FullDrain != nil && s.EmptyDrain != nil {
			r.Targets = append(r.Targets, targetOutcome{Figure: figureStoreDrain, Value: s.DrainRatio,
				Target: fmt.Sprintf("≥ %.1f× the empty store's", targetStoreDrainRatio), Met: s.DrainRatio >= targetStoreDrainRatio})
		}
	}
}

// The figures checked against a target, as named in Targets.
const (
	figureIdle        = "idle wake-up p99 ms"
	figureDrain       = "drain docs/s"
	figureDrainCPU    = "drain CPU µs/doc"
	figureSteady      = "steady peak docs/s"
	figureSteadyCPU   = "steady CPU µs/doc"
	figureLatency     = "submit→SUCCEEDED p99 ms"
	figureStartup     = "store start-up s"
	figureStoreMemory = "store start-up VmHWM MiB"
	figureStoreDrain  = "store full drain ÷ empty store drain"
	figureOverview    = "store GetOverview p99 ms"
)

// writeJSON writes v as indented JSON.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// writeText writes the report one figure per line: name, value, the target
// with "ok" or "MISS" where there is one, and how it was measured.
func writeText(w io.Writer, r *report) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	line := func(name, value, detail, target string) {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", name, value, target, detail)
	}
	verdict := func(figure string) string {
		for _, t := range r.Targets {
			if t.Figure == figure {
				if t.Met {
					return "ok (" + t.Target + ")"
				}
				return "MISS (" + t.Target + ")"
			}
		}
		return ""
	}
	s := r.Setup
	previews := "the mock's previews"
	if s.PreviewBytes > 0 {
		previews = fmt.Sprintf("previews of %s bytes", count(s.PreviewBytes))
	}
	fmt.Fprintf(w, "leasehold bench %s: %d renderers × %d slots, %s, %d CPUs (load average %.1f before, %.1f after), %s\n",
		r.Started.Format(time.RFC3339), s.Renderers, s.Capacity, previews, s.CPUs, s.LoadBefore, s.LoadAfter, s.Coordinator)
	if x := r.Idle; x != nil {
		line("idle wake-up", fmt.Sprintf("p50 %s  p99 %s", msText(x.P50MS), msText(x.P99MS)),
			fmt.Sprintf("%s samples, max %s; SubmitBatch ack → grant line in a renderer's --record file%s", count(x.Samples), msText(x.MaxMS), failedText(x.Failed)),
			verdict(figureIdle))
	}
	if x := r.Drain; x != nil {
		drainLine(line, "drain", x, "", verdict(figureDrain))
	}
	if x := r.Steady; x != nil {
		var levels []string
		for _, l := range x.Levels {
			levels = append(levels, fmt.Sprintf("%d→%.0f", l.InFlightBatches, l.DocsPerSecond))
		}
		line("steady", docsPerSecond(x.PeakDocsPerSecond),
			fmt.Sprintf("closed loop, batches of %d; in flight→docs/s: %s%s", x.BatchSize, strings.Join(levels, ", "), failedText(x.Failed)),
			verdict(figureSteady))
	}
	if x := r.Latency; x != nil {
		line("submit→SUCCEEDED", fmt.Sprintf("p50 %s  p99 %s", msText(x.P50MS), msText(x.P99MS)),
			fmt.Sprintf("open loop at %.0f docs/s (%s; %.0f sent), %s docs in %s batches, max %s%s",
				x.TargetDocsPerSecond, x.Basis, x.AchievedDocsPerSecond, count(x.Documents), count(x.Batches), msText(x.MaxMS), failedText(x.Failed)),
			verdict(figureLatency))
	}
	if g := r.Groups; g != nil {
		var parts []string
		if r.Drain != nil && r.Drain.Groups != nil {
			parts = append(parts, "drain "+groupText(r.Drain.Groups))
		}
		if r.Steady != nil && r.Steady.Groups != nil {
			parts = append(parts, "steady "+groupText(r.Steady.Groups))
		}
		detail := fmt.Sprintf("over the run: %s commands in %s groups", count(int(g.Commands)), count(int(g.Groups)))
		if len(parts) > 0 {
			detail += "; " + strings.Join(parts, ", ")
		}
		line("writer group size", groupText(g), detail, "")
	}
	if x := r.Drain; x != nil && x.CPU != nil {
		cpuLine(line, "CPU drain", x.CPU, "whole phase, submission included", verdict(figureDrainCPU))
	}
	if x := r.Drain; x != nil && x.SubmitCPU != nil {
		cpuLine(line, "  of it submitting", x.SubmitCPU, "up to ResumeDispatch", "")
	}
	if x := r.Steady; x != nil && x.CPU != nil {
		cpuLine(line, "CPU steady", x.CPU, "phase start to last level end", verdict(figureSteadyCPU))
	}
	if x := r.Drain; x != nil && x.Raft != nil {
		raftLine(line, "raft drain", x.Raft)
	}
	if x := r.Steady; x != nil && x.Raft != nil {
		raftLine(line, "raft steady", x.Raft)
	}
	if x := r.Failover; x != nil {
		failoverLine(line, x)
	}
	if x := r.DoS; x != nil {
		reads := func(x readsResult) string { return fmt.Sprintf("p50 %s  p99 %s", msText(x.P50MS), msText(x.P99MS)) }
		line("GetJob, alone", reads(x.Baseline), fmt.Sprintf("another team's reads, %d sequential calls, max %s", x.Baseline.N, msText(x.Baseline.MaxMS)), "")
		line("GetJob, flood", reads(x.Flood.Reads), fmt.Sprintf("while %d unauthenticated callers made %.0f refused calls/s; coordinator log grew %.0f bytes/s; max %s",
			x.Flood.Callers, x.Flood.CallsPerSecond, x.Flood.LogBytesPerSecond, msText(x.Flood.Reads.MaxMS)), "")
		line("GetJob, streams", reads(x.Streams.Reads), fmt.Sprintf("while one submitter holds %d watch streams (%d of %d asked refused TOO_MANY_STREAMS); coordinator RSS %.0f → %.0f MiB; max %s",
			x.Streams.Opened, x.Streams.Refused, x.Streams.Asked, x.Streams.RSSBeforeMiB, x.Streams.RSSAfterMiB, msText(x.Streams.Reads.MaxMS)), "")
	}
	if m := r.CoordinatorMemory; m != nil {
		line("coordinator memory", memoryText(m), "at the end of the run", "")
	}
	if x := r.Store; x != nil {
		line("store", count(x.Jobs)+" jobs",
			fmt.Sprintf("%s SUCCEEDED + %s QUEUED, filled in %s; SIGTERM to exit %s", count(x.Succeeded), count(x.Queued), secondsText(x.FillSeconds), secondsText(x.ShutdownSeconds)), "")
		line("store start-up", secondsText(x.StartupSeconds),
			fmt.Sprintf("restart on the same data: exec to health SERVING, polled every %s", msText(x.HealthPollMS)),
			verdict(figureStartup))
		if x.Memory != nil {
			line("store memory", memoryText(x.Memory), "right after SERVING; the target applies to VmHWM", verdict(figureStoreMemory))
		}
		if o := x.Overview; o != nil {
			line("store overview", fmt.Sprintf("p50 %s  p99 %s", msText(o.P50MS), msText(o.P99MS)),
				fmt.Sprintf("GetOverview over gRPC (operator, every team), %d calls one after another right after start-up; max %s", o.N, msText(o.MaxMS)),
				verdict(figureOverview))
		}
		if x.EmptyDrain != nil {
			drainLine(line, "store empty drain", x.EmptyDrain, "empty store", "")
		}
		if x.FullDrain != nil {
			drainLine(line, "store full drain", x.FullDrain,
				fmt.Sprintf("against the full store, %.2f× the empty store's; queued half cancelled first in %s", x.DrainRatio, secondsText(x.CancelSeconds)),
				verdict(figureStoreDrain))
		}
		if d := x.FullDrain; d != nil && d.CPU != nil {
			cpuLine(line, "CPU store drain", d.CPU, "whole phase, submission included", "")
		}
	}
	return tw.Flush()
}

// drainLine writes the line of one drain.
func drainLine(line func(name, value, detail, target string), name string, x *drainResult, note, target string) {
	detail := fmt.Sprintf("%s docs in %s s from ResumeDispatch to the last SUCCEEDED (submitted in %s)%s",
		count(x.Documents), strconv.FormatFloat(x.Seconds, 'f', 2, 64), secondsText(x.SubmitSeconds), failedText(x.Failed))
	if note != "" {
		detail += "; " + note
	}
	line(name, docsPerSecond(x.DocsPerSecond), detail, target)
}

// cpuLine writes the line of one CPU window.
func cpuLine(line func(name, value, detail, target string), name string, c *cpuResult, window, target string) {
	line(name, fmt.Sprintf("%.0f µs/doc", c.TotalMicrosPerDoc),
		fmt.Sprintf("CPU-s per 1,000 docs: coordinator %.3f%s, renderers %.3f, generator %.3f%s (%s docs, %s; 10 ms ticks); "+
			"written to disk per doc: coordinator %s, all %s%s%s",
			c.CoordinatorPer1000, followersText(c), c.RenderersPer1000, c.GeneratorPer1000, storeCPUText(c), count(c.Documents), window,
			bytesText(c.CoordinatorWrittenPerDoc), bytesText(c.WrittenPerDoc), storeWrittenText(c), nodesText(c.Nodes)),
		target)
}

// storeCPUText is the store server's share of a CPU line's CPU.
func storeCPUText(c *cpuResult) string {
	if c.StoreSeconds == 0 && c.StoreWrittenPerDoc == 0 {
		return ""
	}
	return fmt.Sprintf(", artifact store server %.3f", c.StorePer1000)
}

// storeWrittenText is the store server's share of a CPU line's bytes.
func storeWrittenText(c *cpuResult) string {
	if c.StoreSeconds == 0 && c.StoreWrittenPerDoc == 0 {
		return ""
	}
	return ", artifact store server " + bytesText(c.StoreWrittenPerDoc)
}

// nodesText is a cluster's nodes' share of a CPU line, one by one.
func nodesText(nodes []nodeUsage) string {
	if len(nodes) == 0 {
		return ""
	}
	parts := make([]string, len(nodes))
	for i, n := range nodes {
		role := ""
		if n.Leader {
			role = " (leader)"
		}
		parts[i] = fmt.Sprintf("%s%s %.0f µs, %s written", n.Node, role, n.CPUMicrosPerDoc, bytesText(n.WrittenPerDoc))
	}
	return "; per node per doc: " + strings.Join(parts, "; ")
}

// raftLine writes the replication line of one phase.
func raftLine(line func(name, value, detail, target string), name string, x *raftResult) {
	line(name, fmt.Sprintf("%.1f docs/entry", x.DocsPerEntry),
		fmt.Sprintf("commit (proposal → applied on the leader) p50 %s  p99 %s  mean %s; %s entries (writer groups), commit index +%s",
			msText(x.CommitP50MS), msText(x.CommitP99MS), msText(x.CommitMeanMS), count(int(x.Entries)), count(int(x.LogEntries))),
		"")
}

// failoverLine writes the line of the failover phase.
func failoverLine(line func(name, value, detail, target string), x *failoverResult) {
	samples := make([]string, len(x.SamplesMS))
	for i, v := range x.SamplesMS {
		samples[i] = msText(v)
	}
	line("failover", fmt.Sprintf("p50 %s  max %s", msText(x.P50MS), msText(x.MaxMS)),
		fmt.Sprintf("SIGKILL of the leader → first submission sent after it acknowledged, %d kills under %d batches of %d in flight (%s; new leaders %s); "+
			"killed node restarted on its data: SERVING p50 %s max %s, caught up max %s; %s docs finished, %d submissions given up by the client and sent again%s",
			x.Kills, x.InFlightBatches, x.BatchSize, strings.Join(samples, ", "), strings.Join(x.Leaders, ","),
			msText(x.RejoinP50MS), msText(x.RejoinMaxMS), msText(x.CatchUpMaxMS), count(x.Documents), x.RefusedSubmits, failedText(x.Failed)),
		"")
}

// followersText is a cluster's followers' share of a CPU line.
func followersText(c *cpuResult) string {
	if c.FollowersSeconds == 0 {
		return ""
	}
	return fmt.Sprintf(" (the leader; its followers %.3f together)", c.FollowersPer1000)
}

// bytesText formats a byte count per document.
func bytesText(v float64) string {
	if v >= 10<<10 {
		return fmt.Sprintf("%.1f KiB", v/(1<<10))
	}
	return fmt.Sprintf("%.0f B", v)
}

// docsPerSecond formats a throughput.
func docsPerSecond(v float64) string { return count(int(v+0.5)) + " docs/s" }

// msText formats milliseconds with three significant digits or so.
func msText(v float64) string {
	switch {
	case v < 10:
		return fmt.Sprintf("%.2f ms", v)
	case v < 100:
		return fmt.Sprintf("%.1f ms", v)
	}
	return fmt.Sprintf("%.0f ms", v)
}

// secondsText formats seconds.
func secondsText(v float64) string {
	if v < 10 {
		return fmt.Sprintf("%.3f s", v)
	}
	return fmt.Sprintf("%.1f s", v)
}

// groupText formats a group size summary.
func groupText(g *groupResult) string {
	if g.Groups == 0 {
		return "no groups"
	}
	return fmt.Sprintf("p50 %.1f  p99 %.1f", g.P50, g.P99)
}

// memoryText formats a memory reading.
func memoryText(m *memory) string {
	if m.Anon == 0 && m.File == 0 {
		return fmt.Sprintf("VmHWM %.1f MiB  VmRSS %.1f MiB", mib(m.HWM), mib(m.RSS))
	}
	return fmt.Sprintf("VmHWM %.1f MiB  VmRSS %.1f MiB (anonymous %.1f, file-backed %.1f)", mib(m.HWM), mib(m.RSS), mib(m.Anon), mib(m.File))
}

// failedText notes jobs that did not succeed, if any.
func failedText(n int) string {
	if n == 0 {
		return ""
	}
	return fmt.Sprintf("; %s jobs did not succeed", count(n))
}

// mib converts bytes to mebibytes.
func mib(b int64) float64 { return float64(b) / (1 << 20) }

// count formats n with thousands separators: 1,234,567.
func count(n int) string {
	s := strconv.Itoa(n)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}
