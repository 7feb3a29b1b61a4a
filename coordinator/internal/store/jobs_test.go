package store_test

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	"github.com/leasehold/leasehold/coordinator/internal/store"
)

// fullJob is a job record with every field set, so that a round trip
// through the codec shows any field it drops.
func fullJob(id, batch uint64, team string) jobs.Job {
	return jobs.Job{
		ID: id, BatchID: batch, Team: team,
		Doc:    jobs.Document{Name: "a.pdf", ContentType: "application/pdf", SizeBytes: 1234, SourceURI: "s3://bucket/a.pdf", ContentSHA256: "abc123"},
		Policy: jobs.RetryPolicy{MaxAttempts: 5, BackoffBase: time.Second, BackoffCap: time.Minute},
		Phase:  jobs.PhaseCancelled, Attempt: 2, Cycle: 3,
		Lease:           jobs.Lease{Token: 41, Renderer: "r-1", GrantedAt: t0, Deadline: t0.Add(15 * time.Second)},
		NextAttemptAt:   t0.Add(time.Minute),
		TerminalReason:  jobs.ReasonCancelled,
		TerminalMessage: "wrong file",
		FinishedAt:      t0.Add(2 * time.Minute),
		Artifact:        jobs.Artifact{Digest: "d", Size: 99, ContentType: "image/png", Token: 40, Renderer: "r-0", Stored: true},
		Cancellation: jobs.Cancellation{Principal: "alice", At: t0.Add(3 * time.Minute), Reason: "wrong file", FromPhase: jobs.PhaseLeased,
			Renderer: "r-1", Token: 41, AckedAt: t0.Add(4 * time.Minute)},
		Leases: []jobs.LeaseRecord{
			{Token: 39, Renderer: "r-0", Kind: jobs.LeaseExpired},
			{Token: 40, Renderer: "r-0", Kind: jobs.LeaseCompleted, Outcome: "success:d"},
			{Token: 41, Renderer: "r-1", Kind: jobs.LeaseRevoked},
		},
		LastCause: "renderer crashed",
		CreatedAt: t0, UpdatedAt: t0.Add(5 * time.Minute), EnqueuedAt: t0.Add(6 * time.Minute),
		ContentBytes:        8,
		EventSeq:            2,
		RejectedCompletions: 7,
		Rejected:            []jobs.RejectionKey{{Token: 12, Reason: "STALE_LEASE", Renderer: "r-9"}, {Token: 41, Reason: "JOB_CANCELLED", Renderer: "r-1"}},
		CancelRejected:      true,
		Undelivered:         1,
		HandedBack:          2,
		TraceParent:         "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
	}
}

// fullEvents is a history with every event field set.
func fullEvents() []jobs.Event {
	return []jobs.Event{
		{Seq: 1, At: t0, Kind: jobs.EventSubmitted, Phase: jobs.PhaseQueued},
		{Seq: 2, At: t0.Add(time.Second), Kind: jobs.EventCancelled, Phase: jobs.PhaseLeased, Token: 41, Renderer: "r-1",
			Attempt: 2, Reason: "FROM_LEASED", Message: "wrong file", Principal: "alice"},
	}
}

// checkAllSet fails for every field of v that holds its zero value, apart
// from those named in except, so that a field added to a record without a
// test of its encoding is noticed.
func checkAllSet(t *testing.T, v reflect.Value, path string, except ...string) {
	t.Helper()
	for _, e := range except {
		if path == e {
			return
		}
	}
	switch v.Kind() {
	case reflect.Struct:
		if v.Type() == reflect.TypeFor[time.Time]() {
			break
		}
		for i := range v.NumField() {
			checkAllSet(t, v.Field(i), path+"."+v.Type().Field(i).Name, except...)
		}
		return
	case reflect.Slice:
		for i := range v.Len() {
			checkAllSet(t, v.Index(i), path, except...)
		}
	}
	if v.IsZero() {
		t.Errorf("%s is not set: the round trip does not test it", path)
	}
}

