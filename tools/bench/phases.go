package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
)

// runner runs phases against one stack.
type runner struct {
	cfg config
	st  *stack
	gen *generator
	lg  *logger
}

// runPhases starts a stack, runs the phases of cfg against it and returns
// the report.
func runPhases(ctx context.Context, cfg config, lg *logger) (rep *report, err error) {
	bins, err := prepareBinaries(ctx, cfg.bin, cfg.rebuild, lg)
	if err != nil {
		return nil, err
	}
	st, err := newStack(ctx, cfg, bins, lg, nil)
	if err != nil {
		return nil, err
	}
	defer func() { st.close(err != nil, os.Stderr) }()
	defer func() { err = st.why(err) }()

	startup, err := st.startCoordinator()
	if err != nil {
		return nil, err
	}
	lg.printf("coordinator serving on %s (metrics %s) after %v; data in %s", st.addr, st.metricsAddr, startup.Round(time.Millisecond), st.data)
	gen, err := newGenerator(st.dialAddr(), cfg.maxWatches)
	if err != nil {
		return nil, err
	}
	defer gen.close()
	r := &runner{cfg: cfg, st: st, gen: gen, lg: lg}
	rep = newReport(cfg, bins)
	ctx = st.ctx
	first := r.scrapeGroups(ctx)

	if cfg.has("idle") {
		if rep.Idle, err = r.idlePhase(ctx); err != nil {
			return nil, err
		}
	} else if err := st.startRenderers(false); err != nil {
		return nil, err
	}
	if cfg.has("drain") {
		if rep.Drain, err = r.drain(ctx, "drain", cfg.drainDocs); err != nil {
			return nil, err
		}
	}
	if cfg.has("steady") {
		if rep.Steady, err = r.steady(ctx); err != nil {
			return nil, err
		}
	}
	if cfg.has("latency") {
		rateDocs := cfg.latencyRate
		basis := "-latency-rate"
		if rateDocs == 0 {
			rateDocs, basis = rep.Steady.PeakDocsPerSecond/2, "half the steady peak"
		}
		if rep.Latency, err = r.latency(ctx, rateDocs, basis); err != nil {
			return nil, err
		}
	}
	if cfg.has("dos") {
		if rep.DoS, err = r.dos(ctx); err != nil {
			return nil, err
		}
	}
	rep.Groups = groupsBetween(first, r.scrapeGroups(ctx))
	if m, err := readMemory(st.coord.Pid()); err == nil {
		rep.CoordinatorMemory = &m
	} else {
		lg.printf("warning: reading the coordinator's memory: %v", err)
	}
	// Last, as it moves the leadership the figures above are read from.
	if cfg.has("failover") {
		if rep.Failover, err = r.failover(ctx); err != nil {
			return nil, err
		}
	}
	return rep, nil
}

// why replaces err with the reason the stack stopped, when a child exited
// unexpectedly: that is the error worth reading. A failed call may come back
// a moment before the child's exit is noticed, so it waits a little for one.
func (s *stack) why(err error) error {
	if err == nil {
		return nil
	}
	t := time.NewTimer(500 * time.Millisecond)
	defer t.Stop()
	select {
	case <-s.ctx.Done():
	case <-t.C:
	}
	if cause := context.Cause(s.ctx); cause != nil && !errors.Is(cause, context.Canceled) && !errors.Is(cause, context.DeadlineExceeded) {
		return cause
	}
	return err
}

// cpuSample is the CPU time used so far by the coordinator, the renderers
// together and this process.
type cpuSample struct {
	coordinator, renderers, generator time.Duration
	// followers is a cluster's other nodes together (-cluster).
	followers time.Duration
	// written is the bytes every process has written to storage so far
	// (write_bytes), all of them together; coordWritten the coordinator's.
	written, coordWritten int64
	// nodes are a cluster's nodes one by one, the leader first.
	nodes []nodeSample
	// store and storeWritten are the S3-compatible store server's CPU
	// time and bytes written (a cluster's; zero without one).
	store        time.Duration
	storeWritten int64
}

// nodeSample is one cluster node's CPU time and bytes written so far.
type nodeSample struct {
	id      string
	leader  bool
	cpu     time.Duration
	written int64
}

