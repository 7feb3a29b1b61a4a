package cluster

import (
	"errors"
	"fmt"
	"io"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	"github.com/leasehold/leasehold/coordinator/internal/store"
)

// Entry kinds: the first byte of every command entry this code proposes.
// A kind this code does not know is an entry from a newer release: the
// node stops rather than skip it.
const (
	// entryWriteSet is one writer group's write set (storagev1.WriteSet).
	entryWriteSet byte = 1
)

// FSM is the raft state machine over the coordinator's store (raft.FSM and
// raft.BatchingFSM): it applies every committed write set into the store's
// own schema, with the index it applied, in the same transaction, so the
// store says by itself how far it has applied, and a replay of entries it
// already holds changes nothing. Followers never run a command; the store
// a follower holds is a single-node data file.
//
// raft calls Apply, ApplyBatch, Snapshot and Restore from one goroutine;
// Persist runs concurrently with them. A write set that cannot be applied
// (malformed, or the store failed: a full disk, say) stops the node
// (Fatal): its state would diverge from the log, and the cluster goes on
// without it. Restarted once the fault is mended, the node applies the
// log from where its store stopped.
type FSM struct {
	st *store.Store
	// group is the index of the last write set applied, the base the next
	// one must name; wallFloor the largest wall clock applied, in Unix
	// nanoseconds. Both are read by the writer between groups.
	group     atomic.Uint64
	wallFloor atomic.Int64
	applied   atomic.Uint64
	// metrics time ApplyBatch; StartNode sets them before raft runs.
	metrics *Metrics
	// Fatal is called with an entry that cannot be applied (on the FSM
	// goroutine) or a write the raft log refused (on raft's), and must not
	// return: it stops the process. Nil panics.
	Fatal func(error)
}

// fatal stops the node on an entry it cannot apply or store.
func (f *FSM) fatal(err error) {
	if f.Fatal != nil {
		f.Fatal(err)
	}
	panic(err.Error())
}

// NewFSM returns the state machine over st, at what st already applied.
func NewFSM(st *store.Store) (*FSM, error) {
	f := &FSM{st: st}
	if err := f.load(); err != nil {
		return nil, err
	}
	return f, nil
}

// load reads the applied indexes from the store.
func (f *FSM) load() error {
	rs, err := f.st.ReplicaState()
	if err != nil {
		return fmt.Errorf("reading the replica state: %w", err)
	}
	f.group.Store(rs.Group)
	f.applied.Store(rs.Applied)
	if !rs.WallFloor.IsZero() {
		f.wallFloor.Store(rs.WallFloor.UnixNano())
	}
	return nil
}

// Store returns the store the FSM applies to.
func (f *FSM) Store() *store.Store { return f.st }

// LastGroup returns the index of the last write set applied: the base of
// the next group the leader evaluates.
func (f *FSM) LastGroup() uint64 { return f.group.Load() }

// Applied returns the index of the last entry applied.
func (f *FSM) Applied() uint64 { return f.applied.Load() }

// WallFloor returns the largest group wall clock applied (zero when none):
// a writer taking over stamps nothing earlier.
func (f *FSM) WallFloor() time.Time {
	if ns := f.wallFloor.Load(); ns != 0 {
		return time.Unix(0, ns)
	}
	return time.Time{}
}

// AnnouncedLeader returns the leader last announced in the log applied
// (engine.Announce): its id and gRPC address.
func (f *FSM) AnnouncedLeader() (id, addr string) {
	_ = f.st.View(func(tx *store.Tx) error {
		id, addr = tx.Leader()
		return nil
	})
	return id, addr
}

// Apply implements raft.FSM.
func (f *FSM) Apply(l *raft.Log) any { return f.ApplyBatch([]*raft.Log{l})[0] }

// ApplyBatch implements raft.BatchingFSM: every write set of logs in one
// store transaction. Each response is nil, or store.ErrStaleBase for a
// write set evaluated on another base (it changed nothing).
func (f *FSM) ApplyBatch(logs []*raft.Log) []any {
	res := make([]any, len(logs))
	entries := make([]store.Entry, 0, len(logs))
	at := make([]int, 0, len(logs))
	for i, l := range logs {
		if l.Type != raft.LogCommand {
			continue
		}
		if len(l.Data) == 0 || l.Data[0] != entryWriteSet {
			f.fatal(fmt.Errorf("replica: entry %d is of a kind this release does not know (%x); upgrade this node", l.Index, l.Data[:min(len(l.Data), 1)]))
		}
		entries = append(entries, store.Entry{Index: l.Index, WriteSet: l.Data[1:]})
		at = append(at, i)
	}
	if len(entries) == 0 {
		return res
	}
	start := time.Now()
	defer func() { f.metrics.observeApply(time.Since(start)) }()
	out, err := f.st.ApplyWriteSets(entries)
	if err != nil {
		f.fatal(fmt.Errorf("replica: applying entries %d to %d: %w", entries[0].Index, entries[len(entries)-1].Index, err))
	}
	for j, e := range out {
		if e != nil {
			res[at[j]] = e
		}
	}
	if err := f.load(); err != nil {
		f.fatal(fmt.Errorf("replica: %w", err))
	}
	return res
}

// Snapshot implements raft.FSM: a read transaction of the whole store,
// which Persist copies while the FSM goes on applying.
func (f *FSM) Snapshot() (raft.FSMSnapshot, error) {
	sn, err := f.st.Snapshot()
	if err != nil {
		return nil, fmt.Errorf("beginning a snapshot: %w", err)
	}
	return &snapshot{sn: sn}, nil
}

// Restore implements raft.FSM: the snapshot becomes the store's file.
func (f *FSM) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	if err := f.st.ReplaceFile(rc); err != nil {
		return fmt.Errorf("restoring a snapshot: %w", err)
	}
	return f.load()
}

// snapshot is an FSM snapshot: the store's file as of one read
// transaction.
type snapshot struct{ sn *store.Snapshot }

// Persist implements raft.FSMSnapshot.
func (s *snapshot) Persist(sink raft.SnapshotSink) error {
	if _, err := s.sn.WriteTo(sink); err != nil {
		return errors.Join(err, sink.Cancel())
	}
	return sink.Close()
}

// Release implements raft.FSMSnapshot.
func (s *snapshot) Release() { s.sn.Release() }

var (
	_ raft.BatchingFSM = (*FSM)(nil)
	_ raft.FSMSnapshot = (*snapshot)(nil)
)
