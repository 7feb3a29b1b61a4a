package engine

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/dispatch"
	"github.com/leasehold/leasehold/coordinator/internal/jobs"
)

// Errors of a replicated coordinator's writer.
var (
	// ErrNotLeader is returned when a command was not applied, and will not
	// be, because this node's writer is not the leader's (a follower, or a
	// leader that stepped down).
	ErrNotLeader = errors.New("not the leader")
	// ErrOutcomeUnknown is returned when a command's group was proposed and
	// leadership was lost before it was known to commit: it may have been
	// applied, or not. Every write of the API is idempotent, so retrying it
	// on the new leader is safe.
	ErrOutcomeUnknown = errors.New("outcome unknown: leadership was lost with the command proposed")
)

// NotLeaderError is ErrNotLeader with what this node knows of the leader:
// its id and gRPC address, either empty when unknown. NotLeader builds
// one; the error table (package server) turns it into NOT_LEADER with the
// leader's id and address.
type NotLeaderError struct {
	LeaderID, LeaderAddr string
	// Err is the cause (ErrNotLeader, or a commit that lost leadership).
	Err error
}

// NotLeader returns the error of a node that does not lead, naming the
// leader it knows (leaderID and leaderAddr, either empty when unknown);
// cause is why, nil for plain ErrNotLeader. It is the one way to build
// a NotLeaderError.
func NotLeader(leaderID, leaderAddr string, cause error) error {
	if cause == nil {
		cause = ErrNotLeader
	}
	return &NotLeaderError{LeaderID: leaderID, LeaderAddr: leaderAddr, Err: cause}
}

// Error implements error.
func (e *NotLeaderError) Error() string {
	if e.LeaderID == "" {
		return "not the leader; no leader is known"
	}
	return fmt.Sprintf("not the leader; the leader is %s (%s)", e.LeaderID, e.LeaderAddr)
}

// Unwrap returns ErrNotLeader and the cause.
func (e *NotLeaderError) Unwrap() []error { return []error{ErrNotLeader, e.Err} }

// notLeader returns ErrNotLeader with the leader hint.
func (e *Engine) notLeader() error {
	if e.cfg.LeaderHint == nil {
		return ErrNotLeader
	}
	id, addr := e.cfg.LeaderHint()
	return NotLeader(id, addr, nil)
}

// term is one run of the writer goroutine: from Start or Promote until
// Stop, Demote, or a commit that lost leadership. Each has its own
// channels, so that a command is answered by the run it was sent to.
type term struct {
	stopC    chan struct{}
	doneC    chan struct{}
	stopOnce sync.Once
	// lostC is closed when the writer stepped down by itself: a group was
	// not committed, or its outcome is unknown.
	lostC chan struct{}
	why   atomic.Pointer[error]
}

func newTerm() *term {
	return &term{stopC: make(chan struct{}), doneC: make(chan struct{}), lostC: make(chan struct{})}
}

// err is what the term's late commands are answered.
func (t *term) err() error {
	if p := t.why.Load(); p != nil {
		return *p
	}
	return ErrStopped
}

// stop asks the writer to end the term with why.
func (t *term) stop(why error) {
	t.stopOnce.Do(func() {
		t.why.CompareAndSwap(nil, &why)
		close(t.stopC)
	})
}

// admit reports whether r was sent to this term. A command sent to an
// earlier one is answered ErrNotLeader: its sender was already told that
// it was not applied.
func (t *term) admit(r *request) bool {
	if r.term == t {
		return true
	}
	r.done <- ErrNotLeader
	return false
}

// lost reports whether err ended the term by a lost leadership.
func (t *term) lost(err error) bool {
	return errors.Is(err, ErrNotLeader) || errors.Is(err, ErrOutcomeUnknown)
}

// Lost is closed when the writer's current term ended by itself because a
// group was not committed or its outcome is unknown (a replicated commit
// lost leadership): the replica (package cluster) then promotes the engine
// again if raft still says this node leads. It is nil when no term runs.
func (e *Engine) Lost() <-chan struct{} {
	if t := e.term.Load(); t != nil {
		return t.lostC
	}
	return nil
}

// Leading reports whether a writer term runs.
func (e *Engine) Leading() bool { return e.term.Load() != nil }

// begin starts a term of the writer. The caller holds e.lifecycle.
func (e *Engine) begin() {
	t := newTerm()
	e.term.Store(t)
	go e.run(t)
}

// endTerm stops the running term, if any, with why and waits for its
// writer. The caller holds e.lifecycle.
func (e *Engine) endTerm(why error) bool {
	t := e.term.Swap(nil)
	if t == nil {
		return false
	}
	t.stop(why)
	<-t.doneC
	return true
}

// Promote makes this engine the leader's writer: it drops whatever a
// previous term left in memory, rebuilds the ready queues, the lease and
// retry timers, the counts and the dispatch switch from the store (which
// the caller has made hold every committed group: raft's barrier), gives
// every live lease a full TTL plus extend (renderers reconnecting through
// a failover keep their leases), stamps nothing before wallFloor, and
// starts a term of the writer. It fails when the engine stopped or failed,
// or when a term runs.
func (e *Engine) Promote(extend time.Duration, wallFloor time.Time) error {
	return e.promote(extend, wallFloor, e.begin)
}

