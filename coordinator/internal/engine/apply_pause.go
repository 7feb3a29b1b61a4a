package engine

import (
	"context"
	"fmt"

	"github.com/leasehold/leasehold/coordinator/internal/jobs"
)

// SetPaused pauses or resumes dispatch. The switch is persisted and
// audited; while paused no lease is granted, and everything else works.
func (e *Engine) SetPaused(ctx context.Context, paused bool, principal, reason string) (jobs.DispatchState, error) {
	c := &pauseCmd{paused: paused, principal: principal, reason: reason}
	return call(ctx, e, c)
}

type pauseCmd struct {
	base
	paused    bool
	principal string
	reason    string
	res       jobs.DispatchState
}

func (c *pauseCmd) result() jobs.DispatchState { return c.res }

func (c *pauseCmd) text() error {
	return checkText("principal", c.principal, "reason", c.reason)
}

func (c *pauseCmd) evaluate(g *group) error {
	e := g.e
	tx, err := g.txn()
	if err != nil {
		return err
	}
	st := e.dispatchSt
	if st.Paused != c.paused {
		st = jobs.DispatchState{Paused: c.paused, Since: g.now, Principal: c.principal, Reason: c.reason}
		if err := tx.PutDispatchState(st); err != nil {
			return err
		}
		g.dispatch = true
	}
	action := jobs.AuditPause
	if !c.paused {
		action = jobs.AuditResume
		g.work = true
	}
	if _, err := tx.PutAudit(jobs.AuditRecord{At: g.now, Principal: c.principal, Action: action, Reason: c.reason}); err != nil {
		return err
	}
	e.dispatchMu.Lock()
	e.dispatchSt = st
	e.dispatchMu.Unlock()
	c.res = st
	return nil
}

// RecordAudit appends an audit record, such as an operator's refused
// attempt on a team outside its scope.
func (e *Engine) RecordAudit(ctx context.Context, rec jobs.AuditRecord) error {
	return e.do(ctx, &auditCmd{rec: rec})
}

type auditCmd struct {
	base
	rec jobs.AuditRecord
}

func (c *auditCmd) text() error {
	if err := checkText("principal", c.rec.Principal, "action", c.rec.Action, "reason", c.rec.Reason,
		"request_id", c.rec.RequestID, "target", c.rec.Target); err != nil {
		return err
	}
	for i, team := range c.rec.Teams {
		if !storable(team) {
			return badText(fmt.Sprintf("teams[%d]", i))
		}
	}
	return nil
}

func (c *auditCmd) evaluate(g *group) error {
	tx, err := g.txn()
	if err != nil {
		return err
	}
	c.rec.ID = 0
	if c.rec.At.IsZero() {
		c.rec.At = g.now
	}
	_, err = tx.PutAudit(c.rec)
	return err
}
