package cluster

import (
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/raft"
	"github.com/leasehold/leasehold/coordinator/internal/store"
)

// Errors of a replicated commit: the store's commit outcomes, so that the
// writer, which knows no raft, tells them from a storage failure, answers
// the group's commands with them and steps down instead of fail-stopping.
var (
	// ErrNotLeader is returned when the group was not committed and never
	// will be: this node is not (or no longer) the leader, or the entry was
	// evaluated on a base the log had moved past.
	ErrNotLeader = fmt.Errorf("not the leader: %w", store.ErrNotCommitted)
	// ErrOutcomeUnknown is returned when leadership was lost with the entry
	// proposed: it may yet commit under the next leader, or not.
	ErrOutcomeUnknown = fmt.Errorf("leadership was lost with the write proposed: %w", store.ErrCommitUnknown)
)

// Committer is the replicated committer (engine.Committer): it rolls the
// evaluated transaction back, proposes its write set as one raft entry,
// and returns once the entry is committed and applied to this node's store
// by the FSM, which the writer then reads its own writes from. The group's
// base is the FSM's last applied write set; the writer evaluates a group
// only after the previous one is applied, so the base is the state it was
// evaluated on.
type Committer struct {
	r   *raft.Raft
	fsm *FSM
	// timeout bounds the wait to enqueue the entry with raft.
	timeout time.Duration
	// metrics are the FSM's: Commit is timed with them.
	metrics *Metrics
}

// NewCommitter returns the committer proposing to r, whose FSM is fsm.
func NewCommitter(r *raft.Raft, fsm *FSM, enqueueTimeout time.Duration) *Committer {
	return &Committer{r: r, fsm: fsm, timeout: enqueueTimeout, metrics: fsm.metrics}
}

// Record implements engine.Committer: the entry is the write set.
func (c *Committer) Record() bool { return true }

// Commit implements engine.Committer. A commit that succeeds is timed in
// the metrics, from the write set's encoding to its apply.
func (c *Committer) Commit(tx *store.Tx, wall time.Time) error {
	start := time.Now()
	ws := tx.WriteSet(c.fsm.LastGroup(), wall)
	entry := make([]byte, 1+len(ws))
	entry[0] = entryWriteSet
	copy(entry[1:], ws)
	// The FSM applies the entry with the store's own writer lock, which
	// the evaluation holds until it is rolled back.
	if err := tx.Rollback(); err != nil {
		return fmt.Errorf("rolling back the evaluated group: %w", err)
	}
	f := c.r.Apply(entry, c.timeout)
	if err := f.Error(); err != nil {
		return commitError(err)
	}
	if err, ok := f.Response().(error); ok && err != nil {
		return fmt.Errorf("%w: %w", ErrNotLeader, err)
	}
	c.metrics.observeCommit(time.Since(start))
	return nil
}

// commitError classifies an error of raft.Apply.
func commitError(err error) error {
	switch {
	case errors.Is(err, raft.ErrLeadershipLost):
		return fmt.Errorf("%w: %w", ErrOutcomeUnknown, err)
	case errors.Is(err, raft.ErrNotLeader), errors.Is(err, raft.ErrEnqueueTimeout),
		errors.Is(err, raft.ErrLeadershipTransferInProgress), errors.Is(err, raft.ErrRaftShutdown):
		return fmt.Errorf("%w: %w", ErrNotLeader, err)
	}
	// Anything else raft returns leaves the entry's fate unknown.
	return fmt.Errorf("%w: %w", ErrOutcomeUnknown, err)
}
