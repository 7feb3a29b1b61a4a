package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/leasehold/leasehold/client"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
)

// bench is one run of the scenario: the two teams' clients and alpha's
// batches, in submission order.
type bench struct {
	cfg   config
	alpha *client.Client
	beta  *client.Client
	log   io.Writer

	alphaBatches []string
	// firstOpen is the index of alpha's first batch not known to be done;
	// the saturation check starts there.
	firstOpen int
}

// measure runs the scenario once and returns what it measured. Progress goes
// to log. Alpha's unfinished work is cancelled on the way out, also when the
// measurement fails, unless cfg.cancelAlpha is off.
func measure(ctx context.Context, cfg config, log io.Writer) (result, error) {
	ctx, cancel := context.WithTimeout(ctx, cfg.timeout)
	defer cancel()
	alpha, err := client.Dial(cfg.addr, client.WithToken(cfg.alphaToken))
	if err != nil {
		return result{}, err
	}
	defer alpha.Close()
	beta, err := client.Dial(cfg.addr, client.WithToken(cfg.betaToken))
	if err != nil {
		return result{}, err
	}
	defer beta.Close()
	b := &bench{cfg: cfg, alpha: alpha, beta: beta, log: log}

	res := result{
		Label:       cfg.label,
		Coordinator: cfg.addr,
		Capacity:    cfg.capacity,
		LatencyMS:   ms(cfg.latency),
		Target:      target,
	}
	res.Alpha.Documents = cfg.nAlpha
	if cfg.cancelAlpha {
		defer func() {
			if c, err := b.cancelAlpha(); err != nil {
				b.logf("cancelling alpha's remaining work: %v", err)
			} else {
				b.logf("cancelled alpha's remaining work: %d queued, %d running", c.Queued, c.Running)
			}
		}()
	}

	start := time.Now()
	if err := b.submitAlpha(ctx); err != nil {
		return result{}, err
	}
	res.Alpha.Batches = len(b.alphaBatches)
	res.Alpha.SubmitMS = ms(time.Since(start))
	b.logf("alpha submitted %d documents in %d batches in %v", cfg.nAlpha, len(b.alphaBatches), time.Since(start).Round(time.Millisecond))

	start = time.Now()
	if err := b.waitSaturated(ctx); err != nil {
		return result{}, err
	}
	res.Alpha.SaturateMS = ms(time.Since(start))
	b.logf("alpha holds all %d renderer slots", cfg.capacity)

	backlog, err := b.alphaBacklog(ctx)
	if err != nil {
		return result{}, err
	}
	res.Alpha.Backlog = backlog

	batchID, err := b.submitBeta(ctx)
	if err != nil {
		return result{}, err
	}
	b.logf("beta submitted %d documents as batch %s behind %d unfinished alpha documents", cfg.nBeta, batchID, backlog)
	if err := b.waitDone(ctx, batchID); err != nil {
		return result{}, err
	}
	var jobs []*leaseholdv1.Job
	for j, err := range beta.AllJobs(ctx, &leaseholdv1.ListJobsRequest{BatchId: batchID, PageSize: 1000}) {
		if err != nil {
			return result{}, fmt.Errorf("listing beta's jobs: %w", err)
		}
		jobs = append(jobs, j)
	}
	br, err := analyze(jobs)
	if err != nil {
		return result{}, err
	}
	br.BatchID = batchID
	res.Beta = br
	res.Ideal = idealFor(cfg.nBeta, cfg.capacity, cfg.latency)
	res.Ratio = res.Beta.CompletionMS / res.Ideal.MS
	res.MeetsTarget = res.Ratio <= target
	res.Realistic = realisticFor(res.Ideal, fromMS(res.Beta.LeaseP50MS))
	res.RealisticRatio = res.Beta.CompletionMS / res.Realistic.MS
	return res, nil
}

