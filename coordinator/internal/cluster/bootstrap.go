package cluster

import (
	"errors"
	"fmt"

	"github.com/hashicorp/raft"
)

// ErrRecordsWithoutRaftState is returned by StartNode for a node of
// several voters whose store holds records but whose directory holds no
// raft state.
var ErrRecordsWithoutRaftState = errors.New("the store holds records but there is no raft state beside it")

// checkBootstrap refuses to bootstrap a cluster of several voters over a
// store that already holds records: the database of a single node, or one
// whose raft directory was lost. Every voter of a new cluster starts from
// an empty store and applies the same log; a node that started from
// records of its own would hold what its peers never had, and the stores
// would differ without anyone noticing. A node whose directory was
// emptied rejoins by snapshot; a single voter may adopt the records, as
// it has no peer to differ from.
func checkBootstrap(cfg NodeConfig, fsm *FSM, logs raft.LogStore, stable raft.StableStore, snaps raft.SnapshotStore) error {
	if len(cfg.Peers) < 2 {
		return nil
	}
	existing, err := raft.HasExistingState(logs, stable, snaps)
	if err != nil || existing {
		return err
	}
	held, err := fsm.st.HoldsRecords()
	if err != nil {
		return fmt.Errorf("reading the store: %w", err)
	}
	if held {
		return fmt.Errorf("%w: a node of a cluster of %d voters starts from an empty data directory (it then catches up from the others), "+
			"or it would hold records its peers never had; move the database away, or start it as the only voter of --peers to adopt it",
			ErrRecordsWithoutRaftState, len(cfg.Peers))
	}
	return nil
}
