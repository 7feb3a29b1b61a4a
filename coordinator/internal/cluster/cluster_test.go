package cluster_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/leasehold/leasehold/coordinator/internal/cluster"
	"github.com/leasehold/leasehold/coordinator/internal/engine"
	"github.com/leasehold/leasehold/coordinator/internal/store"
	"github.com/prometheus/client_golang/prometheus"
)

// member is one node of an in-process cluster: a real bbolt store, its
// FSM, raft over the in-memory transport, and the leadership it was told.
type member struct {
	id    string
	st    *store.Store
	fsm   *cluster.FSM
	node  *cluster.Node
	trans *raft.InmemTransport

	mu      sync.Mutex
	leading bool
	// changed is the cluster's: told of every change.
	changed chan struct{}
}

type testCluster struct {
	t       *testing.T
	members []*member
	changed chan struct{}
}

func newCluster(t *testing.T, n int) *testCluster {
	t.Helper()
	c := &testCluster{t: t, changed: make(chan struct{}, 1)}
	var peers []cluster.Peer
	for i := range n {
		id := fmt.Sprintf("n%d", i+1)
		addr, trans := raft.NewInmemTransport(raft.ServerAddress(id))
		peers = append(peers, cluster.Peer{ID: id, RaftAddr: string(addr), GRPCAddr: "grpc-" + id})
		c.members = append(c.members, &member{id: id, trans: trans, changed: c.changed})
	}
	for _, a := range c.members {
		for _, b := range c.members {
			if a != b {
				a.trans.Connect(raft.ServerAddress(b.id), b.trans)
			}
		}
	}
	dir := t.TempDir()
	for _, m := range c.members {
		st, err := store.Open(filepath.Join(dir, m.id+".db"), store.WithoutSync())
		if err != nil {
			t.Fatal(err)
		}
		m.st = st
		if m.fsm, err = cluster.NewFSM(st); err != nil {
			t.Fatal(err)
		}
		m.node, err = cluster.StartNode(cluster.NodeConfig{
			ID: m.id, Peers: peers, Transport: m.trans, InmemStore: true,
			// Short timeouts keep elections quick in memory.
			HeartbeatTimeout: 100 * time.Millisecond, ElectionTimeout: 100 * time.Millisecond, LeaderLeaseTimeout: 50 * time.Millisecond,
		}, m.fsm)
		if err != nil {
			t.Fatal(err)
		}
		go m.follow()
	}
	t.Cleanup(func() {
		for _, m := range c.members {
			if err := m.node.Shutdown(); err != nil {
				t.Errorf("Shutdown %s: %v", m.id, err)
			}
			m.st.Close()
		}
	})
	return c
}

// follow reads the node's leadership changes until raft shuts down, as
// the coordinator's monitor does.
func (m *member) follow() {
	for {
		select {
		case l := <-m.node.LeaderChanges():
			m.mu.Lock()
			m.leading = l
			m.mu.Unlock()
			select {
			case m.changed <- struct{}{}:
			default:
			}
		case <-m.node.Done():
			return
		}
	}
}

// leader waits for a member of among (every member when none) to be told
// it leads, and returns it once its barrier has applied everything before
// its term. It wakes on every leadership change, and retries a member whose
// barrier failed a little later.
func (c *testCluster) leader(among ...*member) *member {
	c.t.Helper()
	if len(among) == 0 {
		among = c.members
	}
	deadline := time.After(10 * time.Second)
	retry := time.NewTicker(50 * time.Millisecond)
	defer retry.Stop()
	for {
		for _, m := range among {
			m.mu.Lock()
			l := m.leading
			m.mu.Unlock()
			if l && m.node.Barrier(5*time.Second) == nil {
				return m
			}
		}
		select {
		case <-deadline:
			c.t.Fatal("no leader within 10 s")
		case <-c.changed:
		case <-retry.C:
		}
	}
}

// submit commits one group on m through the replicated committer: a job
// record and a fencing token, as a grant writes. It returns the token.
func (c *testCluster) submit(m *member, id uint64) (uint64, error) {
	tx, err := m.st.Begin()
	if err != nil {
		return 0, err
	}
	tx.Record()
	if err := putJob(tx, id); err != nil {
		_ = tx.Rollback()
		return 0, err
	}
	token, err := tx.NextToken()
	if err != nil {
		_ = tx.Rollback()
		return 0, err
	}
	committer := cluster.NewCommitter(m.node, m.fsm, time.Second)
	return token, committer.Commit(tx, t0)
}