// logf writes one progress line.
func (b *bench) logf(format string, args ...any) {
	label := b.cfg.label
	if label == "" {
		label = "benchfair"
	}
	fmt.Fprintf(b.log, "%s %s: %s\n", time.Now().UTC().Format("15:04:05.000"), label, fmt.Sprintf(format, args...))
}

// runID makes request ids unique to this run, so that a rerun against the
// same coordinator submits anew instead of replaying.
var runID = time.Now().UTC().Format("20060102T150405.000000000")

// documents builds n tiny inline PDF documents named prefix-00001.pdf and on.
func documents(prefix string, from, n int) []*leaseholdv1.Document {
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
func (b *bench) submitAlpha(ctx context.Context) error {
	for from := 0; from < b.cfg.nAlpha; from += b.cfg.alphaBatch {
		n := min(b.cfg.alphaBatch, b.cfg.nAlpha-from)
		reqID := fmt.Sprintf("benchfair-%s-alpha-%d", runID, len(b.alphaBatches)+1)
		resp, err := b.alpha.SubmitBatch(ctx, b.cfg.alphaTeam, reqID, documents("alpha", from, n), nil)
		if err != nil {
			return fmt.Errorf("submitting alpha batch %d: %w", len(b.alphaBatches)+1, err)
		}
		b.alphaBatches = append(b.alphaBatches, resp.GetBatch().GetId())
	}
	return nil
}

// submitBeta submits beta's batch and returns its id.
func (b *bench) submitBeta(ctx context.Context) (string, error) {
	resp, err := b.beta.SubmitBatch(ctx, b.cfg.betaTeam, "benchfair-"+runID+"-beta", documents("beta", 0, b.cfg.nBeta), nil)
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

// waitSaturated polls until alpha holds cfg.capacity leases, that is until
// every renderer slot is busy with alpha's work. It fails when alpha holds
// more leases than that (the -capacity flag understates the renderers),
// when alpha finishes first, or after cfg.saturateWait.
func (b *bench) waitSaturated(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, b.cfg.saturateWait)
	defer cancel()
	tick := time.NewTicker(b.cfg.poll)
	defer tick.Stop()
	most := 0
	for {
		leased, err := b.alphaLeased(ctx)
		switch {
		case errors.Is(err, context.DeadlineExceeded):
			return fmt.Errorf("alpha never held all %d renderer slots within %v (at most %d): are the renderers up, and is -capacity their total?", b.cfg.capacity, b.cfg.saturateWait, most)
		case err != nil:
			return err
		case leased == b.cfg.capacity:
			return nil
		case leased > b.cfg.capacity:
			return fmt.Errorf("alpha holds %d leases, more than -capacity %d: pass the renderers' total capacity", leased, b.cfg.capacity)
		case b.firstOpen == len(b.alphaBatches):
			return fmt.Errorf("alpha's %d documents finished before the renderers were saturated (at most %d of %d slots): raise -n-alpha", b.cfg.nAlpha, most, b.cfg.capacity)
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
func (b *bench) alphaLeased(ctx context.Context) (int, error) {
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
func (b *bench) alphaBacklog(ctx context.Context) (int, error) {
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

// waitDone follows beta's batch until every job is terminal, watching again
// if the watch falls behind.
func (b *bench) waitDone(ctx context.Context, batchID string) error {
	for {
		var last *leaseholdv1.Batch
		err := b.beta.WatchBatch(ctx, batchID, func(m *leaseholdv1.WatchBatchResponse) error {
			last = m.GetBatch()
			return nil
		})
		switch {
		case errors.Is(err, client.ErrSlowWatcher):
			continue
		case err != nil:
			return fmt.Errorf("watching beta's batch %s: %w", batchID, err)
		}
		if last != nil && !last.GetDone() {
			// The stream ends only once the batch is done; make sure.
			bt, err := b.beta.GetBatch(ctx, batchID)
			if err != nil {
				return fmt.Errorf("reading beta's batch %s: %w", batchID, err)
			}
			if !bt.GetDone() {
				continue
			}
		}
		return nil
	}
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
func (b *bench) cancelAlpha() (cancellation, error) {
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
