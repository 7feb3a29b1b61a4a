package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	"github.com/leasehold/leasehold/coordinator/internal/reads"
	"github.com/leasehold/leasehold/coordinator/internal/watch"
)

// TestListings checks the paged listings: every page continues where the
// previous one stopped, filters hold, and the last page says so.
func TestListings(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	alphaBatch := b.submit(t, "alpha", "r1", names("a", 5)...)
	alpha := alphaBatch.JobIDs()
	beta := b.submit(t, "beta", "r1", names("b", 3)...).JobIDs()
	gs := b.acquire(t, "r-1", 2) // a1, b1
	for i := range 3 {
		if _, err := complete(ctx, b.e, success(gs[0].Job.ID, gs[0].Job.Lease.Token+uint64(10+i), "r-9", "stale")); !jobs.IsFence(err) {
			t.Fatalf("stale completion %d: %v", i, err)
		}
	}
	if _, err := complete(ctx, b.e, success(gs[1].Job.ID, gs[1].Job.Lease.Token+10, "r-9", "stale")); !jobs.IsFence(err) {
		t.Fatal(err)
	}
	for _, team := range []string{"alpha", "beta", ""} {
		rec := jobs.AuditRecord{Principal: "ops", Action: jobs.AuditDenied, Reason: "team " + team}
		if team != "" {
			rec.Teams = []string{team}
		}
		if err := b.e.RecordAudit(ctx, rec); err != nil {
			t.Fatal(err)
		}
	}

	pagesOf := func(t *testing.T, f reads.JobFilter) [][]uint64 {
		t.Helper()
		var out [][]uint64
		for range 10 {
			page, err := b.e.ListJobs(f)
			if err != nil {
				t.Fatal(err)
			}
			var ids []uint64
			for _, j := range page.Jobs {
				ids = append(ids, j.ID)
			}
			out = append(out, ids)
			if page.Next == 0 {
				return out
			}
			f.After = page.Next
		}
		t.Fatalf("listing %+v did not end", f)
		return nil
	}
	tests := []struct {
		name string
		f    reads.JobFilter
		want [][]uint64
	}{
		{"AllJobsInPages", reads.JobFilter{Limit: 3}, [][]uint64{alpha[:3], {alpha[3], alpha[4], beta[0]}, beta[1:]}},
		{"OneBatch", reads.JobFilter{Batch: alphaBatch.ID, Limit: 2}, [][]uint64{alpha[:2], alpha[2:4], alpha[4:]}},
		{"OneTeam", reads.JobFilter{Teams: []string{"beta"}, Limit: 2}, [][]uint64{beta[:2], beta[2:]}},
		{"ALivePhaseFromTheUnfinishedIndex", reads.JobFilter{Phase: jobs.PhaseLeased, Limit: 5}, [][]uint64{{alpha[0], beta[0]}}},
		{"APhaseAndATeam", reads.JobFilter{Phase: jobs.PhaseQueued, Teams: []string{"alpha"}, Limit: 10}, [][]uint64{alpha[1:]}},
		{"NoTeamsListsNothing", reads.JobFilter{Teams: []string{}, Limit: 10}, [][]uint64{nil}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, pagesOf(t, tt.f)); diff != "" {
				t.Errorf("pages (-want +got):\n%s", diff)
			}
		})
	}

	t.Run("AnUnknownBatchIsNotFound", func(t *testing.T) {
		if _, err := b.e.ListJobs(reads.JobFilter{Batch: 999}); !errors.Is(err, jobs.ErrNotFound) {
			t.Errorf("err = %v, want jobs.ErrNotFound", err)
		}
		if _, err := b.e.Batch(999); !reads.IsNotFound(err) {
			t.Errorf("Batch: err = %v, want not found", err)
		}
	})

	t.Run("RejectionsNewestFirstInPages", func(t *testing.T) {
		var got [][]string
		f := reads.RejectionFilter{Job: gs[0].Job.ID, Limit: 2}
		for range 5 {
			page, err := b.e.ListRejections(f)
			if err != nil {
				t.Fatal(err)
			}
			var p []string
			for _, r := range page.Rejections {
				p = append(p, fmt.Sprintf("%d/%d", r.Job, r.Token))
			}
			got = append(got, p)
			if page.Next == 0 {
				break
			}
			f.Before = page.Next
		}
		tok := gs[0].Job.Lease.Token
		id := gs[0].Job.ID
		want := [][]string{{fmt.Sprintf("%d/%d", id, tok+12), fmt.Sprintf("%d/%d", id, tok+11)}, {fmt.Sprintf("%d/%d", id, tok+10)}}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("pages (-want +got):\n%s", diff)
		}
		scoped, err := b.e.ListRejections(reads.RejectionFilter{Teams: []string{"beta"}})
		if err != nil || len(scoped.Rejections) != 1 || scoped.Rejections[0].Job != gs[1].Job.ID {
			t.Errorf("beta's rejections = %+v, %v; want the one of job %d", scoped.Rejections, err, gs[1].Job.ID)
		}
	})

	t.Run("AuditShowsOnlyWhatTheCallerMaySee", func(t *testing.T) {
		visible := func(teams []string) bool { return len(teams) > 0 && !slices.Contains(teams, "beta") }
		page, err := b.e.ListAudit(reads.AuditFilter{Visible: visible})
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, a := range page.Records {
			got = append(got, a.Reason)
		}
		if diff := cmp.Diff([]string{"team alpha"}, got); diff != "" || page.Next != 0 {
			t.Errorf("visible audit (-want +got):\n%s\nnext %d", diff, page.Next)
		}
		first, err := b.e.ListAudit(reads.AuditFilter{Limit: 2})
		if err != nil || len(first.Records) != 2 || first.Next == 0 {
			t.Fatalf("first audit page = %+v, %v; want 2 and a cursor", first, err)
		}
		rest, err := b.e.ListAudit(reads.AuditFilter{Limit: 2, Before: first.Next})
		if err != nil || len(rest.Records) != 1 || rest.Records[0].Reason != "team alpha" || rest.Next != 0 {
			t.Errorf("second audit page = %+v, %v; want the oldest record and the end", rest, err)
		}
	})
}

