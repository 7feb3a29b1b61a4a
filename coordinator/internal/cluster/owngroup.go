package cluster

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/mutation"
	"github.com/leasehold/leasehold/coordinator/internal/store"
)

// A leader writes each of its groups once. The Committer does not roll
// the writer's evaluated transaction back: it hands it to the FSM as the
// own group of the entry it proposes, keyed by the entry's data (the very
// slice handed to raft), and waits for raft's answer. When raft hands the
// FSM that entry, the FSM commits the transaction with the entry's
// replica bookkeeping in it (store.Store.CommitAsEntry) instead of
// decoding the write set and writing it again; the base and replay checks
// are made there, in the transaction, as applying the write set makes
// them.
//
// Whoever takes the own group out first ends it, and only one can: the
// FSM, which commits it for its own entry or rolls it back; any other
// writer of the store, which rolls it back instead of waiting for the
// store's write lock (store.Tx.Yieldable); or the Committer, which rolls
// it back when raft answers without the FSM having taken it (the entry
// never reached the log, or leadership was lost with it in flight). So:
//
//   - The FSM commits the own group only for its entry: the same slice of
//     data, not equal bytes, and only when that entry is the first command
//     raft hands it in a call. Any other command (an entry of another
//     leader, a replay, an entry behind the leader's own in the same call)
//     has it roll the own group back before it applies anything, and it
//     then applies every command the ordinary way, the leader's own
//     included if it comes: its write set's base decides, as on a
//     follower.
//   - The FSM never waits for a proposal. Beginning its own transaction,
//     it ends a waiting own group itself; it waits only for a writer's
//     evaluation, which waits for nothing raft does. (Otherwise a deposed
//     leader's FSM could wait for the lock held by a group whose proposal
//     waits for raft's goroutine, which waits for the FSM.)
//   - Commit returns only once the own group has ended: raft may tell
//     the Committer that leadership was lost while the FSM is committing
//     the group for its entry, which committed meanwhile, and the writer
//     then rolls back (a no-op) what it evaluated. A lost or unknown
//     outcome finds the own group ended (rolled back, or committed for
//     an entry that did commit), and the writer drops its memory and
//     steps down;
//     a writer of a later term begins its own transaction only after that,
//     so no term sees another's group. An entry that commits later, under
//     another leader, is applied from the log as a follower applies it.
type ownGroup struct {
	mu sync.Mutex
	// data is the entry proposed; tx the transaction evaluated for it, on
	// base, at wall. tx is nil when none waits.
	data []byte
	tx   *store.Tx
	base uint64
	wall time.Time
	// ended is closed once the transaction held last has ended, by
	// whoever took it: the Committer waits for it, so that nobody touches
	// the transaction once Commit returned.
	ended chan struct{}
	// committed counts the entries committed from an own group.
	committed atomic.Uint64
}

// OwnEntries returns how many entries this node committed, leading, from
// its writer's evaluated transaction instead of applying their write sets.
func (f *FSM) OwnEntries() uint64 { return f.own.committed.Load() }

// hold makes tx the own group of the entry data, and lets any other
// writer of the store end it.
func (o *ownGroup) hold(tx *store.Tx, data []byte, base uint64, wall time.Time) {
	o.mu.Lock()
	o.tx, o.data, o.base, o.wall, o.ended = tx, data, base, wall, make(chan struct{})
	o.mu.Unlock()
	tx.Yieldable(func() {
		if tx, ended := o.takeIf(tx); tx != nil {
			_ = tx.Rollback()
			close(ended)
		}
	})
}

// take takes the own group out, if any: the caller ends it, then closes
// ended.
func (o *ownGroup) take() (tx *store.Tx, data []byte, base uint64, wall time.Time, ended chan struct{}) {
	o.mu.Lock()
	defer o.mu.Unlock()
	tx, data, base, wall, ended = o.tx, o.data, o.base, o.wall, o.ended
	o.tx, o.data = nil, nil
	return tx, data, base, wall, ended
}

// takeIf takes the own group out if it is tx.
func (o *ownGroup) takeIf(tx *store.Tx) (*store.Tx, chan struct{}) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.tx != tx {
		return nil, nil
	}
	o.tx, o.data = nil, nil
	return tx, o.ended
}

// settle ends the hold, for the Committer once raft answered: it rolls
// the own group back if nobody took it, and otherwise waits until whoever
// took it (the FSM committing it for its entry, while raft told the
// Committer leadership was lost; another writer) has ended it.
func (o *ownGroup) settle() error {
	o.mu.Lock()
	tx, ended := o.tx, o.ended
	o.tx, o.data, o.ended = nil, nil, nil
	o.mu.Unlock()
	if ended == nil {
		return nil
	}
	if tx == nil {
		<-ended
		return nil
	}
	defer close(ended)
	return tx.Rollback()
}

// sameEntry reports whether a and b are the same entry's data: one slice,
// not equal bytes.
func sameEntry(a, b []byte) bool {
	return len(a) > 0 && len(a) == len(b) && &a[0] == &b[0]
}

// applyOwn is the FSM's own-entry path, first in a call, with f.mu held:
// when an own group waits and cmds begins with its entry, it commits that
// group as the entry and reports true; the caller applies the rest of
// cmds the ordinary way. Otherwise any own group is rolled back, and it
// reports false.
func (f *FSM) applyOwn(cmds []Command) bool {
	if len(cmds) == 0 {
		return false
	}
	tx, data, base, wall, ended := f.own.take()
	if tx == nil {
		return false
	}
	defer close(ended)
	ownTaken()
	own := sameEntry(cmds[0].Data, data)
	if mutation.On(mutation.PendingForeignEntry) {
		own = true
	}
	if own && f.batch == nil {
		// The entry is committed in raft's log and nothing of it is in
		// the store, as before a write set's apply.
		failpointBeforeApply()
		start := time.Now()
		rs, committed, err := f.st.CommitAsEntry(tx, cmds[0].Index, base, wall)
		f.metrics.observeApply(time.Since(start))
		if err != nil {
			f.fatal(fmt.Errorf("replica: committing entry %d evaluated on this leader: %w", cmds[0].Index, err))
		}
		if committed {
			f.own.committed.Add(1)
			f.set(rs)
			return true
		}
	}
	if err := tx.Rollback(); err != nil {
		f.fatal(fmt.Errorf("replica: rolling back the group evaluated for entry %d: %w", cmds[0].Index, err))
	}
	return false
}

// release ends the own group's hold (ownGroup.settle).
func (f *FSM) release() error { return f.own.settle() }

// ownTaken is called once the FSM took an own group for a command, before
// it ends it: a test's hook.
var ownTaken = func() {}
