package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/leasehold/leasehold/client"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
)

// The fairness scenario's teams, development principals of a coordinator
// on loopback without a principals file.
const (
	alphaTeam, alphaToken = "alpha", "dev-alpha"
	betaTeam, betaToken   = "beta", "dev-beta"
)

// fairConfig is what the fairness subcommand needs, from its command line.
type fairConfig struct {
	// stack holds the settings of the two stacks: binaries, temporary
	// directory, renderers, their capacity and render latency, extra
	// flags, log level, grace and health poll.
	stack        config
	nAlpha       int
	alphaBatch   int
	nBeta        int
	timeout      time.Duration
	saturateWait time.Duration
	poll         time.Duration
	json         bool
}

// slots is C, the renderer slots of a stack: renderers × capacity.
func (c fairConfig) slots() int { return c.stack.renderers * c.stack.capacity }

// parseFairFlags reads the fairness subcommand's flags and checks them.
func parseFairFlags(args []string, stderr io.Writer) (fairConfig, error) {
	var (
		cfg                          fairConfig
		coordinatorFlags, renderFlag string
	)
	st := &cfg.stack
	st.healthPoll = 2 * time.Millisecond
	fs := flag.NewFlagSet("bench fairness", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&st.bin, "bin", "./bin", "directory of the coordinator and renderer binaries (built there when missing)")
	fs.BoolVar(&st.rebuild, "rebuild", false, "build the binaries into -bin even when present")
	fs.StringVar(&st.tmp, "tmp", os.TempDir(), "parent of the temporary directories (data directories, logs)")
	fs.BoolVar(&st.keep, "keep", false, "keep the temporary directories")
	fs.IntVar(&st.renderers, "renderers", 4, "renderer processes of each stack")
	fs.IntVar(&st.capacity, "capacity", 4, "leases each renderer holds at most (its --capacity)")
	fs.DurationVar(&st.renderLatency, "latency", 100*time.Millisecond, "render latency L of every renderer (its --latency)")
	fs.StringVar(&coordinatorFlags, "coordinator-flags", "", "extra flags of both coordinators, separated by spaces")
	fs.StringVar(&renderFlag, "renderer-flags", "", "extra renderer flags, separated by spaces")
	fs.StringVar(&st.logLevel, "log-level", "", "--log-level of the coordinators and renderers (empty: their default)")
	fs.DurationVar(&st.stopGrace, "stop-grace", 30*time.Second, "time a child has to exit after SIGTERM before SIGKILL")
	fs.IntVar(&cfg.nAlpha, "n-alpha", 20000, "documents in alpha's bulk import")
	fs.IntVar(&cfg.alphaBatch, "alpha-batch", 500, "documents per alpha batch (at most the coordinator's --max-documents)")
	fs.IntVar(&cfg.nBeta, "n-beta", 20, "documents in beta's batch")
	fs.DurationVar(&cfg.timeout, "timeout", 15*time.Minute, "longest one run (fair or FIFO) may take")
	fs.DurationVar(&cfg.saturateWait, "saturate-timeout", time.Minute, "longest to wait for alpha to hold every renderer slot")
	fs.DurationVar(&cfg.poll, "poll", 10*time.Millisecond, "interval of the saturation check")
	fs.BoolVar(&cfg.json, "json", false, "print both results as one JSON object instead of the comparison")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: go run ./tools/bench fairness [flags]   (go doc ./tools/bench explains the figures)")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return fairConfig{}, err
	}
	if fs.NArg() > 0 {
		return fairConfig{}, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	st.coordinatorFlags = strings.Fields(coordinatorFlags)
	st.rendererFlags = strings.Fields(renderFlag)
	switch {
	case st.renderers < 1 || st.capacity < 1:
		return fairConfig{}, errors.New("-renderers and -capacity must be at least 1")
	case st.renderLatency <= 0:
		return fairConfig{}, errors.New("-latency must be above zero: the ideal is counted in renders")
	case cfg.nAlpha < 1 || cfg.nBeta < 1 || cfg.alphaBatch < 1:
		return fairConfig{}, errors.New("-n-alpha, -n-beta and -alpha-batch must be at least 1")
	case cfg.poll <= 0 || cfg.timeout <= 0 || cfg.saturateWait <= 0 || st.stopGrace <= 0:
		return fairConfig{}, errors.New("-poll, -timeout, -saturate-timeout and -stop-grace must be above zero")
	}
	return cfg, nil
}

