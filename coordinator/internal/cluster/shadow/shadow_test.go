package shadow_test

import (
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/cluster/shadow"
	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	"github.com/leasehold/leasehold/coordinator/internal/store"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

type testBundle struct {
	primary, replica *store.Store
	shadow           *shadow.Shadow
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	dir := t.TempDir()
	b := &testBundle{}
	for _, s := range []struct {
		st   **store.Store
		name string
	}{{&b.primary, "primary.db"}, {&b.replica, "replica.db"}} {
		st, err := store.Open(filepath.Join(dir, s.name))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		*s.st = st
	}
	sh, err := shadow.New(b.primary, b.replica)
	if err != nil {
		t.Fatal(err)
	}
	b.shadow = sh
	return b
}

// group writes one job in a recording transaction committed through the
// shadow, as the writer does.
func (b *testBundle) group(t *testing.T, id uint64) {
	t.Helper()
	tx, err := b.primary.Begin()
	if err != nil {
		t.Fatal(err)
	}
	if !b.shadow.Record() {
		t.Fatal("a shadow must record write sets")
	}
	tx.Record()
	if err := putJob(tx, id); err != nil {
		_ = tx.Rollback()
		t.Fatal(err)
	}
	if err := b.shadow.Commit(tx, t0); err != nil {
		t.Fatalf("Commit: %v", err)
	}
}

func putJob(tx *store.Tx, id uint64) error {
	if _, err := tx.NextJobIDs(1); err != nil {
		return err
	}
	j := jobs.Job{ID: id, BatchID: 1, Team: "alpha", Phase: jobs.PhaseQueued, CreatedAt: t0}
	if err := tx.PutJob(j); err != nil {
		return err
	}
	return tx.SetUnfinished(id, true)
}

func TestShadow(t *testing.T) {
	t.Parallel()

	t.Run("ReplicatesEveryGroup", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		for id := uint64(1); id <= 3; id++ {
			b.group(t, id)
		}
		if err := b.shadow.Compare(); err != nil {
			t.Fatalf("Compare after 3 groups: %v", err)
		}
		if err := b.shadow.Err(); err != nil || b.shadow.Groups() != 3 {
			t.Fatalf("after 3 groups: Err %v, Groups %d", err, b.shadow.Groups())
		}
		rs, _ := b.replica.ReplicaState()
		if rs.Group != 3 {
			t.Fatalf("the replica applied up to %d, want 3", rs.Group)
		}
	})

	t.Run("CatchesAWriteThatBypassesTheRecorder", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.group(t, 1)
		// A planted write outside the writer's recorded transaction.
		if err := b.primary.Update(func(tx *store.Tx) error { return putJob(tx, 2) }); err != nil {
			t.Fatal(err)
		}
		b.group(t, 3)
		if err := b.shadow.Err(); err != nil {
			t.Fatalf("the group after an unrecorded write of other keys failed its own check: %v", err)
		}
		if err := b.shadow.Compare(); !errors.Is(err, shadow.ErrMismatch) || !errors.Is(b.shadow.Err(), shadow.ErrMismatch) {
			t.Fatalf("after an unrecorded write: Compare = %v, Err = %v, want ErrMismatch", err, b.shadow.Err())
		}
	})

	t.Run("RefusesStoresThatDifferAtTheStart", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		if err := b.primary.Update(func(tx *store.Tx) error { return putJob(tx, 1) }); err != nil {
			t.Fatal(err)
		}
		if _, err := shadow.New(b.primary, b.replica); !errors.Is(err, shadow.ErrMismatch) {
			t.Fatalf("NewShadow over different stores: %v, want ErrMismatch", err)
		}
	})
}
