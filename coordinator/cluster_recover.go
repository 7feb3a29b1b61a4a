package coordinator

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/leasehold/leasehold/coordinator/internal/cluster"
	"github.com/leasehold/leasehold/coordinator/internal/store"
)

// RecoverResult is what RecoverCluster did.
type RecoverResult struct {
	// RaftDir is the raft directory rewritten.
	RaftDir string
	// LastIndex and LastTerm are of the last log entry the node held, now
	// the index of the snapshot it starts from; Voters is the size of the
	// new configuration.
	LastIndex, LastTerm uint64
	Voters              int
}

// RecoverCluster makes the stopped node nodeID, whose data directory is
// dataDir, a member of a cluster of peers alone: the way out of a lost
// quorum, when too few voters are left to elect a leader and the lost
// ones will not come back. It is hashicorp/raft's RecoverCluster (the
// peers.json procedure): run it on every surviving node with the same
// peers, then start them with those peers; the one that holds the most of
// the log is elected, and the others catch up from it.
//
// Every entry the node holds is applied to its store, including entries
// that may never have been committed (the node cannot tell), so a write
// that was never acknowledged can survive a recovery; an acknowledged one
// is never lost if one of the nodes recovered held it. The store then
// holds the whole log, a snapshot of it is written under the new
// configuration, and the log is emptied.
//
// It works offline: while a coordinator holds the directory it fails
// within a second with an error wrapping ErrDataDirInUse. A directory
// without raft state (a single node's, or an empty one) is refused.
func RecoverCluster(dataDir, nodeID string, peers []cluster.Peer) (RecoverResult, error) {
	raftDir := filepath.Join(dataDir, RaftDir)
	res := RecoverResult{RaftDir: raftDir}
	self := false
	for _, p := range peers {
		self = self || p.ID == nodeID
	}
	if !self {
		return res, fmt.Errorf("node %q is not one of the peers: recover each node into a configuration that holds it", nodeID)
	}
	path := filepath.Join(dataDir, DBFile)
	if _, err := os.Stat(path); err != nil {
		return res, fmt.Errorf("data directory %s: %w", dataDir, err)
	}
	if _, err := os.Stat(raftDir); err != nil {
		return res, fmt.Errorf("data directory %s holds no raft state (%w): a single node has no cluster to recover", dataDir, err)
	}
	st, err := store.Open(path)
	if err != nil {
		return res, offlineErr(dataDir, path, err)
	}
	fsm, err := cluster.NewFSM(st)
	if err != nil {
		return res, errors.Join(err, st.Close())
	}
	r, err := cluster.Recover(raftDir, nodeID, peers, fsm)
	if err != nil {
		return res, errors.Join(err, st.Close())
	}
	res.LastIndex, res.LastTerm, res.Voters = r.LastIndex, r.LastTerm, r.Voters
	return res, st.Close()
}
