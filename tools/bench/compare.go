package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"text/tabwriter"
)

// figure is one number of a report that a comparison follows.
type figure struct {
	name  string
	value float64
	// higher says a larger value is better.
	higher bool
}

// figuresOf lists the figures of rep that a comparison follows, in report
// order; phases that did not run give none.
func figuresOf(rep *report) []figure {
	var fs []figure
	add := func(name string, v float64, higher bool) { fs = append(fs, figure{name, v, higher}) }
	if r := rep.Idle; r != nil {
		add(figureIdle, r.P99MS, false)
	}
	if r := rep.Drain; r != nil {
		add(figureDrain, r.DocsPerSecond, true)
		add(figureDrainCPU, r.CPU.TotalMicrosPerDoc, false)
		add("drain coordinator CPU µs/doc", r.CPU.CoordinatorPer1000*1000, false)
		add("drain coordinator bytes written/doc", r.CPU.CoordinatorWrittenPerDoc, false)
	}
	if r := rep.Steady; r != nil {
		add(figureSteady, r.PeakDocsPerSecond, true)
		add(figureSteadyCPU, r.CPU.TotalMicrosPerDoc, false)
		add("steady coordinator CPU µs/doc", r.CPU.CoordinatorPer1000*1000, false)
		add("steady coordinator bytes written/doc", r.CPU.CoordinatorWrittenPerDoc, false)
	}
	if r := rep.Latency; r != nil {
		add(figureLatency, r.P99MS, false)
	}
	return fs
}

// runCompare runs the phases cfg.rounds times with the binaries in
// cfg.compare (the build to compare against) and in cfg.bin (this one),
// interleaved on this machine, the order swapped every round so that a
// drift of the machine's speed falls on both alike, and prints for each
// figure both medians and the median and range of the per-round ratios
// (this build ÷ the other). The load generator is this build's in both.
func runCompare(ctx context.Context, cfg config, lg *logger, stdout io.Writer) error {
	if cfg.compare == cfg.bin {
		return errors.New("-compare names the same directory as -bin")
	}
	prev, cur := cfg, cfg
	prev.bin, prev.rebuild = cfg.compare, false
	var runs [2][][]figure // [0] the other build, [1] this one; by round
	for round := range cfg.rounds {
		order := []int{0, 1}
		if round%2 == 1 {
			order = []int{1, 0}
		}
		for _, which := range order {
			c, label := prev, "the other build ("+cfg.compare+")"
			if which == 1 {
				c, label = cur, "this build ("+cfg.bin+")"
			}
			lg.printf("round %d of %d: %s", round+1, cfg.rounds, label)
			figs, err := roundFigures(ctx, c, lg)
			if err != nil {
				return fmt.Errorf("round %d, %s: %w", round+1, label, err)
			}
			runs[which] = append(runs[which], figs)
			cur.rebuild = false // built once, in the first round
		}
	}
	return writeComparison(stdout, cfg, runs)
}

// roundFigures runs one build's phases once and returns its figures: with
// -cluster, the single node's, then the cluster's (clusterFigures).
func roundFigures(ctx context.Context, cfg config, lg *logger) ([]figure, error) {
	single := cfg
	single.cluster = 0
	rep, err := runPhases(ctx, single, lg)
	if err != nil || cfg.cluster == 0 {
		return figuresOf(rep), err
	}
	cfg.rebuild = false
	crep, err := runPhases(ctx, cfg, lg)
	if err != nil {
		return nil, err
	}
	return append(figuresOf(rep), clusterFigures(rep, crep)...), nil
}

// clusterFigures lists the figures of a cluster's run, crep, that a
// comparison follows, beside the single node's of the same round, rep:
// its rate and the share of the single node's, the leader's and the
// followers' CPU and bytes written per document, documents per raft
// entry.
func clusterFigures(rep, crep *report) []figure {
	var fs []figure
	add := func(name string, v float64, higher bool) { fs = append(fs, figure{"cluster " + name, v, higher}) }
	phase := func(name string, rate, singleRate float64, cpu *cpuResult, raft *raftResult) {
		add(name+" docs/s", rate, true)
		if singleRate > 0 {
			add(name+" ÷ single", rate/singleRate, true)
		}
		var fCPU, fWritten, n float64
		for _, u := range cpu.Nodes {
			if u.Leader {
				add(name+" leader CPU µs/doc", u.CPUMicrosPerDoc, false)
				add(name+" leader bytes written/doc", u.WrittenPerDoc, false)
				continue
			}
			fCPU, fWritten, n = fCPU+u.CPUMicrosPerDoc, fWritten+u.WrittenPerDoc, n+1
		}
		if n > 0 {
			add(name+" follower CPU µs/doc (mean)", fCPU/n, false)
			add(name+" follower bytes written/doc (mean)", fWritten/n, false)
		}
		if raft != nil {
			add(name+" docs/entry", raft.DocsPerEntry, true)
		}
	}
	if crep.Drain != nil && rep.Drain != nil {
		phase("drain", crep.Drain.DocsPerSecond, rep.Drain.DocsPerSecond, crep.Drain.CPU, crep.Drain.Raft)
	}
	if crep.Steady != nil && rep.Steady != nil {
		phase("steady", crep.Steady.PeakDocsPerSecond, rep.Steady.PeakDocsPerSecond, crep.Steady.CPU, crep.Steady.Raft)
	}
	return fs
}