// TestWatch checks that a watch delivers committed events in commit order,
// every pending one at once, and ends when the engine stops.
func TestWatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("NextReturnsEveryPendingEventInCommitOrder", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		batch := b.submit(t, "alpha", "r1", "a.pdf", "b.pdf")
		w, err := b.e.WatchBatch(batch.ID)
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		b.submit(t, "beta", "r1", "c.pdf")
		gs := b.acquire(t, "r-1", 3)
		if _, err := complete(ctx, b.e, success(gs[0].Job.ID, gs[0].Job.Lease.Token, "r-1", "d")); err != nil {
			t.Fatal(err)
		}
		evs, err := w.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		type seen struct {
			Job   uint64
			Kind  jobs.EventKind
			Phase jobs.Phase
		}
		var got []seen
		for _, ev := range evs {
			if ev.Batch != batch.ID {
				t.Errorf("event of batch %d on a watch of batch %d", ev.Batch, batch.ID)
			}
			got = append(got, seen{ev.Job, ev.Event.Kind, ev.Event.Phase})
		}
		ids := batch.JobIDs()
		want := []seen{{ids[0], jobs.EventLeased, jobs.PhaseLeased}, {ids[1], jobs.EventLeased, jobs.PhaseLeased},
			{ids[0], jobs.EventSucceeded, jobs.PhaseSucceeded}}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("events (-want +got):\n%s", diff)
		}
		b.close()
		if evs, err := w.Next(ctx); !errors.Is(err, ErrStopped) || len(evs) != 0 {
			t.Errorf("Next after Stop = %d events, %v; want ErrStopped", len(evs), err)
		}
	})

	t.Run("AWatcherTooFarBehindIsEnded", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		batch := b.submit(t, "alpha", "r1", names("a", jobs.DefaultMaxDocuments)...)
		w, err := b.e.WatchBatch(batch.ID)
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		// Each round adds two events per job: LEASED, then REQUEUED.
		for events := 0; events <= watch.WatchLimit; events += 2 * jobs.DefaultMaxDocuments {
			gs := b.acquire(t, "r-1", jobs.DefaultMaxDocuments)
			if err := release(ctx, b.e, "r-1", refs(gs)); err != nil {
				t.Fatal(err)
			}
		}
		if evs, err := w.Next(ctx); !errors.Is(err, watch.ErrSlowWatcher) || len(evs) != 0 {
			t.Errorf("Next of a watcher %d events behind = %d events, %v; want watch.ErrSlowWatcher", watch.WatchLimit, len(evs), err)
		}
		if _, err := b.e.WatchBatch(999); !errors.Is(err, jobs.ErrNotFound) {
			t.Errorf("watching an unknown batch: err = %v, want jobs.ErrNotFound", err)
		}
	})
}
