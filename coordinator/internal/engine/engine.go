// Package engine is the coordinator's single writer. One goroutine owns
// every change to job state: callers send it commands with a reply channel,
// it applies each in order to the pure state machine (package jobs) inside
// one bbolt transaction per group of queued commands, commits and fsyncs
// once, and only then answers. Lease deadlines and retry timers are heaps
// the writer owns, on the monotonic clock; expiring them is part of the
// same ordered stream.
//
// Grants are pushed: renderer sessions and long-polling Acquire calls
// register with the writer, and at the end of every group the writer
// grants queued work to those with free credit, in the same transaction,
// so that a completion and the grant that refills its slot, or a submit
// and the grant that wakes an idle renderer, commit together.
//
// Retention is a command too: Purge deletes a bounded number of expired
// records per group, so the commands queued behind it wait only for that.
//
// Reads (Job, ListJobs, Backup, ...) use bbolt read transactions from any
// goroutine. The overview (Overview) is read from a snapshot the writer
// publishes after its groups, never from the writer's own state.
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

	"github.com/leasehold/leasehold/coordinator/internal/mutation"

	"github.com/leasehold/leasehold/coordinator/internal/dispatch"
	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	"github.com/leasehold/leasehold/coordinator/internal/overview"
	"github.com/leasehold/leasehold/coordinator/internal/reads"
	"github.com/leasehold/leasehold/coordinator/internal/store"
	"github.com/leasehold/leasehold/coordinator/internal/watch"
	"github.com/prometheus/client_golang/prometheus"
)

// Defaults for Config.
const (
	DefaultLeaseTTL        = 15 * time.Second
	DefaultMaxAttempts     = 5
	DefaultBackoffBase     = time.Second
	DefaultBackoffCap      = 5 * time.Minute
	DefaultReplayLimit     = 1000
	DefaultMaxGroup        = 1024
	DefaultMaxGroupBytes   = 32 << 20
	DefaultRendererTimeout = 90 * time.Second
	// GrantOverheadBytes is what a grant costs in a reply besides its
	// document's inline content (ids, lease, document metadata, framing).
	GrantOverheadBytes = 4 << 10
)

// Config configures an Engine. Zero fields take the defaults above.
type Config struct {
	Store *store.Store
	// Now is the wall clock: timestamps of records and events. Deadlines
	// and timers run on Mono.
	Now func() time.Time
	// Mono is the monotonic clock, as time since an arbitrary origin. Nil
	// means the process's monotonic clock, or, when Now is injected, Now
	// itself (an injected clock is both).
	Mono     func() time.Duration
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
	// MaxGroup and MaxGroupBytes bound one commit: the most commands, and
	// the most bytes they carry (documents, previews).
	MaxGroup      int
	MaxGroupBytes int
	// MaxWriteSetBytes, when above zero and the committer records write
	// sets, stops a group taking commands once its recorded write set
	// holds that many bytes (grants and completions write more than their
	// requests carry): the commands left wait for the next group.
	MaxWriteSetBytes int
	// RendererTimeout drops a renderer without a session or stream from
	// live capacity after this long without an Acquire.
	RendererTimeout time.Duration
	// Retention says how long terminal jobs, rejections and audit records
	// are kept; Purge deletes what is older. The zero value keeps
	// everything.
	Retention Retention
	// Seed seeds the backoff jitter; 0 picks a random seed.
	Seed       uint64
	Registerer prometheus.Registerer
	Logger     *slog.Logger
	// OnDispatch, when set, is called on the writer goroutine after a
	// commit that paused or resumed dispatch. It must not block.
	OnDispatch func(jobs.DispatchState)
	// OverviewEvery is how often at most the writer publishes the overview
	// (Engine.Overview) while commands keep coming; it is measured on the
	// process's own clock. Zero means DefaultOverviewEvery.
	OverviewEvery time.Duration
	// StallAfter is how long a group (evaluate and commit, on Mono) may take,
	// or the writer's timer may fire late, before the writer counts a
	// stall: a storage stall or a frozen process, during which renderers'
	// messages reached the coordinator but could not be applied. A lease
	// that falls due during a stall, or less than half a TTL after it
	// (a renderer heartbeats every third of a TTL), is kept until half a
	// TTL after the stall ended, so that the heartbeats queued meanwhile
	// are applied first. Zero means a tenth of LeaseTTL, at least
	// MinStallAfter; negative turns stall detection off.
	StallAfter time.Duration
	// Committer makes each group durable; nil commits in place with fsync.
	Committer Committer
	// LeaderHint, on a replicated coordinator, names the leader (id and
	// gRPC address, empty when unknown) for the ErrNotLeader answers.
	LeaderHint func() (id, addr string)
}

