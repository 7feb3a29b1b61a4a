package cluster

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"

	"github.com/hashicorp/raft"
	wal "github.com/hashicorp/raft-wal"
)

// RecoverResult is what Recover did: the log it kept, as one snapshot of
// the new configuration at the last entry it held.
type RecoverResult struct {
	LastIndex, LastTerm uint64
	Voters              int
}

// Recover rewrites the raft state of a stopped node in dir (its raft
// directory) so that it starts as a member of a cluster of peers alone,
// for a cluster that lost its quorum for good: hashicorp/raft's
// RecoverCluster, the peers.json procedure of Consul and Nomad. Every
// surviving node is recovered with the same peers; the one with the most
// entries is then elected. Entries the node holds are applied to fsm's
// store (committed or not: a node cannot tell), a snapshot of the store
// is taken under the new configuration, and the log is emptied.
//
// An entry the store cannot apply (UnappliableError) ends the recovery
// before anything of the raft state is rewritten, with an error naming it,
// unless skip lists its index: it is then applied as nothing.
//
// The caller holds fsm's store open, which is what tells it that no node
// runs on the directory.
func Recover(dir, id string, peers []Peer, fsm *FSM, skip []uint64) (RecoverResult, error) {
	if _, err := os.Stat(filepath.Join(dir, "wal")); err != nil {
		return RecoverResult{}, fmt.Errorf("no raft log in %s: %w", dir, err)
	}
	quiet := hclogOf(slog.New(slog.DiscardHandler))
	w, err := wal.Open(filepath.Join(dir, "wal"), wal.WithLogger(quiet))
	if err != nil {
		return RecoverResult{}, fmt.Errorf("opening the raft log: %w", err)
	}
	defer w.Close()
	snaps, err := raft.NewFileSnapshotStoreWithLogger(dir, snapshotsRetained, quiet)
	if err != nil {
		return RecoverResult{}, fmt.Errorf("opening the snapshot store: %w", err)
	}
	_, trans := raft.NewInmemTransport("")
	defer trans.Close()
	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(id)
	rc.Logger = quiet
	conf := raft.Configuration{Servers: peerServers(peers)}
	rf := &recoverFSM{FSM: fsm, skip: skip}
	if err := raft.RecoverCluster(rc, rf, w, w, snaps, trans, conf); err != nil {
		if rf.failed != nil {
			return RecoverResult{}, fmt.Errorf("recovering the cluster: %w", rf.failed)
		}
		return RecoverResult{}, fmt.Errorf("recovering the cluster: %w", err)
	}
	list, err := snaps.List()
	if err != nil || len(list) == 0 {
		return RecoverResult{}, fmt.Errorf("listing the recovered snapshot: %v", err)
	}
	return RecoverResult{LastIndex: list[0].Index, LastTerm: list[0].Term, Voters: len(peers)}, nil
}

// recoverFSM is the FSM as RecoverCluster is given it. An entry it cannot
// apply and may not skip fails the recovery rather than stop the process:
// it and every entry after it are left alone, and Snapshot then fails, so
// that RecoverCluster rewrites none of the raft state. RecoverCluster
// persists the snapshot it takes but never releases it, and the store
// cannot close while the snapshot's read transaction lives.
type recoverFSM struct {
	*FSM
	// skip are the entries that may be applied as nothing. They are not
	// read from the store: RecoverCluster first restores the latest
	// snapshot, which replaces the store's file.
	skip []uint64
	// failed is the first entry that could not be applied.
	failed *UnappliableError
}

// Apply implements raft.FSM.
func (f *recoverFSM) Apply(l *raft.Log) any {
	if f.failed != nil {
		return nil
	}
	ws, err := decodeEntry(l.Data)
	if err == nil {
		err = f.st.CheckWriteSet(l.Index, ws)
	}
	switch {
	case err == nil:
		return f.FSM.Apply(l)
	case slices.Contains(f.skip, l.Index):
		// Applied as nothing: only its index is recorded.
		if err := f.st.AllowSkip(l.Index); err != nil {
			f.failed = &UnappliableError{Index: l.Index, Term: l.Term, Err: err}
			return nil
		}
		return f.FSM.Apply(l)
	}
	f.failed = &UnappliableError{Index: l.Index, Term: l.Term, Err: err}
	return nil
}

// Snapshot implements raft.FSM: a snapshot released once persisted, or
// the entry that could not be applied.
func (f *recoverFSM) Snapshot() (raft.FSMSnapshot, error) {
	if f.failed != nil {
		return nil, f.failed
	}
	sn, err := f.FSM.Snapshot()
	if err != nil {
		return nil, err
	}
	return releasedSnapshot{sn}, nil
}

// releasedSnapshot releases itself once persisted (Release is safe twice).
type releasedSnapshot struct{ raft.FSMSnapshot }

// Persist implements raft.FSMSnapshot.
func (s releasedSnapshot) Persist(sink raft.SnapshotSink) error {
	defer s.Release()
	return s.FSMSnapshot.Persist(sink)
}
