package cluster_test

import (
	"bytes"
	"errors"
	"path/filepath"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/cluster"
	"github.com/leasehold/leasehold/coordinator/internal/engine"
	"github.com/leasehold/leasehold/coordinator/internal/store"
)

// applyRaft stands in for raft on one node for the Committer: Apply runs
// propose with the entry handed to it, on the caller's goroutine, as raft
// applies a leader's entry before answering its future.
type applyRaft struct {
	cluster.Raft
	propose func(entry []byte) (any, error)
}

func (r applyRaft) Apply(entry []byte, _ time.Duration) (any, error) { return r.propose(entry) }

// ownEntryNode is a leader's store and state machine, and a follower's
// beside it, to compare what the leader's own path leaves with what
// applying the write set leaves.
type ownEntryNode struct {
	st, follower *store.Store
	fsm, ffsm    *cluster.FSM
}

func newOwnEntryNode(t *testing.T) *ownEntryNode {
	t.Helper()
	dir := t.TempDir()
	n := &ownEntryNode{}
	var err error
	for _, p := range []struct {
		st  **store.Store
		fsm **cluster.FSM
		f   string
	}{{&n.st, &n.fsm, "leader.db"}, {&n.follower, &n.ffsm, "follower.db"}} {
		if *p.st, err = store.Open(filepath.Join(dir, p.f), store.WithoutSync()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { (*p.st).Close() })
		if *p.fsm, err = cluster.NewFSM(*p.st); err != nil {
			t.Fatal(err)
		}
	}
	return n
}

// evaluate begins the writer's transaction on the leader's store and
// writes job id in it, recording.
func (n *ownEntryNode) evaluate(t *testing.T, id uint64) *store.Tx {
	t.Helper()
	return evaluateJob(t, n.st, id)
}

// evaluateJob begins a writer's transaction on st, recording, and writes
// job id in it, as a writer's group does.
func evaluateJob(t *testing.T, st *store.Store, id uint64) *store.Tx {
	t.Helper()
	tx, err := st.Begin()
	if err != nil {
		t.Fatal(err)
	}
	tx.Record()
	if err := putJob(tx, id); err != nil {
		t.Fatal(err)
	}
	return tx
}

// foreign is another leader's entry on base: job id, evaluated on a store
// of its own that holds nothing.
func foreign(t *testing.T, base, id uint64) []byte {
	t.Helper()
	st, err := store.Open(filepath.Join(t.TempDir(), "other.db"), store.WithoutSync())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	tx := evaluateJob(t, st, id)
	defer tx.Rollback()
	return append([]byte{1}, tx.WriteSet(base, t0)...)
}

