package engine

import (
	"context"
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/store"
)

// Retention says how long what has ended is kept. A zero period keeps
// that kind of record forever.
type Retention struct {
	// Jobs is how long a terminal job is kept after it ended (SUCCEEDED,
	// FAILED or CANCELLED), with its history, previews, document, index
	// entries and its place in its batch's and team's counts. A batch goes
	// with its last job, and its request id with it.
	Jobs time.Duration
	// Rejections is how long a rejected completion is listed.
	Rejections time.Duration
	// Audit is how long an audit record is kept; a replay's request id is
	// remembered as long as its record.
	Audit time.Duration
	// Step bounds one purge command: at most Step jobs (with what is
	// theirs), Step rejections and Step audit records, and 8 × Step job
	// records read to index a file that predates the finished-jobs index.
	// Zero means DefaultPurgeStep.
	Step int
}

// DefaultPurgeStep is Retention.Step's default.
const DefaultPurgeStep = 128

// backfillPerStep is how many job records one purge step reads, per job
// it may delete, to index a file written before the finished-jobs index.
const backfillPerStep = 8

// On reports whether anything is ever purged.
func (r Retention) On() bool { return r.Jobs > 0 || r.Rejections > 0 || r.Audit > 0 }

// PurgeResult is what one purge step deleted.
type PurgeResult struct {
	Jobs, Batches, Rejections, Audit int
	// Indexed is how many job records the step read to index jobs that
	// ended before the finished-jobs index existed.
	Indexed int
	// More reports that the step stopped at its bound: more may be due
	// now. The caller sends another step after letting other work through.
	More bool
}

// Purge applies one bounded retention step through the writer: it deletes
// at most Retention.Step terminal jobs that ended more than Retention.Jobs
// ago (oldest first), the batches left without jobs, and at most Step
// rejections and audit records older than their retention, judged by the
// writer's wall clock. The step is one command in one group like any
// other, so it is durable when it answers, and what it left is consistent:
// counts, indexes and batches agree with the jobs that remain. It does
// nothing when no retention is configured.
//
// Purge never touches a job that is not terminal, so it changes nothing
// dispatch, leases or timers depend on; the commands queued behind it wait
// only for the bounded step.
func (e *Engine) Purge(ctx context.Context) (PurgeResult, error) {
	return call(ctx, e, &purgeCmd{})
}

type purgeCmd struct {
	base
	noText
	res PurgeResult
}

func (c *purgeCmd) result() PurgeResult { return c.res }

func (c *purgeCmd) evaluate(g *group) error {
	r := g.e.cfg.Retention
	if !r.On() {
		return nil
	}
	tx, err := g.txn()
	if err != nil {
		return err
	}
	if r.Jobs > 0 {
		if err := c.purgeJobs(g, tx, g.now.Add(-r.Jobs), r.Step); err != nil {
			return err
		}
	}
	if r.Rejections > 0 {
		if c.res.Rejections, err = tx.PurgeRejections(g.now.Add(-r.Rejections), r.Step); err != nil {
			return err
		}
		c.res.More = c.res.More || c.res.Rejections == r.Step
	}
	if r.Audit > 0 {
		if c.res.Audit, err = tx.PurgeAudit(g.now.Add(-r.Audit), r.Step); err != nil {
			return err
		}
		c.res.More = c.res.More || c.res.Audit == r.Step
	}
	g.purged.Jobs += c.res.Jobs
	g.purged.Batches += c.res.Batches
	g.purged.Rejections += c.res.Rejections
	g.purged.Audit += c.res.Audit
	return nil
}

// purgeJobs indexes the next records of a file that predates the
// finished-jobs index, deletes up to step jobs (fewer if the group purged
// some already) that ended before cutoff, takes them out of the counts,
// and deletes the batches they leave empty.
func (c *purgeCmd) purgeJobs(g *group, tx *store.Tx, cutoff time.Time, step int) error {
	e := g.e
	if tx.BackfillPending() {
		n, done, err := tx.BackfillFinished(step * backfillPerStep)
		if err != nil {
			return err
		}
		c.res.Indexed, c.res.More = n, !done
	}
	budget := step - g.purged.Jobs
	if budget <= 0 {
		c.res.More = true
		return nil
	}
	due := tx.FinishedBefore(cutoff, budget)
	c.res.More = c.res.More || len(due) == budget
	var batches []uint64
	for _, f := range due {
		j, found, err := tx.Job(f.Job)
		if err != nil {
			return err
		}
		if !found || !j.Phase.Terminal() || !store.FinishTime(j).Equal(f.At) {
			e.log.Error("finished-jobs index disagrees with the store; dropping the entry", "job", f.Job, "at", f.At, "found", found, "phase", j.Phase)
			if err := tx.DropFinished(f); err != nil {
				return err
			}
			continue
		}
		if err := tx.PurgeJob(j); err != nil {
			return err
		}
		g.uncount(j)
		c.res.Jobs++
		if len(batches) == 0 || batches[len(batches)-1] != j.BatchID {
			batches = append(batches, j.BatchID)
		}
	}
	for _, id := range batches {
		if err := c.dropIfEmpty(g, tx, id); err != nil {
			return err
		}
	}
	return nil
}

// dropIfEmpty deletes batch id when none of its jobs is left, with its
// counts (the group's pending changes to them included).
func (c *purgeCmd) dropIfEmpty(g *group, tx *store.Tx, id uint64) error {
	b, found, err := tx.Batch(id)
	if err != nil || !found || tx.BatchHasJobs(b) {
		return err
	}
	if err := tx.DeleteBatch(b); err != nil {
		return err
	}
	delete(g.batchDelta, id)
	c.res.Batches++
	return nil
}