// runFairness runs the fairness scenario on a stack with fair dispatch,
// then on one with --fifo, and prints the two results side by side.
func runFairness(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg, err := parseFairFlags(args, stderr)
	if err != nil {
		return err
	}
	lg := newLogger(stderr)
	bins, err := prepareBinaries(ctx, cfg.stack.bin, cfg.stack.rebuild, lg)
	if err != nil {
		return err
	}
	var runs [2]fairResult
	for i, mode := range []struct {
		label string
		flags []string
	}{{"fair", nil}, {"fifo", []string{"--fifo"}}} {
		if runs[i], err = fairnessOn(ctx, cfg, bins, lg, mode.label, mode.flags, stderr); err != nil {
			return fmt.Errorf("%s: %w", mode.label, err)
		}
	}
	if cfg.json {
		return writeJSON(stdout, map[string]fairResult{"fair": runs[0], "fifo": runs[1]})
	}
	fmt.Fprintln(stdout)
	return writeFairComparison(stdout, runs[0], runs[1])
}

// fairnessOn starts a stack whose coordinator has the extra flags, runs
// the scenario on it, logs its result's table and stops the stack.
func fairnessOn(ctx context.Context, cfg fairConfig, bins binaries, lg *logger, label string, flags []string, stderr io.Writer) (res fairResult, err error) {
	st, err := newStack(ctx, cfg.stack, bins, lg, flags)
	if err != nil {
		return fairResult{}, err
	}
	defer func() { st.close(err != nil, stderr) }()
	defer func() { err = st.why(err) }()
	lg.printf("%s: coordinator %v with %d renderers × %d slots, latency %v", label, flags, cfg.stack.renderers, cfg.stack.capacity, cfg.stack.renderLatency)
	if _, err := st.startCoordinator(); err != nil {
		return fairResult{}, err
	}
	if err := st.startRenderers(false); err != nil {
		return fairResult{}, err
	}
	res, err = measureFairness(st.ctx, cfg, st.addr, label, lg)
	if err != nil {
		return fairResult{}, err
	}
	if err := writeFairText(lg.w, res); err != nil {
		return fairResult{}, err
	}
	return res, nil
}

// fairRun is one run of the scenario: the two teams' clients and alpha's
// batches, in submission order.
type fairRun struct {
	cfg   fairConfig
	alpha *client.Client
	beta  *client.Client
	label string
	lg    *logger

	alphaBatches []string
	// firstOpen is the index of alpha's first batch not known to be done;
	// the saturation check starts there.
	firstOpen int
}

