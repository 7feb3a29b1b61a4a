package store

import (
	"errors"
	"fmt"
	"slices"

	"github.com/leasehold/leasehold/coordinator/internal/jobs"
)

// CheckIndexes recounts everything the indexes and counts say about the
// stored jobs and returns every disagreement, joined, or nil: the
// unfinished and finished indexes against the jobs' phases, the team index
// against the jobs' teams, the counts per batch and per team against a
// recount, and every batch against its jobs, its team index entry and its
// request id. It reads the whole file: tests and diagnostics call it, the
// writer never does.
func (t *Tx) CheckIndexes() error {
	c := &indexCheck{t: t}
	recount, err := c.jobs()
	if err != nil {
		return err
	}
	stored, err := c.batches(recount.batches)
	if err != nil {
		return err
	}
	if err := c.danglingBatchRefs(stored); err != nil {
		return err
	}
	if err := c.teams(recount.teams); err != nil {
		return err
	}
	return errors.Join(c.errs...)
}

// indexCheck gathers the disagreements CheckIndexes finds, step by step.
type indexCheck struct {
	t    *Tx
	errs []error
}

func (c *indexCheck) fail(format string, args ...any) {
	c.errs = append(c.errs, fmt.Errorf(format, args...))
}

// recount is what the jobs say the per-batch and per-team counts are.
type recount struct {
	batches map[uint64]*Counts
	teams   map[string]*Counts
}

// jobs checks every job against the team, unfinished and finished indexes
// and its batch, then each index's size against the entries the jobs
// account for, and returns the recounted counts.
func (c *indexCheck) jobs() (recount, error) {
	t := c.t
	backfillFrom := uint64(0) // jobs above this may not be indexed yet
	backfilling := t.BackfillPending()
	if backfilling {
		backfillFrom = btoi(t.tx.Bucket(bucketMeta).Get(keyFinishedBackfill))
	}
	rc := recount{batches: map[uint64]*Counts{}, teams: map[string]*Counts{}}
	unfinished, finished, teamJobs := 0, 0, 0
	err := t.ForEachJob(0, func(j jobs.Job) (bool, error) {
		if rc.batches[j.BatchID] == nil {
			rc.batches[j.BatchID] = &Counts{}
		}
		if rc.teams[j.Team] == nil {
			rc.teams[j.Team] = &Counts{}
		}
		rc.batches[j.BatchID][j.Phase]++
		rc.teams[j.Team][j.Phase]++
		if t.tx.Bucket(bucketTeamJobs).Get(teamKey(j.Team, j.ID)) == nil {
			c.fail("job %d of team %s is not in the team index", j.ID, j.Team)
		} else {
			teamJobs++
		}
		isUnfinished := t.tx.Bucket(bucketUnfinished).Get(itob(j.ID)) != nil
		isFinished := t.tx.Bucket(bucketFinished).Get(finishedKey(FinishTime(j), j.ID)) != nil
		if isUnfinished {
			unfinished++
		}
		if isFinished {
			finished++
		}
		switch {
		case j.Phase.Terminal() && isUnfinished:
			c.fail("job %d is %v and in the unfinished index", j.ID, j.Phase)
		case !j.Phase.Terminal() && !isUnfinished:
			c.fail("job %d is %v and not in the unfinished index", j.ID, j.Phase)
		case !j.Phase.Terminal() && isFinished:
			c.fail("job %d is %v and in the finished index", j.ID, j.Phase)
		case j.Phase.Terminal() && !isFinished && (!backfilling || j.ID <= backfillFrom):
			c.fail("job %d is %v since %v and not in the finished index", j.ID, j.Phase, FinishTime(j))
		}
		if _, found, err := t.Batch(j.BatchID); err != nil || !found {
			c.fail("job %d names batch %d, which is not stored (%v)", j.ID, j.BatchID, err)
		}
		return true, nil
	})
	if err != nil {
		return rc, err
	}
	if n := t.tx.Bucket(bucketUnfinished).Stats().KeyN; n != unfinished {
		c.fail("the unfinished index holds %d entries, %d of them unfinished jobs", n, unfinished)
	}
	if n := t.tx.Bucket(bucketFinished).Stats().KeyN; n != finished {
		c.fail("the finished index holds %d entries, %d of them terminal jobs at their finish time", n, finished)
	}
	if n := t.tx.Bucket(bucketTeamJobs).Stats().KeyN; n != teamJobs {
		c.fail("the team index holds %d entries, %d of them jobs of their team", n, teamJobs)
	}
	return rc, nil
}

// batches checks every stored batch against its jobs, its team index entry,
// its request id and the recounted counts, and returns the stored ids.
func (c *indexCheck) batches(recounted map[uint64]*Counts) (map[uint64]bool, error) {
	t := c.t
	stored := map[uint64]bool{}
	err := t.tx.Bucket(bucketBatches).ForEach(func(k, _ []byte) error {
		b, _, err := t.Batch(btoi(k))
		if err != nil {
			return err
		}
		stored[b.ID] = true
		if !t.BatchHasJobs(b) {
			c.fail("batch %d has no jobs left", b.ID)
		}
		if t.tx.Bucket(bucketTeamBatches).Get(teamKey(b.Team, b.ID)) == nil {
			c.fail("batch %d of team %s is not in the team index", b.ID, b.Team)
		}
		if v := t.tx.Bucket(bucketRequests).Get(requestKey(b.Team, b.RequestID)); v == nil || btoi(v) != b.ID {
			c.fail("request id %q of team %s does not name batch %d", b.RequestID, b.Team, b.ID)
		}
		got, err := t.BatchCounts(b.ID)
		if err != nil {
			return err
		}
		want := Counts{}
		if rc := recounted[b.ID]; rc != nil {
			want = *rc
		}
		if got != want {
			c.fail("batch %d: stored counts %v, recount %v", b.ID, got, want)
		}
		return nil
	})
	return stored, err
}

// danglingBatchRefs checks that every batch count, request id and team
// index entry names a stored batch.
func (c *indexCheck) danglingBatchRefs(stored map[uint64]bool) error {
	for _, dangling := range []struct {
		bucket []byte
		id     func(k, v []byte) uint64
	}{
		{bucketBatchCounts, func(k, _ []byte) uint64 { return btoi(k) }},
		{bucketRequests, func(_, v []byte) uint64 { return btoi(v) }},
		{bucketTeamBatches, func(k, _ []byte) uint64 { return btoi(k[len(k)-8:]) }},
	} {
		err := c.t.tx.Bucket(dangling.bucket).ForEach(func(k, v []byte) error {
			if id := dangling.id(k, v); !stored[id] {
				c.fail("%s entry %q names batch %d, which is not stored", dangling.bucket, k, id)
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// teams checks every team's stored counts against the recount, and that
// every team with jobs has counts.
func (c *indexCheck) teams(recounted map[string]*Counts) error {
	var teams []string
	err := c.t.ForEachTeamCounts(func(team string, got Counts) error {
		teams = append(teams, team)
		want := Counts{}
		if rc := recounted[team]; rc != nil {
			want = *rc
		}
		if got != want {
			c.fail("team %s: stored counts %v, recount %v", team, got, want)
		}
		return nil
	})
	if err != nil {
		return err
	}
	for team := range recounted {
		if !slices.Contains(teams, team) {
			c.fail("team %s has jobs and no stored counts", team)
		}
	}
	return nil
}
