package store_test

import (
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	"github.com/leasehold/leasehold/coordinator/internal/store"
)

func TestBatches(t *testing.T) {
	t.Parallel()
	b := setup(t)
	batch := jobs.Batch{ID: 1, Team: "alpha", RequestID: "req-1", CreatedAt: t0, FirstJob: 1, Count: 5,
		Policy: jobs.RetryPolicy{MaxAttempts: 5, BackoffBase: time.Second, BackoffCap: time.Minute}, RequestHash: []byte{1, 2, 3}, Purged: 2}
	checkAllSet(t, reflect.ValueOf(batch), "Batch")
	b.update(t, func(tx *store.Tx) error { return tx.PutBatch(batch) })
	b.view(t, func(tx *store.Tx) error {
		got, found, err := tx.Batch(1)
		if err != nil || !found {
			t.Fatalf("Batch(1) = found %v, %v", found, err)
		}
		if diff := cmp.Diff(batch, got); diff != "" {
			t.Errorf("batch read back (-want +got):\n%s", diff)
		}
		if _, found, err := tx.Batch(2); found || err != nil {
			t.Errorf("Batch(2) = found %v, %v; want absent", found, err)
		}
		byReq, found, err := tx.BatchByRequest("alpha", "req-1")
		if err != nil || !found || byReq.ID != 1 {
			t.Errorf("BatchByRequest(alpha, req-1) = %d found %v, %v; want batch 1", byReq.ID, found, err)
		}
		if _, found, _ := tx.BatchByRequest("beta", "req-1"); found {
			t.Error("BatchByRequest(beta, req-1) found alpha's batch; request ids are per team")
		}
		return nil
	})
}

