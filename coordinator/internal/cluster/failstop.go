package cluster

import (
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/hashicorp/raft"
	wal "github.com/hashicorp/raft-wal"
	"github.com/hashicorp/raft-wal/types"
)

// failStopLog is a node's raft log and stable store that stops the node
// (FSM.Fatal) on the first write either refuses: a full disk, say. raft
// itself goes on after a failed append (a follower answers the leader
// with a failure and waits for the next try, forever, while the disk is
// full) and panics after a failed term or vote; a node that cannot keep
// its log stops instead, with the cause, as it does when its store cannot
// apply an entry. What it had written before stays valid: restarted once
// the fault is mended, the node goes on from its last stored entry.
//
// Reads are passed through: raft reports a failed read itself.
type failStopLog struct {
	logs   raft.LogStore
	stable raft.StableStore
	fatal  func(error)
	// explain, when set, adds what the log knows of a write's failure.
	explain func(error) error
}

// stopOnWriteError wraps logs and stable so that a failed write calls
// fatal, which must not return.
func stopOnWriteError(logs raft.LogStore, stable raft.StableStore, fatal func(error)) *failStopLog {
	return &failStopLog{logs: logs, stable: stable, fatal: fatal}
}

// failed stops the node on err, a write that failed; it returns err for
// a fatal that returns (tests).
func (s *failStopLog) failed(what string, err error) error {
	if s.explain != nil {
		err = s.explain(err)
	}
	err = fmt.Errorf("replica: %s: %w", what, err)
	s.fatal(err)
	return err
}

// FirstIndex implements raft.LogStore.
func (s *failStopLog) FirstIndex() (uint64, error) { return s.logs.FirstIndex() }

// LastIndex implements raft.LogStore.
func (s *failStopLog) LastIndex() (uint64, error) { return s.logs.LastIndex() }

// GetLog implements raft.LogStore.
func (s *failStopLog) GetLog(index uint64, log *raft.Log) error { return s.logs.GetLog(index, log) }

// StoreLog implements raft.LogStore.
func (s *failStopLog) StoreLog(log *raft.Log) error {
	if err := s.logs.StoreLog(log); err != nil {
		return s.failed(fmt.Sprintf("appending entry %d to the raft log", log.Index), err)
	}
	return nil
}

// StoreLogs implements raft.LogStore.
func (s *failStopLog) StoreLogs(logs []*raft.Log) error {
	if err := s.logs.StoreLogs(logs); err != nil {
		what := "appending to the raft log"
		if len(logs) > 0 {
			what = fmt.Sprintf("appending entries %d to %d to the raft log", logs[0].Index, logs[len(logs)-1].Index)
		}
		return s.failed(what, err)
	}
	return nil
}

// DeleteRange implements raft.LogStore.
func (s *failStopLog) DeleteRange(lo, hi uint64) error {
	if err := s.logs.DeleteRange(lo, hi); err != nil {
		return s.failed(fmt.Sprintf("deleting entries %d to %d of the raft log", lo, hi), err)
	}
	return nil
}

// IsMonotonic implements raft.MonotonicLogStore as the wrapped log does:
// raft-wal takes no gap in its indexes, so raft must reset it after
// installing a snapshot rather than leave one.
func (s *failStopLog) IsMonotonic() bool {
	m, ok := s.logs.(raft.MonotonicLogStore)
	return ok && m.IsMonotonic()
}

// Set implements raft.StableStore.
func (s *failStopLog) Set(key, val []byte) error {
	if err := s.stable.Set(key, val); err != nil {
		return s.failed(fmt.Sprintf("storing raft's %s", key), err)
	}
	return nil
}

// Get implements raft.StableStore.
func (s *failStopLog) Get(key []byte) ([]byte, error) { return s.stable.Get(key) }

// SetUint64 implements raft.StableStore.
func (s *failStopLog) SetUint64(key []byte, val uint64) error {
	if err := s.stable.SetUint64(key, val); err != nil {
		return s.failed(fmt.Sprintf("storing raft's %s", key), err)
	}
	return nil
}

// GetUint64 implements raft.StableStore.
func (s *failStopLog) GetUint64(key []byte) (uint64, error) { return s.stable.GetUint64(key) }

// segmentFiler is raft-wal's segment filer, keeping why it last failed
// to create a segment. The WAL creates the next segment of its log in the
// background once the current one is full, and only logs a failure; the
// next append then finds the full segment sealed (wal.ErrSealed), and
// explain says why.
type segmentFiler struct {
	types.SegmentFiler
	failed atomic.Pointer[error]
}

// Create implements types.SegmentFiler.
func (f *segmentFiler) Create(info types.SegmentInfo) (types.SegmentWriter, error) {
	w, err := f.SegmentFiler.Create(info)
	if err != nil {
		err = fmt.Errorf("creating segment %d of %d MiB: %w", info.ID, info.SizeLimit>>20, err)
		f.failed.Store(&err)
		return nil, err
	}
	f.failed.Store(nil)
	return w, nil
}

// explain adds to err, an append refused because the segment is full and
// sealed, why no next segment took its place.
func (f *segmentFiler) explain(err error) error {
	if cause := f.failed.Load(); cause != nil && errors.Is(err, wal.ErrSealed) {
		return fmt.Errorf("%w: the log's next segment could not be made: %w", err, *cause)
	}
	return err
}

var (
	_ raft.LogStore          = (*failStopLog)(nil)
	_ raft.StableStore       = (*failStopLog)(nil)
	_ raft.MonotonicLogStore = (*failStopLog)(nil)
)
