package store_test

import (
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	"github.com/leasehold/leasehold/coordinator/internal/store"
	storagev1 "github.com/leasehold/leasehold/gen/leasehold/storage/v1"
	"go.etcd.io/bbolt"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
)

// The schema 1 fixture in testdata/schema1 was written by the schema 1
// coordinator: batch 1 (team alpha) holds jobs 1-6, batch 2 (team beta)
// jobs 7-8.
//
//	1 ok.pdf         SUCCEEDED under token 1, then a stale completion (token 101) rejected
//	2 flaky.pdf      transient failure under 2, LEASED under 9
//	3 held.pdf       lease 3 expired, LEASED under 10
//	4 cancel-me.pdf  CANCELLED while leased under 4, acknowledged
//	5 bad.pdf        FAILED INVALID_DOCUMENT under 5
//	6 waiting.pdf    LEASED under 8
//	7 setup.exe      FAILED UNSUPPORTED_FORMAT at submission
//	8 twice.pdf      lease 6 expired, 7 failed, exhausted, replayed: QUEUED in cycle 2
//
// Its artifact directory holds job 1's preview ("png of j1", 77c1c2ef...)
// and the rejected completion's upload ("late png", 68b4b9c2...).
const (
	fixtureDir    = "testdata/schema1"
	j1Digest      = "77c1c2effe4376885835b4daf40613c6a29b85ca0fde390039d36a3c1d99163c"
	latePngDigest = "68b4b9c236957e8908ef5462e3f8ef1e7f44a1d4b068db3e366503d70948a03a"
)

// fixture is a private copy of the schema 1 fixture.
type fixture struct {
	dir  string
	db   string
	arts string
}

func copyFixture(t *testing.T) fixture {
	t.Helper()
	dir := t.TempDir()
	if err := os.CopyFS(dir, os.DirFS(fixtureDir)); err != nil {
		t.Fatalf("copying the fixture: %v", err)
	}
	return fixture{dir: dir, db: filepath.Join(dir, "leasehold.db"), arts: filepath.Join(dir, "artifacts")}
}

