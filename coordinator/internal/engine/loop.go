package engine

import (
	"container/heap"
	"context"
	"fmt"
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	"github.com/leasehold/leasehold/coordinator/internal/store"
)

// command is one state change applied by the writer. apply runs on the
// writer goroutine with the group's transaction; it records its domain
// outcome in the command itself and returns an error only when the group
// must not commit (a storage failure).
type command interface {
	apply(g *group) error
	// outcome is the domain result handed back to the caller.
	outcome() error
}

// base carries a command's domain outcome.
type base struct{ err error }

func (b *base) outcome() error { return b.err }

type request struct {
	cmd command
	// done has capacity 1 so the writer never blocks on a departed caller.
	done chan error
}

// group is one commit: the commands drained together, the transaction
// they share (opened on first use), the clock reading they are judged
// against, and what to publish once the commit is durable.
type group struct {
	e   *Engine
	now time.Time
	tx  *store.Tx

	events      []JobEvent
	revocations map[string][]LeaseStatus
	work        bool
	dispatch    bool
}

// txn returns the group's read-write transaction, beginning it on first use.
func (g *group) txn() (*store.Tx, error) {
	if g.tx == nil {
		tx, err := g.e.st.Begin()
		if err != nil {
			return nil, fmt.Errorf("beginning transaction: %w", err)
		}
		g.tx = tx
	}
	return g.tx, nil
}

// job reads a job in the group's transaction.
func (g *group) job(id uint64) (jobs.Job, bool, error) {
	tx, err := g.txn()
	if err != nil {
		return jobs.Job{}, false, err
	}
	return tx.Job(id)
}

// save writes after and queues its new history events for watchers.
func (g *group) save(before, after jobs.Job) error {
	tx, err := g.txn()
	if err != nil {
		return err
	}
	if err := tx.PutJob(after); err != nil {
		return err
	}
	n := len(before.Events)
	if before.ID == 0 {
		n = 0
	}
	for _, ev := range after.Events[min(n, len(after.Events)):] {
		g.events = append(g.events, JobEvent{Job: after, Event: ev})
	}
	if before.Phase != after.Phase && after.Phase.Terminal() {
		g.e.m.finished(after.TerminalReason)
	}
	return nil
}

func (g *group) revoke(renderer string, s LeaseStatus) {
	if g.revocations == nil {
		g.revocations = make(map[string][]LeaseStatus)
	}
	g.revocations[renderer] = append(g.revocations[renderer], s)
}

// run is the writer goroutine.
func (e *Engine) run() {
	defer close(e.doneC)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		e.resetTimer(timer)
		var batch []*request
		select {
		case <-e.stopC:
			e.drain(ErrStopped)
			return
		case r := <-e.reqC:
			batch = append(batch, r)
		case <-timer.C:
		}
	more:
		for len(batch) < e.cfg.MaxGroup {
			select {
			case r := <-e.reqC:
				batch = append(batch, r)
			default:
				break more
			}
		}
		if err := e.runGroup(batch); err != nil {
			e.drain(ErrStorageFailed)
			return
		}
	}
}

// drain answers every queued request with err.
func (e *Engine) drain(err error) {
	for {
		select {
		case r := <-e.reqC:
			r.done <- err
		default:
			return
		}
	}
}

// resetTimer arms timer for the earliest lease deadline or retry time.
func (e *Engine) resetTimer(t *time.Timer) {
	next := time.Hour
	for _, q := range []timerHeap{e.leaseQ, e.retryQ} {
		if it, ok := q.peek(); ok {
			next = min(next, it.at.Sub(e.now()))
		}
	}
	t.Reset(max(next, 0))
}