func TestJobRoundTrip(t *testing.T) {
	t.Parallel()

	t.Run("Every field of the record survives the codec", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		want := fullJob(3, 1, "alpha")
		// LeaseLive is the zero kind: it is a value worth storing too.
		want.Leases = append(want.Leases, jobs.LeaseRecord{Token: 42, Renderer: "r-2"})
		checkAllSet(t, reflect.ValueOf(want), "Job", "Job.Events", "Job.History", "Job.Leases.Kind", "Job.Leases.Outcome")
		b.update(t, func(tx *store.Tx) error { return tx.PutJob(want) })
		b.view(t, func(tx *store.Tx) error {
			got, found, err := tx.Job(want.ID)
			if err != nil || !found {
				t.Fatalf("Job(%d) = found %v, %v; want the record", want.ID, found, err)
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("job read back (-want +got):\n%s", diff)
			}
			if _, found, err := tx.Job(99); found || err != nil {
				t.Errorf("Job(99) = found %v, %v; want absent", found, err)
			}
			return nil
		})
	})

	t.Run("What PutJobAsRead returns is what Job reads back", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		j := fullJob(3, 1, "alpha")
		j.Events = fullEvents()
		// A clock reading carries a monotonic reading and a location, which
		// the record keeps neither of.
		now := time.Now().In(time.FixedZone("east", 3600))
		j.CreatedAt, j.Lease.GrantedAt, j.Lease.Deadline = now, now, now.Add(15*time.Second)
		var put jobs.Job
		b.update(t, func(tx *store.Tx) error {
			var err error
			put, err = tx.PutJobAsRead(j)
			return err
		})
		b.view(t, func(tx *store.Tx) error {
			got, _, err := tx.Job(j.ID)
			if err != nil {
				t.Fatal(err)
			}
			// reflect, not cmp: cmp compares times with Equal, which
			// ignores the monotonic reading and the location.
			if !reflect.DeepEqual(put, got) {
				t.Errorf("PutJobAsRead returned %+v\nJob reads %+v", put, got)
			}
			return nil
		})
	})

	t.Run("The record never carries the history", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		j := fullJob(3, 1, "alpha")
		j.Events = fullEvents()
		b.update(t, func(tx *store.Tx) error { return tx.PutJob(j) })
		b.view(t, func(tx *store.Tx) error {
			got, _, err := tx.Job(j.ID)
			if err != nil {
				t.Fatal(err)
			}
			if got.Events != nil {
				t.Errorf("Job(%d).Events = %v, want nil: events are written with PutEvents", j.ID, got.Events)
			}
			if evs, err := tx.Events(j.ID, 0); err != nil || evs != nil {
				t.Errorf("Events(%d, 0) = %v, %v; want none", j.ID, evs, err)
			}
			return nil
		})
	})

	t.Run("A zero record reads back as zero", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.update(t, func(tx *store.Tx) error { return tx.PutJob(jobs.Job{ID: 7}) })
		b.view(t, func(tx *store.Tx) error {
			got, found, err := tx.Job(7)
			if err != nil || !found {
				t.Fatalf("Job(7) = found %v, %v", found, err)
			}
			if diff := cmp.Diff(jobs.Job{ID: 7}, got); diff != "" {
				t.Errorf("zero job read back (-want +got):\n%s", diff)
			}
			return nil
		})
	})
}

func TestForEachJob(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.update(t, func(tx *store.Tx) error {
		for _, id := range []uint64{5, 1, 300, 2} {
			if err := tx.PutJob(jobs.Job{ID: id, Team: "alpha"}); err != nil {
				return err
			}
		}
		return nil
	})
	for _, tc := range []struct {
		after uint64
		limit int
		want  []uint64
	}{
		{0, 10, []uint64{1, 2, 5, 300}},
		{1, 10, []uint64{2, 5, 300}},
		{2, 2, []uint64{5, 300}},
		{5, 1, []uint64{300}},
		{300, 10, nil},
	} {
		var got, gotIDs []uint64
		b.view(t, func(tx *store.Tx) error {
			if err := tx.ForEachJob(tc.after, func(j jobs.Job) (bool, error) {
				got = append(got, j.ID)
				return len(got) < tc.limit, nil
			}); err != nil {
				return err
			}
			return tx.ForEachJobID(tc.after, func(id uint64) bool {
				gotIDs = append(gotIDs, id)
				return len(gotIDs) < tc.limit
			})
		})
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("ForEachJob after %d limit %d (-want +got):\n%s", tc.after, tc.limit, diff)
		}
		if diff := cmp.Diff(tc.want, gotIDs); diff != "" {
			t.Errorf("ForEachJobID after %d limit %d (-want +got):\n%s", tc.after, tc.limit, diff)
		}
	}
}