func hasJob(t *testing.T, st *store.Store, id uint64) bool {
	t.Helper()
	found := false
	if err := st.View(func(tx *store.Tx) (err error) {
		_, found, err = tx.Job(id)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return found
}

// begins reports whether the store's writer lock is free: the test
// fails by its timeout if a pending transaction kept it.
func begins(t *testing.T, st *store.Store) {
	t.Helper()
	tx, err := st.Begin()
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
}

// TestOwnEntry: the leader's evaluated transaction is committed by its
// state machine only for the entry proposed with it, leaves what applying
// the write set leaves, and is rolled back whenever raft answers without
// it, so that no later entry or term finds it.
func TestOwnEntry(t *testing.T) {
	t.Parallel()

	t.Run("CommitsTheEvaluatedGroupAsItsEntry", func(t *testing.T) {
		t.Parallel()
		n := newOwnEntryNode(t)
		var proposed []byte
		c := cluster.NewCommitter(applyRaft{propose: func(entry []byte) (any, error) {
			proposed = entry
			return n.fsm.ApplyCommands([]cluster.Command{{Index: 7, Term: 2, Data: entry}})[0], nil
		}}, n.fsm, time.Second)
		tx := n.evaluate(t, 1)
		if err := c.Commit(tx, t0); err != nil {
			t.Fatalf("Commit: %v", err)
		}
		if n.fsm.OwnEntries() != 1 {
			t.Fatalf("entries committed from the evaluated transaction: %d, want 1", n.fsm.OwnEntries())
		}
		// The transaction was the one committed, not rolled back.
		if err := tx.Rollback(); err == nil {
			t.Fatal("the evaluated transaction is still open after its entry was applied")
		}
		if !hasJob(t, n.st, 1) || n.fsm.Applied() != 7 || n.fsm.LastGroup() != 7 || !n.fsm.WallFloor().Equal(t0) {
			t.Fatalf("after the own entry: job stored %v, Applied %d, LastGroup %d, WallFloor %v",
				hasJob(t, n.st, 1), n.fsm.Applied(), n.fsm.LastGroup(), n.fsm.WallFloor())
		}
		// A follower applying the same entry from its log holds the same.
		if r := n.ffsm.ApplyCommands([]cluster.Command{{Index: 7, Term: 2, Data: bytes.Clone(proposed)}})[0]; r != nil {
			t.Fatalf("the follower's apply: %v", r)
		}
		a, _ := n.st.Digest()
		b, _ := n.follower.Digest()
		rsa, _ := n.st.ReplicaState()
		rsb, _ := n.follower.ReplicaState()
		if a != b || rsa != rsb {
			t.Fatalf("the leader's own commit and the follower's apply differ: digests equal %v, replica state %+v and %+v", a == b, rsa, rsb)
		}
		// Replayed (raft hands it again after a restart), it changes nothing.
		if r := n.fsm.ApplyCommands([]cluster.Command{{Index: 7, Term: 2, Data: proposed}})[0]; r != nil {
			t.Fatalf("replaying the own entry: %v", r)
		}
		if c, _ := n.st.Digest(); c != a {
			t.Fatal("replaying the own entry changed the store")
		}
	})

	t.Run("AnotherEntryFirstRollsThePendingGroupBack", func(t *testing.T) {
		t.Parallel()
		n := newOwnEntryNode(t)
		other := foreign(t, 0, 2)
		// Another leader's entry at the index this leader proposed at,
		// raft hands the deposed leader's state machine while the writer
		// is yet to hear its leadership was lost.
		var res []any
		c := cluster.NewCommitter(applyRaft{propose: func(entry []byte) (any, error) {
			res = n.fsm.ApplyCommands([]cluster.Command{{Index: 1, Term: 3, Data: other}, {Index: 2, Term: 3, Data: entry}})
			return nil, cluster.ErrRaftLeadershipLost
		}}, n.fsm, time.Second)
		err := c.Commit(n.evaluate(t, 1), t0)
		if !errors.Is(err, engine.ErrOutcomeUnknown) {
			t.Fatalf("Commit with leadership lost: %v, want ErrOutcomeUnknown", err)
		}
		if !hasJob(t, n.st, 2) || hasJob(t, n.st, 1) {
			t.Fatalf("another leader's entry first: its job stored %v, the pending group's %v; want true, false", hasJob(t, n.st, 2), hasJob(t, n.st, 1))
		}
		// The own entry behind it was applied from its write set, onto a
		// base the log had moved past.
		if err, _ := res[1].(error); !errors.Is(err, store.ErrStaleBase) || n.fsm.Applied() != 2 || n.fsm.LastGroup() != 1 {
			t.Fatalf("the own entry behind another: %v, Applied %d, LastGroup %d; want ErrStaleBase, 2, 1", res[1], n.fsm.Applied(), n.fsm.LastGroup())
		}
		begins(t, n.st)
	})

	t.Run("AnEqualCopyIsNotTheEntry", func(t *testing.T) {
		t.Parallel()
		n := newOwnEntryNode(t)
		c := cluster.NewCommitter(applyRaft{propose: func(entry []byte) (any, error) {
			return n.fsm.ApplyCommands([]cluster.Command{{Index: 1, Term: 1, Data: bytes.Clone(entry)}})[0], nil
		}}, n.fsm, time.Second)
		tx := n.evaluate(t, 1)
		if err := c.Commit(tx, t0); err != nil {
			t.Fatalf("Commit: %v", err)
		}
		// Applied from its write set after the pending group was rolled
		// back: the same records, and the lock free again.
		if !hasJob(t, n.st, 1) || n.fsm.Applied() != 1 {
			t.Fatalf("job stored %v, Applied %d", hasJob(t, n.st, 1), n.fsm.Applied())
		}
		begins(t, n.st)
	})

	t.Run("ALostOutcomeRollsBackAndTheEntryAppliesLater", func(t *testing.T) {
		t.Parallel()
		n := newOwnEntryNode(t)
		var proposed []byte
		c := cluster.NewCommitter(applyRaft{propose: func(entry []byte) (any, error) {
			proposed = entry
			return nil, cluster.ErrRaftLeadershipLost
		}}, n.fsm, time.Second)
		err := c.Commit(n.evaluate(t, 1), t0)
		if !errors.Is(err, engine.ErrOutcomeUnknown) {
			t.Fatalf("Commit with leadership lost: %v, want ErrOutcomeUnknown", err)
		}
		if hasJob(t, n.st, 1) || n.fsm.Applied() != 0 {
			t.Fatal("a group whose outcome is unknown is in the store before its entry commits")
		}
		begins(t, n.st)
		// Committed later under another leader, raft hands the same
		// entry (a log cache hands the very slice proposed): it applies
		// from its write set.
		if r := n.fsm.ApplyCommands([]cluster.Command{{Index: 1, Term: 1, Data: proposed}})[0]; r != nil {
			t.Fatalf("the entry committed later: %v", r)
		}
		if !hasJob(t, n.st, 1) || n.fsm.Applied() != 1 || n.fsm.LastGroup() != 1 {
			t.Fatalf("the entry committed later: job stored %v, Applied %d, LastGroup %d", hasJob(t, n.st, 1), n.fsm.Applied(), n.fsm.LastGroup())
		}
	})

	t.Run("NotProposedRollsBack", func(t *testing.T) {
		t.Parallel()
		n := newOwnEntryNode(t)
		c := cluster.NewCommitter(applyRaft{propose: func([]byte) (any, error) {
			return nil, cluster.ErrRaftNotLeader
		}}, n.fsm, time.Second)
		if err := c.Commit(n.evaluate(t, 1), t0); !errors.Is(err, engine.ErrNotLeader) {
			t.Fatalf("Commit refused by raft: %v, want ErrNotLeader", err)
		}
		if hasJob(t, n.st, 1) {
			t.Fatal("a group raft refused is in the store")
		}
		begins(t, n.st)
	})

	// A deposed leader's state machine applying another leader's entry
	// waits for bbolt's writer lock while the writer evaluates; the
	// writer's proposal fails, the Committer rolls back, and the state
	// machine goes on. Whichever comes first, neither waits for ever.
	t.Run("TheStateMachineWaitsOnlyForAnEvaluationThatEnds", func(t *testing.T) {
		t.Parallel()
		n := newOwnEntryNode(t)
		other := foreign(t, 0, 2)
		tx := n.evaluate(t, 1)
		applied := make(chan any, 1)
		go func() { applied <- n.fsm.ApplyCommands([]cluster.Command{{Index: 1, Term: 3, Data: other}})[0] }()
		c := cluster.NewCommitter(applyRaft{propose: func([]byte) (any, error) {
			return nil, cluster.ErrRaftNotLeader
		}}, n.fsm, time.Second)
		if err := c.Commit(tx, t0); !errors.Is(err, engine.ErrNotLeader) {
			t.Fatalf("Commit on a deposed leader: %v, want ErrNotLeader", err)
		}
		if r := <-applied; r != nil {
			t.Fatalf("the other leader's entry: %v", r)
		}
		if !hasJob(t, n.st, 2) || hasJob(t, n.st, 1) {
			t.Fatal("the other leader's entry is not the one applied")
		}
	})
}

// TestOwnGroupNeverHoldsUpTheStateMachine: on a deposed leader, raft's
// goroutine may wait for the state machine, which applies the new
// leader's entries, while the writer's group waits for raft with the
// store's write lock. The state machine ends the group itself instead of
// waiting for the lock, and raft then answers the proposal.
func TestOwnGroupNeverHoldsUpTheStateMachine(t *testing.T) {
	t.Parallel()
	n := newOwnEntryNode(t)
	other := foreign(t, 0, 2)
	tx := n.evaluate(t, 1)
	// Raft hands the state machine the new leader's entry while the
	// writer evaluates: it finds no group of this node's waiting, and
	// waits for the store's write lock.
	applied := make(chan any, 1)
	go func() { applied <- n.fsm.ApplyCommands([]cluster.Command{{Index: 1, Term: 3, Data: other}})[0] }()
	for n.st.WritersWaiting() == 0 {
		runtime.Gosched()
	}
	c := cluster.NewCommitter(applyRaft{propose: func([]byte) (any, error) {
		// Raft's goroutine waits for the state machine before it answers
		// this proposal.
		select {
		case r := <-applied:
			applied <- r
		case <-time.After(time.Minute):
			t.Error("the state machine waited for a group that waits for raft")
		}
		return nil, cluster.ErrRaftLeadershipLost
	}}, n.fsm, 0)
	if err := c.Commit(tx, t0); !errors.Is(err, engine.ErrOutcomeUnknown) {
		t.Fatalf("Commit with leadership lost: %v, want ErrOutcomeUnknown", err)
	}
	if r := <-applied; r != nil {
		t.Fatalf("the new leader's entry: %v", r)
	}
	if !hasJob(t, n.st, 2) || hasJob(t, n.st, 1) {
		t.Fatalf("the new leader's job stored %v, the deposed leader's group %v; want true, false", hasJob(t, n.st, 2), hasJob(t, n.st, 1))
	}
	begins(t, n.st)
}

// TestOwnGroupEndsBeforeCommitReturns: raft may tell the Committer that
// leadership was lost while the state machine commits the group for its
// entry, which committed meanwhile. Commit returns only once the state
// machine is done with the transaction, which the writer then rolls back
// as it steps down: nobody touches it after.
func TestOwnGroupEndsBeforeCommitReturns(t *testing.T) {
	// Not parallel: the hook is the package's.
	n := newOwnEntryNode(t)
	taken, proceed := make(chan struct{}), make(chan struct{})
	cluster.OnOwnTaken(t, func() {
		close(taken)
		<-proceed
	})
	var applied atomic.Bool
	c := cluster.NewCommitter(applyRaft{propose: func(entry []byte) (any, error) {
		go func() {
			n.fsm.ApplyCommands([]cluster.Command{{Index: 1, Term: 1, Data: entry}})
			applied.Store(true)
		}()
		<-taken
		close(proceed)
		return nil, cluster.ErrRaftLeadershipLost
	}}, n.fsm, 0)
	tx := n.evaluate(t, 1)
	if err := c.Commit(tx, t0); !errors.Is(err, engine.ErrOutcomeUnknown) {
		t.Fatalf("Commit with leadership lost: %v, want ErrOutcomeUnknown", err)
	}
	if !hasJob(t, n.st, 1) || n.fsm.OwnEntries() != 1 {
		t.Fatalf("Commit returned before the state machine ended the group it took: job stored %v, own entries %d", hasJob(t, n.st, 1), n.fsm.OwnEntries())
	}
	// The writer steps down and rolls back what it evaluated: nothing.
	if err := tx.Rollback(); err == nil {
		t.Fatal("the group was still open after Commit")
	}
	begins(t, n.st)
	if !hasJob(t, n.st, 1) {
		t.Fatal("the writer's rollback undid the committed entry")
	}
	for !applied.Load() {
		runtime.Gosched()
	}
}

// TestOwnEntryOverRaft: on a real raft leader the state machine is handed
// the very entry the Committer proposed, and commits the evaluated
// transaction; the followers apply the write set to the same records.
func TestOwnEntryOverRaft(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 3)
	for try := uint64(1); try <= 5; try++ {
		l := c.leader()
		tx := evaluateJob(t, l.st, try)
		own := l.fsm.OwnEntries()
		err := cluster.NewCommitter(l.node, l.fsm, time.Second).Commit(tx, t0)
		if errors.Is(err, engine.ErrNotLeader) || errors.Is(err, engine.ErrOutcomeUnknown) {
			continue // leadership moved on a loaded machine: again
		}
		if err != nil {
			t.Fatal(err)
		}
		if got := l.fsm.OwnEntries() - own; got != 1 {
			t.Fatalf("the leader's state machine committed %d entries from the evaluated transaction, want 1", got)
		}
		if err := tx.Rollback(); err == nil {
			t.Fatal("the evaluated transaction is still open after Commit")
		}
		if !hasJob(t, l.st, try) {
			t.Fatal("the leader's store lacks the group it committed")
		}
		return
	}
	t.Fatal("leadership was lost in every attempt")
}

// TestGroupBaseIsWhatItWasEvaluatedOn: a writer that begins its group
// after a follower's batch committed, but before the state machine took
// what the batch committed as its state, proposes the batch as its base,
// and its entry applies instead of being refused as stale.
func TestGroupBaseIsWhatItWasEvaluatedOn(t *testing.T) {
	n := newOwnEntryNode(t)
	n.fsm.HoldBatches()
	t.Cleanup(n.fsm.Flush) // before the store closes, which waits for the batch
	if r := n.fsm.ApplyCommands([]cluster.Command{{Index: 1, Term: 1, Data: foreign(t, 0, 1)}})[0]; r != nil {
		t.Fatalf("applying another leader's entry: %v", r)
	}
	var proposed []byte
	c := cluster.NewCommitter(applyRaft{propose: func(entry []byte) (any, error) {
		proposed = entry
		return nil, cluster.ErrRaftLeadershipLost
	}}, n.fsm, time.Second)
	once := false
	cluster.OnBatchCommitted(t, func() {
		if once {
			return
		}
		once = true
		if err := c.Commit(n.evaluate(t, 2), t0); !errors.Is(err, engine.ErrOutcomeUnknown) {
			t.Errorf("Commit with leadership lost: %v, want ErrOutcomeUnknown", err)
		}
	})
	n.fsm.Flush()
	if proposed == nil {
		t.Fatal("no group was proposed between the batch's commit and the state machine taking it")
	}
	if r := n.fsm.ApplyCommands([]cluster.Command{{Index: 2, Term: 2, Data: proposed}})[0]; r != nil {
		t.Fatalf("the group evaluated on the batch's state: %v, want it applied", r)
	}
	n.fsm.Flush()
	if !hasJob(t, n.st, 2) || n.fsm.LastGroup() != 2 {
		t.Fatalf("after the group: its job stored %v, LastGroup %d; want true, 2", hasJob(t, n.st, 2), n.fsm.LastGroup())
	}
}
