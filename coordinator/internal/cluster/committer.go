package cluster

import (
	"fmt"
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/mutation"

	"github.com/leasehold/leasehold/coordinator/internal/engine"
	"github.com/leasehold/leasehold/coordinator/internal/store"
)

// Committer is the replicated committer (engine.Committer): it proposes
// the evaluated transaction's write set as one entry and returns once the
// entry is committed and applied to this node's store by the FSM, which
// the writer then reads its own writes from. The transaction stays open
// meanwhile, as the FSM's own group of that entry (owngroup.go): the FSM
// commits it when raft hands it the entry, so that the leader writes each
// group once, and it is rolled back when raft answers without that (the
// FSM then applies the write set if the entry commits). The group's base
// is the last write set applied to the state the transaction reads, read
// in the transaction itself: the FSM publishes what a batch committed
// only after the store lets its lock go, so a writer that began between
// the two would otherwise name the batch's predecessor as its base and see
// its entry refused. The FSM checks the base again when it applies.
//
// A group it could not commit fails with the commit outcomes of package
// engine (commitOutcome), so that the writer, which knows no raft, steps
// down instead of fail-stopping: engine.ErrNotLeader when the entry never
// reached the log, or reached it on a base the log had moved past (the FSM
// refused it, store.ErrStaleBase), engine.ErrOutcomeUnknown when it may yet
// commit.
type Committer struct {
	raft Raft
	fsm  *FSM
	// timeout bounds the wait to enqueue the entry with raft.
	timeout time.Duration
	// metrics are the FSM's: Commit is timed with them.
	metrics *Metrics
}

var _ engine.Committer = (*Committer)(nil)

// NewCommitter returns the committer proposing to r, whose state machine
// is fsm.
func NewCommitter(r Raft, fsm *FSM, enqueueTimeout time.Duration) *Committer {
	return &Committer{raft: r, fsm: fsm, timeout: enqueueTimeout, metrics: fsm.metrics}
}

// Record implements engine.Committer: the entry is the write set.
func (c *Committer) Record() bool { return true }

// Commit implements engine.Committer. A commit that succeeds is timed in
// the metrics, from the write set's encoding to its apply.
func (c *Committer) Commit(tx *store.Tx, wall time.Time) error {
	start := time.Now()
	base := tx.Group()
	entry := tx.AppendWriteSet([]byte{entryWriteSet}, base, wall)
	c.fsm.own.hold(tx, entry, base, wall)
	resp, err := c.raft.Apply(entry, c.timeout)
	// Raft answered: the FSM took the group for its entry, or never will
	// (not proposed, or leadership lost with it in flight).
	if rerr := c.fsm.release(); rerr != nil {
		return fmt.Errorf("rolling back the evaluated group: %w", rerr)
	}
	if mutation.On(mutation.IgnoreStaleBase) {
		resp = nil
	}
	if err := commitOutcome(resp, err); err != nil {
		return err
	}
	c.metrics.observeCommit(time.Since(start))
	return nil
}