func TestEvents(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ev := func(seq uint32) jobs.Event {
		return jobs.Event{Seq: seq, At: t0.Add(time.Duration(seq) * time.Second), Kind: jobs.EventRequeued, Phase: jobs.PhaseQueued}
	}
	// Seqs past 255 show that keys order numerically, and job 256 that one
	// job's events never leak into another's.
	b.update(t, func(tx *store.Tx) error {
		for _, w := range []struct {
			job uint64
			evs []jobs.Event
		}{
			{1, fullEvents()},
			{1, []jobs.Event{ev(256), ev(3)}},
			{2, []jobs.Event{ev(1)}},
			{256, []jobs.Event{ev(1), ev(2)}},
		} {
			if err := tx.PutEvents(w.job, w.evs); err != nil {
				return err
			}
		}
		return tx.PutJob(jobs.Job{ID: 1, EventSeq: 256})
	})
	want1 := append(fullEvents(), ev(3), ev(256))
	for _, tc := range []struct {
		name       string
		job, after uint64
		want       []jobs.Event
	}{
		{"All of a job's events, in seq order", 1, 0, want1},
		{"The events after a seq", 1, 2, want1[2:]},
		{"The events after a seq that has none next to it", 1, 3, want1[3:]},
		{"Nothing after the last seq", 1, 256, nil},
		{"Nothing after a seq past the uint32 range", 1, 1 << 40, nil},
		{"Another job's events only", 2, 0, []jobs.Event{ev(1)}},
		{"A job whose id shares a byte with another", 256, 1, []jobs.Event{ev(2)}},
		{"No events for an unknown job", 3, 0, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b.view(t, func(tx *store.Tx) error {
				got, err := tx.Events(tc.job, tc.after)
				if err != nil {
					t.Fatalf("Events(%d, %d): %v", tc.job, tc.after, err)
				}
				if diff := cmp.Diff(tc.want, got); diff != "" {
					t.Errorf("Events(%d, %d) (-want +got):\n%s", tc.job, tc.after, diff)
				}
				return nil
			})
		})
	}
	t.Run("JobWithHistory reads the record and every event", func(t *testing.T) {
		b.view(t, func(tx *store.Tx) error {
			got, found, err := tx.JobWithHistory(1)
			if err != nil || !found {
				t.Fatalf("JobWithHistory(1) = found %v, %v", found, err)
			}
			if diff := cmp.Diff(jobs.Job{ID: 1, EventSeq: 256, History: want1}, got); diff != "" {
				t.Errorf("JobWithHistory(1) (-want +got):\n%s", diff)
			}
			if _, found, err := tx.JobWithHistory(2); found || err != nil {
				t.Errorf("JobWithHistory(2) = found %v, %v; want absent: there are events but no record", found, err)
			}
			return nil
		})
	})
}

func TestDocuments(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.update(t, func(tx *store.Tx) error {
		if err := tx.PutDocument(1, []byte("%PDF-1.7 one")); err != nil {
			return err
		}
		return tx.PutDocument(2, []byte("%PDF-1.7 two"))
	})
	var kept []byte
	b.view(t, func(tx *store.Tx) error {
		kept = tx.Document(1)
		if got := tx.Document(3); got != nil {
			t.Errorf("Document(3) = %q, want nil", got)
		}
		return nil
	})
	b.update(t, func(tx *store.Tx) error {
		if err := tx.DeleteDocument(1); err != nil {
			return err
		}
		if err := tx.DeleteDocument(3); err != nil {
			t.Errorf("DeleteDocument of a job without content: %v", err)
		}
		return nil
	})
	if string(kept) != "%PDF-1.7 one" {
		t.Errorf("Document(1) read before its deletion = %q, want the content (a copy)", kept)
	}
	b.view(t, func(tx *store.Tx) error {
		if got := tx.Document(1); got != nil {
			t.Errorf("Document(1) after DeleteDocument = %q, want nil", got)
		}
		if got := string(tx.Document(2)); got != "%PDF-1.7 two" {
			t.Errorf("Document(2) = %q, want it untouched", got)
		}
		return nil
	})
	b.update(t, func(tx *store.Tx) error {
		if err := tx.DeleteDocument(1); err != nil {
			return err
		}
		if tx.Dirty() {
			t.Error("Dirty after deleting a document that is not there, want clean")
		}
		return nil
	})
}

