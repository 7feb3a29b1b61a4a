package store_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/leasehold/leasehold/coordinator/internal/store"
)

var (
	snapTeams  = []string{"a", "ab", "b"}
	snapProbes = [][2]uint64{{1, 39}, {1, 40}, {2, 40}}
)

// backup writes a backup of b's store to a new file and returns its path
// and what WriteBackup announced.
func backup(t *testing.T, b *testBundle) (string, store.BackupInfo) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "backup.db")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var info store.BackupInfo
	n, err := b.st.WriteBackup(f, func(i store.BackupInfo) error { info = i; return nil })
	if err != nil {
		t.Fatalf("WriteBackup: %v", err)
	}
	if n != info.Size {
		t.Errorf("WriteBackup wrote %d bytes, announced %d", n, info.Size)
	}
	return path, info
}

// openAt opens a store at path for the rest of the test.
func openAt(t *testing.T, path string) *store.Store {
	t.Helper()
	st, err := store.Open(path)
	if err != nil {
		t.Fatalf("Open(%s): %v", path, err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

func TestWriteBackup(t *testing.T) {
	t.Parallel()
	b := setup(t)
	populate(t, b)
	want := takeSnapshot(t, b.st, snapTeams, snapProbes)
	path, info := backup(t, b)
	if info.Schema != store.SchemaVersion || info.LastToken != 41 {
		t.Errorf("backup info = %+v, want schema %d and last token 41", info, store.SchemaVersion)
	}
	got := takeSnapshot(t, openAt(t, path), snapTeams, snapProbes)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("the backup opened as a store (-original +backup):\n%s", diff)
	}
}

// stallingWriter is a backup's reader that stops reading: its first Write
// says so on writing and returns only once release is closed.
type stallingWriter struct {
	writing, release chan struct{}
	once             bool
	got              bytes.Buffer
}

func (w *stallingWriter) Write(p []byte) (int, error) {
	if !w.once {
		w.once = true
		close(w.writing)
		<-w.release
	}
	return w.got.Write(p)
}

// hangGuard bounds the wait for a write the old backup made wait forever;
// it only turns that hang into a failure, and a passing run never waits
// on it.
const hangGuard = 30 * time.Second

// TestWriteBackupHoldsNoTransactionWhileItsReaderStalls checks that a
// backup whose reader stops reading does not stop the writer when the
// file outgrows its mapping (bbolt remaps only once every reader has
// ended), and that the copy is the database as it was when the backup
// began.
func TestWriteBackupHoldsNoTransactionWhileItsReaderStalls(t *testing.T) {
	t.Parallel()
	b := setup(t, store.WithInitialMmapSize(1<<16))
	populate(t, b)
	doc := func(id uint64) []byte { return bytes.Repeat([]byte{byte(id)}, 64<<10) }
	b.update(t, func(tx *store.Tx) error {
		for id := uint64(100); id < 116; id++ {
			if err := tx.PutDocument(id, doc(id)); err != nil {
				return err
			}
		}
		return nil
	})

	w := &stallingWriter{writing: make(chan struct{}), release: make(chan struct{})}
	type result struct {
		n    int64
		info store.BackupInfo
		err  error
	}
	backedUp := make(chan result, 1)
	go func() {
		var r result
		r.n, r.err = b.st.WriteBackup(w, func(i store.BackupInfo) error { r.info = i; return nil })
		backedUp <- r
	}()
	<-w.writing

	// 8 MiB more: far past the 64 KiB mapping and the file's size.
	wrote := make(chan error, 1)
	go func() {
		wrote <- b.st.Update(func(tx *store.Tx) error {
			for id := uint64(200); id < 328; id++ {
				if err := tx.PutDocument(id, doc(id)); err != nil {
					return err
				}
			}
			return nil
		})
	}()
	select {
	case err := <-wrote:
		if err != nil {
			t.Fatalf("Update while the backup's reader stalls: %v", err)
		}
	case <-time.After(hangGuard):
		close(w.release)
		<-wrote
		<-backedUp
		t.Fatalf("a write that grows the file waited for a backup whose reader stopped reading")
	}
	err := b.st.View(func(tx *store.Tx) error {
		if got := tx.Document(327); !bytes.Equal(got, doc(327)) {
			t.Errorf("a read after the write found %d bytes of document 327, want %d", len(got), len(doc(327)))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	close(w.release)
	r := <-backedUp
	if r.err != nil || r.n != r.info.Size || int64(w.got.Len()) != r.info.Size {
		t.Fatalf("WriteBackup = %d bytes, %v; announced %d, reader got %d", r.n, r.err, r.info.Size, w.got.Len())
	}
	path := filepath.Join(t.TempDir(), "backup.db")
	if err := os.WriteFile(path, w.got.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	err = openAt(t, path).View(func(tx *store.Tx) error {
		if got := tx.Document(115); !bytes.Equal(got, doc(115)) {
			t.Errorf("the backup has %d bytes of document 115, written before it began; want %d", len(got), len(doc(115)))
		}
		if got := tx.Document(200); got != nil {
			t.Errorf("the backup has document 200, written after it began")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(filepath.Dir(b.path))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Name() != filepath.Base(b.path) {
			t.Errorf("the backup left %s beside the database", e.Name())
		}
	}
}

func TestCompact(t *testing.T) {
	t.Parallel()
	b := setup(t)
	populate(t, b)
	// Grow the file, then free most of it.
	b.update(t, func(tx *store.Tx) error {
		for id := uint64(100); id < 1100; id++ {
			if err := tx.PutDocument(id, bytes.Repeat([]byte{byte(id)}, 4096)); err != nil {
				return err
			}
		}
		return nil
	})
	b.update(t, func(tx *store.Tx) error {
		for id := uint64(100); id < 1100; id++ {
			if err := tx.DeleteDocument(id); err != nil {
				return err
			}
		}
		return nil
	})
	want := takeSnapshot(t, b.st, snapTeams, snapProbes)

	t.Run("ACoordinatorHoldingTheFileIsRefused", func(t *testing.T) {
		_, err := store.Compact(b.path)
		if !errors.Is(err, store.ErrLocked) {
			t.Errorf("Compact of an open file: %v, want ErrLocked", err)
		}
	})
	b.close(t)

	t.Run("TheCopyHoldsEverythingInLess", func(t *testing.T) {
		res, err := store.Compact(b.path)
		if err != nil {
			t.Fatalf("Compact: %v", err)
		}
		if res.After >= res.Before/2 {
			t.Errorf("compacted %d bytes to %d, want less than half", res.Before, res.After)
		}
		if fi, err := os.Stat(b.path); err != nil || fi.Size() != res.After {
			t.Errorf("the file is %v bytes (%v), want %d", fi.Size(), err, res.After)
		}
		if _, err := os.Stat(b.path + ".compact"); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the temporary copy is left behind: %v", err)
		}
		b.open(t)
		if diff := cmp.Diff(want, takeSnapshot(t, b.st, snapTeams, snapProbes)); diff != "" {
			t.Errorf("after compaction (-before +after):\n%s", diff)
		}
	})

	t.Run("AMissingFileIsAnError", func(t *testing.T) {
		if _, err := store.Compact(filepath.Join(t.TempDir(), "none.db")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("Compact of a missing file: %v, want ErrNotExist", err)
		}
	})
}

func TestRestore(t *testing.T) {
	t.Parallel()
	const skip = 1 << 32
	b := setup(t)
	populate(t, b)
	want := takeSnapshot(t, b.st, snapTeams, snapProbes)
	path, _ := backup(t, b)
	// What the original writes after the backup is lost by the restore.
	b.update(t, func(tx *store.Tx) error {
		_, err := tx.PutRejection(fullRejection(1, 50, t0))
		return err
	})

	t.Run("ARunningCoordinatorIsRefused", func(t *testing.T) {
		_, err := store.Restore(path, b.path, skip, t0)
		if !errors.Is(err, store.ErrLocked) {
			t.Errorf("Restore over an open file: %v, want ErrLocked", err)
		}
	})
	b.close(t)

	t.Run("TheBackupReplacesTheFileWithSequencesMovedOn", func(t *testing.T) {
		res, err := store.Restore(path, b.path, skip, t0)
		if err != nil {
			t.Fatalf("Restore: %v", err)
		}
		if res.LastToken != 41 || res.NextToken != 42+skip || res.MovedAside == "" {
			t.Errorf("Restore = %+v, want last token 41, next %d, the old file kept", res, 42+skip)
		}
		b.open(t)
		got := takeSnapshot(t, b.st, snapTeams, snapProbes)
		want := want
		want.LastToken += skip
		want.NextToken += skip
		want.NextJobID += skip
		want.NextBatchID += skip
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("restored (-backup +restored):\n%s", diff)
		}
		b.close(t)
		old := takeSnapshot(t, openAt(t, res.MovedAside), snapTeams, snapProbes)
		if len(old.Rejections) != 2 {
			t.Errorf("the file kept aside has %d rejections, want the 2 it had", len(old.Rejections))
		}
	})

	t.Run("IntoAnEmptyDirectory", func(t *testing.T) {
		target := filepath.Join(t.TempDir(), "leasehold.db")
		res, err := store.Restore(path, target, skip, t0)
		if err != nil || res.MovedAside != "" {
			t.Fatalf("Restore = %+v, %v; want nothing moved aside", res, err)
		}
		if got := takeSnapshot(t, openAt(t, target), snapTeams, snapProbes); len(got.Jobs) != 3 {
			t.Errorf("restored %d jobs, want 3", len(got.Jobs))
		}
	})

	t.Run("AFileThatIsNoBackupIsRefusedAndNothingChanges", func(t *testing.T) {
		dir := t.TempDir()
		bogus := filepath.Join(dir, "bogus.db")
		if err := os.WriteFile(bogus, bytes.Repeat([]byte("not bbolt"), 1000), 0o600); err != nil {
			t.Fatal(err)
		}
		target := filepath.Join(dir, "leasehold.db")
		if _, err := store.Restore(bogus, target, skip, t0); err == nil {
			t.Errorf("Restore of a file that is no database succeeded")
		}
		if entries, _ := os.ReadDir(dir); len(entries) != 1 {
			t.Errorf("the directory holds %d entries, want only the bogus file", len(entries))
		}
	})
}
