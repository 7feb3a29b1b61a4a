// Package engine is the coordinator's single writer. One goroutine owns
// every change to job state: callers send it commands with a reply channel,
// it applies each in order to the pure state machine (package jobs) inside
// one bbolt transaction per group of queued commands, commits and fsyncs
// once, and only then answers. Lease deadlines and retry timers are heaps
// the writer owns; expiring them is part of the same ordered stream, done
// at the start of every group before any command is judged.
//
// Reads (Job, ListJobs, ...) use bbolt read transactions from any goroutine.
package engine

import (
	"cmp"
	"container/heap"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/dispatch"
	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	"github.com/leasehold/leasehold/coordinator/internal/store"
	"github.com/prometheus/client_golang/prometheus"
)

// Defaults for Config.
const (
	DefaultLeaseTTL        = 15 * time.Second
	DefaultMaxAttempts     = 5
	DefaultBackoffBase     = time.Second
	DefaultBackoffCap      = 5 * time.Minute
	DefaultReplayLimit     = 1000
	DefaultMaxGroup        = 256
	DefaultRendererTimeout = 90 * time.Second
)

// Config configures an Engine. Zero fields take the defaults above.
type Config struct {
	Store     *store.Store
	Artifacts *store.Artifacts
	// Now is the writer's clock; every deadline is judged against it.
	Now      func() time.Time
	LeaseTTL time.Duration
	// Retry is the default retry policy of a batch.
	Retry       jobs.RetryPolicy
	Limits      jobs.Limits
	Unsupported jobs.Formats
	Dispatch    dispatch.Config
	// RunningCancel allows cancelling LEASED jobs.
	RunningCancel bool
	// ReplayLimit is the most jobs one replay may touch.
	ReplayLimit int
	// MaxGroup is the most commands committed in one transaction.
	MaxGroup int
	// RendererTimeout drops a renderer without a heartbeat stream from live
	// capacity after this long without an Acquire.
	RendererTimeout time.Duration
	// Seed seeds the backoff jitter; 0 picks a random seed.
	Seed       uint64
	Registerer prometheus.Registerer
	Logger     *slog.Logger
	// OnDispatch, when set, is called on the writer goroutine after a
	// commit that paused or resumed dispatch. It must not block.
	OnDispatch func(jobs.DispatchState)
}

func (c Config) withDefaults() Config {
	if c.Now == nil {
		c.Now = time.Now
	}
	c.LeaseTTL = cmp.Or(c.LeaseTTL, DefaultLeaseTTL)
	c.Retry.MaxAttempts = cmp.Or(c.Retry.MaxAttempts, DefaultMaxAttempts)
	c.Retry.BackoffBase = cmp.Or(c.Retry.BackoffBase, DefaultBackoffBase)
	c.Retry.BackoffCap = cmp.Or(c.Retry.BackoffCap, DefaultBackoffCap)
	c.Limits = c.Limits.WithDefaults()
	if c.Unsupported == nil {
		c.Unsupported = jobs.NewFormats(jobs.DefaultUnsupported)
	}
	c.ReplayLimit = cmp.Or(c.ReplayLimit, DefaultReplayLimit)
	c.MaxGroup = cmp.Or(c.MaxGroup, DefaultMaxGroup)
	c.RendererTimeout = cmp.Or(c.RendererTimeout, DefaultRendererTimeout)
	if c.Seed == 0 {
		c.Seed = rand.Uint64()
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Engine is the single writer and the read side over the same store.
type Engine struct {
	cfg Config
	st  *store.Store
	log *slog.Logger
	m   *metrics

	reqC    chan *request
	stopC   chan struct{}
	doneC   chan struct{}
	failedC chan struct{}

	startOnce sync.Once
	stopOnce  sync.Once
	started   atomic.Bool
	serving   atomic.Bool

	// Owned by the writer goroutine (and by New before Start).
	sched     *dispatch.Scheduler
	leases    map[uint64]leaseEntry
	leaseQ    timerHeap
	retryAt   map[uint64]time.Time
	retryQ    timerHeap
	active    map[string]int // non-terminal jobs per team
	renderers map[string]*rendererState
	rng       *rand.Rand

	// dispatch state is read by handlers (health, metrics) and written by
	// the writer.
	dispatchMu sync.RWMutex
	dispatchSt jobs.DispatchState

	workMu sync.Mutex
	workC  chan struct{}

	hub hub
}

type leaseEntry struct {
	token    uint64
	deadline time.Time
	team     string
	renderer string
}

type rendererState struct {
	capacity int
	streams  int
	lastSeen time.Time
}

// New opens an engine over cfg.Store and rebuilds the in-memory indexes
// (ready queues per team, lease deadlines, retry timers) from it.
func New(cfg Config) (*Engine, error) {
	if cfg.Store == nil {
		return nil, errors.New("engine: Config.Store is required")
	}
	cfg = cfg.withDefaults()
	e := &Engine{
		cfg:       cfg,
		st:        cfg.Store,
		log:       cfg.Logger,
		reqC:      make(chan *request, cfg.MaxGroup),
		stopC:     make(chan struct{}),
		doneC:     make(chan struct{}),
		failedC:   make(chan struct{}),
		sched:     dispatch.New(cfg.Dispatch),
		leases:    make(map[uint64]leaseEntry),
		retryAt:   make(map[uint64]time.Time),
		active:    make(map[string]int),
		renderers: make(map[string]*rendererState),
		rng:       rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15)),
		workC:     make(chan struct{}),
	}
	e.hub.init()
	e.serving.Store(true)
	if err := e.rebuild(); err != nil {
		return nil, err
	}
	e.m = newMetrics(cfg.Registerer, e)
	return e, nil
}

