package store_test

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	"github.com/leasehold/leasehold/coordinator/internal/store"
	"go.etcd.io/bbolt"
)

// consistent writes a batch of three jobs as the writer would leave them:
// one SUCCEEDED after two leases, one LEASED, one QUEUED, with their
// indexes and counts, and the token counter at 3.
func consistent(t *testing.T, b *testBundle) {
	t.Helper()
	b.update(t, func(tx *store.Tx) error {
		for range 3 {
			if _, err := tx.NextToken(); err != nil {
				return err
			}
		}
		if _, err := tx.NextJobIDs(3); err != nil {
			return err
		}
		if _, err := tx.NextBatchID(); err != nil {
			return err
		}
		if err := tx.PutBatch(jobs.Batch{ID: 1, Team: "a", RequestID: "r", CreatedAt: t0, FirstJob: 1, Count: 3}); err != nil {
			return err
		}
		done := jobs.Job{ID: 1, BatchID: 1, Team: "a", Phase: jobs.PhaseSucceeded, Leases: []jobs.LeaseRecord{
			{Token: 1, Kind: jobs.LeaseExpired}, {Token: 2, Kind: jobs.LeaseCompleted, Outcome: jobs.Outcome(true, "d", 0)}},
			Artifact: jobs.Artifact{Token: 2, Digest: "d", Size: 3, Renderer: "r"}}
		if err := tx.PutArtifact(1, 2, store.Artifact{Digest: "d", ContentType: "image/png", Content: []byte("png"), Renderer: "r"}); err != nil {
			return err
		}
		leased := jobs.Job{ID: 2, BatchID: 1, Team: "a", Phase: jobs.PhaseLeased, Lease: jobs.Lease{Token: 3},
			Leases: []jobs.LeaseRecord{{Token: 3}}}
		queued := jobs.Job{ID: 3, BatchID: 1, Team: "a", Phase: jobs.PhaseQueued}
		var counts jobs.Counts
		for _, j := range []jobs.Job{done, leased, queued} {
			if err := tx.PutJob(j); err != nil {
				return err
			}
			if err := tx.IndexTeamJob(j.Team, j.ID); err != nil {
				return err
			}
			var err error
			if j.Phase.Terminal() {
				err = tx.IndexFinished(j)
			} else {
				err = tx.SetUnfinished(j.ID, true)
			}
			if err != nil {
				return err
			}
			counts[j.Phase]++
		}
		if err := tx.AddBatchCounts(1, counts); err != nil {
			return err
		}
		return tx.AddTeamCounts("a", counts)
	})
}

func TestVerify(t *testing.T) {
	t.Parallel()

	t.Run("A consistent store has no problems", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		consistent(t, b)
		b.close(t)
		st, err := store.OpenReadOnly(b.path)
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		got, err := st.Verify()
		if err != nil {
			t.Fatal(err)
		}
		want := store.Summary{Schema: store.SchemaVersion, Jobs: 3, Unfinished: 2, Batches: 1, LastToken: 3}
		if got.Schema != want.Schema || got.Jobs != want.Jobs || got.Unfinished != want.Unfinished ||
			got.Batches != want.Batches || got.LastToken != want.LastToken || len(got.Problems) != 0 {
			t.Errorf("Verify() = %+v, want %+v", got, want)
		}
	})

	for _, tc := range []struct {
		name    string
		corrupt func(tx *store.Tx) error
		want    string
	}{
		{"A finished job left in the unfinished index is reported", func(tx *store.Tx) error {
			return tx.SetUnfinished(1, true)
		}, "job 1: phase SUCCEEDED, but in the index of unfinished jobs: true"},
		{"A live job missing from the unfinished index is reported", func(tx *store.Tx) error {
			return tx.SetUnfinished(3, false)
		}, "job 3: phase QUEUED, but in the index of unfinished jobs: false"},
		{"Counts that disagree with the jobs are reported", func(tx *store.Tx) error {
			var d jobs.Counts
			d[jobs.PhaseQueued] = 1
			return tx.AddBatchCounts(1, d)
		}, "batch 1: counts per phase"},
		{"Team counts that disagree with the jobs are reported", func(tx *store.Tx) error {
			var d jobs.Counts
			d[jobs.PhaseFailed] = 1
			return tx.AddTeamCounts("a", d)
		}, "team a: counts per phase"},
		{"A token granted twice is reported", func(tx *store.Tx) error {
			return tx.PutJob(jobs.Job{ID: 3, BatchID: 1, Team: "a", Phase: jobs.PhaseQueued, Leases: []jobs.LeaseRecord{{Token: 2, Kind: jobs.LeaseReleased}}})
		}, "job 3: lease token 2 was also granted to job 1"},
		{"A token above the counter is reported", func(tx *store.Tx) error {
			return tx.PutJob(jobs.Job{ID: 3, BatchID: 1, Team: "a", Phase: jobs.PhaseQueued, Leases: []jobs.LeaseRecord{{Token: 9, Kind: jobs.LeaseReleased}}})
		}, "job 3: lease token 9 is not between 1 and the token counter 3"},
		{"A LEASED job whose lease is not its last is reported", func(tx *store.Tx) error {
			return tx.PutJob(jobs.Job{ID: 2, BatchID: 1, Team: "a", Phase: jobs.PhaseLeased, Lease: jobs.Lease{Token: 3},
				Leases: []jobs.LeaseRecord{{Token: 3, Kind: jobs.LeaseExpired}}})
		}, "job 2: LEASED under token 3, which is not its last, live lease"},
		{"A batch stored in part is reported", func(tx *store.Tx) error {
			return tx.PutBatch(jobs.Batch{ID: 1, Team: "a", RequestID: "r", CreatedAt: t0, FirstJob: 1, Count: 4})
		}, "batch 1: job 4 is missing"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			consistent(t, b)
			b.update(t, tc.corrupt)
			got, err := b.st.Verify()
			if err != nil {
				t.Fatal(err)
			}
			if !containsPrefix(got.Problems, tc.want) {
				t.Errorf("Verify().Problems = %q, want one starting %q", got.Problems, tc.want)
			}
		})
	}

	t.Run("A file of no coordinator is reported", func(t *testing.T) {
		t.Parallel()
		path := filepath.Join(t.TempDir(), "other.db")
		rawUpdate(t, path, func(tx *bbolt.Tx) error {
			_, err := tx.CreateBucket([]byte("theirs"))
			return err
		})
		st, err := store.OpenReadOnly(path)
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		got, err := st.Verify()
		if err != nil {
			t.Fatal(err)
		}
		if !containsPrefix(got.Problems, "the file has no schema version") {
			t.Errorf("Verify().Problems = %q, want the missing schema version", got.Problems)
		}
	})

	t.Run("A file a coordinator holds is refused", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		if _, err := store.OpenReadOnly(b.path); !errors.Is(err, store.ErrLocked) {
			t.Errorf("OpenReadOnly of an open file = %v, want ErrLocked", err)
		}
	})

	t.Run("A missing file is an error and is not created", func(t *testing.T) {
		t.Parallel()
		path := filepath.Join(t.TempDir(), "none.db")
		if _, err := store.OpenReadOnly(path); err == nil {
			t.Errorf("OpenReadOnly(%s) = nil error, want one", path)
		}
		if _, err := os.Stat(path); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("after OpenReadOnly(%s): Stat = %v, want fs.ErrNotExist", path, err)
		}
	})
}

