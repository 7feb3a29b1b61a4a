package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
)

// runStore measures a coordinator with a big store: a drain on the empty
// store, the store filled to cfg.store jobs (half SUCCEEDED, half QUEUED
// with dispatch paused), a graceful restart timed to SERVING with its
// memory, then a drain of fresh documents against the full store once the
// queued half is cancelled.
func runStore(ctx context.Context, cfg config, lg *logger) (rep *report, err error) {
	bins, err := prepareBinaries(ctx, cfg.bin, cfg.rebuild, lg)
	if err != nil {
		return nil, err
	}
	queued := cfg.store / 2
	// The queued half is one team's unfinished work.
	extra := []string{"--max-team-queue", strconv.Itoa(queued + cfg.drainDocs + cfg.batch)}
	st, err := newStack(ctx, cfg, bins, lg, extra)
	if err != nil {
		return nil, err
	}
	defer func() { st.close(err != nil, os.Stderr) }()
	defer func() { err = st.why(err) }()

	if _, err := st.startCoordinator(); err != nil {
		return nil, err
	}
	lg.printf("coordinator serving on %s (metrics %s); data in %s", st.addr, st.metricsAddr, st.data)
	gen, err := newGenerator(st.addr, cfg.maxWatches)
	if err != nil {
		return nil, err
	}
	defer gen.close()
	r := &runner{cfg: cfg, st: st, gen: gen, lg: lg}
	ctx = st.ctx
	if err := st.startRenderers(false); err != nil {
		return nil, err
	}
	rep = newReport(cfg, bins)
	res := &storeResult{Jobs: cfg.store, HealthPollMS: ms(cfg.healthPoll)}
	rep.Store = res

	if res.EmptyDrain, err = r.drain(ctx, "empty-store drain", cfg.drainDocs); err != nil {
		return nil, err
	}

	fillStart := time.Now()
	// The empty drain's documents are part of the succeeded half.
	res.Succeeded = max(cfg.store-queued, cfg.drainDocs)
	res.Queued = queued
	res.Jobs = res.Succeeded + res.Queued
	if err := r.fillSucceeded(ctx, res.Succeeded-cfg.drainDocs); err != nil {
		return nil, err
	}
	live, err := r.fillQueued(ctx, queued)
	if err != nil {
		return nil, err
	}
	res.FillSeconds = time.Since(fillStart).Seconds()
	lg.printf("store filled: %d jobs (%d SUCCEEDED, %d QUEUED) in %v", res.Jobs, res.Succeeded, res.Queued, time.Since(fillStart).Round(time.Second))

	if err := st.stopRenderers(); err != nil {
		return nil, err
	}
	down, err := st.stopCoordinator()
	if err != nil {
		return nil, fmt.Errorf("stopping the coordinator: %w", err)
	}
	res.ShutdownSeconds = down.Seconds()
	lg.printf("coordinator stopped (SIGTERM) in %v; restarting it on the same data", down.Round(time.Millisecond))
	startup, err := st.startCoordinator()
	if err != nil {
		return nil, err
	}
	res.StartupSeconds = startup.Seconds()
	if m, err := readMemory(st.coord.Pid()); err == nil {
		res.Memory = &m
	} else {
		lg.printf("warning: reading the coordinator's memory: %v", err)
	}
	lg.printf("restarted: SERVING %v after exec", startup.Round(time.Millisecond))
	overview, err := timeOverview(ctx, r.gen.operator)
	if err != nil {
		return nil, err
	}
	res.Overview = &overview
	if res.Memory != nil {
		lg.printf("restarted: %s", memoryText(res.Memory))
	}

	if err := st.startRenderers(false); err != nil {
		return nil, err
	}
	cancelStart := time.Now()
	if err := r.cancelAll(ctx, live); err != nil {
		return nil, err
	}
	res.CancelSeconds = time.Since(cancelStart).Seconds()
	if res.FullDrain, err = r.drain(ctx, "full-store drain", cfg.drainDocs); err != nil {
		return nil, err
	}
	if res.EmptyDrain.DocsPerSecond > 0 {
		res.DrainRatio = res.FullDrain.DocsPerSecond / res.EmptyDrain.DocsPerSecond
	}
	if m, err := readMemory(st.coord.Pid()); err == nil {
		rep.CoordinatorMemory = &m
	}
	return rep, nil
}

