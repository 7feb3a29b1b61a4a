package store_test

import (
	"encoding/binary"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	"github.com/leasehold/leasehold/coordinator/internal/store"
	"go.etcd.io/bbolt"
)

func openStore(t *testing.T, path string, opts ...store.Option) *store.Store {
	t.Helper()
	st, err := store.Open(path, opts...)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return st
}

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)

// fullJob is a job record with every field set, so that a round trip
// through the codec shows any field it drops.
func fullJob(id, batch uint64) jobs.Job {
	return jobs.Job{
		ID: id, BatchID: batch, Team: "alpha",
		Doc:    jobs.Document{Name: "a.pdf", ContentType: "application/pdf", SizeBytes: 1234, SourceURI: "s3://bucket/a.pdf", ContentSHA256: "abc123"},
		Policy: jobs.RetryPolicy{MaxAttempts: 5, BackoffBase: time.Second, BackoffCap: time.Minute},
		Phase:  jobs.PhaseCancelled, Attempt: 2, Cycle: 3,
		Lease:           jobs.Lease{Token: 41, Renderer: "r-1", GrantedAt: t0, Deadline: t0.Add(15 * time.Second)},
		NextAttemptAt:   t0.Add(time.Minute),
		TerminalReason:  jobs.ReasonCancelled,
		TerminalMessage: "wrong file",
		FinishedAt:      t0.Add(2 * time.Minute),
		Artifact:        jobs.Artifact{Digest: "d", Size: 99, ContentType: "image/png", Token: 40, Renderer: "r-0"},
		Cancellation: jobs.Cancellation{Principal: "alice", At: t0.Add(3 * time.Minute), Reason: "wrong file", FromPhase: jobs.PhaseLeased,
			Renderer: "r-1", Token: 41, AckedAt: t0.Add(4 * time.Minute)},
		CompletedToken: 40, CompletedOutcome: "success:d", LastCause: "renderer crashed",
		CreatedAt: t0, UpdatedAt: t0.Add(5 * time.Minute), EnqueuedAt: t0.Add(6 * time.Minute),
		Events: []jobs.Event{
			{Seq: 1, At: t0, Kind: jobs.EventSubmitted, Phase: jobs.PhaseQueued},
			{Seq: 2, At: t0.Add(time.Second), Kind: jobs.EventCancelled, Phase: jobs.PhaseLeased, Token: 41, Renderer: "r-1",
				Attempt: 2, Reason: "FROM_LEASED", Message: "wrong file", Principal: "alice"},
		},
		RejectedCompletions: 7,
	}
}

