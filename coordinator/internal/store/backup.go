package store

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"
)

// BackupInfo describes a backup as it starts: the size of the file it
// copies, its schema and the largest fencing token granted in it, and the
// objects of the artifact store its pointers name (which it does not
// hold), as of the same read transaction.
type BackupInfo struct {
	Size      int64
	Schema    uint64
	LastToken uint64
	Objects   []ObjectRef
}

// ErrBackupSpace is returned by WriteBackup when the file system of the
// database lacks the room for the copy it takes first, with
// backupHeadroom to spare for the writer.
var ErrBackupSpace = errors.New("not enough free disk space beside the database for the backup's copy")

// WriteBackup writes a consistent copy of the whole database to w: the
// file as one read transaction sees it, which is itself a valid database.
// It calls start with what it is about to write before the first byte.
// Any goroutine may call it; the writer goes on meanwhile.
//
// The transaction writes the copy into a temporary file beside the
// database, which takes as long as the disk does, and ends before the
// first byte goes to w; w is then fed from the file. So a slow or stalled
// w holds no read transaction: it keeps no freed page from reuse, and it
// cannot make the writer wait when the file outgrows its mapping (bbolt
// remaps only once every reader has ended, and queues new readers behind
// the remap). The temporary file is unlinked as soon as it is open where
// the system allows, so it takes disk space only while WriteBackup runs
// and never outlives the process. Before the copy, WriteBackup checks
// that the file system has room for it and backupHeadroom more, and fails
// with ErrBackupSpace otherwise: the copy must not fill the disk the
// writer commits to.
func (s *Store) WriteBackup(w io.Writer, start func(BackupInfo) error) (int64, error) {
	spool, info, err := s.spoolBackup()
	if err != nil {
		return 0, err
	}
	defer spool.Close()
	if err := start(info); err != nil {
		return 0, err
	}
	n, err := io.Copy(w, spool)
	if err == nil && n != info.Size {
		err = fmt.Errorf("backup copy: read %d bytes back of the %d written", n, info.Size)
	}
	return n, err
}

// backupHeadroom is the free space a backup's copy must leave on the
// database's file system: a quarter of the database, at least
// minBackupHeadroom.
func backupHeadroom(size int64) int64 { return max(size/4, minBackupHeadroom) }

// minBackupHeadroom is the least free space a backup's copy leaves.
const minBackupHeadroom = 64 << 20

// spoolFile is a backup's temporary copy, open for reading from its start.
type spoolFile struct {
	*os.File
	// linked: the file could not be unlinked while open, so Close
	// removes it.
	linked bool
}

// Close closes the copy and removes it.
func (f *spoolFile) Close() error {
	err := f.File.Close()
	if f.linked {
		os.Remove(f.Name())
	}
	return err
}

// spoolBackup copies the database, from one read transaction, into a
// temporary file beside it and returns the file, at its start, and what
// the copy holds.
func (s *Store) spoolBackup() (*spoolFile, BackupInfo, error) {
	var info BackupInfo
	dir := filepath.Dir(s.Path())
	f, err := os.CreateTemp(dir, ".backup-*.db")
	if err != nil {
		return nil, info, fmt.Errorf("creating the backup's copy: %w", err)
	}
	spool := &spoolFile{File: f, linked: os.Remove(f.Name()) != nil}
	err = s.view(func(tx *bbolt.Tx) error {
		info = BackupInfo{Size: tx.Size(), LastToken: tx.Bucket(bucketTokens).Sequence()}
		if v := tx.Bucket(bucketMeta).Get(keySchema); v != nil {
			info.Schema = btoi(v)
		}
		if free, ok := freeBytes(dir); ok && free < info.Size+backupHeadroom(info.Size) {
			return fmt.Errorf("%w: the copy takes %d bytes and must leave %d free, and %d are free",
				ErrBackupSpace, info.Size, backupHeadroom(info.Size), free)
		}
		if _, err := tx.WriteTo(f); err != nil {
			return err
		}
		info.Objects = (&Tx{tx: tx}).ObjectRefsList()
		return nil
	})
	if err == nil {
		_, err = f.Seek(0, io.SeekStart)
	}
	if err != nil {
		spool.Close()
		return nil, info, fmt.Errorf("copying the database for a backup: %w", err)
	}
	return spool, info, nil
}