func TestCounts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var submit, grant, succeed jobs.Counts
	submit[jobs.PhaseQueued] = 3
	grant[jobs.PhaseQueued], grant[jobs.PhaseLeased] = -1, 1
	succeed[jobs.PhaseLeased], succeed[jobs.PhaseSucceeded] = -1, 1
	b.update(t, func(tx *store.Tx) error {
		for _, d := range []jobs.Counts{submit, grant, grant, succeed} {
			if err := tx.AddBatchCounts(1, d); err != nil {
				return err
			}
			if err := tx.AddTeamCounts("a", d); err != nil {
				return err
			}
		}
		if err := tx.AddBatchCounts(2, submit); err != nil {
			return err
		}
		return tx.AddTeamCounts("ab", submit)
	})
	var want1, want2 jobs.Counts
	want1[jobs.PhaseQueued], want1[jobs.PhaseLeased], want1[jobs.PhaseSucceeded] = 1, 1, 1
	want2[jobs.PhaseQueued] = 3

	check := func(t *testing.T) {
		t.Helper()
		b.view(t, func(tx *store.Tx) error {
			for _, tc := range []struct {
				batch uint64
				want  jobs.Counts
			}{{1, want1}, {2, want2}, {3, jobs.Counts{}}} {
				got, err := tx.BatchCounts(tc.batch)
				if err != nil {
					t.Fatal(err)
				}
				if diff := cmp.Diff(tc.want, got); diff != "" {
					t.Errorf("BatchCounts(%d) (-want +got):\n%s", tc.batch, diff)
				}
			}
			for _, tc := range []struct {
				team string
				want jobs.Counts
			}{{"a", want1}, {"ab", want2}, {"b", jobs.Counts{}}} {
				got, err := tx.TeamCounts(tc.team)
				if err != nil {
					t.Fatal(err)
				}
				if diff := cmp.Diff(tc.want, got); diff != "" {
					t.Errorf("TeamCounts(%q) (-want +got):\n%s", tc.team, diff)
				}
			}
			all := map[string]jobs.Counts{}
			if err := tx.ForEachTeamCounts(func(team string, c jobs.Counts) error {
				all[team] = c
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(map[string]jobs.Counts{"a": want1, "ab": want2}, all); diff != "" {
				t.Errorf("ForEachTeamCounts (-want +got):\n%s", diff)
			}
			return nil
		})
	}

	t.Run("Deltas add up per batch and per team", check)
	t.Run("Counts survive a reopen", func(t *testing.T) {
		b.reopen(t)
		check(t)
	})
	t.Run("Total and Unfinished sum the phases", func(t *testing.T) {
		var c jobs.Counts
		c[jobs.PhaseQueued], c[jobs.PhaseLeased], c[jobs.PhaseRetryWait] = 1, 2, 3
		c[jobs.PhaseSucceeded], c[jobs.PhaseFailed], c[jobs.PhaseCancelled] = 10, 20, 30
		if got := c.Total(); got != 66 {
			t.Errorf("Total = %d, want 66", got)
		}
		if got := c.Unfinished(); got != 6 {
			t.Errorf("Unfinished = %d, want 6", got)
		}
	})
	t.Run("A count never goes below zero", func(t *testing.T) {
		var d jobs.Counts
		d[jobs.PhaseFailed] = -2
		b.update(t, func(tx *store.Tx) error { return tx.AddBatchCounts(2, d) })
		b.view(t, func(tx *store.Tx) error {
			got, err := tx.BatchCounts(2)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(want2, got); diff != "" {
				t.Errorf("BatchCounts(2) after a negative delta on an empty phase (-want +got):\n%s", diff)
			}
			return nil
		})
	})
}

func TestSequences(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.view(t, func(tx *store.Tx) error {
		if got := tx.LastToken(); got != 0 {
			t.Errorf("LastToken of a new file = %d, want 0", got)
		}
		return nil
	})
	b.update(t, func(tx *store.Tx) error {
		for want := uint64(1); want <= 3; want++ {
			if got, err := tx.NextToken(); err != nil || got != want {
				t.Errorf("NextToken = %d, %v; want %d", got, err, want)
			}
		}
		if !tx.Dirty() {
			t.Error("Dirty = false after NextToken, want true: the counter is a write")
		}
		if got, err := tx.NextJobIDs(5); err != nil || got != 1 {
			t.Errorf("NextJobIDs(5) = %d, %v; want 1", got, err)
		}
		if got, err := tx.NextJobIDs(2); err != nil || got != 6 {
			t.Errorf("NextJobIDs(2) = %d, %v; want 6", got, err)
		}
		if got, err := tx.NextBatchID(); err != nil || got != 1 {
			t.Errorf("NextBatchID = %d, %v; want 1", got, err)
		}
		return nil
	})
	b.reopen(t)
	b.update(t, func(tx *store.Tx) error {
		if got := tx.LastToken(); got != 3 {
			t.Errorf("LastToken after reopen = %d, want 3", got)
		}
		if got, err := tx.NextToken(); err != nil || got != 4 {
			t.Errorf("NextToken after reopen = %d, %v; want 4", got, err)
		}
		if got, err := tx.NextJobIDs(1); err != nil || got != 8 {
			t.Errorf("NextJobIDs after reopen = %d, %v; want 8", got, err)
		}
		if got, err := tx.NextBatchID(); err != nil || got != 2 {
			t.Errorf("NextBatchID after reopen = %d, %v; want 2", got, err)
		}
		return nil
	})
	// A transaction that fails hands out nothing for good.
	err := b.st.Update(func(tx *store.Tx) error {
		if _, err := tx.NextToken(); err != nil {
			return err
		}
		return store.ErrInjected
	})
	if !errors.Is(err, store.ErrInjected) {
		t.Fatalf("Update = %v, want ErrInjected", err)
	}
	b.view(t, func(tx *store.Tx) error {
		if got := tx.LastToken(); got != 4 {
			t.Errorf("LastToken after a failed transaction = %d, want 4", got)
		}
		return nil
	})
}

func TestDispatchState(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.view(t, func(tx *store.Tx) error {
		got, err := tx.DispatchState()
		if err != nil || got != (jobs.DispatchState{}) {
			t.Errorf("DispatchState of a new file = %+v, %v; want running", got, err)
		}
		return nil
	})
	paused := jobs.DispatchState{Paused: true, Since: t0, Principal: "ops", Reason: "rollout"}
	checkAllSet(t, reflect.ValueOf(paused), "DispatchState")
	for _, want := range []jobs.DispatchState{paused, {Since: t0.Add(time.Hour), Principal: "ops", Reason: "done"}} {
		b.update(t, func(tx *store.Tx) error { return tx.PutDispatchState(want) })
		b.reopen(t)
		b.view(t, func(tx *store.Tx) error {
			got, err := tx.DispatchState()
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("DispatchState after reopen (-want +got):\n%s", diff)
			}
			return nil
		})
	}
}

func fullRejection(job, token uint64, at time.Time) jobs.Rejection {
	return jobs.Rejection{Job: job, Team: "alpha", Token: token, Renderer: "r-1", Reason: "STALE_LEASE",
		At: at, CurrentToken: 41, CurrentPhase: jobs.PhaseLeased, Outcome: "success:d", Digest: "d"}
}