func TestUnfinishedIndex(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.update(t, func(tx *store.Tx) error {
		for _, id := range []uint64{300, 1, 2, 3, 256} {
			j := jobs.Job{ID: id, Phase: jobs.PhaseQueued, Team: []string{"alpha", "beta"}[id%2],
				EnqueuedAt: time.Unix(1700000000, int64(id)).UTC()}
			if id == 256 {
				j.Phase, j.Lease = jobs.PhaseLeased, jobs.Lease{Token: 7, Renderer: "r1"}
			}
			if id == 3 {
				j.EnqueuedAt = time.Time{}
			}
			if err := tx.PutJob(j); err != nil {
				return err
			}
			if err := tx.SetUnfinished(id, true); err != nil {
				return err
			}
		}
		if err := tx.SetUnfinished(2, false); err != nil {
			return err
		}
		// Removing a job that is not in the index is not an error.
		return tx.SetUnfinished(99, false)
	})
	want := []uint64{1, 3, 256, 300}
	b.view(t, func(tx *store.Tx) error {
		// QUEUED jobs come as what their ready queue needs, read without
		// decoding the record; the others whole.
		var got []uint64
		var queued []store.QueuedJob
		var others []jobs.Job
		if err := tx.ForEachUnfinished(func(q store.QueuedJob) error {
			got = append(got, q.ID)
			queued = append(queued, q)
			return nil
		}, func(j jobs.Job) error {
			got = append(got, j.ID)
			others = append(others, j)
			return nil
		}); err != nil {
			t.Fatalf("ForEachUnfinished: %v", err)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("ForEachUnfinished (-want +got):\n%s", diff)
		}
		wantQueued := []store.QueuedJob{
			{ID: 1, Team: "beta", EnqueuedAt: time.Unix(1700000000, 1).UnixNano()},
			{ID: 3, Team: "beta"},
			{ID: 300, Team: "alpha", EnqueuedAt: time.Unix(1700000000, 300).UnixNano()},
		}
		if diff := cmp.Diff(wantQueued, queued); diff != "" {
			t.Errorf("QUEUED jobs (-want +got):\n%s", diff)
		}
		if len(others) != 1 || others[0].ID != 256 || others[0].Phase != jobs.PhaseLeased || others[0].Lease.Token != 7 {
			t.Errorf("other unfinished jobs = %+v, want job 256 LEASED under token 7", others)
		}
		for _, tc := range []struct {
			after uint64
			limit int
			want  []uint64
		}{
			{0, 10, want},
			{0, 2, []uint64{1, 3}},
			{3, 10, []uint64{256, 300}},
			{256, 1, []uint64{300}},
			{300, 10, nil},
		} {
			if diff := cmp.Diff(tc.want, tx.UnfinishedAfter(tc.after, tc.limit)); diff != "" {
				t.Errorf("UnfinishedAfter(%d, %d) (-want +got):\n%s", tc.after, tc.limit, diff)
			}
		}
		return nil
	})

	t.Run("Long runs of finished jobs are stepped over or sought past", func(t *testing.T) {
		c := setup(t)
		var want []uint64
		c.update(t, func(tx *store.Tx) error {
			for id := uint64(1); id <= 100; id++ {
				j := jobs.Job{ID: id, Phase: jobs.PhaseSucceeded, Team: "alpha"}
				// Unfinished: 1, then after runs of 3 and of 40 finished jobs.
				if id == 1 || id == 5 || id == 46 || id == 47 || id == 100 {
					j.Phase = jobs.PhaseQueued
					want = append(want, id)
					if err := tx.SetUnfinished(id, true); err != nil {
						return err
					}
				}
				if err := tx.PutJob(j); err != nil {
					return err
				}
			}
			return nil
		})
		c.view(t, func(tx *store.Tx) error {
			var got []uint64
			err := tx.ForEachUnfinished(func(q store.QueuedJob) error {
				got = append(got, q.ID)
				return nil
			}, func(j jobs.Job) error { return fmt.Errorf("job %d is %s, want QUEUED", j.ID, j.Phase) })
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("ForEachUnfinished (-want +got):\n%s", diff)
			}
			return nil
		})
	})

	t.Run("An indexed job without a record is reported", func(t *testing.T) {
		b.update(t, func(tx *store.Tx) error { return tx.SetUnfinished(500, true) })
		err := b.st.View(func(tx *store.Tx) error {
			return tx.ForEachUnfinished(func(store.QueuedJob) error { return nil }, func(jobs.Job) error { return nil })
		})
		if err == nil || !strings.Contains(err.Error(), "500") {
			t.Errorf("ForEachUnfinished with a dangling entry: err = %v, want one naming job 500", err)
		}
	})
}

