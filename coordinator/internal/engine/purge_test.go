package engine

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	"github.com/leasehold/leasehold/coordinator/internal/reads"
	"github.com/leasehold/leasehold/coordinator/internal/store"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.etcd.io/bbolt"
)

const week = 7 * 24 * time.Hour

// purgeAll runs purge steps until one says nothing more is due, and
// returns their sum and how many steps it took.
func (b *testBundle) purgeAll(t *testing.T) (PurgeResult, int) {
	t.Helper()
	var sum PurgeResult
	for steps := 1; ; steps++ {
		r, err := b.e.Purge(context.Background())
		if err != nil {
			t.Fatalf("Purge: %v", err)
		}
		sum.Jobs += r.Jobs
		sum.Batches += r.Batches
		sum.Rejections += r.Rejections
		sum.Audit += r.Audit
		sum.Indexed += r.Indexed
		if !r.More {
			return sum, steps
		}
		if steps > 1000 {
			t.Fatalf("purge still has more after %d steps", steps)
		}
	}
}

// purge runs one purge step.
func (b *testBundle) purge(t *testing.T) PurgeResult {
	t.Helper()
	r, err := b.e.Purge(context.Background())
	if err != nil {
		t.Fatalf("Purge: %v", err)
	}
	return r
}

// checkConsistent runs the invariant checks of the writer and of the
// store on the bundle's engine, and the store's own check (what
// "coordinator check" runs).
func (b *testBundle) checkConsistent(t *testing.T) {
	t.Helper()
	checkIndexes(t, b.e)
	checkStore(t, b.st, store.TokenState{})
	sum, err := b.st.Verify()
	if err != nil || len(sum.Problems) > 0 {
		t.Errorf("store.Verify = %q, %v; want no problems", sum.Problems, err)
	}
}

// endAll ends every job of the bundle that is granted now: the first
// succeeds with a preview, the second fails for good (it keeps its
// document), the rest are cancelled while leased.
func (b *testBundle) endAll(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	for i, g := range b.acquire(t, "r-1", 100) {
		var err error
		switch i {
		case 0:
			_, err = complete(ctx, b.e, success(g.Job.ID, g.Job.Lease.Token, "r-1", "d"))
		case 1:
			_, err = complete(ctx, b.e, failure(g.Job.ID, g.Job.Lease.Token, "r-1", jobs.ClassInvalidDocument, "bad"))
		default:
			_, err = b.e.Cancel(ctx, CancelRequest{Job: g.Job.ID, Principal: "alice"})
		}
		if err != nil {
			t.Fatalf("ending job %d: %v", g.Job.ID, err)
		}
	}
}