// fillSucceeded submits n documents with dispatch running, closed loop with
// as many batches in flight as there are watch slots, and returns once
// every one is terminal.
func (r *runner) fillSucceeded(ctx context.Context, n int) error {
	if n <= 0 {
		return nil
	}
	if _, err := r.gen.operator.ResumeDispatch(ctx, "benchmark: filling the store"); err != nil {
		return fmt.Errorf("resuming dispatch: %w", err)
	}
	r.lg.printf("fill: %d documents to render, %d batches of %d in flight", n, cap(r.gen.watches), r.cfg.batch)
	batches := (n + r.cfg.batch - 1) / r.cfg.batch
	var (
		next, finished atomic.Int64
		t              tally
		wg             sync.WaitGroup
	)
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	start := time.Now()
	for range min(batches, cap(r.gen.watches)) {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= batches || ctx.Err() != nil {
					return
				}
				size := min(r.cfg.batch, n-i*r.cfg.batch)
				b, err := r.gen.submit(ctx, "fill", size)
				if err != nil {
					cancel(err)
					return
				}
				err = r.gen.followToEnd(ctx, b, func(at time.Time, p leaseholdv1.Phase) {
					finished.Add(1)
					t.add(at, p, b.ack, false)
				})
				if err != nil {
					cancel(err)
					return
				}
			}
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	tick := time.NewTicker(5 * time.Second)
	defer tick.Stop()
	for {
		select {
		case <-done:
			if err := context.Cause(ctx); err != nil {
				return err
			}
			if _, failed, _ := t.snapshot(); failed > 0 {
				r.lg.printf("warning: fill: not every job succeeded: %s", t.failures())
			}
			r.lg.printf("fill: %d rendered in %v", n, time.Since(start).Round(time.Second))
			return nil
		case <-tick.C:
			f := int(finished.Load())
			el := time.Since(start)
			eta := "?"
			if f > 0 {
				eta = (time.Duration(float64(el) * float64(n-f) / float64(f))).Round(time.Second).String()
			}
			r.lg.printf("fill: %d/%d rendered (%.0f docs/s, about %s to go)", f, n, rate(f, el), eta)
		}
	}
}

// fillQueued pauses dispatch and submits n documents that stay QUEUED; it
// returns their batches.
func (r *runner) fillQueued(ctx context.Context, n int) ([]*batch, error) {
	if n <= 0 {
		return nil, nil
	}
	if _, err := r.gen.operator.PauseDispatch(ctx, "benchmark: filling the store with queued jobs"); err != nil {
		return nil, fmt.Errorf("pausing dispatch: %w", err)
	}
	r.lg.printf("fill: dispatch paused; submitting %d documents to stay queued", n)
	start := time.Now()
	batches, err := r.gen.submitMany(ctx, "queued", n, r.cfg.batch, r.cfg.submitters, r.progress("fill: queued", n))
	if err != nil {
		return nil, err
	}
	r.lg.printf("fill: %d queued in %v (%.0f docs/s)", n, time.Since(start).Round(time.Second), rate(n, time.Since(start)))
	return batches, nil
}

// cancelAll cancels the batches, -submitters at a time, so that the drain
// that follows renders only its own documents.
func (r *runner) cancelAll(ctx context.Context, batches []*batch) error {
	if len(batches) == 0 {
		return nil
	}
	r.lg.printf("cancelling the %d queued batches", len(batches))
	var (
		next, cancelled atomic.Int64
		wg              sync.WaitGroup
	)
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	progress := r.progress("cancel: batches", len(batches))
	for range min(r.cfg.submitters, len(batches)) {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= len(batches) || ctx.Err() != nil {
					return
				}
				if _, err := r.gen.jobs.CancelBatch(ctx, batches[i].id, "benchmark: clearing the queued half"); err != nil {
					cancel(fmt.Errorf("cancelling batch %s: %w", batches[i].id, err))
					return
				}
				progress(int(cancelled.Add(1)))
			}
		})
	}
	wg.Wait()
	return context.Cause(ctx)
}
