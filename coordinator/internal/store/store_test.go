package store_test

import (
	"encoding/binary"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	"github.com/leasehold/leasehold/coordinator/internal/store"
	"go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"
)

// testBundle is one store on a file of its own.
type testBundle struct {
	path string
	st   *store.Store
}

func setup(t *testing.T, opts ...store.Option) *testBundle {
	t.Helper()
	b := &testBundle{path: filepath.Join(t.TempDir(), "leasehold.db")}
	b.open(t, opts...)
	t.Cleanup(func() { b.close(t) })
	return b
}

func (b *testBundle) open(t *testing.T, opts ...store.Option) {
	t.Helper()
	st, err := store.Open(b.path, opts...)
	if err != nil {
		t.Fatalf("Open(%s): %v", b.path, err)
	}
	b.st = st
}

func (b *testBundle) close(t *testing.T) {
	t.Helper()
	if b.st == nil {
		return
	}
	if err := b.st.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	b.st = nil
}

// reopen closes the store and opens the file again.
func (b *testBundle) reopen(t *testing.T, opts ...store.Option) {
	t.Helper()
	b.close(t)
	b.open(t, opts...)
}

func (b *testBundle) update(t *testing.T, fn func(*store.Tx) error) {
	t.Helper()
	if err := b.st.Update(fn); err != nil {
		t.Fatalf("Update: %v", err)
	}
}

func (b *testBundle) view(t *testing.T, fn func(*store.Tx) error) {
	t.Helper()
	if err := b.st.View(fn); err != nil {
		t.Fatalf("View: %v", err)
	}
}

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)

// snapshot is everything the store's reads return about a file, given the
// ids and teams written to it.
type snapshot struct {
	LastToken     uint64
	Jobs          []jobs.Job
	Documents     map[uint64]string
	Artifacts     map[[2]uint64]store.Artifact
	Batches       []jobs.Batch
	ByRequest     map[string]uint64
	Unfinished    []uint64
	TeamJobs      map[string][]uint64
	TeamBatches   map[string][]uint64
	BatchCounts   map[uint64]jobs.Counts
	TeamCounts    map[string]jobs.Counts
	Rejections    []jobs.Rejection
	Audit         []jobs.AuditRecord
	Replay        jobs.AuditRecord
	Dispatch      jobs.DispatchState
	NextJobID     uint64
	NextBatchID   uint64
	NextToken     uint64
	NextRejection uint64
	NextAuditID   uint64
	CheckProblems string
	IndexProblems string
}