// measureFairness runs the scenario once against the coordinator at addr
// and returns what it measured. Alpha's unfinished work is cancelled on
// the way out, also when the measurement fails, so that the stack stops
// quickly.
func measureFairness(ctx context.Context, cfg fairConfig, addr, label string, lg *logger) (fairResult, error) {
	ctx, cancel := context.WithTimeout(ctx, cfg.timeout)
	defer cancel()
	alpha, err := client.Dial(addr, client.WithToken(alphaToken))
	if err != nil {
		return fairResult{}, err
	}
	defer alpha.Close()
	beta, err := client.Dial(addr, client.WithToken(betaToken))
	if err != nil {
		return fairResult{}, err
	}
	defer beta.Close()
	b := &fairRun{cfg: cfg, alpha: alpha, beta: beta, label: label, lg: lg}

	res := fairResult{
		Label:     label,
		Capacity:  cfg.slots(),
		LatencyMS: ms(cfg.stack.renderLatency),
		Target:    fairTarget,
	}
	res.Alpha.Documents = cfg.nAlpha
	defer func() {
		if c, err := b.cancelAlpha(); err != nil {
			b.logf("cancelling alpha's remaining work: %v", err)
		} else {
			b.logf("cancelled alpha's remaining work: %d queued, %d running", c.Queued, c.Running)
		}
	}()

	start := time.Now()
	if err := b.submitAlpha(ctx); err != nil {
		return fairResult{}, err
	}
	res.Alpha.Batches = len(b.alphaBatches)
	res.Alpha.SubmitMS = ms(time.Since(start))
	b.logf("alpha submitted %d documents in %d batches in %v", cfg.nAlpha, len(b.alphaBatches), time.Since(start).Round(time.Millisecond))

	start = time.Now()
	if err := b.waitSaturated(ctx); err != nil {
		return fairResult{}, err
	}
	res.Alpha.SaturateMS = ms(time.Since(start))
	b.logf("alpha holds all %d renderer slots", cfg.slots())

	backlog, err := b.alphaBacklog(ctx)
	if err != nil {
		return fairResult{}, err
	}
	res.Alpha.Backlog = backlog

	batchID, err := b.submitBeta(ctx)
	if err != nil {
		return fairResult{}, err
	}
	b.logf("beta submitted %d documents as batch %s behind %d unfinished alpha documents", cfg.nBeta, batchID, backlog)
	if err := b.waitDone(ctx, batchID); err != nil {
		return fairResult{}, err
	}
	var jobs []*leaseholdv1.Job
	for j, err := range beta.AllJobs(ctx, &leaseholdv1.ListJobsRequest{BatchId: batchID, PageSize: 1000}) {
		if err != nil {
			return fairResult{}, fmt.Errorf("listing beta's jobs: %w", err)
		}
		jobs = append(jobs, j)
	}
	br, err := analyze(jobs)
	if err != nil {
		return fairResult{}, err
	}
	br.BatchID = batchID
	res.Beta = br
	res.Ideal = idealFor(cfg.nBeta, cfg.slots(), cfg.stack.renderLatency)
	res.Ratio = res.Beta.CompletionMS / res.Ideal.MS
	res.MeetsTarget = res.Ratio <= fairTarget
	res.Realistic = realisticFor(res.Ideal, fromMS(res.Beta.LeaseP50MS))
	res.RealisticRatio = res.Beta.CompletionMS / res.Realistic.MS
	return res, nil
}

// logf writes one progress line, prefixed with the run's label.
func (b *fairRun) logf(format string, args ...any) {
	b.lg.printf("%s: %s", b.label, fmt.Sprintf(format, args...))
}

// fairDocuments builds n tiny inline PDF documents named prefix-00001.pdf
// and on.
func fairDocuments(prefix string, from, n int) []*leaseholdv1.Document {
	docs := make([]*leaseholdv1.Document, n)
	for i := range docs {
		name := fmt.Sprintf("%s-%05d.pdf", prefix, from+i+1)
		content := []byte("%PDF-1.4 benchmark " + name)
		docs[i] = &leaseholdv1.Document{
			Name:        name,
			ContentType: "application/pdf",
			SizeBytes:   int64(len(content)),
			Content:     content,
		}
	}
	return docs
}

// submitAlpha submits alpha's bulk import in batches of cfg.alphaBatch.
func (b *fairRun) submitAlpha(ctx context.Context) error {
	for from := 0; from < b.cfg.nAlpha; from += b.cfg.alphaBatch {
		n := min(b.cfg.alphaBatch, b.cfg.nAlpha-from)
		reqID := fmt.Sprintf("fairness-%s-alpha-%d", b.label, len(b.alphaBatches)+1)
		resp, err := b.alpha.SubmitBatch(ctx, alphaTeam, reqID, fairDocuments("alpha", from, n), nil)
		if err != nil {
			return fmt.Errorf("submitting alpha batch %d: %w", len(b.alphaBatches)+1, err)
		}
		b.alphaBatches = append(b.alphaBatches, resp.GetBatch().GetId())
	}
	return nil
}

// submitBeta submits beta's batch and returns its id.
func (b *fairRun) submitBeta(ctx context.Context) (string, error) {
	resp, err := b.beta.SubmitBatch(ctx, betaTeam, "fairness-"+b.label+"-beta", fairDocuments("beta", 0, b.cfg.nBeta), nil)
	if err != nil {
		return "", fmt.Errorf("submitting beta's batch: %w", err)
	}
	return resp.GetBatch().GetId(), nil
}

// countsOf returns a batch's job counts by phase.
func countsOf(bt *leaseholdv1.Batch) map[leaseholdv1.Phase]int {
	m := make(map[leaseholdv1.Phase]int, len(bt.GetCounts()))
	for _, c := range bt.GetCounts() {
		m[c.GetPhase()] += int(c.GetCount())
	}
	return m
}

