package chaos

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"github.com/leasehold/leasehold/internal/proctest"
	"github.com/leasehold/leasehold/internal/stack"
	"github.com/leasehold/leasehold/internal/testbin"
)

// failpoint is a failpoint the campaign arms, with the most times it
// lets pass before it panics.
type failpoint struct {
	name    string
	maxSkip int
}

// failpoints are the writer's failpoints (coordinator/internal/engine,
// failpoints.go), armed in turn, each with the most times it lets pass
// before it fires: the count is drawn below it, so that it fires at a
// different moment each time.
var failpoints = []failpoint{
	{"beforeCommit", 200},
	{"grantsUnpublished", 20},
	{"afterCommit", 200},
	{"replayMidway", 3},
}

// applyFailpoints are the replicated apply's (coordinator/internal/cluster
// and store, failpoints.go), armed too when the coordinator runs on raft
// (-raft): an entry committed in the log and not applied to the store;
// applied in the store's open transaction and not committed; committed to
// the store and not reported to raft.
var applyFailpoints = []failpoint{
	{"beforeApply", 200},
	{"applyBeforeCommit", 200},
	{"applyCommitted", 200},
}

// armable are the failpoints a run arms in turn: on raft the apply's
// first, so that a short run reaches them.
func (c config) armable() []failpoint {
	if c.raft {
		return append(append([]failpoint(nil), applyFailpoints...), failpoints...)
	}
	return failpoints
}

// Settings of the stack that the checks rely on.
const (
	maxAttempts     = 3
	rendererCap     = 8
	stopGrace       = 15 * time.Second
	processTimeout  = 30 * time.Second
	finalReadBudget = 30 * time.Second
)

// harness runs one crash run: the processes, the kill schedule, the checks
// between crashes.
type harness struct {
	cfg  config
	bins binaries
	dir  string
	data string
	addr string
	logw io.Writer
	rng  *rand.Rand

	// ctx ends when the run must stop: the caller's context, or a renderer
	// that exited on its own (its cause says which).
	ctx    context.Context
	cancel context.CancelCauseFunc

	// prog is what the stack's processes report to; stack runs them.
	prog  *proctest.Program
	stack *stack.Stack

	renderers []*stack.RendererProc
	// stopping is set once the harness stops the renderers itself.
	stopping atomic.Bool
	runs     []lifetime
}

// result is what a crash run found.
type result struct {
	cfg      config
	dir      string
	runs     []lifetime
	fired    map[string]int
	armed    map[string]int
	loadErrs []error
	f        *findings
}

// crash runs a crash campaign (see the package documentation), writing
// its progress to logw. The result is nil only when the run could not
// get as far as the checks.
func crash(ctx context.Context, cfg config, logw io.Writer) (res *result, err error) {
	dir, err := os.MkdirTemp(cfg.tmp, "leasehold-chaos-*")
	if err != nil {
		return nil, err
	}
	defer func() {
		if cfg.keep || err != nil || (res != nil && !res.passed()) {
			fmt.Fprintf(logw, "chaos: kept %s (data, process logs, journal.jsonl)\n", dir)
			return
		}
		os.RemoveAll(dir)
	}()
	bins, err := prepare(ctx, filepath.Join(dir, "bin"))
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(logw, "chaos: coordinator %s (with failpoints), renderer %s\n", bins.coordinator, bins.renderer)
	addr, err := testbin.FreeAddr()
	if err != nil {
		return nil, err
	}
	h := &harness{cfg: cfg, bins: bins, dir: dir, data: filepath.Join(dir, "data"), addr: addr, logw: logw,
		rng: rand.New(rand.NewPCG(cfg.seed, 0))}
	h.ctx, h.cancel = context.WithCancelCause(ctx)
	defer h.cancel(nil)
	h.prog = proctest.NewProgram(h.ctx, dir, logw)
	defer h.prog.Close()
	args := []string{"--lease-ttl", cfg.leaseTTL.String(), "--max-attempts", strconv.Itoa(maxAttempts),
		"--backoff-base", "20ms", "--backoff-cap", "200ms"}
	if cfg.raft {
		// A cluster of one voter: every group is a raft entry, applied to
		// the store by the state machine, as on each node of a cluster.
		raftAddr, err := testbin.FreeAddr()
		if err != nil {
			return nil, err
		}
		args = append(args, "--node-id", "n1", "--raft-listen", raftAddr, "--peers", "n1="+raftAddr+"/"+addr)
	}
	h.stack = stack.New(h.prog, stack.Options{
		Coordinator: bins.coordinator, Renderer: bins.renderer, Procs: proctest.Options{Timeout: processTimeout, Tail: 20},
		Listen: addr, DataDirs: []string{h.data}, LogDir: dir, RendererLogLevel: "info", Args: args,
	})
	fmt.Fprintf(logw, "chaos: seed %d, %d cycles, coordinator on %s (raft: %v)\n", cfg.seed, cfg.cycles, addr, cfg.raft)
	return h.crashRun()
}