// converge waits until every member applied what the leader did, then
// checks that their stores are equal. raft tells no one when a follower
// applies, so it asks again every few milliseconds, for at most 10 s.
func (c *testCluster) converge(leader *member) {
	c.t.Helper()
	// raft counts an entry applied once it is handed to the FSM, before the
	// store has it: the FSM's own index is the store's.
	if err := leader.node.Barrier(time.Second); err != nil {
		c.t.Fatal(err)
	}
	want := leader.fsm.Applied()
	deadline := time.Now().Add(10 * time.Second)
	for _, m := range c.members {
		for m.fsm.Applied() < want {
			if time.Now().After(deadline) {
				c.t.Fatalf("%s applied up to %d, the leader %d", m.id, m.fsm.Applied(), want)
			}
			if err := m.node.Barrier(time.Second); err != nil && m == leader {
				c.t.Fatal(err)
			}
			select {
			case <-m.node.Done():
				c.t.Fatal("shut down")
			case <-time.After(5 * time.Millisecond):
			}
		}
	}
	d0, _ := c.members[0].st.Digest()
	for _, m := range c.members[1:] {
		if d, _ := m.st.Digest(); d != d0 {
			c.t.Fatalf("%s's store differs from %s's", m.id, c.members[0].id)
		}
	}
}

func TestCluster(t *testing.T) {
	t.Parallel()

	t.Run("EveryAcknowledgedGroupIsOnEveryNodeAcrossAPartitionAndATransfer", func(t *testing.T) {
		t.Parallel()
		c := newCluster(t, 3)
		var acked []uint64
		var tokens []uint64
		next := uint64(1)
		// write acknowledges n groups on whoever of among leads. A write
		// that lost leadership is not acknowledged: a loaded machine may
		// miss a heartbeat of these short timeouts and hold an election,
		// and the write goes on with the new leader.
		write := func(n int, among ...*member) {
			t.Helper()
			m := c.leader(among...)
			for lost := 0; n > 0; next++ {
				tok, err := c.submit(m, next)
				switch {
				case err == nil:
					acked, tokens = append(acked, next), append(tokens, tok)
					n--
				case (errors.Is(err, engine.ErrNotLeader) || errors.Is(err, engine.ErrOutcomeUnknown)) && lost < 10:
					lost++
					m = c.leader(among...)
				default:
					t.Fatalf("submit %d on %s: %v", next, m.id, err)
				}
			}
		}
		write(20)

		// Cut the leader off from both followers: it steps down, the
		// others elect a leader, and what it proposes alone is refused.
		l1 := c.leader()
		l1.trans.DisconnectAll()
		for _, m := range c.members {
			if m != l1 {
				m.trans.Disconnect(raft.ServerAddress(l1.id))
			}
		}
		var rest []*member
		for _, m := range c.members {
			if m != l1 {
				rest = append(rest, m)
			}
		}
		c.leader(rest...)
		if _, err := c.submit(l1, 10_000); !errors.Is(err, engine.ErrNotLeader) && !errors.Is(err, engine.ErrOutcomeUnknown) {
			t.Fatalf("a write on the deposed leader: %v, want NOT_LEADER or OUTCOME_UNKNOWN", err)
		}
		write(20, rest...)

		// Heal, hand leadership on, and write on whoever leads.
		for _, a := range c.members {
			for _, b := range c.members {
				if a != b {
					a.trans.Connect(raft.ServerAddress(b.id), b.trans)
				}
			}
		}
		if err := c.leader().node.Raft.LeadershipTransfer().Error(); err != nil {
			t.Fatalf("LeadershipTransfer: %v", err)
		}
		write(20)
		c.converge(c.leader())

		for i := 1; i < len(tokens); i++ {
			if tokens[i] <= tokens[i-1] {
				t.Fatalf("token %d after %d: tokens must strictly increase across leaders", tokens[i], tokens[i-1])
			}
		}
		for _, m := range c.members {
			err := m.st.View(func(tx *store.Tx) error {
				for _, id := range acked {
					if _, found, err := tx.Job(id); err != nil || !found {
						return fmt.Errorf("acknowledged job %d is missing (%v)", id, err)
					}
				}
				if _, found, _ := tx.Job(10_000); found {
					return errors.New("the deposed leader's write is stored")
				}
				return nil
			})
			if err != nil {
				t.Errorf("%s: %v", m.id, err)
			}
		}
	})
}