func TestReopenKeepsEverything(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "leasehold.db")
	st := openStore(t, path)

	batch := jobs.Batch{ID: 1, Team: "alpha", RequestID: "req-1", CreatedAt: t0, FirstJob: 1, Count: 5,
		Policy: jobs.RetryPolicy{MaxAttempts: 5, BackoffBase: time.Second, BackoffCap: time.Minute}, RequestHash: []byte{1, 2, 3}}
	job := fullJob(3, 1)
	dispatch := jobs.DispatchState{Paused: true, Since: t0, Principal: "ops", Reason: "rollout"}
	var lastToken uint64
	var rejections []jobs.Rejection
	var audit []jobs.AuditRecord
	err := st.Update(func(tx *store.Tx) error {
		for range 3 {
			tok, err := tx.NextToken()
			if err != nil {
				return err
			}
			if tok <= lastToken {
				t.Errorf("NextToken = %d after %d, want it to increase", tok, lastToken)
			}
			lastToken = tok
		}
		first, err := tx.NextJobIDs(5)
		if err != nil || first != 1 {
			t.Errorf("NextJobIDs(5) = %d, %v; want 1", first, err)
		}
		if id, err := tx.NextBatchID(); err != nil || id != 1 {
			t.Errorf("NextBatchID = %d, %v; want 1", id, err)
		}
		if err := tx.PutBatch(batch); err != nil {
			return err
		}
		if err := tx.PutJob(job); err != nil {
			return err
		}
		if err := tx.PutDocument(job.ID, []byte("%PDF-1.7")); err != nil {
			return err
		}
		for i := range 3 {
			r, err := tx.PutRejection(jobs.Rejection{Job: job.ID, Team: "alpha", Token: uint64(10 + i), Renderer: "r-1", Reason: "STALE_LEASE",
				At: t0.Add(time.Duration(i) * time.Second), CurrentToken: 41, CurrentPhase: jobs.PhaseLeased, Outcome: "success:d", Digest: "d"})
			if err != nil {
				return err
			}
			rejections = append(rejections, r)
		}
		for i, a := range []jobs.AuditRecord{
			{At: t0, Principal: "ops", Action: jobs.AuditPause, Reason: "rollout"},
			{At: t0.Add(time.Second), Principal: "ops", Action: jobs.AuditReplay, Reason: "fixed", RequestID: "replay-1", JobIDs: []uint64{3, 4},
				IncludePermanent: true, Skipped: 1, OutOfScope: 2, Batch: 1, TerminalReason: jobs.ReasonAttemptsExhausted, Response: []byte("answer")},
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
		return tx.PutDispatchState(dispatch)
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}

	st = openStore(t, path)
	defer st.Close()
	err = st.View(func(tx *store.Tx) error {
		if got := tx.LastToken(); got != lastToken {
			t.Errorf("LastToken after reopen = %d, want %d", got, lastToken)
		}
		got, found, err := tx.Job(job.ID)
		if err != nil || !found {
			t.Fatalf("Job(%d) = found %v, %v", job.ID, found, err)
		}
		if diff := cmp.Diff(job, got); diff != "" {
			t.Errorf("job after reopen (-want +got):\n%s", diff)
		}
		if _, found, _ := tx.Job(99); found {
			t.Error("Job(99) found, want absent")
		}
		if doc, err := tx.Document(job.ID); err != nil || string(doc) != "%PDF-1.7" {
			t.Errorf("Document = %q, %v", doc, err)
		}
		if doc, err := tx.Document(99); err != nil || doc != nil {
			t.Errorf("Document(99) = %q, %v; want nil", doc, err)
		}
		gotBatch, found, err := tx.Batch(batch.ID)
		if err != nil || !found {
			t.Fatalf("Batch = found %v, %v", found, err)
		}
		if diff := cmp.Diff(batch, gotBatch); diff != "" {
			t.Errorf("batch after reopen (-want +got):\n%s", diff)
		}
		byReq, found, err := tx.BatchByRequest("alpha", "req-1")
		if err != nil || !found || byReq.ID != batch.ID {
			t.Errorf("BatchByRequest(alpha, req-1) = %d found %v, %v; want batch %d", byReq.ID, found, err, batch.ID)
		}
		if _, found, _ := tx.BatchByRequest("beta", "req-1"); found {
			t.Error("BatchByRequest(beta, req-1) found alpha's batch; request ids are per team")
		}
		replay, found, err := tx.ReplayByRequest("ops", "replay-1")
		if err != nil || !found {
			t.Fatalf("ReplayByRequest = found %v, %v", found, err)
		}
		if diff := cmp.Diff(audit[1], replay); diff != "" {
			t.Errorf("replay audit after reopen (-want +got):\n%s", diff)
		}
		if _, found, _ := tx.ReplayByRequest("ops", "other"); found {
			t.Error("ReplayByRequest(ops, other) found a record")
		}
		if _, found, _ := tx.ReplayByRequest("someone-else", "replay-1"); found {
			t.Error("ReplayByRequest found ops's replay for another principal; request ids are per principal")
		}
		ds, err := tx.DispatchState()
		if err != nil {
			return err
		}
		if diff := cmp.Diff(dispatch, ds); diff != "" {
			t.Errorf("dispatch state after reopen (-want +got):\n%s", diff)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	// Listings: newest first, paged by before.
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
		var gotRej, gotAudit []uint64
		var firstRej jobs.Rejection
		err := st.View(func(tx *store.Tx) error {
			if err := tx.ForEachRejection(tc.before, func(r jobs.Rejection) (bool, error) {
				if len(gotRej) == 0 {
					firstRej = r
				}
				gotRej = append(gotRej, r.ID)
				return len(gotRej) < tc.limit, nil
			}); err != nil {
				return err
			}
			return tx.ForEachAudit(tc.before, func(a jobs.AuditRecord) (bool, error) {
				gotAudit = append(gotAudit, a.ID)
				return len(gotAudit) < tc.limit, nil
			})
		})
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(tc.want, gotRej); diff != "" {
			t.Errorf("rejections before %d limit %d (-want +got):\n%s", tc.before, tc.limit, diff)
		}
		if diff := cmp.Diff(tc.want, gotAudit); diff != "" {
			t.Errorf("audit before %d limit %d (-want +got):\n%s", tc.before, tc.limit, diff)
		}
		if len(tc.want) > 0 {
			if diff := cmp.Diff(rejections[tc.want[0]-1], firstRej); diff != "" {
				t.Errorf("rejection %d after reopen (-want +got):\n%s", tc.want[0], diff)
			}
		}
	}

	// Sequences continue where they were: never a token, job id or batch
	// id handed out twice.
	err = st.Update(func(tx *store.Tx) error {
		tok, err := tx.NextToken()
		if err != nil {
			return err
		}
		if tok <= lastToken {
			t.Errorf("NextToken after reopen = %d, want > %d", tok, lastToken)
		}
		if id, err := tx.NextJobIDs(1); err != nil || id != 6 {
			t.Errorf("NextJobIDs after reopen = %d, %v; want 6", id, err)
		}
		if id, err := tx.NextBatchID(); err != nil || id != 2 {
			t.Errorf("NextBatchID after reopen = %d, %v; want 2", id, err)
		}
		r, err := tx.PutRejection(jobs.Rejection{Job: 3})
		if err != nil || r.ID != 4 {
			t.Errorf("PutRejection after reopen = id %d, %v; want 4", r.ID, err)
		}
		a, err := tx.PutAudit(jobs.AuditRecord{Action: jobs.AuditPause})
		if err != nil || a.ID != 4 {
			t.Errorf("PutAudit after reopen = id %d, %v; want 4", a.ID, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestForEachJob(t *testing.T) {
	t.Parallel()
	st := openStore(t, filepath.Join(t.TempDir(), "leasehold.db"))
	defer st.Close()
	err := st.Update(func(tx *store.Tx) error {
		for _, id := range []uint64{5, 1, 300, 2} {
			if err := tx.PutJob(jobs.Job{ID: id, Team: "alpha"}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
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
		var got []uint64
		err := st.View(func(tx *store.Tx) error {
			return tx.ForEachJob(tc.after, func(j jobs.Job) (bool, error) {
				got = append(got, j.ID)
				return len(got) < tc.limit, nil
			})
		})
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("jobs after %d (-want +got):\n%s", tc.after, diff)
		}
	}
}

func TestSchemaVersion(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "leasehold.db")
	st := openStore(t, path)
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	// setVersion rewrites the file's schema version and returns the one it held.
	setVersion := func(v uint64) (was uint64) {
		t.Helper()
		db, err := bbolt.Open(path, 0o600, &bbolt.Options{Timeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		err = db.Update(func(tx *bbolt.Tx) error {
			meta := tx.Bucket([]byte("meta"))
			was = binary.BigEndian.Uint64(meta.Get([]byte("schema_version")))
			return meta.Put([]byte("schema_version"), binary.BigEndian.AppendUint64(nil, v))
		})
		if err != nil {
			t.Fatal(err)
		}
		return was
	}

	if was := setVersion(store.SchemaVersion + 1); was != store.SchemaVersion {
		t.Errorf("a new file has schema version %d, want %d", was, store.SchemaVersion)
	}
	if _, err := store.Open(path); !errors.Is(err, store.ErrSchemaVersion) {
		t.Fatalf("Open of a file with schema version %d: err = %v, want ErrSchemaVersion", store.SchemaVersion+1, err)
	}
	// The refused Open released the file: it can be fixed and opened.
	setVersion(store.SchemaVersion)
	st = openStore(t, path)
	st.Close()
}

func TestFaultRollsBackTheWholeTransaction(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "leasehold.db")
	writes := 0
	st := openStore(t, path, store.WithFault(func(bucket string) error {
		if bucket == "jobs" {
			writes++
			if writes == 2 {
				return store.ErrInjected
			}
		}
		return nil
	}))
	defer st.Close()
	err := st.Update(func(tx *store.Tx) error {
		if _, err := tx.NextToken(); err != nil {
			return err
		}
		for _, id := range []uint64{1, 2} {
			if err := tx.PutJob(jobs.Job{ID: id}); err != nil {
				return err
			}
		}
		return nil
	})
	if !errors.Is(err, store.ErrInjected) {
		t.Fatalf("Update with a failing write: err = %v, want ErrInjected", err)
	}
	err = st.View(func(tx *store.Tx) error {
		if _, found, _ := tx.Job(1); found {
			t.Error("job 1 of the failed transaction is stored")
		}
		if got := tx.LastToken(); got != 0 {
			t.Errorf("token counter = %d after a failed transaction, want 0", got)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