// writeComparison prints the table of runCompare.
func writeComparison(w io.Writer, cfg config, runs [2][][]figure) error {
	fmt.Fprintf(w, "leasehold bench -compare: %d rounds, interleaved; this build %s against %s; %d renderers × %d slots, %d CPUs\n",
		cfg.rounds, cfg.bin, cfg.compare, cfg.renderers, cfg.capacity, numCPU)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "figure\tother (median)\tthis (median)\tthis ÷ other (median)\tratio range\tverdict")
	for i, f := range runs[0][0] {
		var a, b, ratios []float64
		for r := range runs[0] {
			x, y := runs[0][r][i].value, runs[1][r][i].value
			a, b = append(a, x), append(b, y)
			if x != 0 {
				ratios = append(ratios, y/x)
			}
		}
		if len(ratios) == 0 {
			continue
		}
		med := median(ratios)
		lo, hi := slices.Min(ratios), slices.Max(ratios)
		fmt.Fprintf(tw, "%s\t%s\t%s\t%.3f\t%.3f–%.3f\t%s\n", f.name, plain(median(a)), plain(median(b)), med, lo, hi, verdict(lo, hi, f.higher))
	}
	return tw.Flush()
}

// verdict says whether every round's ratio points the same way, past a 2%
// band of noise: "better", "worse", or "within noise".
func verdict(lo, hi float64, higher bool) string {
	const band = 0.02
	var up bool
	switch {
	case lo > 1+band:
		up = true
	case hi < 1-band:
		up = false
	default:
		return "within noise"
	}
	if up == higher {
		return "better"
	}
	return "worse"
}

// plain formats a figure: whole above 100, two decimals below.
func plain(v float64) string {
	if math.Abs(v) >= 100 {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.2f", v)
}

// median returns the median of vs (which it sorts).
func median(vs []float64) float64 {
	if len(vs) == 0 {
		return math.NaN()
	}
	slices.Sort(vs)
	n := len(vs)
	if n%2 == 1 {
		return vs[n/2]
	}
	return (vs[n/2-1] + vs[n/2]) / 2
}

// runClusterComparison runs the phases on the single node, then on a
// cluster of cfg.cluster nodes, in one run on this machine, prints both
// reports and the cluster's figures as a share of the single node's (with
// -json, one object holding all three). The failover phase runs on the
// cluster only.
func runClusterComparison(ctx context.Context, cfg config, lg *logger, stdout io.Writer) error {
	single := cfg
	single.cluster = 0
	single.phases = slices.DeleteFunc(slices.Clone(cfg.phases), func(p string) bool { return p == "failover" })
	var reps [2]*report
	for i, c := range []config{single, cfg} {
		if len(c.phases) == 0 {
			continue // -phases failover: the single node has nothing to run
		}
		lg.printf("phases on %s", map[bool]string{true: fmt.Sprintf("a cluster of %d", cfg.cluster), false: "the single node"}[c.cluster > 0])
		rep, err := runPhases(ctx, c, lg)
		if err != nil {
			return err
		}
		rep.Setup.LoadAfter, _ = loadAverage()
		rep.check()
		reps[i] = rep
		if !cfg.json {
			if err := writeText(stdout, rep); err != nil {
				return err
			}
			fmt.Fprintln(stdout)
		}
		cfg.rebuild = false
	}
	var ratios []clusterRatio
	if reps[0] != nil {
		ratios = clusterRatios(reps[0], reps[1])
	}
	if cfg.json {
		return writeJSON(stdout, clusterReport{Nodes: cfg.cluster, Single: reps[0], Cluster: reps[1], Ratios: ratios})
	}
	if reps[0] == nil {
		return nil
	}
	fmt.Fprintf(stdout, "cluster of %d against the single node, same machine, same run:\n", cfg.cluster)
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "figure\tsingle node\tcluster\tcluster ÷ single")
	for _, r := range ratios {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%.2f\n", r.Figure, plain(r.Single), plain(r.Cluster), r.Ratio)
	}
	return tw.Flush()
}

// clusterReport is the -json output of -cluster.
type clusterReport struct {
	Nodes   int            `json:"nodes"`
	Single  *report        `json:"single_node"`
	Cluster *report        `json:"cluster"`
	Ratios  []clusterRatio `json:"cluster_vs_single"`
}

// clusterRatio is one figure of both runs and the cluster's over the
// single node's.
type clusterRatio struct {
	Figure  string  `json:"figure"`
	Single  float64 `json:"single_node"`
	Cluster float64 `json:"cluster"`
	Ratio   float64 `json:"ratio"`
}

// clusterRatios pairs the figures both reports have, by name.
func clusterRatios(single, cluster *report) []clusterRatio {
	var out []clusterRatio
	b := figuresOf(cluster)
	for _, x := range figuresOf(single) {
		for _, y := range b {
			if x.name == y.name && x.value != 0 {
				out = append(out, clusterRatio{Figure: x.name, Single: x.value, Cluster: y.value, Ratio: y.value / x.value})
			}
		}
	}
	return out
}