// TestMutedLeader ensures a leader muted to its peers, as one that cannot
// commit mutes itself, hands off to a follower past the mute and is
// replaced; what it proposes is not committed; and, heard again, it
// follows the new leader and holds what it commits.
func TestMutedLeader(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 3)
	l1 := c.leader()
	if _, err := c.submit(l1, 1); err != nil {
		t.Fatal(err)
	}
	l1.node.Mute(true)
	to, err := l1.node.HandOff()
	if err != nil || to == l1.id {
		t.Fatalf("HandOff = %q, %v; want a follower asked to stand", to, err)
	}
	var rest []*member
	for _, m := range c.members {
		if m != l1 {
			rest = append(rest, m)
		}
	}
	l2 := c.leader(rest...)
	if _, err := c.submit(l1, 2); !errors.Is(err, engine.ErrNotLeader) && !errors.Is(err, engine.ErrOutcomeUnknown) {
		t.Fatalf("a write on the muted leader: %v, want NOT_LEADER or OUTCOME_UNKNOWN", err)
	}
	l1.node.Mute(false)
	if _, err := c.submit(l2, 3); err != nil {
		t.Fatalf("a write on the new leader: %v", err)
	}
	c.converge(l2)
	err = l1.st.View(func(tx *store.Tx) error {
		if _, found, _ := tx.Job(2); found {
			return errors.New("the muted leader's write is stored")
		}
		if _, found, _ := tx.Job(3); !found {
			return errors.New("the new leader's write is missing")
		}
		return nil
	})
	if err != nil {
		t.Error(err)
	}
}

