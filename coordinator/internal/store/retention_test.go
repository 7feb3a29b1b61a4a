package store_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	"github.com/leasehold/leasehold/coordinator/internal/store"
	"go.etcd.io/bbolt"
)

// endedAt is a terminal job of batch 1, team a, that ended at t.
func endedAt(id uint64, t time.Time) jobs.Job {
	j := fullJob(id, 1, "a")
	j.FinishedAt = t
	return j
}

// putJob writes j with its history, team index entry, counts and, as the
// writer does, its unfinished or finished index entry (unless unindexed).
func putJob(tx *store.Tx, j jobs.Job, unindexed bool) error {
	if err := tx.PutJob(j); err != nil {
		return err
	}
	if err := tx.PutEvents(j.ID, fullEvents()); err != nil {
		return err
	}
	if err := tx.IndexTeamJob(j.Team, j.ID); err != nil {
		return err
	}
	var d jobs.Counts
	d[j.Phase]++
	if err := tx.AddBatchCounts(j.BatchID, d); err != nil {
		return err
	}
	if err := tx.AddTeamCounts(j.Team, d); err != nil {
		return err
	}
	switch {
	case !j.Phase.Terminal():
		return tx.SetUnfinished(j.ID, true)
	case !unindexed:
		return tx.IndexFinished(j)
	}
	return nil
}

func TestPurgeJobAndBatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	batch := jobs.Batch{ID: 1, Team: "a", RequestID: "req", CreatedAt: t0, FirstJob: 1, Count: 2}
	ended, live := endedAt(1, t0), fullJob(2, 1, "a")
	live.Phase = jobs.PhaseQueued
	b.update(t, func(tx *store.Tx) error {
		if err := tx.PutBatch(batch); err != nil {
			return err
		}
		for _, j := range []jobs.Job{ended, live} {
			if err := putJob(tx, j, false); err != nil {
				return err
			}
			if err := tx.PutDocument(j.ID, []byte("doc")); err != nil {
				return err
			}
			if err := tx.PutArtifact(j.ID, 40, store.Artifact{Digest: "d", Content: []byte("png")}); err != nil {
				return err
			}
		}
		return nil
	})

	b.update(t, func(tx *store.Tx) error {
		if err := tx.PurgeJob(live); err == nil {
			t.Errorf("PurgeJob of a QUEUED job succeeded; want a refusal")
		}
		if err := tx.PurgeJob(ended); err != nil {
			return err
		}
		if err := tx.DeleteBatch(batch); err == nil {
			t.Errorf("DeleteBatch with a job left succeeded; want a refusal")
		}
		return nil
	})
	b.view(t, func(tx *store.Tx) error {
		if _, found, _ := tx.Job(1); found {
			t.Errorf("job 1 is still stored")
		}
		if evs, _ := tx.Events(1, 0); len(evs) != 0 {
			t.Errorf("job 1 keeps %d events", len(evs))
		}
		if _, err := tx.Artifact(1, 40); !errors.Is(err, store.ErrArtifactNotFound) {
			t.Errorf("job 1's preview: %v, want ErrArtifactNotFound", err)
		}
		if d := tx.Document(1); d != nil {
			t.Errorf("job 1 keeps its document")
		}
		if got := tx.TeamJobsAfter("a", 0, 10); !cmp.Equal(got, []uint64{2}) {
			t.Errorf("team index = %v, want [2]", got)
		}
		if got := tx.FinishedBefore(t0.Add(time.Hour), 10); len(got) != 0 {
			t.Errorf("finished index = %v, want empty", got)
		}
		if _, err := tx.Artifact(2, 40); err != nil || tx.Document(2) == nil || !tx.BatchHasJobs(batch) {
			t.Errorf("the live job lost something: preview %v, document %v, batch has jobs %v", err, tx.Document(2) != nil, tx.BatchHasJobs(batch))
		}
		return nil
	})

	done := live
	done.Phase, done.FinishedAt = jobs.PhaseSucceeded, t0
	b.update(t, func(tx *store.Tx) error {
		if err := tx.PurgeJob(done); err != nil {
			return err
		}
		return tx.DeleteBatch(batch)
	})
	b.view(t, func(tx *store.Tx) error {
		if _, found, _ := tx.Batch(1); found {
			t.Errorf("batch 1 is still stored")
		}
		if _, found, _ := tx.BatchByRequest("a", "req"); found {
			t.Errorf("request id req still names a batch")
		}
		if got := tx.TeamBatchesBefore("a", 0, 10); len(got) != 0 {
			t.Errorf("team batches = %v, want none", got)
		}
		return nil
	})
}

