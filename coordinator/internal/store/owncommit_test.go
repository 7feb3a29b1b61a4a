package store_test

import (
	"errors"
	"path/filepath"
	"testing"

	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	"github.com/leasehold/leasehold/coordinator/internal/store"
)

// TestCommitAsEntry: a writer's transaction committed as a replicated
// entry holds what applying its write set holds, bookkeeping included,
// and one that cannot stand for the entry (a replay, another base) is
// left open for its caller to roll back.
func TestCommitAsEntry(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	leader := openAt(t, filepath.Join(dir, "leader.db"))
	follower := openAt(t, filepath.Join(dir, "follower.db"))
	evaluate := func(id uint64) *store.Tx {
		t.Helper()
		tx, err := leader.Begin()
		if err != nil {
			t.Fatal(err)
		}
		tx.Record()
		if err := tx.PutJob(jobs.Job{ID: id, BatchID: 1, Team: "alpha", Phase: jobs.PhaseQueued, CreatedAt: t0}); err != nil {
			t.Fatal(err)
		}
		return tx
	}

	tx := evaluate(1)
	ws := tx.WriteSet(0, t0)
	if rs, ok, err := leader.CommitAsEntry(tx, 5, 0, t0); !ok || err != nil || rs.Applied != 5 || rs.Group != 5 {
		t.Fatalf("CommitAsEntry on its base: %+v, %v, %v", rs, ok, err)
	}
	if err := follower.ApplyWriteSet(5, ws); err != nil {
		t.Fatal(err)
	}
	rl, _ := leader.ReplicaState()
	rf, _ := follower.ReplicaState()
	if digest(t, leader) != digest(t, follower) || rl != rf {
		t.Fatalf("committed as its entry and applied differ: replica state %+v and %+v", rl, rf)
	}

	for _, c := range []struct {
		name        string
		index, base uint64
	}{{"a replay", 5, 5}, {"another base", 6, 4}} {
		tx := evaluate(2)
		_, ok, err := leader.CommitAsEntry(tx, c.index, c.base, t0)
		if ok || err != nil {
			t.Fatalf("CommitAsEntry of %s: %v, %v; want false, nil", c.name, ok, err)
		}
		if err := tx.Rollback(); err != nil {
			t.Fatalf("%s: the transaction was not left open: %v", c.name, err)
		}
	}
	if digest(t, leader) != digest(t, follower) {
		t.Fatal("a transaction that could not stand for its entry changed the store")
	}
}

// TestTxGroup: a transaction's group is the index of the last write set
// applied to what it reads, not the last entry applied: an entry that
// wrote nothing (here one on another base) moves the applied index only.
func TestTxGroup(t *testing.T) {
	t.Parallel()
	st := openAt(t, filepath.Join(t.TempDir(), "s.db"))
	ws := func(base, id uint64) []byte {
		t.Helper()
		tx, err := st.Begin()
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		tx.Record()
		if err := tx.PutJob(jobs.Job{ID: id, BatchID: 1, Team: "alpha", Phase: jobs.PhaseQueued, CreatedAt: t0}); err != nil {
			t.Fatal(err)
		}
		return tx.WriteSet(base, t0)
	}
	if err := st.ApplyWriteSet(3, ws(0, 1)); err != nil {
		t.Fatal(err)
	}
	if err := st.ApplyWriteSet(4, ws(2, 2)); !errors.Is(err, store.ErrStaleBase) {
		t.Fatalf("a write set on another base: %v, want ErrStaleBase", err)
	}
	tx, err := st.Begin()
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if rs, _ := st.ReplicaState(); tx.Group() != 3 || rs.Applied != 4 {
		t.Fatalf("Group %d with entry %d applied; want 3 and 4", tx.Group(), rs.Applied)
	}
}