func TestFSM(t *testing.T) {
	t.Parallel()

	// openStores opens a leader's store, src, and a follower's, dst.
	openStores := func(t *testing.T) (src, dst *store.Store) {
		t.Helper()
		dir := t.TempDir()
		src, err := store.Open(filepath.Join(dir, "src.db"), store.WithoutSync())
		if err != nil {
			t.Fatal(err)
		}
		dst, err = store.Open(filepath.Join(dir, "dst.db"), store.WithoutSync())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { src.Close(); dst.Close() })
		return src, dst
	}
	setupFSM := func(t *testing.T) (*store.Store, *cluster.FSM, func(base uint64) []byte) {
		t.Helper()
		src, dst := openStores(t)
		fsm, err := cluster.NewFSM(dst)
		if err != nil {
			t.Fatal(err)
		}
		id := uint64(0)
		group := func(base uint64) []byte {
			id++
			tx, err := src.Begin()
			if err != nil {
				t.Fatal(err)
			}
			tx.Record()
			if err := putJob(tx, id); err != nil {
				t.Fatal(err)
			}
			ws := tx.WriteSet(base, t0)
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
			return append([]byte{1}, ws...)
		}
		return dst, fsm, group
	}
	logAt := func(index uint64, data []byte) *raft.Log {
		return &raft.Log{Index: index, Term: 1, Type: raft.LogCommand, Data: data}
	}

	t.Run("IsIdempotentOnReplay", func(t *testing.T) {
		t.Parallel()
		st, fsm, group := setupFSM(t)
		e1, e2 := group(0), group(1)
		for _, l := range []*raft.Log{logAt(1, e1), logAt(2, e2)} {
			if r := fsm.Apply(l); r != nil {
				t.Fatalf("Apply(%d) = %v", l.Index, r)
			}
		}
		before, _ := st.Digest()
		res := fsm.ApplyBatch([]*raft.Log{logAt(1, e1), logAt(2, e2)})
		after, _ := st.Digest()
		if res[0] != nil || res[1] != nil || before != after {
			t.Fatalf("replaying applied entries: %v, store changed %v", res, before != after)
		}
		if fsm.LastGroup() != 2 || fsm.Applied() != 2 {
			t.Fatalf("LastGroup %d, Applied %d; want 2, 2", fsm.LastGroup(), fsm.Applied())
		}
	})

	t.Run("RefusesAStaleBaseAsANoOpWithAnError", func(t *testing.T) {
		t.Parallel()
		st, fsm, group := setupFSM(t)
		e1 := group(0)
		stale := group(0) // built on base 0 too: a second proposer's
		fsm.Apply(logAt(1, e1))
		before, _ := st.Digest()
		r := fsm.Apply(logAt(2, stale))
		if err, _ := r.(error); !errors.Is(err, store.ErrStaleBase) {
			t.Fatalf("Apply of a stale base = %v, want ErrStaleBase", r)
		}
		if after, _ := st.Digest(); after != before || fsm.LastGroup() != 1 {
			t.Fatal("a stale entry changed the store")
		}
	})

	t.Run("PanicsOnAnEntryOfAnUnknownKind", func(t *testing.T) {
		t.Parallel()
		_, fsm, _ := setupFSM(t)
		defer func() {
			if recover() == nil {
				t.Fatal("no panic")
			}
		}()
		fsm.Apply(logAt(1, []byte{99, 1, 2}))
	})

	// A follower's batch stays open across calls: what it reports
	// (Applied, LastGroup) and what readers see is what its store
	// committed, until Flush, Lead or Snapshot commits the rest; while it
	// leads, every call commits.
	t.Run("AFollowerReportsWhatItsStoreCommitted", func(t *testing.T) {
		t.Parallel()
		st, fsm, group := setupFSM(t)
		fsm.HoldBatches()
		fsm.ApplyBatch([]*raft.Log{logAt(1, group(0)), logAt(2, group(1))})
		fsm.ApplyBatch([]*raft.Log{logAt(3, group(2))})
		committed := func() (uint64, bool) {
			rs, err := st.ReplicaState()
			if err != nil {
				t.Fatal(err)
			}
			found := false
			if err := st.View(func(tx *store.Tx) error {
				_, found, err = tx.Job(1)
				return err
			}); err != nil {
				t.Fatal(err)
			}
			return rs.Applied, found
		}
		if applied, found := committed(); applied != 0 || found || fsm.Applied() != 0 || fsm.LastGroup() != 0 {
			t.Fatalf("with entries 1 to 3 in the open batch: the store committed %d (job 1 visible: %v), the FSM says %d (group %d); want 0",
				applied, found, fsm.Applied(), fsm.LastGroup())
		}
		snap, err := fsm.Snapshot()
		if err != nil {
			t.Fatal(err)
		}
		snap.Release()
		if applied, found := committed(); applied != 3 || !found || fsm.Applied() != 3 || fsm.LastGroup() != 3 {
			t.Fatalf("after Snapshot: the store committed %d (job 1 visible: %v), the FSM says %d; want 3", applied, found, fsm.Applied())
		}
		fsm.Lead()
		fsm.ApplyBatch([]*raft.Log{logAt(4, group(3))})
		if applied, _ := committed(); applied != 4 || fsm.Applied() != 4 {
			t.Fatalf("leading: the store committed %d after entry 4, the FSM says %d", applied, fsm.Applied())
		}
		fsm.Follow()
		fsm.ApplyBatch([]*raft.Log{logAt(5, group(4))})
		if applied, _ := committed(); applied != 4 || fsm.Applied() != 4 {
			t.Fatalf("following again: the store committed %d with entry 5 in the batch, the FSM says %d", applied, fsm.Applied())
		}
		fsm.Flush()
		if applied, _ := committed(); applied != 5 || fsm.Applied() != 5 {
			t.Fatalf("after Flush: the store committed %d, the FSM says %d; want 5", applied, fsm.Applied())
		}
	})

	// The metrics show the open batch: its entries while it is open, and
	// how long it was open once its commit returned.
	t.Run("ItsMetricsShowTheOpenBatch", func(t *testing.T) {
		t.Parallel()
		_, fsm, group := setupFSM(t)
		reg := prometheus.NewRegistry()
		fsm.SetMetrics(cluster.NewMetrics(reg))
		fsm.HoldBatches()
		// A failure with the batch open must not leave the store's close
		// waiting for its write transaction.
		t.Cleanup(func() { _ = fsm.Abandon() })
		held := func() uint64 {
			t.Helper()
			mfs, err := reg.Gather()
			if err != nil {
				t.Fatal(err)
			}
			for _, mf := range mfs {
				if mf.GetName() == "leasehold_raft_batch_held_seconds" {
					return mf.GetMetric()[0].GetHistogram().GetSampleCount()
				}
			}
			t.Fatal("no leasehold_raft_batch_held_seconds")
			return 0
		}
		fsm.ApplyBatch([]*raft.Log{logAt(1, group(0)), logAt(2, group(1))})
		fsm.ApplyBatch([]*raft.Log{logAt(3, group(2))})
		if fsm.Pending() != 3 || held() != 0 {
			t.Fatalf("entries 1 to 3 in the open batch: pending %d, batches held %d; want 3, 0", fsm.Pending(), held())
		}
		fsm.Flush()
		if fsm.Pending() != 0 || held() != 1 {
			t.Fatalf("after Flush: pending %d, batches held %d; want 0, 1", fsm.Pending(), held())
		}
		fsm.Lead()
		fsm.ApplyBatch([]*raft.Log{logAt(4, group(3))})
		if fsm.Pending() != 0 || held() != 2 {
			t.Fatalf("leading, after entry 4: pending %d, batches held %d; want 0, 2", fsm.Pending(), held())
		}
	})

	// A follower killed with a batch open loses the batch, and its store
	// says how far it committed: raft hands it the log again from its
	// snapshot (here from the start), and the store ends as the leader's.
	// Its batch bound cuts one call into two commits; the first must not
	// claim the entries of the second.
	t.Run("AKillMidBatchReplaysWhatTheStoreLacks", func(t *testing.T) {
		t.Parallel()
		src, dst := openStores(t)
		n := cluster.BatchEntries + 5
		logs := make([]*raft.Log, n)
		for i := range logs {
			tx, err := src.Begin()
			if err != nil {
				t.Fatal(err)
			}
			tx.Record()
			if err := putJob(tx, uint64(i+1)); err != nil {
				t.Fatal(err)
			}
			ws := tx.WriteSet(uint64(i), t0)
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
			logs[i] = logAt(uint64(i+1), append([]byte{1}, ws...))
		}
		fsm, err := cluster.NewFSM(dst)
		if err != nil {
			t.Fatal(err)
		}
		fsm.HoldBatches()
		fsm.ApplyBatch(logs)
		if err := fsm.Abandon(); err != nil { // the kill
			t.Fatal(err)
		}
		rs, err := dst.ReplicaState()
		if err != nil {
			t.Fatal(err)
		}
		if rs.Applied != uint64(cluster.BatchEntries) || fsm.Applied() != rs.Applied {
			t.Fatalf("killed with entries %d to %d in the open batch: the store says it applied %d, the FSM %d; want %d",
				cluster.BatchEntries+1, n, rs.Applied, fsm.Applied(), cluster.BatchEntries)
		}
		restarted, err := cluster.NewFSM(dst)
		if err != nil {
			t.Fatal(err)
		}
		restarted.HoldBatches()
		for _, r := range restarted.ApplyBatch(logs) {
			if r != nil {
				t.Fatalf("replaying the log: %v", r)
			}
		}
		restarted.Flush()
		want, _ := src.Digest()
		if got, _ := dst.Digest(); got != want || restarted.Applied() != uint64(n) {
			t.Fatalf("after the replay the follower's store differs from the leader's (%v), or applied %d of %d", got != want, restarted.Applied(), n)
		}
	})

	t.Run("RestoresASnapshotWholeUnderReaders", func(t *testing.T) {
		t.Parallel()
		st, fsm, group := setupFSM(t)
		fsm.Apply(logAt(1, group(0)))
		fsm.Apply(logAt(2, group(1)))
		want, _ := st.Digest()
		snap, err := fsm.Snapshot()
		if err != nil {
			t.Fatal(err)
		}
		sink := &memSink{}
		if err := snap.Persist(sink); err != nil {
			t.Fatal(err)
		}
		snap.Release()
		fsm.Apply(logAt(3, group(2)))

		// Readers hold the store while the restore waits for them.
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					_ = st.View(func(tx *store.Tx) error {
						_, _, err := tx.Job(1)
						return err
					})
				}
			})
		}
		err = fsm.Restore(io.NopCloser(bytes.NewReader(sink.Bytes())))
		close(stop)
		wg.Wait()
		if err != nil {
			t.Fatalf("Restore: %v", err)
		}
		if got, _ := st.Digest(); got != want {
			t.Fatal("the restored store differs from the snapshot")
		}
		if fsm.Applied() != 2 || fsm.LastGroup() != 2 {
			t.Fatalf("after restoring a snapshot at 2: Applied %d, LastGroup %d", fsm.Applied(), fsm.LastGroup())
		}
		if r := fsm.Apply(logAt(3, group(2))); r != nil {
			t.Fatalf("applying the entry after the snapshot: %v", r)
		}
	})
}

// memSink is a snapshot sink in memory.
type memSink struct {
	bytes.Buffer
	cancelled bool
}

func (s *memSink) ID() string    { return "mem" }
func (s *memSink) Cancel() error { s.cancelled = true; return nil }
func (s *memSink) Close() error  { return nil }
