package store

import (
	"errors"
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/mutation"
	"go.etcd.io/bbolt"
)

// CommitAsEntry commits t, a transaction of s's writer (Begin) that
// recorded its writes (Record) evaluated on base, as the replicated entry
// at index whose write set it recorded: the replica bookkeeping that
// applying the write set writes for that entry (the applied index, the
// group index, the wall floor raised to wall) goes into t, and t commits,
// with fsync, holding exactly what applying the write set would have left.
// So a leader writes its own group once, where a replica decodes the write
// set and writes it again.
//
// It returns the replica state committed. It reports false, and leaves t
// open for the caller to roll back, when t
// cannot stand for the entry: the store already applied index (a replay
// changes nothing), or base is not the last write set the store applied
// (ErrStaleBase). The caller then applies the entry's write set the
// ordinary way, which says which.
func (s *Store) CommitAsEntry(t *Tx, index, base uint64, wall time.Time) (ReplicaState, bool, error) {
	rs := readReplicaState(t.tx)
	if index <= rs.Applied || base != rs.Group {
		return ReplicaState{}, false, nil
	}
	next := ReplicaState{Applied: index, Group: index, WallFloor: rs.WallFloor}
	if !wall.IsZero() && wall.UnixNano() > rs.wallFloorNanos() {
		next.WallFloor = wall
	}
	apart := mutation.On(mutation.ApplyIndexApart)
	if !apart {
		if err := putReplicaState(t.tx, next); err != nil {
			return ReplicaState{}, false, errors.Join(err, t.Rollback())
		}
	}
	failpointApplyBeforeCommit()
	if err := t.Commit(); err != nil {
		return ReplicaState{}, false, err
	}
	failpointApplyCommitted()
	if apart {
		return next, true, s.update(func(tx *bbolt.Tx) error { return putReplicaState(tx, next) })
	}
	return next, true, nil
}