func TestTeamIndexes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// "a" is a prefix of "ab", and "" of everything.
	teamJobs := map[string][]uint64{"a": {1, 4, 256, 300}, "ab": {2, 5}, "b": {3}, "": {6}}
	teamBatches := map[string][]uint64{"a": {1, 3, 256}, "ab": {2, 4}, "b": {5}}
	b.update(t, func(tx *store.Tx) error {
		for team, ids := range teamJobs {
			for _, id := range ids {
				if err := tx.IndexTeamJob(team, id); err != nil {
					return err
				}
			}
		}
		for team, ids := range teamBatches {
			for _, id := range ids {
				if err := tx.PutBatch(jobs.Batch{ID: id, Team: team, RequestID: "req-" + team + string(rune('0'+id%10))}); err != nil {
					return err
				}
			}
		}
		return nil
	})

	t.Run("Jobs by team, in id order, paged by after", func(t *testing.T) {
		for _, tc := range []struct {
			team  string
			after uint64
			limit int
			want  []uint64
		}{
			{"a", 0, 10, []uint64{1, 4, 256, 300}},
			{"a", 0, 2, []uint64{1, 4}},
			{"a", 4, 10, []uint64{256, 300}},
			{"a", 256, 1, []uint64{300}},
			{"a", 300, 10, nil},
			{"ab", 0, 10, []uint64{2, 5}},
			{"ab", 2, 10, []uint64{5}},
			{"b", 0, 10, []uint64{3}},
			{"", 0, 10, []uint64{6}},
			{"abc", 0, 10, nil},
			{"zz", 0, 10, nil},
		} {
			b.view(t, func(tx *store.Tx) error {
				if diff := cmp.Diff(tc.want, tx.TeamJobsAfter(tc.team, tc.after, tc.limit)); diff != "" {
					t.Errorf("TeamJobsAfter(%q, %d, %d) (-want +got):\n%s", tc.team, tc.after, tc.limit, diff)
				}
				return nil
			})
		}
	})

	t.Run("Batches by team, newest first, paged by before", func(t *testing.T) {
		for _, tc := range []struct {
			team   string
			before uint64
			limit  int
			want   []uint64
		}{
			{"a", 0, 10, []uint64{256, 3, 1}},
			{"a", 0, 2, []uint64{256, 3}},
			{"a", 256, 10, []uint64{3, 1}},
			{"a", 3, 10, []uint64{1}},
			{"a", 2, 10, []uint64{1}},
			{"a", 1, 10, nil},
			{"a", 1000, 10, []uint64{256, 3, 1}},
			{"ab", 0, 10, []uint64{4, 2}},
			{"ab", 4, 1, []uint64{2}},
			{"ab", 3, 10, []uint64{2}},
			{"b", 0, 10, []uint64{5}},
			{"", 0, 10, nil},
			{"aa", 0, 10, nil},
			{"abc", 0, 10, nil},
			{"zz", 0, 10, nil},
		} {
			b.view(t, func(tx *store.Tx) error {
				if diff := cmp.Diff(tc.want, tx.TeamBatchesBefore(tc.team, tc.before, tc.limit)); diff != "" {
					t.Errorf("TeamBatchesBefore(%q, %d, %d) (-want +got):\n%s", tc.team, tc.before, tc.limit, diff)
				}
				return nil
			})
		}
	})

	t.Run("Batches of every team, newest first, paged by before", func(t *testing.T) {
		for _, tc := range []struct {
			before uint64
			limit  int
			want   []uint64
		}{
			{0, 10, []uint64{256, 5, 4, 3, 2, 1}},
			{0, 2, []uint64{256, 5}},
			{256, 3, []uint64{5, 4, 3}},
			{100, 10, []uint64{5, 4, 3, 2, 1}},
			{1000, 1, []uint64{256}},
			{2, 10, []uint64{1}},
			{1, 10, nil},
		} {
			b.view(t, func(tx *store.Tx) error {
				if diff := cmp.Diff(tc.want, tx.BatchesBefore(tc.before, tc.limit)); diff != "" {
					t.Errorf("BatchesBefore(%d, %d) (-want +got):\n%s", tc.before, tc.limit, diff)
				}
				return nil
			})
		}
	})
}

func TestJobStatesReadsPhaseAndEventSeqOnly(t *testing.T) {
	t.Parallel()
	b := setup(t)
	full := fullJob(7, 1, "alpha")
	other := jobs.Job{ID: 9, BatchID: 1, Team: "alpha", Phase: jobs.PhaseQueued}
	b.update(t, func(tx *store.Tx) error {
		if err := tx.PutJob(full); err != nil {
			return err
		}
		return tx.PutJob(other)
	})
	b.view(t, func(tx *store.Tx) error {
		got, err := tx.JobStates(6, 5)
		if err != nil {
			return err
		}
		want := []jobs.State{{ID: 7, Phase: full.Phase, EventSeq: full.EventSeq}, {ID: 9, Phase: jobs.PhaseQueued}}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("JobStates (-want +got):\n%s", diff)
		}
		return nil
	})
}
