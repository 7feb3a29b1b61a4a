package coordinator

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/store"
)

// The offline tools work on a data directory no coordinator is running on;
// the database's file lock tells them apart, so a running coordinator is
// refused at once, never raced.

// CompactResult is what Compact did: the database file's size on disk
// before and after.
type CompactResult struct {
	Path          string
	Before, After int64
}

// Compact rewrites the database in dataDir without its free pages, which
// bbolt otherwise keeps for reuse and never returns to the disk. It works
// offline: while a coordinator holds the directory it fails within a
// second with an error wrapping ErrDataDirInUse. It writes a compacted
// copy beside the file, checks it (bbolt's consistency check, and the same
// keys and sequences in every bucket), syncs it and renames it over the
// file; a failure at any step leaves the file as it was.
func Compact(dataDir string) (CompactResult, error) {
	path := filepath.Join(dataDir, DBFile)
	res, err := store.Compact(path)
	if err != nil {
		return CompactResult{}, offlineErr(dataDir, path, err)
	}
	return CompactResult{Path: path, Before: res.Before, After: res.After}, nil
}

// RestoreSkip is how far Restore moves the fencing-token counter and the
// job and batch ids on past the backup's: tokens and ids handed out after
// the backup was taken, which renderers and clients may still hold, are
// never handed out again as long as fewer than this many were.
const RestoreSkip = 1 << 32

// RestoreResult is what Restore did.
type RestoreResult struct {
	Path string
	Size int64
	// LastToken is the largest fencing token in the backup; NextToken is
	// the first the restored coordinator grants.
	LastToken, NextToken uint64
	// MovedAside is where the database that was in place was kept, or ""
	// when there was none.
	MovedAside string
	// Objects counts the objects of the artifact store that the restored
	// jobs' pointers name (the backup holds the inline previews only);
	// MissingObjects are those ArtifactStore does not hold: previews the
	// restore cannot bring back. ObjectsErr, when set, says why they were
	// not looked for (the store did not answer).
	ArtifactStore  string
	Objects        int
	MissingObjects []MissingObject
	ObjectsErr     error
}

// Restore puts the backup file from (written by OperatorService.Backup,
// `leasehold backup`) in place as the database of dataDir, creating the
// directory if needed, offline: while a coordinator holds the directory it
// fails within a second with an error wrapping ErrDataDirInUse. It checks
// the backup first (the current schema, bbolt's consistency check); a
// database already in place is kept beside it as
// leasehold.db.before-restore-<UTC time>. The restored coordinator grants
// tokens and ids RestoreSkip above the backup's (see RestoreSkip).
//
// The backup holds the previews kept inline; those in the artifact store
// are objects the backup only names. Restore then looks for them in the
// store artifactStore names (as --artifact-store does; empty for the
// directory beside the database) and reports those missing, whose
// previews it cannot bring back; a store that does not answer is reported
// in ObjectsErr, and the database is restored all the same.
func Restore(ctx context.Context, dataDir, from, artifactStore string, now time.Time) (RestoreResult, error) {
	if err := os.MkdirAll(dataDir, 0o750); err != nil {
		return RestoreResult{}, fmt.Errorf("creating data directory: %w", err)
	}
	path := filepath.Join(dataDir, DBFile)
	res, err := store.Restore(from, path, RestoreSkip, now)
	if err != nil {
		return RestoreResult{}, offlineErr(dataDir, path, err)
	}
	out := RestoreResult{Path: path, Size: res.Size, LastToken: res.LastToken, NextToken: res.NextToken, MovedAside: res.MovedAside}
	pointers, err := storedPointers(path)
	if err != nil {
		return out, err
	}
	out.Objects = len(pointers)
	if len(pointers) > 0 {
		out.MissingObjects, out.ArtifactStore, out.ObjectsErr = missingObjects(ctx, dataDir, artifactStore, pointers)
	}
	return out, nil
}

// storedPointers lists the objects of the artifact store that the jobs of
// the database at path name.
func storedPointers(path string) ([]store.StoredPointer, error) {
	st, err := store.OpenReadOnly(path)
	if err != nil {
		return nil, err
	}
	defer st.Close()
	sum, err := st.Verify()
	if err != nil {
		return nil, fmt.Errorf("reading the pointers of %s: %w", path, err)
	}
	return sum.Pointers, nil
}

// offlineErr says that the directory is in use when the store found its
// database locked.
func offlineErr(dataDir, path string, err error) error {
	if errors.Is(err, store.ErrLocked) {
		return fmt.Errorf("data directory %s: %w: its database %s is locked by a running coordinator; stop it first (this works offline)",
			dataDir, ErrDataDirInUse, path)
	}
	return err
}
