// Command bench is Leasehold's end-to-end benchmark: it starts a real
// coordinator and mock renderers as separate processes, drives them with an
// in-process load generator built on the client library, and reports the
// figures the speed targets are stated in, one line each (or one JSON object
// with -json).
//
// Usage, from the repository root:
//
//	go run ./tools/bench                               # every phase, default sizes
//	go run ./tools/bench -drain-docs 5000 -duration 10s -latency-duration 5s
//	go run ./tools/bench -phases drain -json
//	go run ./tools/bench -store 1000000                # start-up and drain with a big store
//	go run ./tools/bench fairness -n-alpha 2000        # fair dispatch against FIFO
//
// The coordinator and renderer binaries come from -bin (default ./bin) and
// are built there with go build when missing, or always with -rebuild; pass
// -rebuild after changing the code, or bin/ holds yesterday's binaries. The
// coordinator runs on a fresh data directory under a temporary directory
// (-tmp; fsync on, as by default: put it on a real disk, not tmpfs), on free
// loopback ports, with its metrics listener on; the development tokens are
// used (dev-alpha submits as team alpha, dev-renderer, dev-operator).
// -renderers renderers with -capacity slots each render with zero latency, so
// every figure is the cost of coordination. LEASEHOLD_* variables are not
// passed to the children; -coordinator-flags and -renderer-flags add flags.
//
// The phases, in order (-phases picks some):
//
//   - idle: renderers idle; one document is submitted at a time, -idle-gap
//     apart, -idle-samples times. Wake-up is the time from the SubmitBatch
//     acknowledgement to the grant's arrival at a renderer, seen as the
//     renderer appending it to its --record file (inotify, microsecond
//     resolution). The renderers are then restarted without --record, so
//     that the later phases do not pay for the file.
//   - drain: dispatch paused (OperatorService.PauseDispatch as dev-operator),
//     -drain-docs documents submitted in batches of -batch by -submitters
//     goroutines, watches opened, dispatch resumed. Throughput is the
//     documents over the time from the ResumeDispatch call to the arrival of
//     the last SUCCEEDED. Its CPU covers the whole phase; the "of it
//     submitting" line is the share up to ResumeDispatch.
//   - steady: submitting and rendering at once, closed loop: for each level
//     of -steady-inflight (batches of -steady-batch documents kept in flight,
//     each submitted again as soon as the previous one is terminal), for
//     -duration divided among the levels, the first quarter (at most 1 s)
//     discarded as warm-up. The peak is the best level.
//   - latency: open loop at half the steady peak (or -latency-rate) for
//     -latency-duration: every -latency-tick a batch of the documents due is
//     submitted, whatever is still in flight. Latency is from the SubmitBatch
//     acknowledgement to the arrival of the job's terminal update on its
//     batch's watch. The watch can only be opened once the batch id is known,
//     so a job that finished before the watch's opening snapshot counts at
//     the snapshot's arrival.
//
// Progress is always followed with the client library's FollowBatch
// (terminal updates only, batched), never by polling; a job's terminal
// update is timed as FollowBatch yields it. At most -max-watches watches
// are open at once (the coordinator allows 64 per caller).
//
// Besides, the report gives the writer's group size p50 and p99 (the
// coordinator's leasehold_writer_group_commands histogram, scraped from
// /metrics before and after, quantiles interpolated in the buckets as
// histogram_quantile does, the first bucket starting at 1), CPU time per
// 1,000 documents of the coordinator, the renderers together and the load
// generator (utime + stime from /proc/<pid>/stat, 10 ms ticks; drain from the
// first submission to the last SUCCEEDED, steady from its start to the end of
// its last level) with their total in µs per document, the coordinator's
// VmHWM and VmRSS at the end, and the load average before and after: the
// figures mean little on a busy machine.
//
// With -phases dos (not part of the default run), the harness times
// another team's GetJob calls alone, while 64 unauthenticated callers flood
// the coordinator, and while one submitter asks for 2,000 watch streams
// (the coordinator lets a caller hold 64), and reports the coordinator's log
// growth and memory meanwhile.
//
// With -cluster 3 (or 5), the phases run on the single node and then on a
// replicated cluster of that many coordinator nodes on this machine, in
// the same run, and a table gives the cluster's figures over the single
// node's (-json prints both reports and the table as one object). The
// renderers and the generator dial every node and find the leader
// themselves. The cluster's CPU lines add each node's CPU µs and bytes
// written per document, the leader first, and a line per phase gives the
// documents per raft entry (the leader's leasehold_raft_commit_seconds
// count is one per writer group, which is one entry; the commit index's
// advance, which also counts raft's own entries, beside it) and the
// commit latency, proposal to apply on the leader, p50 and p99
// interpolated in that histogram's buckets. Unless -phases says
// otherwise, a failover phase runs last on the cluster: with
// -failover-inflight batches of -steady-batch kept in flight, closed
// loop, -failover-kills times it lets the load run -failover-gap, kills
// the leader with SIGKILL and times the kill to the first acknowledgement
// of a submission sent after it (a one-document probe sent at once, or a
// batch of the load); the killed node is then restarted on its data
// directory and timed to SERVING and to applying the leader's commit
// index of that moment. The report gives p50 and max, every sample, and
// the restarts.
//
// With -preview-bytes N, the renderers pad their previews to N bytes of
// incompressible data (--preview-bytes), so that the figures are those of
// realistic previews: above the coordinator's inline threshold (16 KiB by
// default; -coordinator-flags --inline-artifact-bytes moves it) they go to
// the artifact store the docs recommend for each shape. The single node
// uses its default, the directory beside its data file; -cluster starts
// an S3-compatible server for its nodes (versitygw, from -bin, built there
// from scripts/s3server when missing) and reports its CPU time and bytes
// written beside the coordinators'.
//
// With -compare DIR, the phases run -rounds times (default 3) with the
// coordinator and renderer in DIR (another build: check it out and run
// scripts/build there, or go build -o DIR ./coordinator/cmd/coordinator
// ./renderer/cmd/renderer) and -rounds times with those in -bin,
// interleaved, the order swapped every round, and the report is a table: for
// every figure, each build's median, and the median and range of the
// per-round ratios of this build over DIR's, with a verdict that calls a
// change only when every round's ratio is past 2% on the same side. Judge a
// change this way, on one machine in one run, not against a figure from
// another day. With -cluster too, each round of each build runs the single
// node and then the cluster, and the table adds the cluster's figures: its
// rate and its share of the same round's single node, the leader's and
// the followers' (mean) CPU µs and bytes written per document, and
// documents per raft entry (no failover phase).
//
// With -store N, the phases are replaced by: a drain on the empty store;
// filling the store to N jobs, half of them SUCCEEDED (closed loop) and half
// QUEUED (submitted with dispatch paused); SIGTERM to the coordinator and a
// restart on the same data directory, timed from exec to the first SERVING
// answer of grpc.health.v1 Check (polled every -health-poll) with the
// coordinator's VmHWM and VmRSS then, and GetOverview over gRPC timed
// right after; then, after the live half has been
// cancelled, a drain of -drain-docs fresh documents against the full store,
// compared with the empty-store drain. The coordinator gets
// --max-team-queue large enough for the live half.
//
// # fairness
//
// The fairness subcommand measures fair dispatch against plain FIFO
// dispatch. It runs one scenario twice, each time on a fresh stack of its
// own (a coordinator on a new data directory, with the default flags the
// first time and with --fifo the second, and -renderers renderers of
// -capacity slots, each rendering in -latency): team alpha submits
// -n-alpha documents (20,000 by default, in batches of -alpha-batch);
// once alpha holds every renderer slot, team beta submits one batch of
// -n-beta documents (20) and follows it until every document has
// SUCCEEDED; then alpha's remaining work is cancelled. From beta's job
// histories it reports beta's queue wait (SUBMITTED to first LEASED) at
// p50, p99 and max, and how long beta's last document took from the
// batch's submission, against the ideal of beta rendering at its fair
// share of the renderers from the moment it arrives:
//
//	ideal = ceil(N_beta / (C/2)) × L
//
// with C the renderer slots (-renderers × -capacity) and L the render
// latency: two teams of equal weight share C evenly. Fair dispatch meets
// the target when beta's last document is done within 1.5 × the ideal.
// Each run's figures are logged as it ends, and the two are printed side
// by side with the ratio FIFO / fair of each (-json prints both as one
// object instead). FIFO makes beta wait for alpha's whole backlog: with
// the defaults, 20,000 documents on 16 slots of 100 ms is about two
// minutes; -n-alpha 2000 takes seconds.
//
// Every child process is stopped on exit (SIGTERM, then SIGKILL after
// -stop-grace), also on Ctrl-C, on failure and if the harness is killed
// (they get SIGKILL when it dies), and the temporary directory with the data
// and the logs is removed unless -keep. On failure the tail of the failing
// process's log is printed first.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func main() {
	// SIGPIPE is received and dropped, so that a write to a closed pipe or
	// socket fails with EPIPE instead of killing the harness before its
	// clean-up: a reader of the output that goes away (| head) fails the
	// report's write, and a connection to a coordinator the failover phase
	// killed fails as any lost connection does.
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	switch {
	case errors.Is(err, flag.ErrHelp):
	case err != nil:
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// config is everything a run needs, from the command line.
type config struct {
	bin              string
	rebuild          bool
	tmp              string
	keep             bool
	renderers        int
	capacity         int
	phases           []string
	drainDocs        int
	batch            int
	submitters       int
	maxWatches       int
	idleSamples      int
	idleGap          time.Duration
	steadyBatch      int
	steadyInflight   []int
	duration         time.Duration
	latencyRate      float64
	latencyDuration  time.Duration
	latencyTick      time.Duration
	store            int
	healthPoll       time.Duration
	coordinatorFlags []string
	rendererFlags    []string
	logLevel         string
	stopGrace        time.Duration
	timeout          time.Duration
	json             bool
	// cpuProfile is -cpuprofile: where the load generator's CPU profile
	// of the whole run is written.
	cpuProfile string
	// compare and rounds: -compare.
	compare string
	rounds  int
	// cluster is -cluster: the phases again on a cluster of that many
	// nodes, after the single node.
	cluster int
	// failoverKills, failoverInflight and failoverGap shape the failover
	// phase of a cluster.
	failoverKills    int
	failoverInflight int
	failoverGap      time.Duration
	// renderLatency is the renderers' --latency: zero but for the
	// fairness scenario, so that every other figure is the cost of
	// coordination.
	renderLatency time.Duration
	// previewBytes is the renderers' --preview-bytes (0: not passed, the
	// mock's 0.4 KiB previews).
	previewBytes int
}

// allPhases are the phases of a run without -store, in the order they run.
var allPhases = []string{"idle", "drain", "steady", "latency"}

// extraPhases run only when -phases names them.
var extraPhases = []string{"dos", "failover"}

// has reports whether the run includes phase.
func (c config) has(phase string) bool { return slices.Contains(c.phases, phase) }

// parseFlags reads the command line into a config and checks it.
func parseFlags(args []string, stderr io.Writer) (config, error) {
	var (
		cfg                          config
		phases, inflight             string
		coordinatorFlags, renderFlag string
	)
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.bin, "bin", "./bin", "directory of the coordinator and renderer binaries (built there when missing)")
	fs.BoolVar(&cfg.rebuild, "rebuild", false, "build the binaries into -bin even when present")
	fs.StringVar(&cfg.tmp, "tmp", os.TempDir(), "parent of the temporary directory (data directory, logs, record files)")
	fs.BoolVar(&cfg.keep, "keep", false, "keep the temporary directory")
	fs.IntVar(&cfg.renderers, "renderers", 4, "renderer processes")
	fs.IntVar(&cfg.capacity, "capacity", 64, "leases each renderer holds at most (its --capacity)")
	fs.StringVar(&phases, "phases", strings.Join(allPhases, ","), "phases to run, of "+strings.Join(allPhases, ","))
	fs.IntVar(&cfg.drainDocs, "drain-docs", 50000, "documents of a drain")
	fs.IntVar(&cfg.batch, "batch", 500, "documents per batch when submitting a drain or filling a store, and at most per batch of the latency phase")
	fs.IntVar(&cfg.submitters, "submitters", 8, "concurrent SubmitBatch calls when submitting a drain or filling a store")
	fs.IntVar(&cfg.maxWatches, "max-watches", 60, "watch streams open at once, at most (the coordinator allows 64 per caller)")
	fs.IntVar(&cfg.idleSamples, "idle-samples", 200, "single documents submitted to idle renderers")
	fs.DurationVar(&cfg.idleGap, "idle-gap", 20*time.Millisecond, "pause before each idle sample, once the previous one is terminal")
	fs.IntVar(&cfg.steadyBatch, "steady-batch", 100, "documents per batch in the steady phase")
	fs.StringVar(&inflight, "steady-inflight", "4,8,16,32,48", "levels of the steady phase: batches kept in flight, each at most -max-watches")
	fs.DurationVar(&cfg.duration, "duration", 20*time.Second, "length of the steady phase, divided among its levels")
	fs.Float64Var(&cfg.latencyRate, "latency-rate", 0, "documents per second of the latency phase (0: half the steady peak; required without the steady phase)")
	fs.DurationVar(&cfg.latencyDuration, "latency-duration", 10*time.Second, "length of the latency phase's submissions")
	fs.DurationVar(&cfg.latencyTick, "latency-tick", 10*time.Millisecond, "interval of the latency phase's submissions")
	fs.IntVar(&cfg.store, "store", 0, "fill a store with this many jobs and measure restart and drain against it, instead of the phases")
	fs.DurationVar(&cfg.healthPoll, "health-poll", 2*time.Millisecond, "interval of the health checks that time a start-up")
	fs.StringVar(&coordinatorFlags, "coordinator-flags", "", "extra coordinator flags, separated by spaces")
	fs.StringVar(&renderFlag, "renderer-flags", "", "extra renderer flags, separated by spaces")
	fs.StringVar(&cfg.logLevel, "log-level", "", "--log-level of the coordinator and renderers (empty: their default)")
	fs.DurationVar(&cfg.stopGrace, "stop-grace", 30*time.Second, "time a child has to exit after SIGTERM before SIGKILL")
	fs.DurationVar(&cfg.timeout, "timeout", 2*time.Hour, "longest the whole run may take")
	fs.BoolVar(&cfg.json, "json", false, "print the report as one JSON object")
	fs.StringVar(&cfg.cpuProfile, "cpuprofile", "", "write the load generator's CPU profile of the whole run to this file (the coordinator's: -coordinator-flags --pprof and its /debug/pprof/profile)")
	fs.StringVar(&cfg.compare, "compare", "", "directory of another build's coordinator and renderer: run both builds' phases interleaved and print ratios")
	fs.IntVar(&cfg.rounds, "rounds", 3, "rounds of each build with -compare")
	fs.IntVar(&cfg.cluster, "cluster", 0, "after the single node, run the phases on a replicated cluster of this many nodes (3 or 5) on this machine, and compare")
	fs.IntVar(&cfg.failoverKills, "failover-kills", 5, "leader kills of the failover phase (-cluster)")
	fs.IntVar(&cfg.failoverInflight, "failover-inflight", 8, "batches of -steady-batch kept in flight during the failover phase")
	fs.DurationVar(&cfg.failoverGap, "failover-gap", 2*time.Second, "load before each leader kill of the failover phase")
	fs.IntVar(&cfg.previewBytes, "preview-bytes", 0, "the renderers' --preview-bytes: previews padded to this size with incompressible bytes (0: the mock's 0.4 KiB, and the flag not passed)")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: go run ./tools/bench [flags]   (go doc ./tools/bench explains the figures)")
		fmt.Fprintln(fs.Output(), "       go run ./tools/bench fairness [flags]   (fair dispatch against FIFO; fairness -h for its flags)")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	if fs.NArg() > 0 {
		return config{}, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	phasesSet := false
	fs.Visit(func(f *flag.Flag) { phasesSet = phasesSet || f.Name == "phases" })
	if !phasesSet && cfg.cluster > 0 {
		phases += ",failover"
	}
	for p := range strings.SplitSeq(phases, ",") {
		if p = strings.TrimSpace(p); p == "" {
			continue
		}
		if !slices.Contains(allPhases, p) && !slices.Contains(extraPhases, p) {
			return config{}, fmt.Errorf("-phases: unknown phase %q, want some of %s", p, strings.Join(append(allPhases, extraPhases...), ","))
		}
		if !slices.Contains(cfg.phases, p) {
			cfg.phases = append(cfg.phases, p)
		}
	}
	for l := range strings.SplitSeq(inflight, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(l))
		if err != nil || n < 1 {
			return config{}, fmt.Errorf("-steady-inflight: %q is not a positive number of batches", l)
		}
		cfg.steadyInflight = append(cfg.steadyInflight, n)
	}
	cfg.coordinatorFlags = strings.Fields(coordinatorFlags)
	cfg.rendererFlags = strings.Fields(renderFlag)
	return cfg, cfg.validate()
}