// rebuild loads the indexes from the store.
func (e *Engine) rebuild() error {
	type queued struct {
		at   time.Time
		id   uint64
		team string
	}
	var ready []queued
	err := e.st.View(func(tx *store.Tx) error {
		ds, err := tx.DispatchState()
		if err != nil {
			return err
		}
		e.dispatchSt = ds
		return tx.ForEachJob(0, func(j jobs.Job) (bool, error) {
			switch j.Phase {
			case jobs.PhaseQueued:
				ready = append(ready, queued{j.EnqueuedAt, j.ID, j.Team})
			case jobs.PhaseLeased:
				e.trackLease(j)
				e.sched.Acquired(j.Team)
			case jobs.PhaseRetryWait:
				e.trackRetry(j)
			default:
				return true, nil
			}
			e.active[j.Team]++
			return true, nil
		})
	})
	if err != nil {
		return fmt.Errorf("rebuilding indexes: %w", err)
	}
	slices.SortFunc(ready, func(a, b queued) int {
		return cmp.Or(a.at.Compare(b.at), cmp.Compare(a.id, b.id))
	})
	for _, q := range ready {
		e.sched.Push(q.team, q.id)
	}
	return nil
}

func (e *Engine) trackLease(j jobs.Job) {
	e.leases[j.ID] = leaseEntry{token: j.Lease.Token, deadline: j.Lease.Deadline, team: j.Team, renderer: j.Lease.Renderer}
	heap.Push(&e.leaseQ, timerItem{at: j.Lease.Deadline, job: j.ID, token: j.Lease.Token})
}

func (e *Engine) trackRetry(j jobs.Job) {
	e.retryAt[j.ID] = j.NextAttemptAt
	heap.Push(&e.retryQ, timerItem{at: j.NextAttemptAt, job: j.ID})
}

// Start starts the writer goroutine. Calling it again does nothing.
func (e *Engine) Start() {
	e.startOnce.Do(func() {
		e.started.Store(true)
		go e.run()
	})
}

// Stop stops the writer and waits for it. Commands not yet applied are
// answered with ErrStopped. It is safe to call twice or without Start.
func (e *Engine) Stop() {
	e.stopOnce.Do(func() { close(e.stopC) })
	if e.started.Load() {
		<-e.doneC
	}
	e.hub.closeAll()
}

// Serving reports whether the writer accepts commands; false after a failed
// commit (fail-stop).
func (e *Engine) Serving() bool { return e.serving.Load() }

// Failed is closed when a commit fails and the writer stops.
func (e *Engine) Failed() <-chan struct{} { return e.failedC }

// HeartbeatInterval is how often renderers should heartbeat: a third of
// the lease TTL.
func (e *Engine) HeartbeatInterval() time.Duration { return e.cfg.LeaseTTL / 3 }

// Artifacts returns the artifact store.
func (e *Engine) Artifacts() *store.Artifacts { return e.cfg.Artifacts }

// DispatchState returns the operator's dispatch switch.
func (e *Engine) DispatchState() jobs.DispatchState {
	e.dispatchMu.RLock()
	defer e.dispatchMu.RUnlock()
	return e.dispatchSt
}

// WorkAvailable returns a channel closed when work may have become
// dispatchable. Take it before calling Acquire, then wait on it, so that no
// wake-up is lost in between.
func (e *Engine) WorkAvailable() <-chan struct{} {
	e.workMu.Lock()
	defer e.workMu.Unlock()
	return e.workC
}

func (e *Engine) notifyWork() {
	e.workMu.Lock()
	close(e.workC)
	e.workC = make(chan struct{})
	e.workMu.Unlock()
}

func (e *Engine) now() time.Time { return e.cfg.Now().Round(0).UTC() }

// jitter draws a backoff jitter in [0, 1).
func (e *Engine) jitter() float64 { return e.rng.Float64() }

// timerHeap is a min-heap of deadlines. Entries are invalidated lazily:
// the writer checks an entry against the leases or retryAt map when it
// pops it.
type timerHeap []timerItem

type timerItem struct {
	at    time.Time
	job   uint64
	token uint64
}

func (h timerHeap) Len() int           { return len(h) }
func (h timerHeap) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h timerHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *timerHeap) Push(x any)        { *h = append(*h, x.(timerItem)) }
func (h *timerHeap) Pop() any {
	old := *h
	it := old[len(old)-1]
	*h = old[:len(old)-1]
	return it
}

func (h timerHeap) peek() (timerItem, bool) {
	if len(h) == 0 {
		return timerItem{}, false
	}
	return h[0], true
}

// call sends c to the writer and returns its result. The error is the
// command's domain refusal, or why the writer did not apply it.
func call[R any](ctx context.Context, e *Engine, c interface {
	command
	result() R
}) (R, error) {
	if err := e.do(ctx, c); err != nil {
		var zero R
		return zero, err
	}
	return c.result(), nil
}

// do sends c to the writer and waits for its answer: the command's domain
// outcome, or why it was not applied.
func (e *Engine) do(ctx context.Context, c command) error {
	if !e.serving.Load() {
		return ErrStorageFailed
	}
	r := &request{cmd: c, done: make(chan error, 1)}
	select {
	case e.reqC <- r:
	case <-ctx.Done():
		return ctx.Err()
	case <-e.stopC:
		return ErrStopped
	case <-e.failedC:
		return ErrStorageFailed
	}
	select {
	case err := <-r.done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	case <-e.doneC:
		// The writer exited; it may have answered just before.
		select {
		case err := <-r.done:
			return err
		default:
		}
		if !e.serving.Load() {
			return ErrStorageFailed
		}
		return ErrStopped
	}
}