// containsPrefix reports whether one of list starts with prefix.
func containsPrefix(list []string, prefix string) bool {
	for _, s := range list {
		if strings.HasPrefix(s, prefix) {
			return true
		}
	}
	return false
}

func TestVerifyAfterAPartialPurge(t *testing.T) {
	t.Parallel()
	b := setup(t)
	consistent(t, b)
	b.update(t, func(tx *store.Tx) error {
		j, _, err := tx.Job(1)
		if err != nil {
			return err
		}
		if err := tx.PurgeJob(j); err != nil {
			return err
		}
		var d jobs.Counts
		d[jobs.PhaseSucceeded] = -1
		if err := tx.AddBatchCounts(1, d); err != nil {
			return err
		}
		return tx.AddTeamCounts("a", d)
	})
	got, err := b.st.Verify()
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Problems) != 0 {
		t.Errorf("Verify after retention purged one job of a batch: %q, want no problems", got.Problems)
	}
	b.view(t, func(tx *store.Tx) error {
		if batch, _, err := tx.Batch(1); err != nil || batch.Purged != 1 {
			t.Errorf("batch 1 after one purge: Purged %d (%v), want 1", batch.Purged, err)
		}
		return nil
	})

	// A job lost besides the purged one is still reported.
	b.update(t, func(tx *store.Tx) error {
		var d jobs.Counts
		d[jobs.PhaseQueued] = -1
		if err := tx.AddBatchCounts(1, d); err != nil {
			return err
		}
		if err := tx.AddTeamCounts("a", d); err != nil {
			return err
		}
		if err := tx.SetUnfinished(3, false); err != nil {
			return err
		}
		return tx.DeleteJobRecord(3)
	})
	got, err = b.st.Verify()
	if err != nil {
		t.Fatal(err)
	}
	if !containsPrefix(got.Problems, "batch 1: job 1 is missing") || !containsPrefix(got.Problems, "batch 1: job 3 is missing") {
		t.Errorf("Verify with a job lost beside the purged one: %q, want both named", got.Problems)
	}
}

// TestVerifySince shows that a token seen at the previous check is not
// taken as settled when another job holds it now (the first job's record
// purged meanwhile, say), and that the counter may not go back.
func TestVerifySince(t *testing.T) {
	t.Parallel()
	b := setup(t)
	consistent(t, b)
	sum, now, err := b.st.VerifySince(store.TokenState{})
	if err != nil || sum.Err() != nil {
		t.Fatalf("the first check: %v, %v", err, sum.Err())
	}
	if now.Tokens[3] != 2 || now.LastToken != 3 || now.LeasesTo[""] != 3 {
		t.Fatalf("the first check saw %+v, want token 3 as job 2's, counter 3, 3 leases", now)
	}
	prev := now
	prev.Tokens = map[uint64]uint64{3: 1}
	if sum, _, _ := b.st.VerifySince(prev); sum.Err() == nil || !strings.Contains(sum.Err().Error(), "was job 1's") {
		t.Errorf("a token earlier another job's: %v, want a problem naming the earlier job", sum.Err())
	}
	prev = now
	prev.LastToken = 9
	if sum, _, _ := b.st.VerifySince(prev); sum.Err() == nil || !strings.Contains(sum.Err().Error(), "went back") {
		t.Errorf("a counter below the previous check's: %v, want a problem", sum.Err())
	}
}
