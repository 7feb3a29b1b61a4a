package cluster

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

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
// The caller holds fsm's store open, which is what tells it that no node
// runs on the directory.
func Recover(dir, id string, peers []Peer, fsm *FSM) (RecoverResult, error) {
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
	var conf raft.Configuration
	for _, p := range peers {
		conf.Servers = append(conf.Servers, raft.Server{Suffrage: raft.Voter, ID: raft.ServerID(p.ID), Address: raft.ServerAddress(p.RaftAddr)})
	}
	if err := raft.RecoverCluster(rc, recoverFSM{fsm}, w, w, snaps, trans, conf); err != nil {
		return RecoverResult{}, fmt.Errorf("recovering the cluster: %w", err)
	}
	list, err := snaps.List()
	if err != nil || len(list) == 0 {
		return RecoverResult{}, fmt.Errorf("listing the recovered snapshot: %v", err)
	}
	return RecoverResult{LastIndex: list[0].Index, LastTerm: list[0].Term, Voters: len(peers)}, nil
}

// recoverFSM is the FSM as RecoverCluster is given it: RecoverCluster
// persists the snapshot it takes but never releases it, and the store
// cannot close while the snapshot's read transaction lives.
type recoverFSM struct{ *FSM }

// Snapshot implements raft.FSM: a snapshot released once persisted.
func (f recoverFSM) Snapshot() (raft.FSMSnapshot, error) {
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