// crashRun starts the stack, crashes and restarts the coordinator
// cfg.cycles times under load, drains, and examines what happened.
func (h *harness) crashRun() (*result, error) {
	f, err := os.Create(filepath.Join(h.dir, "journal.jsonl"))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	j := &journal{f: f}
	ld, err := newLoad(h.addr, j, h.cfg.seed)
	if err != nil {
		return nil, err
	}
	defer ld.close()
	// On the way out, whatever happened (deferred calls run last first):
	// the renderers stop, the load's contexts end, the load is waited for
	// (it writes the journal), its connections close.
	defer ld.wait()
	stopLoad, endStop := context.WithCancel(h.ctx)
	defer endStop()
	followCtx, endFollow := context.WithCancel(h.ctx)
	defer endFollow()
	defer h.stopRenderers()

	res := &result{cfg: h.cfg, dir: h.dir, fired: map[string]int{}, armed: map[string]int{}}
	for n := 1; n <= h.cfg.cycles; n++ {
		fp := h.failpointFor(n)
		p, r, err := h.startCoordinator(n, fp)
		if err != nil {
			return nil, err
		}
		if n == 1 {
			if err := h.startRenderers(); err != nil {
				h.kill(p)
				return nil, err
			}
			ld.start(stopLoad, followCtx)
		}
		if err := h.crashOnce(p, &r); err != nil {
			return nil, err
		}
		if fp != "" {
			res.armed[fp]++
			if r.Fired {
				res.fired[fp]++
			}
		}
		if err := h.check(&r); err != nil {
			return nil, err
		}
		h.runs = append(h.runs, r)
		fmt.Fprintf(h.logw, "cycle %d/%d: %s, then %s; check: %d jobs, last token %d, %d problems\n",
			n, h.cfg.cycles, r.serving(), r.End, r.Jobs, r.Counter, len(r.Problems))
	}

	p, r, err := h.startCoordinator(h.cfg.cycles+1, "")
	if err != nil {
		return nil, err
	}
	ev, err := h.drain(ld, stopLoad, endStop, endFollow)
	if err != nil {
		h.kill(p)
		return nil, err
	}
	r.End = "SIGTERM"
	if _, err := p.Stop(stopGrace); err != nil {
		r.End = fmt.Sprintf("SIGTERM, then: %v", err)
		r.Problems = append(r.Problems, "the coordinator did not stop cleanly: "+err.Error())
	}
	if err := h.check(&r); err != nil {
		return nil, err
	}
	h.runs = append(h.runs, r)
	fmt.Fprintf(h.logw, "final: %s, drained, then %s; check: %d jobs, last token %d, %d problems\n",
		r.serving(), r.End, r.Jobs, r.Counter, len(r.Problems))

	ev.runs, ev.raft = h.runs, h.cfg.raft
	j.mu.Lock()
	ev.submits, ev.terminals, ev.cancels, ev.replays = j.submits, j.terminals, j.cancels, j.replays
	j.mu.Unlock()
	res.runs = h.runs
	res.loadErrs = ld.failures()
	res.f = examine(ev)
	return res, nil
}

// failpointFor names the failpoint crash n arms, or "" for a SIGKILL.
func (h *harness) failpointFor(n int) string {
	if every := h.cfg.failpointEvery; every > 0 && n%every == 0 {
		fps := h.cfg.armable()
		return fps[(n/every-1)%len(fps)].name
	}
	return ""
}