// sampleCPU reads every process's CPU time.
func (r *runner) sampleCPU() (cpuSample, error) {
	var s cpuSample
	coord, renderers := r.st.pids()
	var err error
	if s.coordinator, err = cpuTime(coord); err != nil {
		return s, fmt.Errorf("reading the coordinator's CPU time: %w", err)
	}
	for _, pid := range renderers {
		d, err := cpuTime(pid)
		if err != nil {
			return s, fmt.Errorf("reading a renderer's CPU time: %w", err)
		}
		s.renderers += d
	}
	if s.generator, err = cpuTime(0); err != nil {
		return s, fmt.Errorf("reading the harness's CPU time: %w", err)
	}
	followers := r.st.followerPids()
	for _, pid := range followers {
		d, err := cpuTime(pid)
		if err != nil {
			return s, fmt.Errorf("reading a follower's CPU time: %w", err)
		}
		s.followers += d
	}
	for i, pid := range slices.Concat([]int{coord, 0}, renderers, followers) {
		n, err := writeBytes(pid)
		if err != nil {
			return s, fmt.Errorf("reading the bytes a process wrote: %w", err)
		}
		if i == 0 {
			s.coordWritten = n
		}
		s.written += n
	}
	if s.nodes, err = r.sampleNodes(); err != nil {
		return s, err
	}
	if pid := r.st.storePid(); pid != 0 {
		if s.store, err = cpuTime(pid); err != nil {
			return s, fmt.Errorf("reading the store server's CPU time: %w", err)
		}
		if s.storeWritten, err = writeBytes(pid); err != nil {
			return s, fmt.Errorf("reading the bytes the store server wrote: %w", err)
		}
	}
	return s, nil
}

// cpuBetween is the CPU each side used from a to b for docs documents over
// wall.
func cpuBetween(a, b cpuSample, docs int, wall time.Duration) *cpuResult {
	per1000 := func(d time.Duration) float64 {
		if docs == 0 {
			return 0
		}
		return d.Seconds() * 1000 / float64(docs)
	}
	c, rd, g, f := b.coordinator-a.coordinator, b.renderers-a.renderers, b.generator-a.generator, b.followers-a.followers
	res := &cpuResult{
		FollowersSeconds:   f.Seconds(),
		FollowersPer1000:   per1000(f),
		Documents:          docs,
		WallSeconds:        wall.Seconds(),
		CoordinatorSeconds: c.Seconds(),
		RenderersSeconds:   rd.Seconds(),
		GeneratorSeconds:   g.Seconds(),
		CoordinatorPer1000: per1000(c),
		RenderersPer1000:   per1000(rd),
		GeneratorPer1000:   per1000(g),
	}
	if docs > 0 {
		res.TotalMicrosPerDoc = float64((c + rd + g + f).Microseconds()) / float64(docs)
		res.CoordinatorWrittenPerDoc = float64(b.coordWritten-a.coordWritten) / float64(docs)
		res.WrittenPerDoc = float64(b.written-a.written) / float64(docs)
		res.Nodes = nodesBetween(a.nodes, b.nodes, docs)
		if st := b.store - a.store; st > 0 || b.storeWritten > a.storeWritten {
			res.StoreSeconds, res.StorePer1000 = st.Seconds(), per1000(st)
			res.StoreWrittenPerDoc = float64(b.storeWritten-a.storeWritten) / float64(docs)
			res.TotalMicrosPerDoc += float64(st.Microseconds()) / float64(docs)
		}
	}
	return res
}

// scrapeGroups reads the writer group histogram, or returns nil (and says
// so) when the coordinator does not expose it.
func (r *runner) scrapeGroups(ctx context.Context) *histogram {
	h, err := scrapeHistogram(ctx, r.st.metricsURL(), groupMetric)
	if err != nil {
		r.lg.printf("warning: %v", err)
		return nil
	}
	return &h
}

// groupsBetween summarizes the writer groups committed between two scrapes.
func groupsBetween(a, b *histogram) *groupResult {
	if a == nil || b == nil {
		return nil
	}
	d := b.sub(*a)
	g := &groupResult{Groups: int64(d.Count), Commands: int64(d.Sum)}
	if d.Count > 0 {
		g.P50, g.P99 = d.quantile(0.5, 1), d.quantile(0.99, 1)
	}
	return g
}