// waitSaturated polls until alpha holds C leases, that is until every
// renderer slot is busy with alpha's work. It fails when alpha holds more
// leases than that (-renderer-flags gave the renderers another capacity),
// when alpha finishes first, or after cfg.saturateWait.
func (b *fairRun) waitSaturated(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, b.cfg.saturateWait)
	defer cancel()
	tick := time.NewTicker(b.cfg.poll)
	defer tick.Stop()
	most := 0
	for {
		leased, err := b.alphaLeased(ctx)
		switch {
		case errors.Is(err, context.DeadlineExceeded):
			return fmt.Errorf("alpha never held all %d renderer slots within %v (at most %d)", b.cfg.slots(), b.cfg.saturateWait, most)
		case err != nil:
			return err
		case leased == b.cfg.slots():
			return nil
		case leased > b.cfg.slots():
			return fmt.Errorf("alpha holds %d leases, more than the %d renderer slots: do -renderer-flags change the capacity?", leased, b.cfg.slots())
		case b.firstOpen == len(b.alphaBatches):
			return fmt.Errorf("alpha's %d documents finished before the renderers were saturated (at most %d of %d slots): raise -n-alpha", b.cfg.nAlpha, most, b.cfg.slots())
		}
		most = max(most, leased)
		select {
		case <-ctx.Done():
		case <-tick.C:
		}
	}
}

// alphaLeased counts alpha's LEASED jobs. A team's ready queue is first in,
// first out, so the leased jobs sit in the first batches that are not done:
// the count stops at the first batch none of whose jobs has started, and
// batches found done are skipped from then on.
func (b *fairRun) alphaLeased(ctx context.Context) (int, error) {
	n := 0
	for i := b.firstOpen; i < len(b.alphaBatches); i++ {
		bt, err := b.alpha.GetBatch(ctx, b.alphaBatches[i])
		if err != nil {
			if ctx.Err() != nil {
				return 0, ctx.Err()
			}
			return 0, fmt.Errorf("reading alpha batch %s: %w", b.alphaBatches[i], err)
		}
		counts := countsOf(bt)
		n += counts[leaseholdv1.Phase_PHASE_LEASED]
		if bt.GetDone() && i == b.firstOpen {
			b.firstOpen++
		}
		if counts[leaseholdv1.Phase_PHASE_QUEUED] == int(bt.GetJobCount()) {
			break
		}
	}
	return n, nil
}

// alphaBacklog counts alpha's jobs that are not terminal.
func (b *fairRun) alphaBacklog(ctx context.Context) (int, error) {
	n := 0
	for _, id := range b.alphaBatches[b.firstOpen:] {
		bt, err := b.alpha.GetBatch(ctx, id)
		if err != nil {
			return 0, fmt.Errorf("reading alpha batch %s: %w", id, err)
		}
		c := countsOf(bt)
		n += c[leaseholdv1.Phase_PHASE_QUEUED] + c[leaseholdv1.Phase_PHASE_LEASED] + c[leaseholdv1.Phase_PHASE_RETRY_WAIT]
	}
	return n, nil
}

// waitDone follows beta's batch with client.FollowBatch until every job
// is terminal.
func (b *fairRun) waitDone(ctx context.Context, batchID string) error {
	for _, err := range b.beta.FollowBatch(ctx, batchID, followOptions) {
		if err != nil {
			return fmt.Errorf("following beta's batch %s: %w", batchID, err)
		}
	}
	return nil
}

// cancellation counts what cancelling alpha's batches stopped.
type cancellation struct {
	Queued  int
	Running int
}

// cancelAlpha cancels every alpha batch that is not done. It goes from the
// last batch to the first: renderers keep leasing from the front of alpha's
// queue meanwhile, and cancelling the front last keeps them from leasing jobs
// that are cancelled moments later. It gets its own short deadline so that it
// also runs after the measurement timed out.
func (b *fairRun) cancelAlpha() (cancellation, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var c cancellation
	for _, id := range slices.Backward(b.alphaBatches[b.firstOpen:]) {
		resp, err := b.alpha.CancelBatch(ctx, id, "benchmark finished")
		if err != nil {
			return c, fmt.Errorf("cancelling alpha batch %s: %w", id, err)
		}
		c.Queued += int(resp.GetCancelledQueued())
		c.Running += int(resp.GetCancelledRunning())
	}
	return c, nil
}
