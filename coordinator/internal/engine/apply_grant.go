package engine

import (
	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	"github.com/leasehold/leasehold/coordinator/internal/mutation"
	"github.com/leasehold/leasehold/coordinator/internal/store"
)

// grantOne leases the next ready job, chosen fairly across teams, to c
// under a fresh fencing token persisted in the group's transaction. It
// reports whether it granted one; false means no job is ready (or c's
// reply has no room left).
func (e *Engine) grantOne(g *group, c *Conn, live int) (bool, error) {
	if c.credit <= 0 || (c.budget >= 0 && c.budget < e.MaxGrantBytes()) {
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
		if mutation.On(mutation.LocalToken) {
			e.mutTokens++
			token = e.mutTokens
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
		if c.budget >= 0 {
			c.budget -= int(j.ContentBytes) + GrantOverheadBytes
		}
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