// takeSnapshot reads what is stored through the store's own reads. Its
// sequences are read in a transaction that is rolled back.
func takeSnapshot(t *testing.T, st *store.Store, teams []string, artifacts [][2]uint64) snapshot {
	t.Helper()
	s := snapshot{Documents: map[uint64]string{}, Artifacts: map[[2]uint64]store.Artifact{}, ByRequest: map[string]uint64{},
		TeamJobs: map[string][]uint64{}, TeamBatches: map[string][]uint64{}, BatchCounts: map[uint64]jobs.Counts{},
		TeamCounts: map[string]jobs.Counts{}}
	err := st.View(func(tx *store.Tx) error {
		s.LastToken = tx.LastToken()
		var ids []uint64
		if err := tx.ForEachJobID(0, func(id uint64) bool { ids = append(ids, id); return true }); err != nil {
			return err
		}
		for _, id := range ids {
			j, _, err := tx.JobWithHistory(id)
			if err != nil {
				return err
			}
			s.Jobs = append(s.Jobs, j)
			if d := tx.Document(id); d != nil {
				s.Documents[id] = string(d)
			}
			if _, found, _ := tx.Batch(j.BatchID); found {
				c, err := tx.BatchCounts(j.BatchID)
				if err != nil {
					return err
				}
				s.BatchCounts[j.BatchID] = c
			}
		}
		for _, k := range artifacts {
			a, err := tx.Artifact(k[0], k[1])
			if err == nil {
				s.Artifacts[k] = a
			} else if !errors.Is(err, store.ErrArtifactNotFound) {
				return err
			}
		}
		for _, team := range teams {
			s.TeamJobs[team] = tx.TeamJobsAfter(team, 0, 1000)
			s.TeamBatches[team] = tx.TeamBatchesBefore(team, 0, 1000)
			for _, id := range s.TeamBatches[team] {
				bt, _, err := tx.Batch(id)
				if err != nil {
					return err
				}
				s.Batches = append(s.Batches, bt)
				got, found, err := tx.BatchByRequest(bt.Team, bt.RequestID)
				if err != nil || !found {
					return errors.Join(err, errors.New("a batch is not found by its request id"))
				}
				s.ByRequest[bt.Team+"/"+bt.RequestID] = got.ID
			}
		}
		s.Unfinished = tx.UnfinishedAfter(0, 1000)
		if err := tx.ForEachTeamCounts(func(team string, c jobs.Counts) error {
			s.TeamCounts[team] = c
			return nil
		}); err != nil {
			return err
		}
		if err := tx.ForEachRejection(0, func(r jobs.Rejection) (bool, error) {
			s.Rejections = append(s.Rejections, r)
			return true, nil
		}); err != nil {
			return err
		}
		if err := tx.ForEachAudit(0, func(a jobs.AuditRecord) (bool, error) {
			s.Audit = append(s.Audit, a)
			if a.Action == jobs.AuditReplay && a.RequestID != "" {
				r, found, err := tx.ReplayByRequest(a.Principal, a.RequestID)
				if err != nil || !found {
					return false, errors.Join(err, errors.New("a replay is not found by its request id"))
				}
				s.Replay = r
			}
			return true, nil
		}); err != nil {
			return err
		}
		if err := tx.CheckIndexes(); err != nil {
			s.IndexProblems = err.Error()
		}
		var err error
		s.Dispatch, err = tx.DispatchState()
		return err
	})
	if err != nil {
		t.Fatalf("reading the store: %v", err)
	}
	tx, err := st.Begin()
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	s.NextJobID, _ = tx.NextJobIDs(1)
	s.NextBatchID, _ = tx.NextBatchID()
	s.NextToken, _ = tx.NextToken()
	if r, err := tx.PutRejection(jobs.Rejection{}); err == nil {
		s.NextRejection = r.ID
	}
	if a, err := tx.PutAudit(jobs.AuditRecord{}); err == nil {
		s.NextAuditID = a.ID
	}
	if err := st.Check(); err != nil {
		s.CheckProblems = err.Error()
	}
	return s
}

// populate writes one of everything the store keeps.
func populate(t *testing.T, b *testBundle) {
	t.Helper()
	b.update(t, populateTx)
}

// populateTx writes a record of every kind in tx.
func populateTx(tx *store.Tx) error {
	for range 41 {
		if _, err := tx.NextToken(); err != nil {
			return err
		}
	}
	if _, err := tx.NextJobIDs(3); err != nil {
		return err
	}
	for _, bt := range []jobs.Batch{
		{ID: 1, Team: "a", RequestID: "req-1", CreatedAt: t0, FirstJob: 1, Count: 2, RequestHash: []byte{1}},
		{ID: 2, Team: "ab", RequestID: "req-1", CreatedAt: t0, FirstJob: 3, Count: 1, RequestHash: []byte{2}},
	} {
		if _, err := tx.NextBatchID(); err != nil {
			return err
		}
		if err := tx.PutBatch(bt); err != nil {
			return err
		}
	}
	j1, j2, j3 := fullJob(1, 1, "a"), fullJob(2, 1, "a"), fullJob(3, 2, "ab")
	j2.Phase, j3.Phase = jobs.PhaseLeased, jobs.PhaseQueued
	for _, j := range []jobs.Job{j1, j2, j3} {
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
		if !j.Phase.Terminal() {
			if err := tx.SetUnfinished(j.ID, true); err != nil {
				return err
			}
			if err := tx.PutDocument(j.ID, []byte("content of job "+string(rune('0'+j.ID)))); err != nil {
				return err
			}
		} else if err := tx.IndexFinished(j); err != nil {
			return err
		}
	}
	if err := tx.PutArtifact(1, 40, store.Artifact{Digest: "d", ContentType: "image/png", Content: []byte("png"), Renderer: "r-0"}); err != nil {
		return err
	}
	if _, err := tx.PutRejection(fullRejection(1, 12, t0)); err != nil {
		return err
	}
	for _, a := range []jobs.AuditRecord{
		{At: t0, Principal: "ops", Action: jobs.AuditReplay, Reason: "fixed", RequestID: "replay-1", JobIDs: []uint64{1},
			Teams: []string{"a"}, Response: []byte("answer")},
		{At: t0, Principal: "ops", Action: jobs.AuditPause, Reason: "rollout"},
	} {
		if _, err := tx.PutAudit(a); err != nil {
			return err
		}
	}
	return tx.PutDispatchState(jobs.DispatchState{Paused: true, Since: t0, Principal: "ops", Reason: "rollout"})
}