// validate checks the values parseFlags cannot check one by one.
func (c config) validate() error {
	switch {
	case c.renderers < 1 || c.capacity < 1:
		return errors.New("-renderers and -capacity must be at least 1")
	case c.store == 0 && len(c.phases) == 0:
		return errors.New("-phases names no phase")
	case c.store < 0:
		return errors.New("-store must not be negative")
	case c.drainDocs < 1 || c.batch < 1 || c.submitters < 1 || c.steadyBatch < 1:
		return errors.New("-drain-docs, -batch, -submitters and -steady-batch must be at least 1")
	case c.maxWatches < 1:
		return errors.New("-max-watches must be at least 1")
	case slices.Max(c.steadyInflight) > c.maxWatches:
		return fmt.Errorf("-steady-inflight: %d batches in flight need as many watches, more than -max-watches %d", slices.Max(c.steadyInflight), c.maxWatches)
	case c.idleSamples < 1 || c.idleGap < 0:
		return errors.New("-idle-samples must be at least 1 and -idle-gap not negative")
	case c.duration <= 0 || c.latencyDuration <= 0 || c.latencyTick <= 0 || c.healthPoll <= 0 || c.stopGrace <= 0 || c.timeout <= 0:
		return errors.New("-duration, -latency-duration, -latency-tick, -health-poll, -stop-grace and -timeout must be above zero")
	case c.cluster != 0 && c.cluster != 3 && c.cluster != 5:
		return errors.New("-cluster takes 3 or 5 nodes")
	case c.cluster != 0 && c.store > 0:
		return errors.New("-cluster does not take -store")
	case c.cluster != 0 && c.compare != "" && c.has("failover"):
		return errors.New("-cluster with -compare does not run the failover phase")
	case c.has("failover") && c.cluster == 0:
		return errors.New("the failover phase needs -cluster")
	case c.failoverKills < 1 || c.failoverInflight < 1 || c.failoverInflight > c.maxWatches || c.failoverGap < 0:
		return errors.New("-failover-kills and -failover-inflight must be at least 1, -failover-inflight at most -max-watches, -failover-gap not negative")
	case c.compare != "" && (c.store > 0 || c.rounds < 1 || c.json):
		return errors.New("-compare needs -rounds of at least 1 and takes neither -store nor -json")
	case c.latencyRate < 0:
		return errors.New("-latency-rate must not be negative")
	case c.previewBytes < 0:
		return errors.New("-preview-bytes must not be negative")
	case c.store == 0 && c.has("latency") && !c.has("steady") && c.latencyRate == 0:
		return errors.New("the latency phase without the steady phase needs -latency-rate")
	}
	return nil
}

