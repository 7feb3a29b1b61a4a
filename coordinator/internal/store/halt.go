package store

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"go.etcd.io/bbolt"
)

// The replica's record of an entry it could not apply, and the entries an
// operator allowed it to skip (bucketReplica).
var (
	keyReplicaHalted = []byte("halted_entry")
	keyReplicaSkips  = []byte("skip_entries")
)

// HaltedEntry is a replicated entry this replica stopped at because it
// could not apply it: its index and term in the log, and its bytes, so
// that a later start can tell whether it can apply it then (a newer
// release) without the log.
type HaltedEntry struct {
	Index, Term uint64
	Data        []byte
}

// ErrNotHalted is returned by AllowSkip for an index other than the one
// the replica stopped at.
var ErrNotHalted = errors.New("this node did not stop at that entry")

// Halt records that the replica stopped at h.
func (s *Store) Halt(h HaltedEntry) error {
	v := make([]byte, 16, 16+len(h.Data))
	binary.BigEndian.PutUint64(v, h.Index)
	binary.BigEndian.PutUint64(v[8:], h.Term)
	return s.update(func(tx *bbolt.Tx) error { return putReplica(tx, keyReplicaHalted, append(v, h.Data...)) })
}

// Halted returns the entry the replica stopped at, ok false when it did
// not stop at one.
func (s *Store) Halted() (h HaltedEntry, ok bool, err error) {
	err = s.view(func(tx *bbolt.Tx) error {
		b := tx.Bucket(bucketReplica)
		if b == nil {
			return nil
		}
		v := b.Get(keyReplicaHalted)
		if len(v) < 16 {
			return nil
		}
		h = HaltedEntry{Index: btoi(v), Term: btoi(v[8:16]), Data: slices.Clone(v[16:])}
		ok = true
		return nil
	})
	return h, ok, err
}

// ClearHalt forgets the entry the replica stopped at: it can apply it now.
func (s *Store) ClearHalt() error {
	return s.update(func(tx *bbolt.Tx) error { return putReplica(tx, keyReplicaHalted, nil) })
}

// AllowSkip records that the replica may apply the entry at index as
// nothing if it cannot apply it (SkipEntry), and forgets that it stopped
// there. A replica that stopped at another entry refuses it
// (ErrNotHalted): skipping is for the entry it stopped at, or for one it
// has not reached yet.
func (s *Store) AllowSkip(index uint64) error {
	return s.update(func(tx *bbolt.Tx) error {
		rs := readReplicaState(tx)
		if index <= rs.Applied {
			return fmt.Errorf("entry %d is applied already (this node applied up to %d)", index, rs.Applied)
		}
		b := tx.Bucket(bucketReplica)
		var skips []byte
		if b != nil {
			if v := b.Get(keyReplicaHalted); len(v) >= 16 {
				if at := btoi(v); at != index {
					return fmt.Errorf("%w: it stopped at entry %d, not %d", ErrNotHalted, at, index)
				}
			}
			skips = slices.Clone(b.Get(keyReplicaSkips))
		}
		if !skipAllowed(skips, index) {
			skips = append(skips, itob(index)...)
		}
		if err := putReplica(tx, keyReplicaSkips, skips); err != nil {
			return err
		}
		return putReplica(tx, keyReplicaHalted, nil)
	})
}

// SkipsAllowed returns the indexes AllowSkip recorded, in order.
func (s *Store) SkipsAllowed() ([]uint64, error) {
	var out []uint64
	err := s.view(func(tx *bbolt.Tx) error {
		if b := tx.Bucket(bucketReplica); b != nil {
			for v := b.Get(keyReplicaSkips); len(v) >= 8; v = v[8:] {
				out = append(out, btoi(v))
			}
		}
		return nil
	})
	return out, err
}

// SkipEntry applies the entry at index as nothing, recording it applied,
// when AllowSkip allowed it and the replica has not applied it yet; it
// reports whether it did.
func (s *Store) SkipEntry(index uint64) (bool, error) {
	skipped := false
	err := s.update(func(tx *bbolt.Tx) error {
		b := tx.Bucket(bucketReplica)
		if b == nil || !skipAllowed(b.Get(keyReplicaSkips), index) || index <= readReplicaState(tx).Applied {
			return nil
		}
		skipped = true
		return putReplica(tx, keyReplicaApplied, itob(index))
	})
	return skipped && err == nil, err
}

// skipAllowed reports whether skips, a list of big-endian indexes, holds
// index.
func skipAllowed(skips []byte, index uint64) bool {
	for ; len(skips) >= 8; skips = skips[8:] {
		if btoi(skips) == index {
			return true
		}
	}
	return false
}

// putReplica sets key of the replica's bookkeeping to v, or deletes it
// when v is nil: the replica's own record, in no write set.
func putReplica(tx *bbolt.Tx, key, v []byte) error {
	b, err := tx.CreateBucketIfNotExists(bucketReplica)
	if err != nil {
		return err
	}
	if v == nil {
		return b.Delete(key)
	}
	return b.Put(key, v)
}
