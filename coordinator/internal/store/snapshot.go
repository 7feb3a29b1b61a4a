package store

import (
	"errors"
	"fmt"
	"io"
	"os"

	"go.etcd.io/bbolt"
)

// Snapshot is the whole store as of one instant, for a replica's snapshot:
// a read transaction held until Release. It holds pages the writer frees
// meanwhile, so the file may grow while it lives; release it soon.
type Snapshot struct {
	tx      *bbolt.Tx
	release func()
	// State is the replica bookkeeping of the snapshot: the index of the
	// last entry it holds.
	State ReplicaState
}

// Snapshot begins a snapshot. Any goroutine may call it; the writer and
// the replica's apply go on meanwhile.
func (s *Store) Snapshot() (*Snapshot, error) {
	s.mu.RLock()
	tx, err := s.db.Begin(false)
	if err != nil {
		s.mu.RUnlock()
		return nil, err
	}
	return &Snapshot{tx: tx, release: s.mu.RUnlock, State: readReplicaState(tx)}, nil
}

// WriteTo writes the snapshot as a bbolt file.
func (sn *Snapshot) WriteTo(w io.Writer) (int64, error) { return sn.tx.WriteTo(w) }

// Release ends the snapshot; it is safe to call twice.
func (sn *Snapshot) Release() {
	if sn.release != nil {
		_ = sn.tx.Rollback()
		sn.release()
		sn.release = nil
	}
}

// ReplaceFile puts the bbolt file read from r in place of the store's, as a
// replica restoring a snapshot does: it writes r to a file beside the
// store's and syncs it, checks it is a file of this schema, then waits for
// every transaction to end, closes the store's file, renames the new one
// over it and opens it with the store's options. Transactions begun
// meanwhile wait, and then see the new file. A failure before the rename
// leaves the store as it was; one after it (opening the new file) leaves
// the store closed.
func (s *Store) ReplaceFile(r io.Reader) error {
	path := s.Path()
	tmp := path + ".restore"
	if err := writeSynced(tmp, r); err != nil {
		return fmt.Errorf("writing %s: %w", tmp, err)
	}
	if err := checkFile(tmp); err != nil {
		os.Remove(tmp)
		return err
	}
	s.wl.lock()
	defer s.wl.unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.db.Close(); err != nil {
		return fmt.Errorf("closing %s: %w", path, err)
	}
	if err := replace(tmp, path); err != nil {
		return fmt.Errorf("renaming %s over %s: %w", tmp, path, err)
	}
	db, err := s.openDB(path)
	if err != nil {
		return fmt.Errorf("opening the restored %s: %w", path, err)
	}
	s.db = db
	return nil
}

// writeSynced writes r to a new file at path and syncs it.
func writeSynced(path string, r io.Reader) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	_, err = io.Copy(f, r)
	if err == nil {
		err = f.Sync()
	}
	return errors.Join(err, f.Close())
}

// checkFile checks that path is a bbolt file of this schema.
func checkFile(path string) error {
	db, err := openOffline(path, true)
	if err != nil {
		return err
	}
	defer db.Close()
	return schemaOf(db)
}