// promote is Promote, with begin starting the term's writer.
func (e *Engine) promote(extend time.Duration, wallFloor time.Time, begin func()) error {
	e.lifecycle.Lock()
	defer e.lifecycle.Unlock()
	select {
	case <-e.stoppedC:
		return ErrStopped
	default:
	}
	if err := e.FailErr(); err != nil {
		return err
	}
	if e.term.Load() != nil {
		return errors.New("engine: Promote while a writer term runs")
	}
	e.startOnce.Do(func() {}) // a replicated engine is never Started
	if !wallFloor.IsZero() {
		e.wallFloor.Store(wallFloor.UnixNano() + int64(time.Microsecond))
	}
	if mutant(mutationNoExtend) {
		extend = 0
	}
	keep := mutant(mutationKeepSoft)
	if !keep {
		e.resetSoft()
	}
	e.clockMono = max(e.clockMono, e.cfg.Mono())
	e.extendedTo = e.clockMono + e.cfg.LeaseTTL + extend
	wall := e.now()
	if !keep {
		if err := e.rebuild(wall, extend); err != nil {
			return fmt.Errorf("promoting: %w", err)
		}
	}
	e.publishOverview(wall, e.clockMono)
	e.started.Store(true)
	begin()
	e.log.Info("writer promoted", "extend", extend, "leases", len(e.leases), "ready", e.sched.Ready())
	return nil
}

// Demote ends the writer's term, if one runs, because this node no longer
// leads: queued commands are answered ErrNotLeader, and the term's
// in-memory state is dropped (every renderer session and watch ends with
// ErrNotLeader; grants stay leases, which the next leader keeps for the
// renderers that reconnect to it). It is safe to call at any time; a
// replica calls it once at start, to be a follower until promoted, which
// also keeps the writer's gauges out of its metrics.
func (e *Engine) Demote() {
	e.lifecycle.Lock()
	defer e.lifecycle.Unlock()
	if e.endTerm(ErrNotLeader) {
		e.dropSoft(e.notLeader())
		e.log.Info("writer demoted")
	}
	e.m.idle()
}

// leadershipLost returns err when the committer says the group was not
// committed (ErrNotLeader) or that its fate is unknown (ErrOutcomeUnknown),
// and nil for any other error (a storage failure).
func leadershipLost(err error) error {
	if errors.Is(err, ErrNotLeader) || errors.Is(err, ErrOutcomeUnknown) {
		return err
	}
	return nil
}

// stepDown answers a group whose commit lost leadership: nothing of it is
// published, and each command is answered why (ErrNotLeader or
// ErrOutcomeUnknown). The writer then ends its term (run).
func (e *Engine) stepDown(g *group, batch []*request, why error) {
	if g.tx != nil {
		_ = g.tx.Rollback()
	}
	answer := e.notLeader()
	if errors.Is(why, ErrOutcomeUnknown) {
		answer = ErrOutcomeUnknown
	}
	for _, r := range batch {
		r.done <- answer
	}
	e.log.Warn("commit lost leadership; writer stepping down", "err", why, "commands", len(batch))
}

// lose ends term t on its own writer goroutine after stepDown: the queued
// commands are answered ErrNotLeader, and the in-memory state, which the
// lost group's evaluation changed as if it had committed, is dropped.
// Lost tells the replica.
func (e *Engine) lose(t *term) {
	t.why.CompareAndSwap(nil, &ErrNotLeader)
	why := e.notLeader()
	e.drain(why)
	e.dropSoft(why)
	close(t.lostC)
}

// dropSoft ends every renderer session and watch with why and forgets the
// writer's in-memory state: nothing of it may outlive the leadership it
// was built under. It runs on the writer goroutine, or with no writer.
func (e *Engine) dropSoft(why error) {
	if mutant(mutationKeepSoft) {
		return
	}
	for _, c := range e.conns.byID {
		c.Outbox.end(why)
	}
	e.hub.EndAll(why)
	e.resetSoft()
	if e.m != nil {
		e.m.idle()
	}
}

// resetSoft empties the writer's in-memory state; rebuild fills it again.
func (e *Engine) resetSoft() {
	e.sched = dispatch.New(e.cfg.Dispatch)
	e.leases = make(map[uint64]*leaseEntry)
	e.held = make(map[uint64]jobs.Job)
	e.leaseQ = nil
	e.retryAt = make(map[uint64]time.Duration)
	e.retryQ = nil
	e.teamCounts = make(map[string]*jobs.Counts)
	e.renderers = make(map[string]*rendererState)
	e.conns = newConnSet()
	e.rings = make(map[string]*minuteRing)
	e.stallFrom, e.stallTo = 0, 0
}

// Announce records, through the writer, that this node (id, reachable for
// gRPC at addr) leads: the record replicates to every follower, which names
// the leader from it when it refuses a write. The replica calls it once
// promoted.
func (e *Engine) Announce(ctx context.Context, id, addr string) error {
	return e.do(ctx, &announceCmd{id: id, addr: addr})
}

type announceCmd struct {
	base
	id, addr string
}

func (c *announceCmd) text() error { return checkText("node_id", c.id, "grpc_address", c.addr) }

func (c *announceCmd) evaluate(g *group) error {
	tx, err := g.txn()
	if err != nil {
		return err
	}
	if id, addr := tx.Leader(); id == c.id && addr == c.addr {
		return nil
	}
	return tx.PutLeader(c.id, c.addr)
}