// idlePhase starts the renderers with record files, measures the idle
// wake-up, then restarts them without the files.
func (r *runner) idlePhase(ctx context.Context) (*idleResult, error) {
	paths := make([]string, r.cfg.renderers)
	for i := range paths {
		paths[i] = r.st.recordPath(i + 1)
	}
	grants, err := newGrantLog(paths)
	if err != nil {
		return nil, err
	}
	defer grants.close()
	if err := r.st.startRenderers(true); err != nil {
		return nil, err
	}
	res, err := r.idle(ctx, grants)
	if err != nil {
		return nil, err
	}
	r.lg.printf("restarting the renderers without --record")
	if err := r.st.stopRenderers(); err != nil {
		return nil, err
	}
	return res, r.st.startRenderers(false)
}

// idle submits one document at a time to idle renderers and times each
// grant's arrival from the submission's acknowledgement.
func (r *runner) idle(ctx context.Context, grants *grantLog) (*idleResult, error) {
	r.lg.printf("idle: %d single documents, %v apart", r.cfg.idleSamples, r.cfg.idleGap)
	var t tally
	samples := make([]time.Duration, 0, r.cfg.idleSamples)
	for i := range r.cfg.idleSamples {
		if err := sleep(ctx, r.cfg.idleGap); err != nil {
			return nil, err
		}
		b, err := r.gen.submit(ctx, "idle", 1)
		if err != nil {
			return nil, err
		}
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		at, err := grants.wait(wctx, b.jobIDs[0])
		cancel()
		if err != nil {
			return nil, fmt.Errorf("idle sample %d: no renderer recorded the grant of %s: %w", i+1, b.jobIDs[0], err)
		}
		samples = append(samples, at.Sub(b.ack))
		if err := r.gen.followToEnd(ctx, b, func(at time.Time, p leaseholdv1.Phase) { t.add(at, p, b.ack, false) }); err != nil {
			return nil, err
		}
		if (i+1)%50 == 0 {
			r.lg.printf("idle: %d/%d samples", i+1, r.cfg.idleSamples)
		}
	}
	s := summarize(samples)
	_, failed, _ := t.snapshot()
	return &idleResult{
		Samples: s.N,
		P50MS:   ms(s.P50),
		P99MS:   ms(s.P99),
		MaxMS:   ms(s.Max),
		Failed:  failed,
		Method:  "SubmitBatch acknowledgement to the grant's line in a renderer's --record file (inotify)",
	}, nil
}