func TestFinishedBefore(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.update(t, func(tx *store.Tx) error {
		for id, at := range map[uint64]time.Time{1: t0.Add(3 * time.Hour), 2: t0, 3: t0.Add(time.Hour), 4: t0.Add(time.Hour)} {
			if err := tx.IndexFinished(endedAt(id, at)); err != nil {
				return err
			}
		}
		return nil
	})
	b.view(t, func(tx *store.Tx) error {
		want := []store.Finished{{Job: 2, At: t0}, {Job: 3, At: t0.Add(time.Hour)}, {Job: 4, At: t0.Add(time.Hour)}}
		if diff := cmp.Diff(want, tx.FinishedBefore(t0.Add(2*time.Hour), 10)); diff != "" {
			t.Errorf("FinishedBefore(+2h), oldest first (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff(want[:2], tx.FinishedBefore(t0.Add(2*time.Hour), 2)); diff != "" {
			t.Errorf("FinishedBefore with a limit of 2 (-want +got):\n%s", diff)
		}
		if got := tx.FinishedBefore(t0, 10); len(got) != 0 {
			t.Errorf("FinishedBefore(t0) = %v, want nothing: the cutoff is exclusive", got)
		}
		return nil
	})
	// A job with no finish time (schema 1) is judged by its last update.
	j := endedAt(5, time.Time{})
	if got := store.FinishTime(j); !got.Equal(j.UpdatedAt) {
		t.Errorf("FinishTime without FinishedAt = %v, want UpdatedAt %v", got, j.UpdatedAt)
	}
}

func TestPurgeRejectionsAndAudit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.update(t, func(tx *store.Tx) error {
		for i := range 5 {
			if _, err := tx.PutRejection(fullRejection(1, uint64(i), t0.Add(time.Duration(i)*time.Hour))); err != nil {
				return err
			}
		}
		for i, a := range []jobs.AuditRecord{
			{At: t0, Principal: "ops", Action: jobs.AuditReplay, RequestID: "old"},
			{At: t0.Add(time.Hour), Principal: "ops", Action: jobs.AuditPause},
			{At: t0.Add(2 * time.Hour), Principal: "ops", Action: jobs.AuditReplay, RequestID: "new"},
		} {
			if _, err := tx.PutAudit(a); err != nil {
				return fmt.Errorf("audit %d: %w", i, err)
			}
		}
		return nil
	})
	var n1, n2, n3, a1 int
	b.update(t, func(tx *store.Tx) error {
		var err error
		cutoff := t0.Add(3*time.Hour + time.Minute)
		if n1, err = tx.PurgeRejections(cutoff, 2); err != nil {
			return err
		}
		if n2, err = tx.PurgeRejections(cutoff, 2); err != nil {
			return err
		}
		if n3, err = tx.PurgeRejections(cutoff, 2); err != nil {
			return err
		}
		a1, err = tx.PurgeAudit(t0.Add(90*time.Minute), 10)
		return err
	})
	if got, want := []int{n1, n2, n3, a1}, []int{2, 2, 0, 2}; !cmp.Equal(got, want) {
		t.Errorf("purged rejections in three steps of 2, then audit records = %v, want %v", got, want)
	}
	b.view(t, func(tx *store.Tx) error {
		var left []time.Time
		tx.ForEachRejection(0, func(r jobs.Rejection) (bool, error) { left = append(left, r.At); return true, nil })
		if want := []time.Time{t0.Add(4 * time.Hour)}; !cmp.Equal(left, want) {
			t.Errorf("rejections left %v, want %v", left, want)
		}
		if _, found, _ := tx.ReplayByRequest("ops", "old"); found {
			t.Errorf("the purged replay's request id is still indexed")
		}
		if _, found, err := tx.ReplayByRequest("ops", "new"); !found || err != nil {
			t.Errorf("the kept replay's request id: found %v, %v", found, err)
		}
		return nil
	})
}

func TestBackfillFinished(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// A file as a release before the finished-jobs index wrote it.
	b.update(t, func(tx *store.Tx) error {
		if err := tx.PutBatch(jobs.Batch{ID: 1, Team: "a", RequestID: "r", FirstJob: 1, Count: 5}); err != nil {
			return err
		}
		for id := uint64(1); id <= 5; id++ {
			j := endedAt(id, t0.Add(time.Duration(id)*time.Minute))
			if id == 3 {
				j.Phase = jobs.PhaseQueued
			}
			if err := putJob(tx, j, true); err != nil {
				return err
			}
		}
		return nil
	})
	b.close(t)
	rawUpdate(t, b.path, func(tx *bbolt.Tx) error { return tx.DeleteBucket([]byte("finished")) })
	b.open(t)

	var steps []int
	for {
		var n int
		var done bool
		b.update(t, func(tx *store.Tx) error {
			if !tx.BackfillPending() {
				t.Fatalf("no backfill pending before it is done")
			}
			var err error
			n, done, err = tx.BackfillFinished(2)
			return err
		})
		steps = append(steps, n)
		if done {
			break
		}
	}
	if want := []int{2, 2, 1}; !cmp.Equal(steps, want) {
		t.Errorf("records read per step = %v, want %v", steps, want)
	}
	b.reopen(t)
	b.view(t, func(tx *store.Tx) error {
		if tx.BackfillPending() {
			t.Errorf("backfill still pending after it finished and a reopen")
		}
		var got []uint64
		for _, f := range tx.FinishedBefore(t0.Add(time.Hour), 10) {
			got = append(got, f.Job)
		}
		if want := []uint64{1, 2, 4, 5}; !cmp.Equal(got, want) {
			t.Errorf("indexed %v, want the terminal jobs %v", got, want)
		}
		return tx.CheckIndexes()
	})
}