func openFixture(t *testing.T, path string, opts ...store.Option) *store.Store {
	t.Helper()
	st, err := store.Open(path, opts...)
	if err != nil {
		t.Fatalf("Open(%s): %v", path, err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// rawBucket is a bucket's contents as stored.
type rawBucket struct {
	Sequence uint64
	Items    map[string]string
}

// rawDump reads every bucket of a closed file as bytes.
func rawDump(t *testing.T, path string) map[string]rawBucket {
	t.Helper()
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{ReadOnly: true, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	out := map[string]rawBucket{}
	err = db.View(func(tx *bbolt.Tx) error {
		return tx.ForEach(func(name []byte, bk *bbolt.Bucket) error {
			rb := rawBucket{Sequence: bk.Sequence(), Items: map[string]string{}}
			out[string(name)] = rb
			return bk.ForEach(func(k, v []byte) error {
				rb.Items[string(k)] = string(v)
				return nil
			})
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// rawJobs decodes the job records of a closed file as stored.
func rawJobs(t *testing.T, path string) map[uint64]*storagev1.JobRecord {
	t.Helper()
	out := map[uint64]*storagev1.JobRecord{}
	for k, v := range rawDump(t, path)["jobs"].Items {
		r := &storagev1.JobRecord{}
		if err := proto.Unmarshal([]byte(v), r); err != nil {
			t.Fatal(err)
		}
		out[binary.BigEndian.Uint64([]byte(k))] = r
	}
	return out
}

func rawMeta(t *testing.T, path string) (version, cursor uint64) {
	t.Helper()
	meta := rawDump(t, path)["meta"].Items
	if v, ok := meta["schema_version"]; ok {
		version = binary.BigEndian.Uint64([]byte(v))
	}
	if v, ok := meta["migration_cursor"]; ok {
		cursor = binary.BigEndian.Uint64([]byte(v))
	}
	return version, cursor
}

// schema1Events is a schema 1 record's history as the store returns it.
func schema1Events(r *storagev1.JobRecord) []jobs.Event {
	var out []jobs.Event
	for _, e := range r.Events {
		at := time.Time{}
		if e.At != 0 {
			at = time.Unix(0, e.At).UTC()
		}
		out = append(out, jobs.Event{Seq: e.Seq, At: at, Kind: jobs.EventKind(e.Kind), Phase: jobs.Phase(e.Phase), Token: e.Token,
			Renderer: e.Renderer, Attempt: e.Attempt, Reason: e.Reason, Message: e.Message, Principal: e.Principal})
	}
	return out
}

func phaseCounts(kv map[jobs.Phase]int64) jobs.Counts {
	var c jobs.Counts
	for p, n := range kv {
		c[p] = n
	}
	return c
}

func TestMigrateSchema1Fixture(t *testing.T) {
	t.Parallel()
	fx := copyFixture(t)
	before := rawJobs(t, fx.db)
	if len(before) != 8 {
		t.Fatalf("the fixture has %d jobs, want 8", len(before))
	}
	st := openFixture(t, fx.db, store.WithLegacyArtifacts(fx.arts))

	t.Run("Open reports what it migrated", func(t *testing.T) {
		want := store.Migration{From: 1, Jobs: 8, Artifacts: 1}
		if diff := cmp.Diff(want, st.Migration()); diff != "" {
			t.Errorf("Migration (-want +got):\n%s", diff)
		}
	})

	t.Run("Every job reads back with its whole history under the same seqs", func(t *testing.T) {
		err := st.View(func(tx *store.Tx) error {
			for id, old := range before {
				j, found, err := tx.JobWithHistory(id)
				if err != nil || !found {
					t.Fatalf("JobWithHistory(%d) = found %v, %v", id, found, err)
				}
				want := schema1Events(old)
				if diff := cmp.Diff(want, j.History); diff != "" {
					t.Errorf("job %d history (-schema 1 +migrated):\n%s", id, diff)
				}
				last := want[len(want)-1].Seq
				if j.EventSeq != last {
					t.Errorf("job %d EventSeq = %d, want its last seq %d", id, j.EventSeq, last)
				}
				if tail, err := tx.Events(id, uint64(last-1)); err != nil || len(tail) != 1 || tail[0].Seq != last {
					t.Errorf("job %d Events(after %d) = %v, %v; want only seq %d", id, last-1, tail, err, last)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	})

	t.Run("Leases, rejections and content sizes are derived from the history", func(t *testing.T) {
		live := func(tok uint64, r string) jobs.LeaseRecord { return jobs.LeaseRecord{Token: tok, Renderer: r} }
		ended := func(tok uint64, r string, kind jobs.LeaseEndKind, outcome string) jobs.LeaseRecord {
			return jobs.LeaseRecord{Token: tok, Renderer: r, Kind: kind, Outcome: outcome}
		}
		type derived struct {
			Leases         []jobs.LeaseRecord
			Rejected       []jobs.RejectionKey
			CancelRejected bool
			Undelivered    uint32
			ContentBytes   int64
		}
		want := map[uint64]derived{
			1: {Leases: []jobs.LeaseRecord{ended(1, "r-1", jobs.LeaseCompleted, "success:"+j1Digest)},
				Rejected: []jobs.RejectionKey{{Token: 101, Reason: "STALE_LEASE", Renderer: "r-9"}}, ContentBytes: 17},
			2: {Leases: []jobs.LeaseRecord{ended(2, "r-1", jobs.LeaseCompleted, "failure:TRANSIENT"), live(9, "r-2")}, ContentBytes: 20},
			3: {Leases: []jobs.LeaseRecord{ended(3, "r-1", jobs.LeaseExpired, ""), live(10, "r-2")}, ContentBytes: 19},
			4: {Leases: []jobs.LeaseRecord{ended(4, "r-1", jobs.LeaseRevoked, "")}, ContentBytes: 24},
			5: {Leases: []jobs.LeaseRecord{ended(5, "r-1", jobs.LeaseCompleted, "failure:INVALID_DOCUMENT")}, ContentBytes: 18},
			6: {Leases: []jobs.LeaseRecord{live(8, "r-2")}, ContentBytes: 22},
			7: {ContentBytes: 20},
			8: {Leases: []jobs.LeaseRecord{ended(6, "r-2", jobs.LeaseExpired, ""), ended(7, "r-2", jobs.LeaseCompleted, "failure:TRANSIENT")},
				ContentBytes: 20},
		}
		err := st.View(func(tx *store.Tx) error {
			for id, w := range want {
				j, _, err := tx.Job(id)
				if err != nil {
					t.Fatal(err)
				}
				got := derived{Leases: j.Leases, Rejected: j.Rejected, CancelRejected: j.CancelRejected, Undelivered: j.Undelivered, ContentBytes: j.ContentBytes}
				if diff := cmp.Diff(w, got); diff != "" {
					t.Errorf("job %d derived fields (-want +got):\n%s", id, diff)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	})

	t.Run("The fencing check judges the fixture's leases as schema 1 did", func(t *testing.T) {
		err := st.View(func(tx *store.Tx) error {
			j1, _, _ := tx.Job(1)
			if _, replayed, err := j1.Complete(jobs.Completion{Token: 1, Renderer: "r-1", Success: true, Digest: j1Digest}, t0, 0); !replayed || err != nil {
				t.Errorf("job 1: repeating its applied completion = replayed %v, %v; want a replay", replayed, err)
			}
			j3, _, _ := tx.Job(3)
			if err := j3.CheckLease(3, "r-1", t0); !errors.Is(err, jobs.ErrLeaseExpired) {
				t.Errorf("job 3: CheckLease of its expired lease 3 = %v, want ErrLeaseExpired", err)
			}
			j4, _, _ := tx.Job(4)
			if err := j4.CheckLease(4, "r-1", t0); !errors.Is(err, jobs.ErrJobCancelled) {
				t.Errorf("job 4: CheckLease of its revoked lease 4 = %v, want ErrJobCancelled", err)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	})

	t.Run("Job 1's preview is in the database under its lease, the late upload is not", func(t *testing.T) {
		content, err := os.ReadFile(filepath.Join(fx.arts, j1Digest[:2], j1Digest))
		if err != nil {
			t.Fatal(err)
		}
		err = st.View(func(tx *store.Tx) error {
			got, err := tx.Artifact(1, 1)
			if err != nil {
				t.Fatalf("Artifact(1, 1): %v", err)
			}
			want := store.Artifact{Digest: j1Digest, ContentType: "image/png", Content: content, Renderer: "r-1"}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("Artifact(1, 1) (-want +got):\n%s", diff)
			}
			if string(got.Content) != "png of j1" {
				t.Errorf("Artifact(1, 1) content = %q, want the fixture's %q", got.Content, "png of j1")
			}
			if _, err := tx.Artifact(1, 101); !errors.Is(err, store.ErrArtifactNotFound) {
				t.Errorf("Artifact(1, 101) of the rejected completion: err = %v, want ErrArtifactNotFound", err)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	})

	t.Run("Documents of succeeded and cancelled jobs are dropped, others kept raw", func(t *testing.T) {
		want := map[uint64]string{2: "content of flaky.pdf", 3: "content of held.pdf", 5: "content of bad.pdf",
			6: "content of waiting.pdf", 7: "content of setup.exe", 8: "content of twice.pdf"}
		got := map[uint64]string{}
		err := st.View(func(tx *store.Tx) error {
			for id := range before {
				if d := tx.Document(id); d != nil {
					got[id] = string(d)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("documents (-want +got):\n%s", diff)
		}
	})

	t.Run("The indexes and counts are built", func(t *testing.T) {
		err := st.View(func(tx *store.Tx) error {
			if diff := cmp.Diff([]uint64{2, 3, 6, 8}, tx.UnfinishedAfter(0, 100)); diff != "" {
				t.Errorf("unfinished (-want +got):\n%s", diff)
			}
			var loaded []uint64
			queued := func(q store.QueuedJob) error { loaded = append(loaded, q.ID); return nil }
			if err := tx.ForEachUnfinished(queued, func(j jobs.Job) error { loaded = append(loaded, j.ID); return nil }); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff([]uint64{2, 3, 6, 8}, loaded); diff != "" {
				t.Errorf("ForEachUnfinished (-want +got):\n%s", diff)
			}
			alpha := phaseCounts(map[jobs.Phase]int64{jobs.PhaseLeased: 3, jobs.PhaseSucceeded: 1, jobs.PhaseFailed: 1, jobs.PhaseCancelled: 1})
			beta := phaseCounts(map[jobs.Phase]int64{jobs.PhaseQueued: 1, jobs.PhaseFailed: 1})
			for batch, want := range map[uint64]jobs.Counts{1: alpha, 2: beta} {
				got, err := tx.BatchCounts(batch)
				if err != nil {
					t.Fatal(err)
				}
				if diff := cmp.Diff(want, got); diff != "" {
					t.Errorf("BatchCounts(%d) (-want +got):\n%s", batch, diff)
				}
			}
			teams := map[string]jobs.Counts{}
			if err := tx.ForEachTeamCounts(func(team string, c jobs.Counts) error { teams[team] = c; return nil }); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(map[string]jobs.Counts{"alpha": alpha, "beta": beta}, teams); diff != "" {
				t.Errorf("team counts (-want +got):\n%s", diff)
			}
			for team, want := range map[string][]uint64{"alpha": {1, 2, 3, 4, 5, 6}, "beta": {7, 8}} {
				if diff := cmp.Diff(want, tx.TeamJobsAfter(team, 0, 100)); diff != "" {
					t.Errorf("TeamJobsAfter(%s) (-want +got):\n%s", team, diff)
				}
			}
			for team, want := range map[string][]uint64{"alpha": {1}, "beta": {2}} {
				if diff := cmp.Diff(want, tx.TeamBatchesBefore(team, 0, 100)); diff != "" {
					t.Errorf("TeamBatchesBefore(%s) (-want +got):\n%s", team, diff)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	})

	t.Run("Batches, rejections, audit, dispatch and sequences are kept", func(t *testing.T) {
		err := st.View(func(tx *store.Tx) error {
			if b, found, err := tx.BatchByRequest("beta", "req-2"); err != nil || !found || b.ID != 2 || b.FirstJob != 7 || b.Count != 2 {
				t.Errorf("BatchByRequest(beta, req-2) = %+v found %v, %v; want batch 2 of jobs 7-8", b, found, err)
			}
			var rej []jobs.Rejection
			if err := tx.ForEachRejection(0, func(r jobs.Rejection) (bool, error) { rej = append(rej, r); return true, nil }); err != nil {
				t.Fatal(err)
			}
			if len(rej) != 1 || rej[0].Job != 1 || rej[0].Token != 101 || rej[0].Digest != latePngDigest {
				t.Errorf("rejections = %+v, want the one of job 1 token 101", rej)
			}
			replay, found, err := tx.ReplayByRequest("dev-operator", "replay-1")
			if err != nil || !found || !slices.Equal(replay.JobIDs, []uint64{8}) {
				t.Errorf("ReplayByRequest(dev-operator, replay-1) = %+v found %v, %v; want the replay of job 8", replay, found, err)
			}
			ds, err := tx.DispatchState()
			if err != nil || !ds.Paused || ds.Principal != "dev-operator" || ds.Reason != "rolling back" {
				t.Errorf("DispatchState = %+v, %v; want paused by dev-operator", ds, err)
			}
			if got := tx.LastToken(); got != 10 {
				t.Errorf("LastToken = %d, want 10", got)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Check(); err != nil {
			t.Errorf("Check after the migration: %v", err)
		}
	})

	st.Close()

	t.Run("The file says schema 2 and every other field of each record is kept", func(t *testing.T) {
		if version, cursor := rawMeta(t, fx.db); version != store.SchemaVersion || cursor != 0 {
			t.Errorf("after the migration: schema %d, cursor %d; want schema %d and no cursor", version, cursor, store.SchemaVersion)
		}
		after := rawJobs(t, fx.db)
		for id, old := range before {
			diff := cmp.Diff(old, after[id], protocmp.Transform(), protocmp.IgnoreFields(&storagev1.JobRecord{},
				"events", "completed_token", "completed_outcome", // schema 1 only
				"event_seq", "leases", "rejected", "cancel_rejected", "content_bytes", "undelivered")) // derived, checked above
			if diff != "" {
				t.Errorf("job %d record (-schema 1 +schema 2):\n%s", id, diff)
			}
		}
		if n := len(rawDump(t, fx.db)["artifacts"].Items); n != 1 {
			t.Errorf("the artifacts bucket holds %d previews, want only job 1's", n)
		}
	})

	t.Run("Reopening a migrated file changes nothing", func(t *testing.T) {
		want := rawDump(t, fx.db)
		again := openFixture(t, fx.db, store.WithLegacyArtifacts(fx.arts))
		if got := again.Migration(); got != (store.Migration{}) {
			t.Errorf("Migration on reopen = %+v, want none", got)
		}
		again.Close()
		if diff := cmp.Diff(want, rawDump(t, fx.db)); diff != "" {
			t.Errorf("file after a second Open (-before +after):\n%s", diff)
		}
	})
}

// migrated migrates a fresh copy of the fixture in one go and returns its
// contents.
func migrated(t *testing.T) map[string]rawBucket {
	t.Helper()
	fx := copyFixture(t)
	openFixture(t, fx.db, store.WithLegacyArtifacts(fx.arts)).Close()
	return rawDump(t, fx.db)
}

func TestMigrateResumesAfterAnInterruption(t *testing.T) {
	t.Parallel()
	want := migrated(t)

	t.Run("A chunk that fails is redone by the next Open", func(t *testing.T) {
		t.Parallel()
		fx := copyFixture(t)
		jobWrites := 0
		failSecondChunk := store.WithFault(func(bucket string) error {
			if bucket == "jobs" {
				jobWrites++
				if jobWrites == 4 {
					return store.ErrInjected
				}
			}
			return nil
		})
		if st, err := store.Open(fx.db, store.WithLegacyArtifacts(fx.arts), store.WithMigrateChunk(3), failSecondChunk); !errors.Is(err, store.ErrInjected) {
			if err == nil {
				st.Close()
			}
			t.Fatalf("Open failing in the second chunk: err = %v, want ErrInjected", err)
		}
		// The first chunk is committed, the second is not, and the file
		// still says schema 1.
		if version, cursor := rawMeta(t, fx.db); version != 1 || cursor != 3 {
			t.Errorf("after the interruption: schema %d, cursor %d; want schema 1, cursor 3", version, cursor)
		}
		for id, r := range rawJobs(t, fx.db) {
			if converted := len(r.Events) == 0; converted != (id <= 3) {
				t.Errorf("after the interruption job %d converted = %v, want %v", id, converted, id <= 3)
			}
		}

		st := openFixture(t, fx.db, store.WithLegacyArtifacts(fx.arts), store.WithMigrateChunk(3))
		if diff := cmp.Diff(store.Migration{From: 1, Jobs: 5}, st.Migration()); diff != "" {
			t.Errorf("Migration of the resumed Open (-want +got):\n%s", diff)
		}
		st.Close()
		if diff := cmp.Diff(want, rawDump(t, fx.db)); diff != "" {
			t.Errorf("resumed migration against an uninterrupted one (-uninterrupted +resumed):\n%s", diff)
		}
	})

	t.Run("A failure building the indexes is redone by the next Open", func(t *testing.T) {
		t.Parallel()
		fx := copyFixture(t)
		failIndexes := store.WithFault(func(bucket string) error {
			if bucket == "team_counts" {
				return store.ErrInjected
			}
			return nil
		})
		if st, err := store.Open(fx.db, store.WithLegacyArtifacts(fx.arts), failIndexes); !errors.Is(err, store.ErrInjected) {
			if err == nil {
				st.Close()
			}
			t.Fatalf("Open failing in the last step: err = %v, want ErrInjected", err)
		}
		if version, cursor := rawMeta(t, fx.db); version != 1 || cursor != 8 {
			t.Errorf("after the interruption: schema %d, cursor %d; want schema 1, cursor 8", version, cursor)
		}
		openFixture(t, fx.db, store.WithLegacyArtifacts(fx.arts)).Close()
		if diff := cmp.Diff(want, rawDump(t, fx.db)); diff != "" {
			t.Errorf("resumed migration against an uninterrupted one (-uninterrupted +resumed):\n%s", diff)
		}
	})

	t.Run("The chunk size does not change the result", func(t *testing.T) {
		t.Parallel()
		for _, n := range []int{1, 7, 8} {
			fx := copyFixture(t)
			openFixture(t, fx.db, store.WithLegacyArtifacts(fx.arts), store.WithMigrateChunk(n)).Close()
			if diff := cmp.Diff(want, rawDump(t, fx.db)); diff != "" {
				t.Errorf("migration in chunks of %d against one chunk (-one +chunked):\n%s", n, diff)
			}
		}
	})
}

func TestMigrateWithoutLegacyArtifacts(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		opts func(fixture) []store.Option
	}{
		{"No legacy directory configured", func(fixture) []store.Option { return nil }},
		{"An empty legacy directory", func(fx fixture) []store.Option {
			empty := filepath.Join(fx.dir, "empty")
			if err := os.Mkdir(empty, 0o700); err != nil {
				t.Fatal(err)
			}
			return []store.Option{store.WithLegacyArtifacts(empty)}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			fx := copyFixture(t)
			st := openFixture(t, fx.db, tc.opts(fx)...)
			if diff := cmp.Diff(store.Migration{From: 1, Jobs: 8, MissingArtifacts: 1}, st.Migration()); diff != "" {
				t.Errorf("Migration (-want +got):\n%s", diff)
			}
			err := st.View(func(tx *store.Tx) error {
				if _, err := tx.Artifact(1, 1); !errors.Is(err, store.ErrArtifactNotFound) {
					t.Errorf("Artifact(1, 1) err = %v, want ErrArtifactNotFound", err)
				}
				j, _, err := tx.Job(1)
				if err != nil || j.Phase != jobs.PhaseSucceeded || j.Artifact.Digest != j1Digest {
					t.Errorf("job 1 = phase %v, artifact %q, %v; want SUCCEEDED still naming its preview", j.Phase, j.Artifact.Digest, err)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}

// history drives a job through the real transitions, as the schema 1
// writer did, one second per step.
type history struct {
	t   *testing.T
	j   jobs.Job
	now time.Time
}

const ttl = 15 * time.Second

func (h *history) step() time.Time { h.now = h.now.Add(time.Second); return h.now }

func (h *history) must(j jobs.Job, err error) {
	h.t.Helper()
	if err != nil {
		h.t.Fatalf("job %d: %v", h.j.ID, err)
	}
	h.j = j
}

func (h *history) grant(token uint64, renderer string) {
	h.t.Helper()
	h.must(h.j.Grant(token, renderer, h.step(), ttl))
}

func (h *history) expire(heard bool) {
	h.t.Helper()
	h.now = h.now.Add(ttl)
	h.must(h.j.Expire(h.now, 0, heard))
}

func (h *history) requeue() {
	h.t.Helper()
	h.must(h.j.Requeue(h.step()))
}

// complete applies a completion; a refusal is part of the history too.
func (h *history) complete(c jobs.Completion) {
	h.j, _, _ = h.j.Complete(c, h.step(), 0)
}

func (h *history) cancel() {
	h.j, _, _ = h.j.Cancel("alice", "no longer needed", h.step(), true)
}

func success(token uint64, renderer string) jobs.Completion {
	return jobs.Completion{Token: token, Renderer: renderer, Success: true, Digest: "digest", Size: 3, ContentType: "image/png"}
}

func failure(token uint64, renderer string, class jobs.FailureClass) jobs.Completion {
	return jobs.Completion{Token: token, Renderer: renderer, Class: class, Message: "broken"}
}

// writeSchema1 writes a schema 1 file holding jobs as the schema 1 writer
// stored them: history inside the record, content wrapped, none of the
// fields schema 2 derives.
func writeSchema1(t *testing.T, path string, js []jobs.Job) {
	t.Helper()
	rawUpdate(t, path, func(tx *bbolt.Tx) error {
		for _, name := range []string{"meta", "jobs", "documents", "batches", "batch_requests", "rejections", "audit", "replay_requests", "tokens"} {
			if _, err := tx.CreateBucket([]byte(name)); err != nil {
				return err
			}
		}
		if err := tx.Bucket([]byte("meta")).Put([]byte("schema_version"), binary.BigEndian.AppendUint64(nil, 1)); err != nil {
			return err
		}
		batch, _ := proto.Marshal(&storagev1.BatchRecord{Id: 1, Team: "a", RequestId: "r", FirstJobId: 1, JobCount: uint32(len(js))})
		if err := tx.Bucket([]byte("batches")).Put(binary.BigEndian.AppendUint64(nil, 1), batch); err != nil {
			return err
		}
		for _, j := range js {
			v, err := store.EncodeJob(j)
			if err != nil {
				return err
			}
			r := &storagev1.JobRecord{}
			if err := proto.Unmarshal(v, r); err != nil {
				return err
			}
			r.EventSeq, r.Leases, r.Rejected, r.CancelRejected, r.ContentBytes, r.Undelivered, r.HandedBack = 0, nil, nil, false, 0, 0, 0
			for _, e := range j.Events {
				r.Events = append(r.Events, &storagev1.Event{Seq: e.Seq, At: e.At.UnixNano(), Kind: int32(e.Kind), Phase: int32(e.Phase),
					Token: e.Token, Renderer: e.Renderer, Attempt: e.Attempt, Reason: e.Reason, Message: e.Message, Principal: e.Principal})
			}
			key := binary.BigEndian.AppendUint64(nil, j.ID)
			if v, err = proto.Marshal(r); err != nil {
				return err
			}
			if err := tx.Bucket([]byte("jobs")).Put(key, v); err != nil {
				return err
			}
			doc, _ := proto.Marshal(&storagev1.DocumentRecord{Content: []byte("content")})
			if err := tx.Bucket([]byte("documents")).Put(key, doc); err != nil {
				return err
			}
		}
		return tx.Bucket([]byte("jobs")).SetSequence(uint64(len(js)))
	})
}

// TestMigrateDerivesWhatTheTransitionsKeep runs histories through the
// real transitions, stores them as schema 1 did, and checks that the
// migration derives from the history exactly the record the transitions
// kept.
func TestMigrateDerivesWhatTheTransitionsKeep(t *testing.T) {
	t.Parallel()
	policy := jobs.RetryPolicy{MaxAttempts: 3, BackoffBase: time.Second, BackoffCap: time.Minute}
	for _, tc := range []struct {
		name string
		run  func(h *history)
	}{
		{"Leases never heard from go back uncounted, and are counted", func(h *history) {
			h.grant(1, "r-1")
			h.expire(false)
			h.grant(2, "r-1")
			h.expire(false)
			h.grant(3, "r-2")
		}},
		{"Hand-backs and undelivered grants are released, not counted", func(h *history) {
			h.grant(1, "r-1")
			h.must(h.j.HandBack(1, "r-1", h.step(), 0))
			h.grant(2, "r-1")
			h.must(h.j.Release(2, "r-1", h.step(), jobs.ReleaseUndelivered))
			h.grant(3, "r-2")
			h.complete(success(3, "r-2"))
		}},
		{"Hand-backs past the cycle's free ones count as failed attempts", func(h *history) {
			for tok := uint64(1); tok <= 4; tok++ {
				h.grant(tok, "r-1")
				h.must(h.j.HandBack(tok, "r-1", h.step(), 0))
			}
			h.now = h.j.NextAttemptAt
			h.requeue()
			h.grant(5, "r-2")
		}},
		{"Every kind of refusal is recorded once", func(h *history) {
			h.grant(1, "r-1")
			h.complete(failure(99, "r-1", jobs.ClassTransient)) // never granted
			h.complete(failure(99, "r-1", jobs.ClassTransient)) // the same again: not recorded
			h.complete(success(1, "r-9"))                       // not the holder
			h.complete(failure(1, "r-1", jobs.ClassTransient))
			h.complete(success(1, "r-1")) // another outcome for an applied completion
			h.requeue()
			h.grant(2, "r-1")
			h.complete(success(2, "r-1"))
			h.cancel()
			h.cancel() // refused once only
		}},
		{"A cancel revokes the lease and its acknowledgement is kept", func(h *history) {
			h.grant(1, "r-1")
			h.cancel()
			h.j, _ = h.j.AckCancel(1, "r-1", h.step())
			h.complete(success(1, "r-1"))
		}},
		{"A permanent failure completes the lease", func(h *history) {
			h.grant(1, "r-1")
			h.complete(failure(1, "r-1", jobs.ClassInvalidDocument))
		}},
		{"A replay starts a cycle without its refusals and uncounted expiries", func(h *history) {
			h.grant(1, "r-1")
			h.expire(false)
			h.grant(2, "r-1")
			h.complete(failure(2, "r-1", jobs.ClassTransient))
			h.requeue()
			h.grant(3, "r-1")
			h.expire(true)
			h.requeue()
			h.grant(4, "r-1")
			h.complete(failure(4, "r-1", jobs.ClassTransient)) // exhausted
			h.complete(success(2, "r-9"))
			h.cancel()
			h.must(h.j.Replay("ops", "fixed", false, h.step()))
			h.grant(5, "r-2")
			h.expire(false)
			h.grant(6, "r-2")
			h.complete(success(4, "r-9"))
		}},
		{"A refusal past the bound is counted, not recorded", func(h *history) {
			h.grant(1, "r-1")
			for tok := range uint64(jobs.MaxRejectionEvents + 5) {
				h.complete(success(100+tok, "r-1"))
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := &history{t: t, now: t0}
			h.j = jobs.New(1, 1, "a", jobs.Document{Name: "d.pdf", ContentType: "application/pdf"}, policy, false, h.now)
			tc.run(h)
			path := filepath.Join(t.TempDir(), "leasehold.db")
			writeSchema1(t, path, []jobs.Job{h.j})

			st := openFixture(t, path)
			want := h.j
			want.ContentBytes = int64(len("content"))
			// What the transitions appended is what a read returns as the
			// stored history.
			want.History, want.Events = want.Events, nil
			err := st.View(func(tx *store.Tx) error {
				got, found, err := tx.JobWithHistory(1)
				if err != nil || !found {
					t.Fatalf("JobWithHistory(1) = found %v, %v", found, err)
				}
				if diff := cmp.Diff(want, got, cmpopts.EquateEmpty()); diff != "" {
					t.Errorf("migrated job (-transitions +migrated):\n%s", diff)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}