// run parses the flags, runs the benchmark (or the fairness scenario) and
// prints the report.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "fairness" {
		return runFairness(ctx, args[1:], stdout, stderr)
	}
	cfg, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.timeout)
	defer cancel()
	lg := newLogger(stderr)
	if cfg.cpuProfile != "" {
		f, err := os.Create(cfg.cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	if load, err := loadAverage(); err == nil && load > float64(numCPU)/2 {
		lg.printf("warning: the load average is %.1f on %d CPUs: other work will skew the figures", load, numCPU)
	}
	if cfg.compare != "" {
		return runCompare(ctx, cfg, lg, stdout)
	}
	if cfg.cluster > 0 {
		return runClusterComparison(ctx, cfg, lg, stdout)
	}
	var rep *report
	if cfg.store > 0 {
		rep, err = runStore(ctx, cfg, lg)
	} else {
		rep, err = runPhases(ctx, cfg, lg)
	}
	if err != nil {
		return err
	}
	rep.Setup.LoadAfter, _ = loadAverage()
	rep.check()
	if cfg.json {
		return writeJSON(stdout, rep)
	}
	return writeText(stdout, rep)
}

// logger writes timestamped progress lines.
type logger struct {
	w     io.Writer
	start time.Time
}

func newLogger(w io.Writer) *logger { return &logger{w: w, start: time.Now()} }

// printf writes one progress line, prefixed with the time since the start.
func (l *logger) printf(format string, args ...any) {
	fmt.Fprintf(l.w, "bench %7.1fs  %s\n", time.Since(l.start).Seconds(), fmt.Sprintf(format, args...))
}
