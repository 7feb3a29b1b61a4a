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
// An entry the store cannot apply (a *cluster.UnappliableError) fails the
// recovery with the raft state left as it was, unless skip names its
// index: it is then applied as nothing (see SkipEntries).
//
// It works offline: while a coordinator holds the directory it fails
// within a second with an error wrapping ErrDataDirInUse. A directory
// without raft state (a single node's, or an empty one) is refused.
func RecoverCluster(dataDir, nodeID string, peers []cluster.Peer, skip []uint64) (RecoverResult, error) {
	raftDir := filepath.Join(dataDir, RaftDir)
	res := RecoverResult{RaftDir: raftDir}
	self := false
	for _, p := range peers {
		self = self || p.ID == nodeID
	}
	if !self {
		return res, fmt.Errorf("node %q is not one of the peers: recover each node into a configuration that holds it", nodeID)
	}
	st, fsm, err := openReplica(dataDir)
	if err != nil {
		return res, err
	}
	r, err := cluster.Recover(raftDir, nodeID, peers, fsm, skip)
	if err != nil {
		return res, errors.Join(err, st.Close())
	}
	res.LastIndex, res.LastTerm, res.Voters = r.LastIndex, r.LastTerm, r.Voters
	return res, st.Close()
}

// SkipResult is what SkipEntries did.
type SkipResult struct {
	// Applied is the last entry the node applied; Halted the entry it
	// stopped at, 0 when none.
	Applied, Halted uint64
}

// SkipEntries allows the stopped node of dataDir to apply the entries at
// indexes as nothing, should it be unable to apply them: the way past a
// committed entry that no node can apply (a cluster.UnappliableError), an
// entry no release of this program wrote, or a malformed one. It changes
// no raft state; the next start goes on from the skipped entry. Every
// node must be given the same indexes, or their stores would differ: a
// node that applied the entry would hold what the others skipped, which
// is why an entry this node can apply is never skipped. An index the node
// applied already, or one other than the entry it stopped at, is refused.
//
// It works offline, as RecoverCluster does.
func SkipEntries(dataDir string, indexes []uint64) (SkipResult, error) {
	st, fsm, err := openReplica(dataDir)
	if err != nil {
		return SkipResult{}, err
	}
	var res SkipResult
	if h, ok, err := st.Halted(); err != nil {
		return res, errors.Join(err, st.Close())
	} else if ok {
		res.Halted = h.Index
	}
	for _, i := range indexes {
		if err := st.AllowSkip(i); err != nil {
			return res, errors.Join(fmt.Errorf("skipping entry %d: %w", i, err), st.Close())
		}
	}
	res.Applied = fsm.Applied()
	return res, st.Close()
}

// openReplica opens the store of a stopped cluster node's data directory
// and its state machine; a directory without raft state is refused.
func openReplica(dataDir string) (*store.Store, *cluster.FSM, error) {
	path := filepath.Join(dataDir, DBFile)
	if _, err := os.Stat(path); err != nil {
		return nil, nil, fmt.Errorf("data directory %s: %w", dataDir, err)
	}
	if _, err := os.Stat(filepath.Join(dataDir, RaftDir)); err != nil {
		return nil, nil, fmt.Errorf("data directory %s holds no raft state (%w): a single node has no cluster to recover", dataDir, err)
	}
	st, err := store.Open(path)
	if err != nil {
		return nil, nil, offlineErr(dataDir, path, err)
	}
	fsm, err := cluster.NewFSM(st)
	if err != nil {
		return nil, nil, errors.Join(err, st.Close())
	}
	return st, fsm, nil
}