// startCoordinator starts coordinator process n, with failpoint fp armed
// if not empty, and waits until it serves.
func (h *harness) startCoordinator(n int, fp string) (*proctest.Proc, lifetime, error) {
	r := lifetime{N: n, Failpoint: fp}
	var env []string
	if fp != "" {
		for _, f := range h.cfg.armable() {
			if f.name == fp {
				// The panic names the failpoint: gofail's bare panic says "{}".
				env = append(env, fmt.Sprintf("GOFAIL_FAILPOINTS=%s=%d*off->panic(%q)", fp, h.rng.IntN(f.maxSkip), fp))
			}
		}
	}
	var p *proctest.Proc
	if err := h.prog.Run(func() { p = h.stack.Launch(0, h.stack.NodeArgs(0), env...).Proc }); err != nil {
		return nil, r, err
	}
	name := fmt.Sprintf("coordinator %d", n)
	r.Exec = p.Started()
	at, err := testbin.WaitServing(h.ctx, h.addr, healthPoll, p.Exited())
	if errors.Is(err, testbin.ErrExited) {
		err = fmt.Errorf("%s: %w: %v", name, err, p.Err())
	}
	if err != nil && p.HasExited() && fired(p, fp) {
		// A call waiting for the restart reached the failpoint before the
		// health check did: no restart time, the crash is the failpoint's.
		return p, r, nil
	}
	if err != nil {
		h.kill(p)
		return nil, r, fmt.Errorf("%s: %w\n%s", name, errors.Join(err, context.Cause(h.ctx)), p.Tail(20))
	}
	r.Ready = at.Sub(p.Started())
	return p, r, nil
}

// kill kills p and waits until it is gone.
func (h *harness) kill(p *proctest.Proc) {
	if err := h.prog.Run(p.Kill); err != nil {
		fmt.Fprintf(h.logw, "chaos: %v\n", err)
	}
}

// crashOnce ends process p as its run says: SIGKILL after a random uptime,
// or its armed failpoint, killed if the failpoint is not reached in time.
// A process that exits otherwise is an error.
func (h *harness) crashOnce(p *proctest.Proc, r *lifetime) error {
	wait := h.cfg.fireTimeout
	if r.Failpoint == "" {
		span := int64(h.cfg.maxUptime - h.cfg.minUptime)
		wait = h.cfg.minUptime + time.Duration(h.rng.Int64N(span+1))
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-h.ctx.Done():
		h.kill(p)
		return context.Cause(h.ctx)
	case <-p.Exited():
		if fired(p, r.Failpoint) {
			r.End, r.Fired = "failpoint "+r.Failpoint, true
			return nil
		}
		return fmt.Errorf("coordinator %d exited on its own: %v\n%s", r.N, p.Err(), p.Tail(30))
	case <-t.C:
		h.kill(p)
		r.End = fmt.Sprintf("SIGKILL after %v", wait.Round(time.Millisecond))
		if r.Failpoint != "" {
			r.End = fmt.Sprintf("failpoint %s not reached in %v; SIGKILL", r.Failpoint, wait)
		}
		return nil
	}
}

// serving says how soon the process served.
func (r lifetime) serving() string {
	if r.Ready == 0 {
		return "not yet serving"
	}
	return fmt.Sprintf("serving %v after exec", r.Ready.Round(time.Millisecond))
}

// fired reports whether process p died of failpoint fp's panic.
func fired(p *proctest.Proc, fp string) bool {
	return fp != "" && p.HasExited() && strings.Contains(p.LogText(), "failpoint panic: "+fp)
}

// check runs the consistency check on the data file of the stopped
// coordinator and records what it found in r.
func (h *harness) check(r *lifetime) error {
	rep, err := checkStore(h.ctx, h.bins.coordinator, h.data)
	if err != nil {
		return fmt.Errorf("after %s: %w", r.End, err)
	}
	r.Counter, r.Jobs = rep.LastToken, rep.Jobs
	r.Problems = append(r.Problems, rep.Problems...)
	return nil
}

// startRenderers starts the renderers, each recording the grants it
// receives. One that exits on its own ends the run.
func (h *harness) startRenderers() error {
	for i := 1; i <= h.cfg.renderers; i++ {
		r := stack.Renderer{ID: fmt.Sprintf("chaos-%d", i), Record: h.recordPath(i),
			Args: []string{"--capacity", strconv.Itoa(rendererCap),
				"--latency", "2ms", "--latency-jitter", "20ms", "--fail-rate", "0.15",
				"--seed", strconv.FormatUint(h.cfg.seed+uint64(i), 10)}}
		var p *stack.RendererProc
		if err := h.prog.Run(func() { p = h.stack.StartRenderer(r) }); err != nil {
			return err
		}
		h.renderers = append(h.renderers, p)
		go func() {
			<-p.Exited()
			if !h.stopping.Load() {
				h.cancel(fmt.Errorf("%s exited on its own: %v\n%s", p.Name(), p.Err(), p.Tail(20)))
			}
		}()
	}
	return nil
}

