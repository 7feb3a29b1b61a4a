package store_test

import (
	"io"
	"path/filepath"
	"runtime"
	"sync/atomic"
	"testing"

	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	"github.com/leasehold/leasehold/coordinator/internal/store"
)

// TestYieldable: a writer's transaction made yieldable is ended by the
// next writer of the store, which then goes on, instead of waiting for
// it; one that is not yieldable is waited for; and a writer already
// waiting when the holder becomes yieldable ends it at once.
func TestYieldable(t *testing.T) {
	t.Parallel()
	begin := func(t *testing.T, st *store.Store, id uint64) *store.Tx {
		t.Helper()
		tx, err := st.Begin()
		if err != nil {
			t.Fatal(err)
		}
		if err := tx.PutJob(jobs.Job{ID: id, BatchID: 1, Team: "alpha", Phase: jobs.PhaseQueued, CreatedAt: t0}); err != nil {
			t.Fatal(err)
		}
		return tx
	}
	hasJob := func(t *testing.T, st *store.Store, id uint64) bool {
		t.Helper()
		found := false
		if err := st.View(func(tx *store.Tx) (err error) {
			_, found, err = tx.Job(id)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return found
	}

	t.Run("TheNextWriterEndsIt", func(t *testing.T) {
		t.Parallel()
		st := openAt(t, filepath.Join(t.TempDir(), "s.db"))
		tx := begin(t, st, 1)
		var yields atomic.Int32
		tx.Yieldable(func() {
			yields.Add(1)
			if err := tx.Rollback(); err != nil {
				t.Error(err)
			}
		})
		// The replica's batch, the store's own updates and the writer's
		// next group all go through the one lock.
		b, err := st.BeginBatch()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.Commit(); err != nil {
			t.Fatal(err)
		}
		if _, err := st.SkipEntry(9); err != nil {
			t.Fatal(err)
		}
		next := begin(t, st, 2)
		if err := next.Commit(); err != nil {
			t.Fatal(err)
		}
		if n := yields.Load(); n != 1 {
			t.Fatalf("yield called %d times, want 1", n)
		}
		if hasJob(t, st, 1) || !hasJob(t, st, 2) {
			t.Fatalf("the yielded group stored %v, the next %v; want false, true", hasJob(t, st, 1), hasJob(t, st, 2))
		}
	})

	// batchWaiting begins a batch on another goroutine and returns once
	// it waits for the store's write lock (the write lock's own count,
	// not bbolt's lock, which would hold it up as well): done then gets
	// the batch's outcome, once it began and committed.
	batchWaiting := func(st *store.Store) <-chan error {
		done := make(chan error, 1)
		go func() {
			b, err := st.BeginBatch()
			if err == nil {
				_, err = b.Commit()
			}
			done <- err
		}()
		for st.WritersWaiting() == 0 {
			runtime.Gosched()
		}
		return done
	}

	t.Run("AHolderThatIsNotYieldableIsWaitedFor", func(t *testing.T) {
		t.Parallel()
		st := openAt(t, filepath.Join(t.TempDir(), "s.db"))
		tx := begin(t, st, 1)
		done := batchWaiting(st)
		select {
		case err := <-done:
			t.Fatalf("a batch began while the writer's transaction was open: %v", err)
		default:
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if !hasJob(t, st, 1) {
			t.Fatal("the writer's group was not committed")
		}
	})

	t.Run("AWaitingWriterEndsItOnceYieldable", func(t *testing.T) {
		t.Parallel()
		st := openAt(t, filepath.Join(t.TempDir(), "s.db"))
		tx := begin(t, st, 1)
		done := batchWaiting(st)
		ended := make(chan struct{})
		tx.Yieldable(func() {
			if err := tx.Rollback(); err != nil {
				t.Error(err)
			}
			close(ended)
		})
		// Nobody else ends tx: the waiting batch must.
		<-ended
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if hasJob(t, st, 1) {
			t.Fatal("the yielded group was committed")
		}
	})

	t.Run("ReplaceFileEndsIt", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		other := openAt(t, filepath.Join(dir, "other.db"))
		sn, err := other.Snapshot()
		if err != nil {
			t.Fatal(err)
		}
		defer sn.Release()
		st := openAt(t, filepath.Join(dir, "s.db"))
		tx := begin(t, st, 1)
		tx.Yieldable(func() { _ = tx.Rollback() })
		r, w := io.Pipe()
		go func() { _, err := sn.WriteTo(w); w.CloseWithError(err) }()
		if err := st.ReplaceFile(r); err != nil {
			t.Fatal(err)
		}
		if hasJob(t, st, 1) {
			t.Fatal("the yielded group is in the restored store")
		}
	})
}