func TestReopenKeepsEverything(t *testing.T) {
	t.Parallel()
	b := setup(t)
	populate(t, b)
	teams := []string{"a", "ab", "b"}
	probes := [][2]uint64{{1, 39}, {1, 40}, {2, 40}}
	before := takeSnapshot(t, b.st, teams, probes)
	if len(before.Jobs) != 3 || len(before.Jobs[0].History) != 2 || len(before.Artifacts) != 1 || len(before.Documents) != 2 ||
		len(before.Unfinished) != 2 || len(before.Rejections) != 1 || len(before.Audit) != 2 || before.LastToken != 41 || !before.Dispatch.Paused {
		t.Fatalf("populate wrote less than it should:\n%+v", before)
	}
	if before.CheckProblems != "" || before.IndexProblems != "" {
		t.Errorf("checks on a healthy file: %s %s", before.CheckProblems, before.IndexProblems)
	}
	b.reopen(t)
	after := takeSnapshot(t, b.st, teams, probes)
	if diff := cmp.Diff(before, after); diff != "" {
		t.Errorf("store after reopen (-before +after):\n%s", diff)
	}
}

func TestCheck(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if err := b.st.Check(); err != nil {
		t.Errorf("Check on a new file = %v, want nil", err)
	}
	populate(t, b)
	b.update(t, func(tx *store.Tx) error {
		if err := tx.DeleteArtifacts(1, 0); err != nil {
			return err
		}
		return tx.DeleteDocument(2)
	})
	if err := b.st.Check(); err != nil {
		t.Errorf("Check after writes and deletes = %v, want nil", err)
	}
}

// rawUpdate changes the file at path with bbolt directly, as something
// other than this store would.
func rawUpdate(t *testing.T, path string, fn func(*bbolt.Tx) error) {
	t.Helper()
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.Update(fn); err != nil {
		t.Fatal(err)
	}
}