// stopRenderers stops the renderers with SIGTERM (they drain) and waits
// for them.
func (h *harness) stopRenderers() error {
	h.stopping.Store(true)
	rs := h.renderers
	h.renderers = nil
	errs := make([]error, len(rs))
	var wg sync.WaitGroup
	for i, p := range rs {
		wg.Go(func() {
			if _, err := p.Stop(stopGrace); err != nil {
				errs[i] = fmt.Errorf("%s: %w", p.Name(), err)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

func (h *harness) recordPath(i int) string {
	return filepath.Join(h.dir, fmt.Sprintf("renderer-%d.record", i))
}

// drain lets the load finish on a coordinator left running: no new
// submits, cancels or replays; the ones under way answered; every batch
// followed to its end, within cfg.drainTimeout. It then stops the
// renderers and reads the final state: every job with its history, the
// audit trail and the grants the renderers recorded.
func (h *harness) drain(ld *load, stopLoad context.Context, endStop, endFollow context.CancelFunc) (*evidence, error) {
	endStop()
	done := make(chan struct{})
	go func() {
		ld.wait()
		close(done)
	}()
	t := time.NewTimer(h.cfg.drainTimeout)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		fmt.Fprintf(h.logw, "chaos: the load did not drain within %v; reading what is left\n", h.cfg.drainTimeout)
		endFollow()
		<-done
	case <-h.ctx.Done():
		endFollow()
		<-done
		return nil, context.Cause(h.ctx)
	}
	endFollow()
	if err := h.stopRenderers(); err != nil {
		return nil, fmt.Errorf("stopping the renderers: %w", err)
	}
	ev := &evidence{}
	ctx, cancel := context.WithTimeout(h.ctx, finalReadBudget)
	defer cancel()
	for j, err := range ld.sub.AllJobs(ctx, &leaseholdv1.ListJobsRequest{Team: team, PageSize: 1000}) {
		if err != nil {
			return nil, fmt.Errorf("listing the jobs: %w", err)
		}
		ev.jobs = append(ev.jobs, j)
	}
	for a, err := range ld.op.AllAudit(ctx, &leaseholdv1.GetAuditRequest{PageSize: 1000}) {
		if err != nil {
			return nil, fmt.Errorf("reading the audit trail: %w", err)
		}
		ev.audit = append(ev.audit, a)
	}
	for i := 1; i <= h.cfg.renderers; i++ {
		gs, err := readRecord(h.recordPath(i), fmt.Sprintf("chaos-%d", i))
		if err != nil {
			return nil, err
		}
		ev.grants = append(ev.grants, gs...)
	}
	return ev, nil
}

// readRecord reads a renderer's --record file as that renderer's grants.
func readRecord(path, renderer string) ([]grant, error) {
	recs, err := stack.ReadRecord(path)
	out := make([]grant, 0, len(recs))
	for _, r := range recs {
		out = append(out, grant{Renderer: renderer, Job: r.Job, Token: r.Token})
	}
	return out, err
}

// passed reports whether the run found no violation, met no unexpected
// refusal, and saw every failpoint it armed fire.
func (r *result) passed() bool {
	if r.f == nil || r.f.violations() > 0 || len(r.loadErrs) > 0 {
		return false
	}
	for fp, n := range r.armed {
		if n > 0 && r.fired[fp] == 0 {
			return false
		}
	}
	return true
}

// restartTimes returns the times from exec to SERVING of every process
// started on a crashed one's data file (but those a failpoint killed before
// they answered the health check).
func (r *result) restartTimes() []time.Duration {
	var ds []time.Duration
	for _, run := range r.runs[1:] {
		if run.Ready > 0 {
			ds = append(ds, run.Ready)
		}
	}
	slices.Sort(ds)
	return ds
}

// percentile returns the nearest-rank p-th percentile of sorted ds.
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	i := int(float64(len(ds))*p/100+0.999999) - 1
	return ds[min(max(i, 0), len(ds)-1)]
}

// figure is the report's one-line summary.
func (r *result) figure() string {
	f, ds := r.f, r.restartTimes()
	if f == nil {
		return "no findings"
	}
	var p50, p99 time.Duration
	if len(ds) > 0 {
		p50, p99 = percentile(ds, 50), percentile(ds, 99)
	}
	kills, fpCrashes := r.crashes()
	return fmt.Sprintf("crash-restart: %d cycles (%d SIGKILL, %d failpoint) under load, %d jobs acknowledged: "+
		"%d lost, %d duplicated tokens, %d double terminal transitions, %d stuck, %d violations in all; "+
		"restart p50 %v, p99 %v (seed %d)",
		kills+fpCrashes, kills, fpCrashes, f.AckedJobs, f.Lost, f.DuplicateTokens, f.DoubleTerminal, f.Stuck, f.violations(),
		p50.Round(time.Millisecond), p99.Round(time.Millisecond), r.cfg.seed)
}

// crashes counts the processes a SIGKILL ended and those a failpoint did.
func (r *result) crashes() (kills, failpoints int) {
	for _, run := range r.runs {
		switch {
		case run.Fired:
			failpoints++
		case strings.HasPrefix(run.End, "SIGKILL") || strings.Contains(run.End, "; SIGKILL"):
			kills++
		}
	}
	return kills, failpoints
}

// print writes the report.
func (r *result) print(w io.Writer) {
	f := r.f
	kills, fpCrashes := r.crashes()
	fmt.Fprintf(w, "chaos crash: %d crash cycles (%d SIGKILL, %d failpoint), seed %d\n", kills+fpCrashes, kills, fpCrashes, r.cfg.seed)
	var fps []string
	for _, fp := range r.cfg.armable() {
		switch {
		case r.armed[fp.name] == 0:
			fps = append(fps, fp.name+" not armed")
		default:
			fps = append(fps, fmt.Sprintf("%s fired %d of %d", fp.name, r.fired[fp.name], r.armed[fp.name]))
		}
	}
	fmt.Fprintf(w, "failpoints: %s\n", strings.Join(fps, ", "))
	if f == nil {
		return
	}
	fmt.Fprintf(w, "acknowledged: %d batches, %d jobs (%d submits answered on a retry, %d of them already stored); "+
		"%d grants received; %d terminal events watched; %d cancels; %d replays re-queuing %d jobs\n",
		f.AckedBatches, f.AckedJobs, f.RetriedSubmits, f.ReplayedSubmits, f.Grants, f.Terminals, f.Cancels, f.Replays, f.ReplayedJobs)
	for _, line := range []struct {
		what string
		n    int
	}{
		{"lost jobs", f.Lost},
		{"stored jobs never acknowledged", f.Unacknowledged},
		{"duplicated tokens", f.DuplicateTokens},
		{"tokens that did not grow across restarts", f.TokensBack},
		{"grants received but not stored", f.GrantsNotStored},
		{"double terminal transitions", f.DoubleTerminal},
		{"stuck jobs", f.Stuck},
		{"attempts over the maximum", f.AttemptsOver},
		{"answers or events the store contradicts", f.Contradicted},
	} {
		fmt.Fprintf(w, "%-48s %d\n", line.what+":", line.n)
	}
	fmt.Fprintf(w, "%-48s %d opens, %d problems\n", "consistency checks (bbolt and records):", f.Checks, f.CheckProblems)
	ds := r.restartTimes()
	if len(ds) > 0 {
		fmt.Fprintf(w, "restart, exec to the first SERVING health answer (%d restarts, polled every %v; nearest rank): p50 %v, p99 %v, max %v\n",
			len(ds), healthPoll, percentile(ds, 50).Round(time.Millisecond), percentile(ds, 99).Round(time.Millisecond), ds[len(ds)-1].Round(time.Millisecond))
	}
	for _, p := range f.Problems {
		fmt.Fprintln(w, "violation:", p)
	}
	if f.omitted > 0 {
		fmt.Fprintf(w, "violation: %d more not listed\n", f.omitted)
	}
	for _, err := range r.loadErrs {
		fmt.Fprintln(w, "unexpected refusal:", err)
	}
	for fp, n := range r.armed {
		if n > 0 && r.fired[fp] == 0 {
			fmt.Fprintf(w, "failpoint %s was armed %d times and never fired\n", fp, n)
		}
	}
	if r.passed() {
		fmt.Fprintln(w, "PASS")
	} else {
		fmt.Fprintf(w, "FAIL (data and logs kept in %s)\n", r.dir)
	}
}
