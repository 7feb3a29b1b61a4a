package engine

import (
	"context"
	"slices"

	"github.com/leasehold/leasehold/client/reason"
	"github.com/leasehold/leasehold/coordinator/internal/jobs"
)

// Replay re-queues FAILED jobs for an operator: dry-run first, bounded,
// scoped, idempotent per request id and audited. A document whose format
// the coordinator knows is unsupported is never queued again, even with
// IncludePermanent.
func (e *Engine) Replay(ctx context.Context, req ReplayRequest) (ReplayResult, error) {
	return call(ctx, e, newReplayCmd(req))
}

// newReplayCmd builds a replay's command; no scope means every team.
func newReplayCmd(req ReplayRequest) *replayCmd {
	if req.InScope == nil {
		req.InScope = func(string) bool { return true }
	}
	return &replayCmd{req: req}
}

type replayCmd struct {
	base
	req ReplayRequest
	res ReplayResult
}

func (c *replayCmd) result() ReplayResult { return c.res }

func (c *replayCmd) text() error {
	return checkText("principal", c.req.Principal, "request_id", c.req.RequestID, "reason", c.req.Reason)
}

func (c *replayCmd) evaluate(g *group) error {
	e := g.e
	tx, err := g.txn()
	if err != nil {
		return err
	}
	c.res = ReplayResult{DryRun: c.req.DryRun, Limit: e.cfg.ReplayLimit}
	if !c.req.DryRun {
		prev, found, err := tx.ReplayByRequest(c.req.Principal, c.req.RequestID)
		if err != nil {
			return err
		}
		if found {
			c.res.Previous = prev.Response
			c.res.AuditID = prev.ID
			return nil
		}
	}
	candidates, missing, err := c.select_(g)
	if err != nil || c.err != nil {
		return err
	}
	// A job outside the operator's scope is answered exactly as one that
	// does not exist, so that a replay reveals no other team's ids.
	var inScope []jobs.Job
	teams := map[string]bool{}
	for _, j := range candidates {
		if c.req.InScope(j.Team) {
			inScope = append(inScope, j)
			teams[j.Team] = true
		} else {
			missing = append(missing, j.ID)
		}
	}
	slices.Sort(missing)
	c.res.Selected = len(inScope) + len(missing)
	for _, id := range missing {
		c.res.Items = append(c.res.Items, ReplayItem{ID: id, SkipReason: string(reason.JobNotFound)})
		c.res.Skipped++
	}
	// The limit bounds the jobs a call touches: skipped jobs are listed
	// but do not use it up, so a batch's retryable failures are reachable
	// behind any number of permanent ones.
	var requeued []uint64
	for _, j := range inScope {
		item, err := c.replayOne(g, j)
		if err != nil {
			return err
		}
		if item.Requeue && !c.req.DryRun {
			requeued = append(requeued, j.ID)
		}
		if item.Requeue || item.SkipReason != "" {
			c.res.Items = append(c.res.Items, item)
		}
	}
	if c.req.DryRun {
		return nil
	}
	teamList := make([]string, 0, len(teams))
	for t := range teams {
		teamList = append(teamList, t)
	}
	slices.Sort(teamList)
	rec := jobs.AuditRecord{At: g.now, Principal: c.req.Principal, Action: jobs.AuditReplay, Reason: c.req.Reason,
		RequestID: c.req.RequestID, JobIDs: requeued, IncludePermanent: c.req.IncludePermanent, Skipped: uint32(c.res.Skipped),
		OutOfScope: uint32(c.res.OutOfScope), Batch: c.req.Batch, TerminalReason: c.req.TerminalReason, Teams: teamList}
	rec, err = tx.PutAudit(rec)
	if err != nil {
		return err
	}
	c.res.AuditID = rec.ID
	if c.req.Encode != nil {
		rec.Response = c.req.Encode(c.res)
		if _, err := tx.PutAudit(rec); err != nil {
			return err
		}
	}
	return nil
}

// select_ returns the replay's candidates: a batch's FAILED jobs (of the
// terminal reason, if given), or the named jobs, and the named ids that do
// not exist.
func (c *replayCmd) select_(g *group) (candidates []jobs.Job, missing []uint64, err error) {
	tx, err := g.txn()
	if err != nil {
		return nil, nil, err
	}
	if c.req.Batch != 0 {
		b, found, err := tx.Batch(c.req.Batch)
		if err != nil {
			return nil, nil, err
		}
		if !found || !c.req.InScope(b.Team) {
			c.err = jobs.ErrNotFound
			return nil, nil, nil
		}
		for _, id := range b.JobIDs() {
			j, _, err := tx.Job(id)
			if err != nil {
				return nil, nil, err
			}
			if j.Phase == jobs.PhaseFailed && (c.req.TerminalReason == jobs.ReasonUnspecified || j.TerminalReason == c.req.TerminalReason) {
				candidates = append(candidates, j)
			}
		}
		return candidates, nil, nil
	}
	ids := slices.Clone(c.req.JobIDs)
	slices.Sort(ids)
	for _, id := range slices.Compact(ids) {
		j, found, err := tx.Job(id)
		if err != nil {
			return nil, nil, err
		}
		if !found {
			missing = append(missing, id)
			continue
		}
		candidates = append(candidates, j)
	}
	return candidates, missing, nil
}

// replayOne judges one in-scope job and, unless dry-run, re-queues it.
func (c *replayCmd) replayOne(g *group, j jobs.Job) (ReplayItem, error) {
	e := g.e
	item := ReplayItem{Job: j, ID: j.ID}
	if err := j.CanReplay(c.req.IncludePermanent); err != nil {
		item.SkipReason = jobs.ReasonCode(err)
		c.res.Skipped++
		return item, nil
	}
	if e.cfg.Unsupported.Unsupported(j.Doc) {
		item.SkipReason = "UNSUPPORTED_FORMAT"
		c.res.Skipped++
		return item, nil
	}
	if c.res.Requeued == c.res.Limit {
		c.res.Truncated = true
		return ReplayItem{}, nil
	}
	item.Requeue = true
	c.res.Requeued++
	if c.req.DryRun {
		return item, nil
	}
	next, err := j.Replay(c.req.Principal, c.req.Reason, c.req.IncludePermanent, g.now)
	if err != nil {
		// CanReplay said yes a moment ago; a refusal here is a bug, and a
		// domain refusal never stops the writer.
		e.log.Error("replay refused", "job", j.ID, "err", err)
		item.Requeue, item.SkipReason = false, jobs.ReasonCode(err)
		c.res.Requeued--
		c.res.Skipped++
		return item, nil
	}
	if err := g.save(j, next); err != nil {
		return item, err
	}
	failpointReplayMidway()
	e.sched.Push(next.Team, next.ID)
	g.work = true
	item.Job = next
	return item, nil
}