// rawBuckets lists the file's top-level buckets and its schema version
// (0 when none is written).
func rawBuckets(t *testing.T, path string) (names []string, version uint64) {
	t.Helper()
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{ReadOnly: true, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	err = db.View(func(tx *bbolt.Tx) error {
		return tx.ForEach(func(name []byte, bk *bbolt.Bucket) error {
			names = append(names, string(name))
			if string(name) == "meta" {
				if v := bk.Get([]byte("schema_version")); v != nil {
					version = binary.BigEndian.Uint64(v)
				}
			}
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	return names, version
}

func TestSchemaVersion(t *testing.T) {
	t.Parallel()

	t.Run("A new file is written with the current version", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.close(t)
		if _, version := rawBuckets(t, b.path); version != store.SchemaVersion {
			t.Errorf("schema version of a new file = %d, want %d", version, store.SchemaVersion)
		}
	})

	t.Run("A file of a newer schema is refused, untouched, with what to do", func(t *testing.T) {
		t.Parallel()
		path := filepath.Join(t.TempDir(), "leasehold.db")
		rawUpdate(t, path, func(tx *bbolt.Tx) error {
			meta, err := tx.CreateBucket([]byte("meta"))
			if err != nil {
				return err
			}
			return meta.Put([]byte("schema_version"), binary.BigEndian.AppendUint64(nil, 3))
		})
		st, err := store.Open(path)
		if err == nil {
			st.Close()
		}
		if !errors.Is(err, store.ErrSchemaVersion) {
			t.Fatalf("Open of a schema 3 file: err = %v, want ErrSchemaVersion", err)
		}
		for _, want := range []string{"schema 3", "release that wrote it", "restore a backup"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("Open of a schema 3 file: err = %q, want it to say %q", err, want)
			}
		}
		// The refusal released the file and changed nothing in it.
		names, version := rawBuckets(t, path)
		if diff := cmp.Diff([]string{"meta"}, names); diff != "" || version != 3 {
			t.Errorf("file after the refusal: version %d, buckets (-want +got):\n%s", version, diff)
		}
	})

	for _, bucket := range []string{"jobs", "sessions"} {
		t.Run("A file with a "+bucket+" bucket but no version is refused, untouched", func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(t.TempDir(), "leasehold.db")
			rawUpdate(t, path, func(tx *bbolt.Tx) error {
				bk, err := tx.CreateBucket([]byte(bucket))
				if err != nil {
					return err
				}
				return bk.Put([]byte("k"), []byte("v"))
			})
			st, err := store.Open(path)
			if err == nil {
				st.Close()
			}
			if !errors.Is(err, store.ErrSchemaVersion) {
				t.Fatalf("Open of a file without a version: err = %v, want ErrSchemaVersion", err)
			}
			if !strings.Contains(err.Error(), "no schema version") {
				t.Errorf("Open of a file without a version: err = %q, want it to say it has no schema version", err)
			}
			names, version := rawBuckets(t, path)
			if diff := cmp.Diff([]string{bucket}, names); diff != "" || version != 0 {
				t.Errorf("file after the refusal: version %d, buckets (-want +got):\n%s", version, diff)
			}
		})
	}

	t.Run("An empty file is initialised", func(t *testing.T) {
		t.Parallel()
		path := filepath.Join(t.TempDir(), "leasehold.db")
		rawUpdate(t, path, func(*bbolt.Tx) error { return nil })
		st, err := store.Open(path)
		if err != nil {
			t.Fatalf("Open of an empty bbolt file: %v", err)
		}
		st.Close()
		if _, version := rawBuckets(t, path); version != store.SchemaVersion {
			t.Errorf("schema version = %d, want %d", version, store.SchemaVersion)
		}
	})
}

func TestOpenLocked(t *testing.T) {
	t.Parallel()
	b := setup(t)
	start := time.Now()
	second, err := store.Open(b.path)
	if err == nil {
		second.Close()
		t.Fatal("a second Open of an open file succeeded, want ErrLocked")
	}
	if !errors.Is(err, store.ErrLocked) || !errors.Is(err, bolterrors.ErrTimeout) {
		t.Errorf("second Open: err = %v, want ErrLocked wrapping bbolt's ErrTimeout", err)
	}
	if !strings.Contains(err.Error(), "in use by another process") || !strings.Contains(err.Error(), b.path) {
		t.Errorf("second Open: err = %q, want it to name the file and say it is in use", err)
	}
	if waited := time.Since(start); waited > 10*time.Second {
		t.Errorf("second Open waited %v for the lock, want it to fail fast", waited)
	}
	// Once the first is closed, the file opens.
	b.reopen(t)
}

func TestFaultRollsBackTheWholeTransaction(t *testing.T) {
	t.Parallel()
	var failOn string
	b := setup(t, store.WithFault(func(bucket string) error {
		if bucket == failOn {
			return store.ErrInjected
		}
		return nil
	}))
	// write touches every kind of record, in the order the writer does.
	write := func(tx *store.Tx) error {
		if _, err := tx.NextToken(); err != nil {
			return err
		}
		if _, err := tx.NextJobIDs(1); err != nil {
			return err
		}
		if _, err := tx.NextBatchID(); err != nil {
			return err
		}
		if err := tx.PutBatch(jobs.Batch{ID: 1, Team: "a", RequestID: "r"}); err != nil {
			return err
		}
		if err := tx.PutJob(fullJob(1, 1, "a")); err != nil {
			return err
		}
		if err := tx.PutEvents(1, fullEvents()); err != nil {
			return err
		}
		if err := tx.PutDocument(1, []byte("doc")); err != nil {
			return err
		}
		if err := tx.PutArtifact(1, 1, store.Artifact{Digest: "d"}); err != nil {
			return err
		}
		if err := tx.SetUnfinished(1, true); err != nil {
			return err
		}
		if err := tx.IndexTeamJob("a", 1); err != nil {
			return err
		}
		var d jobs.Counts
		d[jobs.PhaseQueued] = 1
		if err := tx.AddBatchCounts(1, d); err != nil {
			return err
		}
		if err := tx.AddTeamCounts("a", d); err != nil {
			return err
		}
		if _, err := tx.PutRejection(jobs.Rejection{Job: 1}); err != nil {
			return err
		}
		if _, err := tx.PutAudit(jobs.AuditRecord{Action: jobs.AuditReplay, Principal: "ops", RequestID: "x"}); err != nil {
			return err
		}
		return tx.PutDispatchState(jobs.DispatchState{Paused: true})
	}
	empty := takeSnapshot(t, b.st, []string{"a"}, [][2]uint64{{1, 1}})

	for _, bucket := range []string{"batches", "team_batches", "batch_requests", "jobs", "events", "documents", "artifacts",
		"unfinished", "team_jobs", "batch_counts", "team_counts", "rejections", "audit", "replay_requests", "meta"} {
		t.Run("A fault writing "+bucket+" leaves nothing of the transaction", func(t *testing.T) {
			failOn = bucket
			defer func() { failOn = "" }()
			if err := b.st.Update(write); !errors.Is(err, store.ErrInjected) {
				t.Fatalf("Update with a failing %s write: err = %v, want ErrInjected", bucket, err)
			}
			tx, err := b.st.Begin()
			if err != nil {
				t.Fatal(err)
			}
			if err := write(tx); !errors.Is(err, store.ErrInjected) {
				t.Fatalf("a group transaction with a failing %s write: err = %v, want ErrInjected", bucket, err)
			}
			if err := tx.Rollback(); err != nil {
				t.Fatal(err)
			}
			failOn = ""
			if diff := cmp.Diff(empty, takeSnapshot(t, b.st, []string{"a"}, [][2]uint64{{1, 1}})); diff != "" {
				t.Errorf("store after the failed transactions (-want +got):\n%s", diff)
			}
		})
	}
	t.Run("Without a fault the same transaction commits", func(t *testing.T) {
		failOn = ""
		b.update(t, write)
		got := takeSnapshot(t, b.st, []string{"a"}, [][2]uint64{{1, 1}})
		if len(got.Jobs) != 1 || got.LastToken != 1 || len(got.Unfinished) != 1 || !got.Dispatch.Paused {
			t.Errorf("store after the committed transaction = %+v, want its writes", got)
		}
	})
}

// TestWithPageSize checks that a new file gets the page size asked for and
// that a file keeps its own, whatever a later Open asks.
func TestWithPageSize(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "leasehold.db")
	pageSize := func(opts ...store.Option) int {
		t.Helper()
		st, err := store.Open(path, opts...)
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		s, err := st.Stats()
		if err != nil {
			t.Fatal(err)
		}
		return s.PageSize
	}
	if got := pageSize(store.WithPageSize(8192)); got != 8192 {
		t.Errorf("a new file has pages of %d bytes, want 8192", got)
	}
	if got := pageSize(store.WithPageSize(16384)); got != 8192 {
		t.Errorf("an existing file opened asking for 16384 has pages of %d bytes, want its own 8192", got)
	}
	if got := pageSize(); got != 8192 {
		t.Errorf("an existing file opened without a size has pages of %d bytes, want its own 8192", got)
	}
}