// runGroup applies a group of requests in one transaction, publishes their
// effects and answers them, all after the commit. A failed commit fail-stops the engine: nothing of the
// group is acknowledged, and no later command is taken.
func (e *Engine) runGroup(batch []*request) error {
	start := time.Now()
	g := &group{e: e, now: e.now()}
	err := e.advance(g)
	for i := 0; err == nil && i < len(batch); i++ {
		err = batch[i].cmd.apply(g)
	}
	if err == nil && g.tx != nil {
		if g.tx.Dirty() {
			err = g.tx.Commit()
		} else {
			err = g.tx.Rollback()
		}
	}
	if err != nil {
		if g.tx != nil {
			_ = g.tx.Rollback()
		}
		e.serving.Store(false)
		close(e.failedC)
		e.log.Error("commit failed; writer stopped, acknowledging nothing", "err", err, "commands", len(batch))
		for _, r := range batch {
			r.done <- ErrStorageFailed
		}
		return err
	}
	// Publish before answering, so that a caller who sees its answer can
	// rely on watchers, revocation streams and health having been told.
	e.publish(g)
	for _, r := range batch {
		r.done <- r.cmd.outcome()
	}
	e.m.group(len(batch), time.Since(start))
	return nil
}

// publish hands the group's committed effects to watchers, renderers'
// revocation streams and long-polling Acquire calls.
func (e *Engine) publish(g *group) {
	for _, ev := range g.events {
		e.hub.publishJob(ev)
	}
	for r, list := range g.revocations {
		e.hub.publishRevocations(r, list)
	}
	if g.work {
		e.notifyWork()
	}
	if g.dispatch && e.cfg.OnDispatch != nil {
		e.cfg.OnDispatch(e.DispatchState())
	}
	e.m.snapshot()
}

// advance expires every lease whose deadline has passed and re-queues
// every job whose backoff has elapsed, before any command of the group is
// judged, so that "expired" is decided in the writer's order.
func (e *Engine) advance(g *group) error {
	for {
		it, ok := e.leaseQ.peek()
		if !ok || g.now.Before(it.at) {
			break
		}
		heap.Pop(&e.leaseQ)
		le, held := e.leases[it.job]
		if !held || le.token != it.token || !le.deadline.Equal(it.at) {
			continue
		}
		j, found, err := g.job(it.job)
		if err != nil {
			return err
		}
		if !found {
			delete(e.leases, it.job)
			continue
		}
		next, err := j.Expire(g.now, e.jitter())
		if err != nil {
			e.log.Error("lease index disagrees with the store", "job", it.job, "err", err)
			delete(e.leases, it.job)
			continue
		}
		if err := g.save(j, next); err != nil {
			return err
		}
		e.endLease(g, j, next)
	}
	for {
		it, ok := e.retryQ.peek()
		if !ok || g.now.Before(it.at) {
			break
		}
		heap.Pop(&e.retryQ)
		if at, waiting := e.retryAt[it.job]; !waiting || !at.Equal(it.at) {
			continue
		}
		delete(e.retryAt, it.job)
		j, found, err := g.job(it.job)
		if err != nil {
			return err
		}
		if !found {
			continue
		}
		next, err := j.Requeue(g.now)
		if err != nil {
			e.log.Error("retry index disagrees with the store", "job", it.job, "err", err)
			continue
		}
		if err := g.save(j, next); err != nil {
			return err
		}
		e.sched.Push(next.Team, next.ID)
		g.work = true
	}
	return nil
}

// endLease updates the indexes after a LEASED job moved on to next.
func (e *Engine) endLease(g *group, before, next jobs.Job) {
	delete(e.leases, before.ID)
	e.sched.Release(before.Team)
	g.work = true
	switch {
	case next.Phase == jobs.PhaseRetryWait:
		e.trackRetry(next)
	case next.Phase.Terminal():
		e.active[next.Team]--
	}
}

// Tick runs one empty group: due leases expire and due retries re-queue.
// The writer does this by itself on a timer; tests with an injected clock
// call it after moving the clock.
func (e *Engine) Tick(ctx context.Context) error {
	return e.do(ctx, &tickCmd{})
}

type tickCmd struct{ base }

func (c *tickCmd) apply(*group) error { return nil }