// MinStallAfter is the shortest default StallAfter: a group of ordinary
// size commits in a few milliseconds.
const MinStallAfter = 50 * time.Millisecond

func (c Config) withDefaults() Config {
	switch {
	case c.Now == nil:
		start := time.Now()
		c.Now = time.Now
		if c.Mono == nil {
			c.Mono = func() time.Duration { return time.Since(start) }
		}
	case c.Mono == nil:
		now := c.Now
		c.Mono = func() time.Duration { return time.Duration(now().UnixNano()) }
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
	c.MaxGroupBytes = cmp.Or(c.MaxGroupBytes, DefaultMaxGroupBytes)
	c.RendererTimeout = cmp.Or(c.RendererTimeout, DefaultRendererTimeout)
	c.OverviewEvery = cmp.Or(c.OverviewEvery, DefaultOverviewEvery)
	c.StallAfter = cmp.Or(c.StallAfter, max(c.LeaseTTL/10, MinStallAfter))
	c.Retention.Step = cmp.Or(c.Retention.Step, DefaultPurgeStep)
	if c.Seed == 0 {
		c.Seed = rand.Uint64()
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Engine is the single writer, with the read side over the same store
// (package reads, whose methods any goroutine may call) embedded.
type Engine struct {
	*reads.Reader

	cfg       Config
	st        *store.Store
	log       *slog.Logger
	m         *metrics
	committer Committer

	reqC chan *request
	// term is the writer goroutine's current run (nil while none runs: not
	// started, stopped, or a follower); stoppedC is closed by Stop.
	term     atomic.Pointer[term]
	stoppedC chan struct{}
	failedC  chan struct{}
	failErr  atomic.Pointer[error]
	// wallFloor is the earliest wall clock the writer stamps, in Unix
	// nanoseconds (Promote): records never go back in time across leaders.
	wallFloor atomic.Int64

	startOnce sync.Once
	stopOnce  sync.Once
	started   atomic.Bool
	serving   atomic.Bool
	// lifecycle serialises Start, Stop, Promote and Demote.
	lifecycle sync.Mutex

	// Owned by the writer goroutine (and by New before Start).
	sched  *dispatch.Scheduler
	leases map[uint64]*leaseEntry
	// held are the records of the LEASED jobs as the writer last wrote
	// them (group.save), in the form a read of the store gives: a
	// completion, heartbeat or expiry loads them from here instead of
	// decoding them. A job leaves it with the write that moves it out of
	// LEASED; a lease recovered at start-up is held from its first write.
	// A group that does not commit either stops the writer or ends its
	// term, and the map goes with the rest of the writer's memory
	// (resetSoft).
	held       map[uint64]jobs.Job
	leaseQ     timerHeap
	retryAt    map[uint64]time.Duration
	retryQ     timerHeap
	teamCounts map[string]*jobs.Counts
	renderers  map[string]*rendererState
	conns      connSet
	// rings are each team's per-minute figures for the overview.
	rings map[string]*minuteRing
	rng   *rand.Rand
	// carry holds the commands a group left for the next one when its
	// write set reached Config.MaxWriteSetBytes (group.full).
	carry []*request
	// clockMono is the monotonic time of the last command applied; the
	// writer's clock never goes backwards.
	clockMono time.Duration
	// stallFrom and stallTo bound the last stall on the monotonic clock
	// (see Config.StallAfter); timerAt is when the writer's timer is due.
	stallFrom, stallTo, timerAt time.Duration
	// extendedTo is the latest deadline the last promotion gave the live
	// leases (a TTL and the extension, from then), on the monotonic clock.
	extendedTo time.Duration
	// mutTokens is the token counter of a mutation (mutation.LocalToken).
	mutTokens uint64

	// busySince is when the writer began its current group, on the
	// monotonic clock plus one, or 0 while it waits for work (Busy).
	busySince atomic.Int64

	// dispatch state is read by handlers (health, metrics) and written by
	// the writer.
	dispatchMu sync.RWMutex
	dispatchSt jobs.DispatchState

	hub *watch.Hub
	ov  overviewPub
}

// leaseEntry is the writer's view of a live lease: its deadline on the
// monotonic clock, and whether its holder was ever heard from.
type leaseEntry struct {
	token    uint64
	deadline time.Duration
	// shown is the deadline shown to people (the job's record, heartbeat
	// answers, the overview), on the wall clock: decided once at the grant,
	// at start-up and at each extension, and not re-derived from deadline
	// at each command, which would move it by the drift between the two
	// clocks. The writer judges by deadline alone.
	shown    time.Time
	team     string
	renderer string
	heard    bool
}

// rendererState is one renderer id's contribution to live capacity.
type rendererState struct {
	principal   string
	maxCapacity int
	capacity    int
	// conns counts its open sessions and heartbeat streams.
	conns    int
	draining bool
	lastSeen time.Duration
}

// New opens an engine over cfg.Store and rebuilds the in-memory indexes
// (ready queues per team, lease deadlines, retry timers, counts) from the
// index of unfinished jobs.
func New(cfg Config) (*Engine, error) {
	if cfg.Store == nil {
		return nil, errors.New("engine: Config.Store is required")
	}
	cfg = cfg.withDefaults()
	e := &Engine{
		cfg:        cfg,
		st:         cfg.Store,
		log:        cfg.Logger,
		reqC:       make(chan *request, cfg.MaxGroup),
		stoppedC:   make(chan struct{}),
		failedC:    make(chan struct{}),
		sched:      dispatch.New(cfg.Dispatch),
		leases:     make(map[uint64]*leaseEntry),
		held:       make(map[uint64]jobs.Job),
		retryAt:    make(map[uint64]time.Duration),
		teamCounts: make(map[string]*jobs.Counts),
		renderers:  make(map[string]*rendererState),
		rings:      make(map[string]*minuteRing),
		conns:      newConnSet(),
		rng:        rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15)),
		committer:  cfg.Committer,
		hub:        watch.NewHub(),
		ov:         overviewPub{feed: overview.NewFeed(cfg.Store, cfg.Now)},
		Reader:     reads.NewReader(cfg.Store, cfg.Now),
	}
	if e.committer == nil {
		e.committer = localCommitter{}
	}
	e.serving.Store(true)
	e.clockMono = cfg.Mono()
	if err := e.rebuild(cfg.Now(), 0); err != nil {
		return nil, err
	}
	if mutation.On(mutation.LocalToken) {
		_ = e.st.View(func(tx *store.Tx) error {
			e.mutTokens = tx.LastToken()
			return nil
		})
	}
	e.m = newMetrics(cfg.Registerer, e)
	e.publishOverview(cfg.Now(), e.clockMono)
	return e, nil
}

// rebuild loads the indexes from the store. Every live lease gets a full
// TTL from now, and extend more (a failover's election): the coordinator's
// downtime must not expire leases whose renderers reconnect in time.
// Leases are marked not heard from until their holder speaks again.
func (e *Engine) rebuild(wall time.Time, extend time.Duration) error {
	var ready []store.QueuedJob
	mono := e.clockMono
	err := e.st.View(func(tx *store.Tx) error {
		ds, err := tx.DispatchState()
		if err != nil {
			return err
		}
		e.dispatchSt = ds
		if err := tx.ForEachTeamCounts(func(team string, c jobs.Counts) error {
			e.teamCounts[team] = &c
			return nil
		}); err != nil {
			return err
		}
		queued := func(q store.QueuedJob) error {
			ready = append(ready, q)
			return nil
		}
		return tx.ForEachUnfinished(queued, func(j jobs.Job) error {
			switch j.Phase {
			case jobs.PhaseLeased:
				e.trackLease(j, mono+e.cfg.LeaseTTL+extend, wall.Add(e.cfg.LeaseTTL+extend), false)
				e.sched.Acquired(j.Team)
			case jobs.PhaseRetryWait:
				e.trackRetry(j.ID, mono+max(j.NextAttemptAt.Sub(wall), 0))
			default:
				return fmt.Errorf("job %d is indexed as unfinished but is %s", j.ID, j.Phase)
			}
			return nil
		})
	})
	if err != nil {
		return fmt.Errorf("rebuilding indexes: %w", err)
	}
	slices.SortFunc(ready, func(a, b store.QueuedJob) int {
		return cmp.Or(cmp.Compare(a.EnqueuedAt, b.EnqueuedAt), cmp.Compare(a.ID, b.ID))
	})
	for _, q := range ready {
		e.sched.Push(q.Team, q.ID)
	}
	return nil
}

// trackLease indexes j's lease with a deadline on the monotonic clock and
// the wall-clock deadline shown for it.
func (e *Engine) trackLease(j jobs.Job, deadline time.Duration, shown time.Time, heard bool) {
	e.leases[j.ID] = &leaseEntry{token: j.Lease.Token, deadline: deadline, shown: shown, team: j.Team, renderer: j.Lease.Renderer, heard: heard}
	heap.Push(&e.leaseQ, timerItem{at: deadline, job: j.ID, token: j.Lease.Token})
}

// trackRetry indexes a RETRY_WAIT job's next attempt on the monotonic clock.
func (e *Engine) trackRetry(id uint64, at time.Duration) {
	e.retryAt[id] = at
	heap.Push(&e.retryQ, timerItem{at: at, job: id})
}

// Start starts the writer goroutine over the state New rebuilt: the single
// node's one term. Calling it again does nothing. A replicated
// coordinator calls Promote instead, on each leadership.
func (e *Engine) Start() {
	e.startOnce.Do(func() {
		e.lifecycle.Lock()
		defer e.lifecycle.Unlock()
		select {
		case <-e.stoppedC:
			return
		default:
		}
		e.started.Store(true)
		e.begin()
	})
}

// Stop stops the writer and waits for it. Commands not yet applied are
// answered with ErrStopped. It is safe to call twice or without Start.
func (e *Engine) Stop() {
	e.lifecycle.Lock()
	defer e.lifecycle.Unlock()
	e.stopOnce.Do(func() { close(e.stoppedC) })
	e.endTerm(ErrStopped)
	e.hub.Close(ErrStopped)
}

// Serving reports whether the writer accepts commands; false after a failed
// commit (fail-stop).
func (e *Engine) Serving() bool { return e.serving.Load() }

// Failed is closed when a commit fails and the writer stops.
func (e *Engine) Failed() <-chan struct{} { return e.failedC }

// FailErr returns why the writer fail-stopped (ErrStorageFailed, or
// ErrStorageFull when the disk was full), or nil.
func (e *Engine) FailErr() error {
	if p := e.failErr.Load(); p != nil {
		return *p
	}
	return nil
}

// LeaseTTL is how long a lease lives without a heartbeat.
func (e *Engine) LeaseTTL() time.Duration { return e.cfg.LeaseTTL }

// Busy reports how long the writer has been on its current group
// (evaluating it and waiting for its commit), or 0 while it waits for
// work. A group that stays busy is pending work whose commit makes no
// progress (a frozen disk under the store or the raft log); the cluster's
// leadership steps a leader down on it. Any goroutine may call it.
func (e *Engine) Busy() time.Duration {
	since := e.busySince.Load()
	if since == 0 {
		return 0
	}
	return max(e.cfg.Mono()-time.Duration(since-1), 0)
}

// HeartbeatInterval is how often renderers should heartbeat: a third of
// the lease TTL.
func (e *Engine) HeartbeatInterval() time.Duration { return e.cfg.LeaseTTL / 3 }

// MaxGrantBytes is the most bytes one grant can take in a reply: the
// largest inline document plus its metadata.
func (e *Engine) MaxGrantBytes() int { return e.cfg.Limits.MaxInlineBytes + GrantOverheadBytes }

// DispatchState returns the operator's dispatch switch.
func (e *Engine) DispatchState() jobs.DispatchState {
	e.dispatchMu.RLock()
	defer e.dispatchMu.RUnlock()
	return e.dispatchSt
}

// jitter draws a backoff jitter in [0, 1).
func (e *Engine) jitter() float64 { return e.rng.Float64() }

// timerHeap is a min-heap of monotonic deadlines. Entries are invalidated
// lazily: the writer checks an entry against the leases or retryAt map when
// it pops it.
type timerHeap []timerItem

type timerItem struct {
	at    time.Duration
	job   uint64
	token uint64
}

func (h timerHeap) Len() int           { return len(h) }
func (h timerHeap) Less(i, j int) bool { return h[i].at < h[j].at }
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
// command's domain refusal, or why the writer did not evaluate it.
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
// outcome, or why it was not applied. The command is stamped with the time
// it was sent: the writer judges it at that time (never earlier than the
// command before it), so a command that waited behind a long group is not
// judged late for it.
func (e *Engine) do(ctx context.Context, c command) error {
	if !e.serving.Load() {
		return e.stoppedErr()
	}
	t := e.term.Load()
	if t == nil {
		return e.idleErr()
	}
	r := &request{cmd: c, done: make(chan error, 1), wall: e.now(), mono: e.cfg.Mono(), term: t}
	select {
	case e.reqC <- r:
	case <-ctx.Done():
		return ctx.Err()
	case <-t.stopC:
		return e.termErr(t)
	case <-e.failedC:
		return e.stoppedErr()
	}
	select {
	case err := <-r.done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	case <-t.doneC:
		// The writer exited; it may have answered just before.
		select {
		case err := <-r.done:
			return err
		default:
		}
		return e.termErr(t)
	}
}

// termErr is why term t answers no more: ErrNotLeader, with a fresh leader
// hint, when leadership ended it.
func (e *Engine) termErr(t *term) error {
	err := t.err()
	if errors.Is(err, ErrNotLeader) {
		return e.notLeader()
	}
	return err
}

// idleErr says why no writer takes commands: stopped, failed, or not the
// leader (a follower, or an engine not started yet).
func (e *Engine) idleErr() error {
	select {
	case <-e.stoppedC:
		return ErrStopped
	default:
	}
	if err := e.FailErr(); err != nil {
		return err
	}
	return e.notLeader()
}

// now is the wall clock the writer stamps, never before the floor a
// promotion set.
func (e *Engine) now() time.Time {
	t := e.cfg.Now()
	if f := e.wallFloor.Load(); f != 0 && t.UnixNano() < f {
		return time.Unix(0, f).In(t.Location())
	}
	return t
}

// stoppedErr says why the writer takes no command.
func (e *Engine) stoppedErr() error {
	if err := e.FailErr(); err != nil {
		return err
	}
	return ErrStopped
}