func TestPurge(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	retention := func(step int) func(*Config) {
		return func(c *Config) {
			c.Retention = Retention{Jobs: week, Rejections: 30 * 24 * time.Hour, Audit: 365 * 24 * time.Hour, Step: step}
		}
	}

	t.Run("OldTerminalJobsGoWithEverythingTheirsInBoundedSteps", func(t *testing.T) {
		t.Parallel()
		b := setup(t, retention(2))
		old := b.submit(t, "alpha", "r-old", "a.pdf", "b.pdf", "c.pdf")
		b.endAll(t)
		live := b.submit(t, "alpha", "r-live", "d.pdf")
		ids := old.JobIDs()
		if d := b.document(t, ids[1]); d == nil {
			t.Fatalf("the FAILED job %d keeps no document before the purge; it should, for a replay", ids[1])
		}
		succeeded := b.job(t, ids[0])

		b.clock.Advance(week - time.Second)
		if r := b.purge(t); r != (PurgeResult{}) {
			t.Fatalf("a purge before the retention ran out deleted %+v", r)
		}
		b.clock.Advance(2 * time.Second)
		first := b.purge(t)
		if want := (PurgeResult{Jobs: 2, More: true}); first != want {
			t.Errorf("first step = %+v, want %+v (bounded by Step)", first, want)
		}
		second := b.purge(t)
		if want := (PurgeResult{Jobs: 1, Batches: 1}); second != want {
			t.Errorf("second step = %+v, want %+v", second, want)
		}

		for _, id := range ids {
			if _, err := b.e.Job(id); !errors.Is(err, jobs.ErrNotFound) {
				t.Errorf("Job(%d) after the purge: err = %v, want jobs.ErrNotFound", id, err)
			}
			if evs, err := b.e.Events(id, 0); err != nil || len(evs) != 0 {
				t.Errorf("job %d keeps %d events (%v)", id, len(evs), err)
			}
			if d := b.document(t, id); d != nil {
				t.Errorf("job %d keeps its document", id)
			}
		}
		if _, err := b.artifactAt(t, succeeded.ID, succeeded.Artifact.Token); !errors.Is(err, store.ErrArtifactNotFound) {
			t.Errorf("the preview of job %d: err = %v, want jobs.ErrArtifactNotFound", succeeded.ID, err)
		}
		if _, err := b.e.Batch(old.ID); !errors.Is(err, jobs.ErrNotFound) {
			t.Errorf("Batch(%d): err = %v, want jobs.ErrNotFound", old.ID, err)
		}
		if j := b.job(t, live.FirstJob); j.Phase != jobs.PhaseQueued {
			t.Errorf("the live job is %v, want QUEUED", j.Phase)
		}
		if got, want := *b.e.teamCounts["alpha"], (jobs.Counts{jobs.PhaseQueued: 1}); got != want {
			t.Errorf("alpha's counts = %v, want only the live job %v", got, want)
		}
		b.checkConsistent(t)
		if got := testutil.ToFloat64(b.e.m.purged.WithLabelValues(purgedJobs)); got != 3 {
			t.Errorf("leasehold_purged_total{kind=jobs} = %v, want 3", got)
		}

		// The request id went with its batch: it makes a new batch now.
		res, err := b.e.Submit(ctx, SubmitRequest{Team: "alpha", RequestID: "r-old", Docs: docs("other.pdf")})
		if err != nil || res.Replayed || res.Batch.Batch.ID == old.ID {
			t.Errorf("resubmitting r-old after its batch was purged = %+v, %v; want a new batch", res.Batch.Batch, err)
		}
	})

	t.Run("ABatchStaysWhileAnyOfItsJobsDoes", func(t *testing.T) {
		t.Parallel()
		b := setup(t, retention(10))
		batch := b.submit(t, "alpha", "r", "a.pdf", "b.pdf")
		first := b.acquire(t, "r-1", 1)[0]
		if _, err := complete(ctx, b.e, success(first.Job.ID, first.Job.Lease.Token, "r-1", "d")); err != nil {
			t.Fatal(err)
		}
		b.clock.Advance(week + time.Second)
		second := b.acquire(t, "r-1", 1)[0]
		if _, err := complete(ctx, b.e, success(second.Job.ID, second.Job.Lease.Token, "r-1", "d")); err != nil {
			t.Fatal(err)
		}
		if r := b.purge(t); r != (PurgeResult{Jobs: 1}) {
			t.Errorf("purge = %+v, want the first job only", r)
		}
		v, err := b.e.Batch(batch.ID)
		if err != nil {
			t.Fatalf("Batch: %v", err)
		}
		if want := (jobs.Counts{jobs.PhaseSucceeded: 1}); v.Counts != want || !v.Done {
			t.Errorf("batch counts = %v done %v, want %v (retained jobs only), done", v.Counts, v.Done, want)
		}
		page, err := b.e.ListJobs(reads.JobFilter{Batch: batch.ID})
		if err != nil || len(page.Jobs) != 1 || page.Jobs[0].ID != second.Job.ID {
			t.Errorf("ListJobs(batch) = %+v, %v; want the second job alone", page.Jobs, err)
		}
		b.checkConsistent(t)
		b.clock.Advance(week + time.Second)
		if r := b.purge(t); r != (PurgeResult{Jobs: 1, Batches: 1}) {
			t.Errorf("purge = %+v, want the second job and the batch", r)
		}
		b.checkConsistent(t)
	})

	t.Run("AReplayedJobIsJudgedByItsNewEnd", func(t *testing.T) {
		t.Parallel()
		b := setup(t, retention(10), func(c *Config) { c.Retry.MaxAttempts = 1 })
		id := b.submit(t, "alpha", "r", "a.pdf").FirstJob
		g := b.acquire(t, "r-1", 1)[0]
		if _, err := complete(ctx, b.e, failure(id, g.Job.Lease.Token, "r-1", jobs.ClassTransient, "boom")); err != nil {
			t.Fatal(err)
		}
		b.clock.Advance(6 * 24 * time.Hour)
		if _, err := b.e.Replay(ctx, ReplayRequest{Principal: "ops", RequestID: "rp", Reason: "fixed", JobIDs: []uint64{id}}); err != nil {
			t.Fatal(err)
		}
		g = b.acquire(t, "r-1", 1)[0]
		if _, err := complete(ctx, b.e, success(id, g.Job.Lease.Token, "r-1", "d")); err != nil {
			t.Fatal(err)
		}
		b.clock.Advance(2 * 24 * time.Hour) // 8 days after the first end, 2 after the second
		if r := b.purge(t); r.Jobs != 0 {
			t.Errorf("purge = %+v, want nothing: the job ended again 2 days ago", r)
		}
		b.checkConsistent(t)
		b.clock.Advance(week + time.Second)
		if r := b.purge(t); r.Jobs != 1 {
			t.Errorf("purge = %+v, want the job", r)
		}
	})

	t.Run("StepsInOneGroupShareTheBound", func(t *testing.T) {
		t.Parallel()
		b := setup(t, retention(3))
		b.submit(t, "alpha", "r", "a.pdf", "b.pdf", "c.pdf", "d.pdf", "e.pdf")
		b.endAll(t)
		b.clock.Advance(week + time.Second)
		release := b.block(t)
		results := make(chan PurgeResult, 2)
		for range 2 {
			go func() {
				r, err := b.e.Purge(ctx)
				if err != nil {
					t.Errorf("Purge: %v", err)
				}
				results <- r
			}()
		}
		b.waitQueued(t, 2)
		release()
		total := (<-results).Jobs + (<-results).Jobs
		if total != 3 {
			t.Errorf("two steps in one group deleted %d jobs, want the bound of 3", total)
		}
		b.checkConsistent(t)
	})

	t.Run("PurgingSurvivesARestartMidWay", func(t *testing.T) {
		t.Parallel()
		b := setup(t, retention(2))
		b.submit(t, "alpha", "r1", "a.pdf", "b.pdf", "c.pdf")
		b.submit(t, "beta", "r2", "d.pdf", "e.pdf")
		b.endAll(t)
		kept := b.submit(t, "beta", "r3", "f.pdf")
		b.clock.Advance(week + time.Second)
		if r := b.purge(t); r.Jobs != 2 || !r.More {
			t.Fatalf("first step = %+v, want 2 jobs and more", r)
		}
		b.restart(t)
		b.checkConsistent(t)
		sum, steps := b.purgeAll(t)
		if sum.Jobs != 3 || sum.Batches != 2 || steps != 2 {
			t.Errorf("after the restart: %+v in %d steps, want the other 3 jobs and both batches in 2", sum, steps)
		}
		b.checkConsistent(t)
		all := b.allJobs(t)
		if len(all) != 1 || all[0].ID != kept.FirstJob {
			t.Errorf("jobs left: %d, want only job %d", len(all), kept.FirstJob)
		}
		b.restart(t)
		b.checkConsistent(t)
		for _, team := range []string{"alpha", "beta"} {
			if _, known := b.e.teamCounts[team]; !known {
				t.Errorf("team %s is forgotten after its jobs were purged; its gauges would vanish", team)
			}
		}
	})

	t.Run("RejectionsAndAuditRecordsHaveTheirOwnRetention", func(t *testing.T) {
		t.Parallel()
		b := setup(t, func(c *Config) {
			c.Retention = Retention{Rejections: 30 * 24 * time.Hour, Audit: 60 * 24 * time.Hour, Step: 10}
			c.Retry.MaxAttempts = 1
		})
		// Day 0: a rejection, a replay (audited, with its request id) and a pause.
		id := b.submit(t, "alpha", "r", "a.pdf").FirstJob
		stale := b.acquire(t, "r-1", 1)[0]
		if _, err := complete(ctx, b.e, failure(id, stale.Job.Lease.Token, "r-1", jobs.ClassTransient, "boom")); err != nil {
			t.Fatal(err)
		}
		if _, err := complete(ctx, b.e, success(id, stale.Job.Lease.Token+1, "r-1", "d")); !jobs.IsFence(err) {
			t.Fatalf("a completion under a token never granted: %v, want a fencing refusal", err)
		}
		replay := ReplayRequest{Principal: "ops", RequestID: "rp-1", Reason: "retry", JobIDs: []uint64{id}, Encode: encodeReplay}
		if res, err := b.e.Replay(ctx, replay); err != nil || res.Requeued != 1 {
			t.Fatalf("Replay = %+v, %v", res, err)
		}
		if _, err := b.e.SetPaused(ctx, true, "ops", "day 0"); err != nil {
			t.Fatal(err)
		}
		// Day 40: another of each.
		b.clock.Advance(40 * 24 * time.Hour)
		again := b.acquire(t, "r-1", 1)
		if len(again) != 0 {
			t.Fatalf("granted %d while paused", len(again))
		}
		if _, err := b.e.SetPaused(ctx, false, "ops", "day 40"); err != nil {
			t.Fatal(err)
		}
		g := b.acquire(t, "r-1", 1)[0]
		if _, err := complete(ctx, b.e, failure(id, g.Job.Lease.Token, "r-1", jobs.ClassTransient, "boom")); err != nil {
			t.Fatal(err)
		}
		if _, err := complete(ctx, b.e, success(id, stale.Job.Lease.Token, "r-1", "d")); !jobs.IsFence(err) {
			t.Fatalf("a stale completion: %v, want a fencing refusal", err)
		}

		if r := b.purge(t); r != (PurgeResult{Rejections: 1}) {
			t.Errorf("purge on day 40 = %+v, want the day-0 rejection only", r)
		}
		if got := b.rejections(t, id); len(got) != 1 || !got[0].At.Equal(b.clock.Now()) {
			t.Errorf("rejections left: %+v, want the day-40 one", got)
		}
		// The replay's request id is remembered while its audit record is.
		if res, err := b.e.Replay(ctx, replay); err != nil || res.Previous == nil {
			t.Errorf("replaying rp-1 again on day 40 = %+v, %v; want the first answer", res, err)
		}

		b.clock.Advance(31 * 24 * time.Hour) // day 71
		if r := b.purge(t); r != (PurgeResult{Rejections: 1, Audit: 2}) {
			t.Errorf("purge on day 71 = %+v, want the day-40 rejection and the two day-0 audit records", r)
		}
		var actions []string
		for _, a := range b.allAudit(t) {
			actions = append(actions, a.Action)
		}
		if want := []string{jobs.AuditResume}; !slices.Equal(actions, want) {
			t.Errorf("audit left: %v, want %v", actions, want)
		}
		res, err := b.e.Replay(ctx, replay)
		if err != nil || res.Previous != nil || res.Requeued != 1 {
			t.Errorf("replaying rp-1 after its audit record went = %+v, %v; want a new replay", res, err)
		}
		if _, err := b.e.Job(id); err != nil {
			t.Errorf("the job went with retention for jobs off: %v", err)
		}
	})

	t.Run("AFileFromBeforeTheFinishedIndexIsIndexedInSteps", func(t *testing.T) {
		t.Parallel()
		b := setup(t, retention(2))
		b.submit(t, "alpha", "r1", "a.pdf", "b.pdf", "c.pdf", "d.pdf", "e.pdf")
		b.endAll(t)
		b.submit(t, "alpha", "r2", "live.pdf")
		// As a release before the index left the file.
		b.close()
		db, err := bbolt.Open(filepath.Join(b.dir, "leasehold.db"), 0o600, &bbolt.Options{Timeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if err := db.Update(func(tx *bbolt.Tx) error { return tx.DeleteBucket([]byte("finished")) }); err != nil {
			t.Fatal(err)
		}
		db.Close()
		b.resetShadow(t)
		b.start(t)
		b.clock.Advance(week + time.Second)
		sum, steps := b.purgeAll(t)
		// The first step indexes all six records (it may read 8 per job of
		// its bound), and each step deletes at most 2 of what is due.
		if sum.Jobs != 5 || sum.Batches != 1 || sum.Indexed != 6 || steps != 3 {
			t.Errorf("purged %+v in %d steps, want the 5 ended jobs and their batch, 6 records indexed, in 3 steps", sum, steps)
		}
		b.checkConsistent(t)
	})

	t.Run("NothingIsPurgedWithoutRetention", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.submit(t, "alpha", "r", "a.pdf")
		b.endAll(t)
		b.clock.Advance(10 * 365 * 24 * time.Hour)
		if r := b.purge(t); r != (PurgeResult{}) {
			t.Errorf("purge without retention = %+v, want nothing", r)
		}
		if diff := cmp.Diff(1, len(b.allJobs(t))); diff != "" {
			t.Errorf("jobs (-want +got):\n%s", diff)
		}
	})
}