// drain pauses dispatch, submits docs documents, opens the watches, resumes
// dispatch and times the renderers' draining of the backlog.
func (r *runner) drain(ctx context.Context, label string, docs int) (*drainResult, error) {
	cpu0, err := r.sampleCPU()
	if err != nil {
		return nil, err
	}
	h0, raft0 := r.scrapeGroups(ctx), r.scrapeRaft(ctx)
	start := time.Now()
	if _, err := r.gen.operator.PauseDispatch(ctx, "benchmark: "+label+" backlog"); err != nil {
		return nil, fmt.Errorf("pausing dispatch: %w", err)
	}
	r.lg.printf("%s: dispatch paused; submitting %d documents in batches of %d", label, docs, r.cfg.batch)
	progress := r.progress(label+": submitted", docs)
	batches, err := r.gen.submitMany(ctx, label, docs, r.cfg.batch, r.cfg.submitters, progress)
	if err != nil {
		return nil, err
	}
	submitted := time.Since(start)
	r.lg.printf("%s: %d documents submitted in %v (%.0f docs/s); opening watches", label, docs, submitted.Round(time.Millisecond), rate(docs, submitted))

	var t tally
	opened := make(chan struct{})
	followed := make(chan error, 1)
	go func() { followed <- r.gen.followInOrder(ctx, batches, &t, opened) }()
	select {
	case <-opened:
	case err := <-followed:
		if err == nil {
			err = errors.New("every job was terminal before dispatch resumed")
		}
		return nil, err
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
	cpuMid, err := r.sampleCPU()
	if err != nil {
		return nil, err
	}
	resumed := time.Now()
	if _, err := r.gen.operator.ResumeDispatch(ctx, "benchmark: "+label+" measured"); err != nil {
		return nil, fmt.Errorf("resuming dispatch: %w", err)
	}
	r.lg.printf("%s: dispatch resumed", label)
	if err := r.waitFollowed(ctx, label, followed, &t, docs, resumed); err != nil {
		return nil, err
	}
	cpu1, err := r.sampleCPU()
	if err != nil {
		return nil, err
	}
	succeeded, failed, last := t.snapshot()
	if failed > 0 {
		r.lg.printf("warning: %s: not every job succeeded: %s", label, t.failures())
	}
	elapsed := last.Sub(resumed)
	res := &drainResult{
		Documents:     docs,
		Batches:       len(batches),
		Succeeded:     succeeded,
		Failed:        failed,
		SubmitSeconds: submitted.Seconds(),
		Seconds:       elapsed.Seconds(),
		DocsPerSecond: rate(docs, elapsed),
		CPU:           cpuBetween(cpu0, cpu1, docs, last.Sub(start)),
		SubmitCPU:     cpuBetween(cpu0, cpuMid, docs, resumed.Sub(start)),
		Groups:        groupsBetween(h0, r.scrapeGroups(ctx)),
		Raft:          raftBetween(raft0, r.scrapeRaft(ctx), docs),
	}
	r.lg.printf("%s: %.0f docs/s (%d documents in %v after resuming)", label, res.DocsPerSecond, docs, elapsed.Round(time.Millisecond))
	return res, nil
}

// waitFollowed waits for the followers' result, printing progress every five
// seconds.
func (r *runner) waitFollowed(ctx context.Context, label string, followed <-chan error, t *tally, docs int, since time.Time) error {
	tick := time.NewTicker(5 * time.Second)
	defer tick.Stop()
	for {
		select {
		case err := <-followed:
			return err
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-tick.C:
			s, f, _ := t.snapshot()
			r.lg.printf("%s: %d/%d terminal (%.0f docs/s so far)", label, s+f, docs, rate(s+f, time.Since(since)))
		}
	}
}

// progress returns a function that prints "what n/total" at most every five
// seconds.
func (r *runner) progress(what string, total int) func(int) {
	var mu sync.Mutex
	last := time.Now()
	return func(n int) {
		mu.Lock()
		defer mu.Unlock()
		if time.Since(last) >= 5*time.Second {
			last = time.Now()
			r.lg.printf("%s %d/%d", what, n, total)
		}
	}
}

// steady keeps batches in flight, closed loop, at increasing levels, and
// measures the documents finished per second at each.
func (r *runner) steady(ctx context.Context) (*steadyResult, error) {
	levels := r.cfg.steadyInflight
	step := r.cfg.duration / time.Duration(len(levels))
	warm := min(step/4, time.Second)
	r.lg.printf("steady: batches of %d in flight at levels %v, %v each (%v warm-up)", r.cfg.steadyBatch, levels, step.Round(time.Millisecond), warm.Round(time.Millisecond))

	var (
		finished atomic.Int64
		stopping atomic.Bool
		t        tally
		wg       sync.WaitGroup
		errOnce  sync.Once
		firstErr error
	)
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	worker := func() {
		for !stopping.Load() && ctx.Err() == nil {
			err := func() error {
				b, err := r.gen.submit(ctx, "steady", r.cfg.steadyBatch)
				if err != nil {
					return err
				}
				return r.gen.followToEnd(ctx, b, func(at time.Time, p leaseholdv1.Phase) {
					finished.Add(1)
					t.add(at, p, b.ack, false)
				})
			}()
			if err != nil {
				errOnce.Do(func() { firstErr = err })
				cancel(err)
				return
			}
		}
	}

	cpu0, err := r.sampleCPU()
	if err != nil {
		return nil, err
	}
	h0, raft0 := r.scrapeGroups(ctx), r.scrapeRaft(ctx)
	start, finished0 := time.Now(), finished.Load()
	res := &steadyResult{BatchSize: r.cfg.steadyBatch}
	running := 0
	for _, level := range levels {
		for ; running < level; running++ {
			wg.Go(worker)
		}
		if err := sleep(ctx, warm); err != nil {
			break
		}
		t0, n0 := time.Now(), finished.Load()
		if err := sleep(ctx, step-warm); err != nil {
			break
		}
		t1, n1 := time.Now(), finished.Load()
		l := steadyLevel{InFlightBatches: level, Seconds: t1.Sub(t0).Seconds(), Documents: int(n1 - n0)}
		l.DocsPerSecond = rate(l.Documents, t1.Sub(t0))
		res.Levels = append(res.Levels, l)
		r.lg.printf("steady: %d batches in flight: %.0f docs/s", level, l.DocsPerSecond)
		if l.DocsPerSecond > res.PeakDocsPerSecond {
			res.PeakDocsPerSecond, res.PeakInFlightBatches = l.DocsPerSecond, level
		}
	}
	end, finishedEnd := time.Now(), finished.Load()
	cpu1, cpuErr := r.sampleCPU()
	h1, raft1 := r.scrapeGroups(ctx), r.scrapeRaft(ctx)
	stopping.Store(true)
	r.lg.printf("steady: waiting for the batches in flight")
	wg.Wait()
	if firstErr != nil {
		return nil, firstErr
	}
	if err := context.Cause(ctx); err != nil {
		return nil, err
	}
	if cpuErr != nil {
		return nil, cpuErr
	}
	if _, failed, _ := t.snapshot(); failed > 0 {
		res.Failed = failed
		r.lg.printf("warning: steady: not every job succeeded: %s", t.failures())
	}
	res.Documents = int(finishedEnd - finished0)
	res.CPU = cpuBetween(cpu0, cpu1, res.Documents, end.Sub(start))
	res.Groups = groupsBetween(h0, h1)
	res.Raft = raftBetween(raft0, raft1, res.Documents)
	return res, nil
}

// latency submits open loop at rateDocs documents per second for the
// latency phase's duration and measures each job's time from its batch's
// acknowledgement to its terminal update's arrival.
func (r *runner) latency(ctx context.Context, rateDocs float64, basis string) (*latencyResult, error) {
	if rateDocs <= 0 {
		return nil, fmt.Errorf("latency: no rate to submit at (%s is %v)", basis, rateDocs)
	}
	r.lg.printf("latency: open loop at %.0f docs/s (%s) for %v, a batch every %v", rateDocs, basis, r.cfg.latencyDuration, r.cfg.latencyTick)
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var (
		t         tally
		wg        sync.WaitGroup
		submitted int
		batches   int
	)
	send := func(n int) {
		b, err := r.gen.submit(ctx, "latency", n)
		if err != nil {
			cancel(err)
			return
		}
		if err := r.gen.followToEnd(ctx, b, func(at time.Time, p leaseholdv1.Phase) { t.add(at, p, b.ack, true) }); err != nil {
			cancel(err)
		}
	}
	tick := time.NewTicker(r.cfg.latencyTick)
	start := time.Now()
	for ctx.Err() == nil {
		elapsed := time.Since(start)
		if elapsed >= r.cfg.latencyDuration {
			break
		}
		// A tick the harness took late (a loaded machine) makes more
		// documents due than one batch may carry: they go in batches of
		// at most -batch, the coordinator's limit by default.
		for due := int(rateDocs*elapsed.Seconds()) - submitted; due >= 1; {
			n := min(due, r.cfg.batch)
			due -= n
			submitted += n
			batches++
			wg.Go(func() { send(n) })
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
		}
	}
	tick.Stop()
	sent := time.Since(start)
	r.lg.printf("latency: %d documents in %d batches submitted; waiting for the last", submitted, batches)
	wg.Wait()
	if err := context.Cause(ctx); err != nil {
		return nil, err
	}
	_, failed, _ := t.snapshot()
	t.mu.Lock()
	s := summarize(t.latencies)
	t.mu.Unlock()
	res := &latencyResult{
		TargetDocsPerSecond:   rateDocs,
		Basis:                 basis,
		AchievedDocsPerSecond: rate(submitted, sent),
		Documents:             submitted,
		Batches:               batches,
		Samples:               s.N,
		P50MS:                 ms(s.P50),
		P99MS:                 ms(s.P99),
		MaxMS:                 ms(s.Max),
		Failed:                failed,
	}
	if failed > 0 {
		r.lg.printf("warning: latency: not every job succeeded: %s", t.failures())
	}
	return res, nil
}

// ms converts a duration to milliseconds.
func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// numCPU is the machine's processor count, for the report.
var numCPU = runtime.NumCPU()
