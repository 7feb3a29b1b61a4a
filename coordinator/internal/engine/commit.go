package engine

import (
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/store"
)

// A Committer makes a group's writes durable: the one step of the writer
// that a replicated coordinator replaces. The writer evaluates a group
// (every command applied, the grants made, the counts flushed) in one
// read-write transaction, then hands that transaction to Commit, and
// publishes the group's effects and answers its callers only once Commit
// returned nil. Commit runs on the writer goroutine, once per group that
// wrote something, and must end the transaction (commit or roll back) in
// every case.
//
// An error from Commit means nothing of the group may be acknowledged. A
// committer that replicates the group hands on tx.WriteSet and returns
// only once the write set is applied to this store, by committing tx
// itself or by rolling it back and applying the write set, and once
// nothing touches tx any more (it may end it on another goroutine, the
// one that applies); when it cannot, its error says
// what became of the group, and the writer steps down instead of
// fail-stopping: an error wrapping ErrNotLeader when the group was not
// committed and never will be (this node does not lead, or the group was
// evaluated on a base the log has moved past), ErrOutcomeUnknown when it
// may yet commit, or not (leadership was lost with it proposed). Any other
// error is a storage failure, and the writer fail-stops on it
// (ErrStorageFailed).
type Committer interface {
	// Record reports whether Commit needs the group's write set: each
	// group's transaction then records its writes (store.Tx.Record).
	Record() bool
	// Commit makes the writes of tx durable and ends tx. wall is the
	// group's wall clock at its end, for the write set's header.
	Commit(tx *store.Tx, wall time.Time) error
}

// localCommitter commits the group's transaction in place, with fsync:
// the single-node coordinator.
type localCommitter struct{}

func (localCommitter) Record() bool { return false }

func (localCommitter) Commit(tx *store.Tx, _ time.Time) error { return tx.Commit() }