func TestRejectionsAndAudit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var rejections []jobs.Rejection
	var audit []jobs.AuditRecord
	b.update(t, func(tx *store.Tx) error {
		for i := range 3 {
			r, err := tx.PutRejection(fullRejection(3, uint64(10+i), t0.Add(time.Duration(i)*time.Second)))
			if err != nil {
				return err
			}
			if r.ID != uint64(i+1) {
				t.Errorf("rejection %d got id %d, want %d", i, r.ID, i+1)
			}
			rejections = append(rejections, r)
		}
		for i, a := range []jobs.AuditRecord{
			{At: t0, Principal: "ops", Action: jobs.AuditPause, Reason: "rollout"},
			{At: t0.Add(time.Second), Principal: "ops", Action: jobs.AuditReplay, Reason: "fixed", RequestID: "replay-1", JobIDs: []uint64{3, 4},
				IncludePermanent: true, Skipped: 1, OutOfScope: 2, Batch: 1, TerminalReason: jobs.ReasonAttemptsExhausted,
				Teams: []string{"a", "ab"}, Response: []byte("answer"), Target: "n3 at 10.0.0.3:7201"},
			{At: t0.Add(2 * time.Second), Principal: "ops", Action: jobs.AuditResume, Reason: "done"},
		} {
			r, err := tx.PutAudit(a)
			if err != nil {
				return err
			}
			if r.ID != uint64(i+1) {
				t.Errorf("audit %d got id %d, want %d", i, r.ID, i+1)
			}
			audit = append(audit, r)
		}
		return nil
	})
	checkAllSet(t, reflect.ValueOf(rejections[0]), "Rejection")
	checkAllSet(t, reflect.ValueOf(audit[1]), "AuditRecord")
	b.reopen(t)

	t.Run("Listings are newest first and paged by before", func(t *testing.T) {
		for _, tc := range []struct {
			before uint64
			limit  int
			want   []uint64
		}{
			{0, 10, []uint64{3, 2, 1}},
			{0, 2, []uint64{3, 2}},
			{3, 10, []uint64{2, 1}},
			{2, 1, []uint64{1}},
			{1, 10, nil},
			{100, 10, []uint64{3, 2, 1}},
		} {
			var gotRej []jobs.Rejection
			var gotAudit []jobs.AuditRecord
			b.view(t, func(tx *store.Tx) error {
				if err := tx.ForEachRejection(tc.before, func(r jobs.Rejection) (bool, error) {
					gotRej = append(gotRej, r)
					return len(gotRej) < tc.limit, nil
				}); err != nil {
					return err
				}
				return tx.ForEachAudit(tc.before, func(a jobs.AuditRecord) (bool, error) {
					gotAudit = append(gotAudit, a)
					return len(gotAudit) < tc.limit, nil
				})
			})
			var wantRej []jobs.Rejection
			var wantAudit []jobs.AuditRecord
			for _, id := range tc.want {
				wantRej = append(wantRej, rejections[id-1])
				wantAudit = append(wantAudit, audit[id-1])
			}
			if diff := cmp.Diff(wantRej, gotRej); diff != "" {
				t.Errorf("rejections before %d limit %d (-want +got):\n%s", tc.before, tc.limit, diff)
			}
			if diff := cmp.Diff(wantAudit, gotAudit); diff != "" {
				t.Errorf("audit before %d limit %d (-want +got):\n%s", tc.before, tc.limit, diff)
			}
		}
	})

	t.Run("A replay is found again by its principal and request id only", func(t *testing.T) {
		b.view(t, func(tx *store.Tx) error {
			got, found, err := tx.ReplayByRequest("ops", "replay-1")
			if err != nil || !found {
				t.Fatalf("ReplayByRequest(ops, replay-1) = found %v, %v", found, err)
			}
			if diff := cmp.Diff(audit[1], got); diff != "" {
				t.Errorf("ReplayByRequest(ops, replay-1) (-want +got):\n%s", diff)
			}
			if _, found, _ := tx.ReplayByRequest("ops", "other"); found {
				t.Error("ReplayByRequest(ops, other) found a record")
			}
			if _, found, _ := tx.ReplayByRequest("someone-else", "replay-1"); found {
				t.Error("ReplayByRequest found ops's replay for another principal; request ids are per principal")
			}
			return nil
		})
	})

	t.Run("PutAudit with an id rewrites that record", func(t *testing.T) {
		rewritten := audit[1]
		rewritten.Response = []byte("encoded answer")
		b.update(t, func(tx *store.Tx) error {
			r, err := tx.PutAudit(rewritten)
			if err != nil || r.ID != 2 {
				t.Errorf("PutAudit(id 2) = id %d, %v; want 2", r.ID, err)
			}
			return err
		})
		b.view(t, func(tx *store.Tx) error {
			got, _, err := tx.ReplayByRequest("ops", "replay-1")
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(rewritten, got); diff != "" {
				t.Errorf("rewritten replay (-want +got):\n%s", diff)
			}
			n := 0
			if err := tx.ForEachAudit(0, func(jobs.AuditRecord) (bool, error) { n++; return true, nil }); err != nil {
				t.Fatal(err)
			}
			if n != 3 {
				t.Errorf("audit records after a rewrite = %d, want 3", n)
			}
			return nil
		})
	})

	t.Run("Ids continue after a reopen", func(t *testing.T) {
		b.update(t, func(tx *store.Tx) error {
			if r, err := tx.PutRejection(jobs.Rejection{Job: 3}); err != nil || r.ID != 4 {
				t.Errorf("PutRejection after reopen = id %d, %v; want 4", r.ID, err)
			}
			if a, err := tx.PutAudit(jobs.AuditRecord{Action: jobs.AuditPause}); err != nil || a.ID != 4 {
				t.Errorf("PutAudit after reopen = id %d, %v; want 4", a.ID, err)
			}
			return nil
		})
	})
}
