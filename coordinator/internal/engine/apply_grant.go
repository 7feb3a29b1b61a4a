package engine

import (
	"context"

	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	"github.com/leasehold/leasehold/coordinator/internal/store"
)

// grantOne leases the next ready job, chosen fairly across teams, to c
// under a fresh fencing token persisted in the group's transaction. It
// reports whether it granted one; false means no job is ready (or c's
// reply has no room left).
func (e *Engine) grantOne(g *group, c *Conn, live int) (bool, error) {
	if c.credit <= 0 || (c.kind == ConnWaiter && c.budget < e.MaxGrantBytes()) {
		return false, nil
	}
	for {
		team, id, ok := e.sched.Next(live)
		if !ok {
			return false, nil
		}
		j, found, err := g.load(id)
		if err != nil {
			return false, err
		}
		if !found || j.Phase != jobs.PhaseQueued {
			e.log.Error("ready queue disagrees with the store", "job", id, "team", team, "found", found, "phase", j.Phase)
			e.sched.Release(team)
			continue
		}
		tx, err := g.txn()
		if err != nil {
			return false, err
		}
		token, err := tx.NextToken()
		if err != nil {
			return false, err
		}
		next, err := j.Grant(token, c.renderer.ID, g.now, e.cfg.LeaseTTL)
		if err != nil {
			// The phase was checked above; a refusal here is a bug, not a
			// reason to stop the writer.
			e.log.Error("grant refused", "job", id, "err", err)
			e.sched.Release(team)
			continue
		}
		if err := g.save(j, next); err != nil {
			return false, err
		}
		// A grant this process makes counts as delivered: if the reply or
		// stream that carries it fails, the caller hands it back. Only leases
		// recovered at start-up wait to be heard from.
		e.trackLease(next, g.mono+e.cfg.LeaseTTL, next.Lease.Deadline, true)
		e.m.queueWait(team, g.now.Sub(j.EnqueuedAt))
		c.credit--
		if c.kind == ConnWaiter {
			c.budget -= int(j.ContentBytes) + GrantOverheadBytes
		}
		c.granted++
		g.deliver(c, Grant{Job: next})
		return true, nil
	}
}

// dispatchWaiting grants ready work to every connection with credit, one
// job each in turn, until the work or the credit runs out. It runs at the
// end of every group in which work or credit appeared, inside the group's
// transaction: the submit that queued a job, or the completion that freed a
// slot, commits together with the grant it makes possible.
func (e *Engine) dispatchWaiting(g *group) error {
	if e.dispatchSt.Paused {
		return nil
	}
	wanting := e.conns.wanting()
	if len(wanting) == 0 || e.sched.Ready() == 0 {
		return nil
	}
	live := e.liveCapacity(g.mono)
	// A long poll answers once, with what this group gave it (up to its Max
	// and byte budget); it takes nothing more while its answer is sent.
	defer func() {
		for _, c := range wanting {
			if c.kind == ConnWaiter && c.granted > 0 {
				c.credit = 0
			}
		}
	}()
	for progressed := true; progressed; {
		progressed = false
		for _, c := range wanting {
			ok, err := e.grantOne(g, c, live)
			if err != nil {
				return err
			}
			if ok {
				progressed = true
			} else if e.sched.Ready() == 0 {
				return nil
			}
		}
	}
	return nil
}

// Acquire grants up to req.Max leases to a renderer, each under a fresh
// fencing token persisted in the same transaction. When nothing can be
// granted at once and req.Wait is set, it registers a waiter: the writer
// grants to it as work arrives and publishes the grants in
// Waiter.Outbox. The caller ends the wait with CloseConn, which hands back
// what the waiter never took.
//
// Document content is read after the commit (ReadContent), on the caller's
// goroutine: it never changes once stored, and copying it is no work for
// the writer.
func (e *Engine) Acquire(ctx context.Context, req AcquireRequest) (AcquireResult, error) {
	return call(ctx, e, &acquireCmd{req: req})
}

type acquireCmd struct {
	base
	req AcquireRequest
	res AcquireResult
}

func (c *acquireCmd) result() AcquireResult { return c.res }

func (c *acquireCmd) apply(g *group) error {
	e := g.e
	if s := e.conns.sessions[c.req.Renderer.ID]; s != nil && s.kind == ConnSession {
		c.err = ErrRendererInUse
		return nil
	}
	e.seen(c.req.Renderer, c.req.Capacity, g.mono)
	w := &Conn{kind: ConnWaiter, renderer: c.req.Renderer, credit: c.req.Max, budget: c.req.MaxBytes}
	if w.budget <= 0 {
		w.budget = 1 << 62
	}
	e.conns.add(w)
	c.res.Paused = e.dispatchSt.Paused
	if !c.res.Paused {
		live := e.liveCapacity(g.mono)
		for {
			ok, err := e.grantOne(g, w, live)
			if err != nil {
				return err
			}
			if !ok {
				break
			}
		}
	}
	if len(g.deliveries[w]) > 0 || !c.req.Wait {
		c.res.Grants = g.endConn(w, nil)
		return nil
	}
	e.conns.want(w)
	c.res.Waiter = w
	return nil
}

// ReadContent fills in the inline document content of grants, in one read
// transaction.
func (e *Engine) ReadContent(grants []Grant) error {
	return e.st.View(func(tx *store.Tx) error {
		for i := range grants {
			if grants[i].Job.ContentBytes > 0 {
				grants[i].Content = tx.Document(grants[i].Job.ID)
			}
		}
		return nil
	})
}

// Release returns leases granted to renderer that never reached it (the
// call or stream that was to carry them ended first) to their ready
// queues, without counting the attempt. A lease that has meanwhile moved
// on is left alone.
func (e *Engine) Release(ctx context.Context, renderer string, leases []LeaseRef) error {
	return e.do(ctx, &releaseCmd{renderer: renderer, leases: leases})
}

type releaseCmd struct {
	base
	renderer string
	leases   []LeaseRef
}

func (c *releaseCmd) apply(g *group) error {
	for _, ref := range c.leases {
		if err := g.e.release(g, c.renderer, ref, jobs.ReleaseUndelivered); err != nil {
			return err
		}
	}
	return nil
}

// release re-queues a lease granted to renderer that never reached it.
func (e *Engine) release(g *group, renderer string, ref LeaseRef, reason string) error {
	j, found, err := g.load(ref.Job)
	if err != nil || !found {
		return err
	}
	next, err := j.Release(ref.Token, renderer, g.now, reason)
	if err != nil {
		return nil // the lease moved on: nothing to hand back
	}
	if err := g.save(j, next); err != nil {
		return err
	}
	e.endLease(g, j, next)
	return nil
}
