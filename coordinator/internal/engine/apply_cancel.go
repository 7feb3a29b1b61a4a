package engine

import (
	"context"
	"errors"

	"github.com/leasehold/leasehold/client/reason"
	"github.com/leasehold/leasehold/coordinator/internal/jobs"
)

// Cancel cancels one job (req.Job) or every unfinished job of a batch
// (req.Batch). The caller has checked that the principal may. A LEASED
// job's lease is revoked in the same transaction, and the revocation is
// pushed to its holder's session or stream once committed.
func (e *Engine) Cancel(ctx context.Context, req CancelRequest) (CancelResult, error) {
	c := &cancelCmd{req: req}
	return call(ctx, e, c)
}

type cancelCmd struct {
	base
	req CancelRequest
	res CancelResult
}

func (c *cancelCmd) result() CancelResult { return c.res }

func (c *cancelCmd) text() error {
	return checkText("principal", c.req.Principal, "reason", c.req.Reason)
}

func (c *cancelCmd) evaluate(g *group) error {
	ids, team, err := c.targets(g)
	if err != nil || c.err != nil {
		return err
	}
	var touched []uint64
	for _, id := range ids {
		changed, err := c.cancelOne(g, id)
		if err != nil {
			return err
		}
		if errors.Is(c.err, jobs.ErrNotFound) {
			return nil
		}
		if changed {
			touched = append(touched, id)
		}
	}
	if !c.req.Operator {
		return nil
	}
	if c.req.Batch == 0 {
		team = c.res.Job.Team
	}
	action := jobs.AuditCancelJob
	switch {
	case c.req.Batch != 0:
		action = jobs.AuditCancelBatch
	case c.err != nil:
		action = jobs.AuditCancelRefused
	}
	tx, err := g.txn()
	if err != nil {
		return err
	}
	_, err = tx.PutAudit(jobs.AuditRecord{At: g.now, Principal: c.req.Principal, Action: action, Reason: c.req.Reason,
		JobIDs: touched, Batch: c.req.Batch, Teams: []string{team}})
	return err
}

// targets returns the jobs a cancel names and, for a batch, their team; a
// single job is read once, by cancelOne, which finds its team.
func (c *cancelCmd) targets(g *group) ([]uint64, string, error) {
	if c.req.Batch == 0 {
		return []uint64{c.req.Job}, "", nil
	}
	tx, err := g.txn()
	if err != nil {
		return nil, "", err
	}
	b, found, err := tx.Batch(c.req.Batch)
	if err != nil {
		return nil, "", err
	}
	if !found {
		c.err = jobs.ErrNotFound
		return nil, "", nil
	}
	return b.JobIDs(), b.Team, nil
}

// cancelOne cancels one job and reports whether it changed.
func (c *cancelCmd) cancelOne(g *group, id uint64) (bool, error) {
	e := g.e
	j, found, err := g.load(id)
	if err != nil {
		return false, err
	}
	if !found {
		c.err = jobs.ErrNotFound
		return false, nil
	}
	next, res, cerr := j.Cancel(c.req.Principal, c.req.Reason, g.now, e.cfg.RunningCancel)
	if c.req.Batch == 0 {
		c.res.Job, c.res.Result, c.err = next, res, cerr
	}
	if cerr != nil {
		switch {
		case errors.Is(cerr, jobs.ErrRunningCancelDisabled):
			c.res.SkippedRunning++
		case j.Phase == jobs.PhaseSucceeded:
			c.res.AlreadySucceeded++
		case j.Phase == jobs.PhaseFailed:
			c.res.AlreadyFailed++
		}
		if next.EventSeq != j.EventSeq {
			return false, g.save(j, next)
		}
		return false, nil
	}
	switch res {
	case jobs.AlreadyCancelled:
		c.res.AlreadyCancelled++
		return false, nil
	case jobs.CancelledQueued:
		c.res.CancelledQueued++
		if j.Phase == jobs.PhaseQueued {
			e.sched.Remove(j.Team, j.ID)
		}
		delete(e.retryAt, j.ID)
	case jobs.CancelledRunning:
		c.res.CancelledRunning++
		c.res.Running = append(c.res.Running, next)
		e.endLease(g, j, next)
		g.revoke(j.Lease.Renderer, LeaseStatus{Job: j.ID, Token: j.Lease.Token, Reason: string(reason.JobCancelled), CurrentToken: next.LastToken(), CurrentPhase: next.Phase})
	}
	return true, g.save(j, next)
}