// offlineOptions open a database file for the offline tools, failing
// within lockTimeout when a running coordinator holds it.
func offlineOptions(readOnly bool) *bbolt.Options {
	return &bbolt.Options{Timeout: lockTimeout, ReadOnly: readOnly, FreelistType: bbolt.FreelistArrayType}
}

// openOffline opens path for an offline tool. A file another process holds
// is ErrLocked; a missing one is an error saying so.
func openOffline(path string, readOnly bool) (*bbolt.DB, error) {
	if _, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("opening %s: %w", path, err)
	}
	db, err := bbolt.Open(path, 0o600, offlineOptions(readOnly))
	if errors.Is(err, bolterrors.ErrTimeout) {
		return nil, fmt.Errorf("opening %s: %w (%w)", path, ErrLocked, err)
	}
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", path, err)
	}
	return db, nil
}

// schemaOf reads the schema version of an open file, refusing any but the
// current one: the offline tools do not migrate.
func schemaOf(db *bbolt.DB) error {
	return db.View(func(tx *bbolt.Tx) error {
		meta := tx.Bucket(bucketMeta)
		if meta == nil || meta.Get(keySchema) == nil {
			return fmt.Errorf("%w: the file has no schema version, so no coordinator wrote it", ErrSchemaVersion)
		}
		if v := btoi(meta.Get(keySchema)); v != SchemaVersion {
			return fmt.Errorf("%w: the file has schema %d, this release works on %d; start the coordinator on it once to migrate it",
				ErrSchemaVersion, v, SchemaVersion)
		}
		return nil
	})
}

// CompactResult is what Compact did: the file's size on disk before and
// after.
type CompactResult struct {
	Before, After int64
}

// compactTxBytes bounds one transaction of a compaction, so that copying a
// large file does not hold all of it in memory at once.
const compactTxBytes = 64 << 20

// Compact rewrites the database at path without its free pages, offline.
// It holds the file's lock throughout, so no coordinator can open it
// meanwhile, and fails with ErrLocked at once when one has it open. It
// copies every bucket into path+".compact" (bbolt.Compact), checks the
// copy (bbolt's consistency check, and the same keys and sequences in
// every bucket), syncs it and renames it over path. A failure at any step
// leaves path as it was.
func Compact(path string) (CompactResult, error) {
	var res CompactResult
	src, err := openOffline(path, true)
	if err != nil {
		return res, err
	}
	defer src.Close()
	if err := schemaOf(src); err != nil {
		return res, err
	}
	fi, err := os.Stat(path)
	if err != nil {
		return res, err
	}
	res.Before = fi.Size()
	tmp := path + ".compact"
	if err := os.Remove(tmp); err != nil && !errors.Is(err, os.ErrNotExist) {
		return res, err
	}
	dst, err := bbolt.Open(tmp, 0o600, offlineOptions(false))
	if err != nil {
		return res, fmt.Errorf("creating %s: %w", tmp, err)
	}
	err = bbolt.Compact(dst, src, compactTxBytes)
	if err == nil {
		err = sameContent(src, dst)
	}
	if cerr := dst.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		fi, err = os.Stat(tmp)
	}
	if err == nil {
		res.After = fi.Size()
		err = replace(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return res, fmt.Errorf("compacting %s: %w", path, err)
	}
	return res, nil
}

// sameContent checks that dst passes bbolt's consistency check and holds
// the same buckets as src, each with the same number of keys and the same
// sequence.
func sameContent(src, dst *bbolt.DB) error {
	type shape struct {
		keys int
		seq  uint64
	}
	shapes := func(db *bbolt.DB) (map[string]shape, error) {
		out := map[string]shape{}
		err := db.View(func(tx *bbolt.Tx) error {
			for err := range tx.Check() {
				return fmt.Errorf("consistency check: %w", err)
			}
			return tx.ForEach(func(name []byte, b *bbolt.Bucket) error {
				out[string(name)] = shape{keys: b.Stats().KeyN, seq: b.Sequence()}
				return nil
			})
		})
		return out, err
	}
	want, err := shapes(src)
	if err != nil {
		return err
	}
	got, err := shapes(dst)
	if err != nil {
		return err
	}
	if len(got) != len(want) {
		return fmt.Errorf("the copy has %d buckets, the original %d", len(got), len(want))
	}
	for name, w := range want {
		if g := got[name]; g != w {
			return fmt.Errorf("bucket %s: the copy has %d keys and sequence %d, the original %d and %d", name, g.keys, g.seq, w.keys, w.seq)
		}
	}
	return nil
}

