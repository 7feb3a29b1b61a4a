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
	var errs []error
	fail := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	backfillFrom := uint64(0) // jobs above this may not be indexed yet
	backfilling := t.BackfillPending()
	if backfilling {
		backfillFrom = btoi(t.tx.Bucket(bucketMeta).Get(keyFinishedBackfill))
	}

	batchCounts := map[uint64]*Counts{}
	teamCounts := map[string]*Counts{}
	unfinished, finished, teamJobs := 0, 0, 0
	err := t.ForEachJob(0, func(j jobs.Job) (bool, error) {
		if batchCounts[j.BatchID] == nil {
			batchCounts[j.BatchID] = &Counts{}
		}
		if teamCounts[j.Team] == nil {
			teamCounts[j.Team] = &Counts{}
		}
		batchCounts[j.BatchID][j.Phase]++
		teamCounts[j.Team][j.Phase]++
		if t.tx.Bucket(bucketTeamJobs).Get(teamKey(j.Team, j.ID)) == nil {
			fail("job %d of team %s is not in the team index", j.ID, j.Team)
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
			fail("job %d is %v and in the unfinished index", j.ID, j.Phase)
		case !j.Phase.Terminal() && !isUnfinished:
			fail("job %d is %v and not in the unfinished index", j.ID, j.Phase)
		case !j.Phase.Terminal() && isFinished:
			fail("job %d is %v and in the finished index", j.ID, j.Phase)
		case j.Phase.Terminal() && !isFinished && (!backfilling || j.ID <= backfillFrom):
			fail("job %d is %v since %v and not in the finished index", j.ID, j.Phase, FinishTime(j))
		}
		if _, found, err := t.Batch(j.BatchID); err != nil || !found {
			fail("job %d names batch %d, which is not stored (%v)", j.ID, j.BatchID, err)
		}
		return true, nil
	})
	if err != nil {
		return err
	}
	if n := t.tx.Bucket(bucketUnfinished).Stats().KeyN; n != unfinished {
		fail("the unfinished index holds %d entries, %d of them unfinished jobs", n, unfinished)
	}
	if n := t.tx.Bucket(bucketFinished).Stats().KeyN; n != finished {
		fail("the finished index holds %d entries, %d of them terminal jobs at their finish time", n, finished)
	}
	if n := t.tx.Bucket(bucketTeamJobs).Stats().KeyN; n != teamJobs {
		fail("the team index holds %d entries, %d of them jobs of their team", n, teamJobs)
	}

	stored := map[uint64]bool{}
	err = t.tx.Bucket(bucketBatches).ForEach(func(k, _ []byte) error {
		b, _, err := t.Batch(btoi(k))
		if err != nil {
			return err
		}
		stored[b.ID] = true
		if !t.BatchHasJobs(b) {
			fail("batch %d has no jobs left", b.ID)
		}
		if t.tx.Bucket(bucketTeamBatches).Get(teamKey(b.Team, b.ID)) == nil {
			fail("batch %d of team %s is not in the team index", b.ID, b.Team)
		}
		if v := t.tx.Bucket(bucketRequests).Get(requestKey(b.Team, b.RequestID)); v == nil || btoi(v) != b.ID {
			fail("request id %q of team %s does not name batch %d", b.RequestID, b.Team, b.ID)
		}
		got, err := t.BatchCounts(b.ID)
		if err != nil {
			return err
		}
		want := Counts{}
		if c := batchCounts[b.ID]; c != nil {
			want = *c
		}
		if got != want {
			fail("batch %d: stored counts %v, recount %v", b.ID, got, want)
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, dangling := range []struct {
		bucket []byte
		id     func(k, v []byte) uint64
	}{
		{bucketBatchCounts, func(k, _ []byte) uint64 { return btoi(k) }},
		{bucketRequests, func(_, v []byte) uint64 { return btoi(v) }},
		{bucketTeamBatches, func(k, _ []byte) uint64 { return btoi(k[len(k)-8:]) }},
	} {
		err := t.tx.Bucket(dangling.bucket).ForEach(func(k, v []byte) error {
			if id := dangling.id(k, v); !stored[id] {
				fail("%s entry %q names batch %d, which is not stored", dangling.bucket, k, id)
			}
			return nil
		})
		if err != nil {
			return err
		}
	}

	var teams []string
	err = t.ForEachTeamCounts(func(team string, got Counts) error {
		teams = append(teams, team)
		want := Counts{}
		if c := teamCounts[team]; c != nil {
			want = *c
		}
		if got != want {
			fail("team %s: stored counts %v, recount %v", team, got, want)
		}
		return nil
	})
	if err != nil {
		return err
	}
	for team := range teamCounts {
		if !slices.Contains(teams, team) {
			fail("team %s has jobs and no stored counts", team)
		}
	}
	return errors.Join(errs...)
}