// replace renames tmp over path and syncs the directory, so that the
// rename survives a crash.
func replace(tmp, path string) error {
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	dir, err := os.Open(filepath.Dir(path))
	if err != nil {
		return err
	}
	defer dir.Close()
	return dir.Sync()
}

// RestoreResult is what Restore did.
type RestoreResult struct {
	// Size is the size of the restored file.
	Size int64
	// LastToken is the largest fencing token the backup had granted;
	// NextToken the first the restored coordinator will grant.
	LastToken, NextToken uint64
	// MovedAside is where the database that was in place went ("" when
	// there was none).
	MovedAside string
}

// Restore puts the backup from in place as the database at path, offline.
// It checks the backup first (a file of the current schema that passes
// bbolt's consistency check) and refuses with ErrLocked when a running
// coordinator holds path. A database already at path is kept as
// path+".before-restore-<UTC time>".
//
// The restored file's fencing-token counter, job ids and batch ids move
// on by skip: tokens and ids handed out after the backup was taken, which
// renderers and clients may still hold, are then never handed out again
// (as long as fewer than skip were).
func Restore(from, path string, skip uint64, now time.Time) (RestoreResult, error) {
	var res RestoreResult
	if err := checkBackup(from); err != nil {
		return res, fmt.Errorf("checking the backup %s: %w", from, err)
	}
	if _, err := os.Stat(path); err == nil {
		// Hold the current file's lock until it is renamed away, so that
		// no coordinator opens it meanwhile.
		cur, err := openOffline(path, true)
		if err != nil {
			return res, err
		}
		defer cur.Close()
	} else if !errors.Is(err, os.ErrNotExist) {
		return res, err
	}
	tmp := path + ".restore"
	if err := copyFile(from, tmp); err != nil {
		os.Remove(tmp)
		return res, fmt.Errorf("copying the backup: %w", err)
	}
	if err := skipAhead(tmp, skip, &res); err != nil {
		os.Remove(tmp)
		return res, fmt.Errorf("restoring %s: %w", from, err)
	}
	if _, err := os.Stat(path); err == nil {
		// Link, then rename over: path names a whole database at every
		// instant, the old one or the restored one.
		res.MovedAside = path + ".before-restore-" + now.UTC().Format("20060102T150405Z")
		if err := os.Link(path, res.MovedAside); err != nil {
			os.Remove(tmp)
			return res, fmt.Errorf("keeping the current database: %w", err)
		}
	}
	if err := replace(tmp, path); err != nil {
		os.Remove(tmp)
		return res, err
	}
	return res, nil
}

// checkBackup opens a backup read-only and checks its schema and pages.
func checkBackup(path string) error {
	db, err := openOffline(path, true)
	if err != nil {
		return err
	}
	defer db.Close()
	if err := schemaOf(db); err != nil {
		return err
	}
	return db.View(func(tx *bbolt.Tx) error {
		for _, b := range allBuckets {
			if tx.Bucket(b) == nil && requiredBucket(b) {
				return fmt.Errorf("the file has no %s bucket", b)
			}
		}
		for err := range tx.Check() {
			return fmt.Errorf("consistency check: %w", err)
		}
		return nil
	})
}

// copyFile copies from to a new file to, synced.
func copyFile(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Sync(); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// skipAhead moves the token counter and the job and batch id sequences of
// the database at path on by skip, in one transaction.
func skipAhead(path string, skip uint64, res *RestoreResult) error {
	db, err := bbolt.Open(path, 0o600, offlineOptions(false))
	if err != nil {
		return err
	}
	err = db.Update(func(tx *bbolt.Tx) error {
		res.Size = tx.Size()
		res.LastToken = tx.Bucket(bucketTokens).Sequence()
		res.NextToken = res.LastToken + skip + 1
		for _, name := range [][]byte{bucketTokens, bucketJobs, bucketBatches} {
			b := tx.Bucket(name)
			if err := b.SetSequence(b.Sequence() + skip); err != nil {
				return err
			}
		}
		return nil
	})
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	return err
}
