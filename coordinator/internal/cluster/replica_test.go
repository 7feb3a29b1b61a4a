package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/leasehold/leasehold/coordinator/internal/cluster"
	"github.com/leasehold/leasehold/coordinator/internal/engine"
	"github.com/leasehold/leasehold/coordinator/internal/store"
)

// replicaNode is one coordinator's replication in process: a real store,
// the Replica over raft's in-memory transport, and a real writer that
// the replica promotes and demotes.
type replicaNode struct {
	id    string
	trans *raft.InmemTransport
	st    *store.Store
	rep   *cluster.Replica
	eng   *engine.Engine
}

// noHealth is a health service nobody reads.
type noHealth struct{}

func (noHealth) SetLeading(bool)     {}
func (noHealth) SetLeaderKnown(bool) {}

// startReplicas starts n replicas whose raft has heartbeat, election and
// leader lease timeouts of timeout, and stops them when the test ends.
func startReplicas(t *testing.T, n int, timeout time.Duration) []*replicaNode {
	t.Helper()
	var nodes []*replicaNode
	var peers []cluster.Peer
	for i := range n {
		id := fmt.Sprintf("n%d", i+1)
		addr, trans := raft.NewInmemTransport(raft.ServerAddress(id))
		peers = append(peers, cluster.Peer{ID: id, RaftAddr: string(addr), GRPCAddr: "grpc-" + id})
		nodes = append(nodes, &replicaNode{id: id, trans: trans})
	}
	connectAll(nodes)
	dir := t.TempDir()
	for _, rn := range nodes {
		st, err := store.Open(filepath.Join(dir, rn.id+".db"), store.WithoutSync())
		if err != nil {
			t.Fatal(err)
		}
		rn.st = st
		rn.rep, err = cluster.Start(st, cluster.Config{
			Node: cluster.NodeConfig{ID: rn.id, Peers: peers, Transport: rn.trans, InmemStore: true,
				HeartbeatTimeout: timeout, ElectionTimeout: timeout, LeaderLeaseTimeout: timeout},
			Failed: func(err error) { t.Errorf("%s failed: %v", rn.id, err) },
		})
		if err != nil {
			t.Fatal(err)
		}
		rn.eng, err = engine.New(engine.Config{Store: st, Committer: rn.rep.Committer(), MaxGroupBytes: cluster.MaxGroupBytes,
			LeaderHint: rn.rep.LeaderHint})
		if err != nil {
			t.Fatal(err)
		}
		rn.rep.Follow(rn.eng, noHealth{})
	}
	t.Cleanup(func() {
		for _, rn := range nodes {
			rn.rep.StopFollowing()
			rn.eng.Stop()
			if err := rn.rep.Shutdown(); err != nil {
				t.Errorf("Shutdown %s: %v", rn.id, err)
			}
			rn.st.Close()
		}
	})
	return nodes
}

// connectAll links every node's raft to every other's.
func connectAll(nodes []*replicaNode) {
	for _, a := range nodes {
		for _, b := range nodes {
			if a != b {
				a.trans.Connect(raft.ServerAddress(b.id), b.trans)
			}
		}
	}
}

// isolate cuts rn's raft links both ways.
func isolate(nodes []*replicaNode, rn *replicaNode) {
	rn.trans.DisconnectAll()
	for _, o := range nodes {
		if o != rn {
			o.trans.Disconnect(raft.ServerAddress(rn.id))
		}
	}
}

// leadingReplica waits, asking every few milliseconds for at most 20 s
// (raft's elections run on real timers and tell no one), for a node
// whose raft leads and whose writer is promoted.
func leadingReplica(t *testing.T, nodes []*replicaNode) *replicaNode {
	t.Helper()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(20 * time.Second)
	for {
		for _, rn := range nodes {
			if rn.rep.Node().IsLeader() && rn.eng.Leading() {
				return rn
			}
		}
		select {
		case <-tick.C:
		case <-deadline:
			t.Fatal("no leader within 20 s")
		}
	}
}

// TestIsolatedLeaderServesNoLinearizableRead cuts the leader off from
// both followers and asks it again and again to confirm its leadership,
// as a linearizable read does: raft on it still believes it leads (until
// its leader lease runs out), and so does its writer, but no quorum can
// answer a round it starts after the cut. A follower's answer to a
// heartbeat raft sent before the cut may still arrive and count (raft
// counts an answer for every round waiting when it arrives), so up to one
// confirmation per follower may succeed; the next must fail. A cut that
// came after raft had already stepped down shows nothing; the test heals
// the cluster and tries again.
func TestIsolatedLeaderServesNoLinearizableRead(t *testing.T) {
	t.Parallel()
	nodes := startReplicas(t, 3, 500*time.Millisecond)
	inFlight := len(nodes) - 1
	for try := 0; try < 5; try++ {
		l := leadingReplica(t, nodes)
		if err := l.rep.VerifyLeader(t.Context()); err != nil {
			t.Fatalf("the connected leader %s: %v", l.id, err)
		}
		// No append in flight at the cut (the writer's announcement):
		// only the followers' heartbeats may be.
		replicated(t, l)
		isolate(nodes, l)
		confirmed := 0
		for {
			believed := l.rep.Node().IsLeader() && l.eng.Leading()
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			err := l.rep.VerifyLeader(ctx)
			cancel()
			if err == nil {
				if confirmed++; confirmed > inFlight {
					t.Fatalf("the isolated leader %s confirmed its leadership %d times after the cut (raft believed it led: %v)", l.id, confirmed, believed)
				}
				continue
			}
			if !errors.Is(err, engine.ErrNotLeader) {
				t.Fatalf("the isolated leader %s: %v, want ErrNotLeader", l.id, err)
			}
			if believed {
				return
			}
			break
		}
		connectAll(nodes)
	}
	t.Fatal("raft had stepped down before every refusal: the isolated leader was never asked while it believed it led")
}

// replicated waits, asking every few milliseconds for at most 20 s, until
// every follower has answered the leader l's appends up to its last
// index.
func replicated(t *testing.T, l *replicaNode) {
	t.Helper()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(20 * time.Second)
	for {
		st, err := l.rep.Status()
		done := err == nil
		for _, m := range st.Members {
			done = done && m.Known && m.Match == st.LastIndex
		}
		if done {
			return
		}
		select {
		case <-tick.C:
		case <-deadline:
			t.Fatalf("the followers of %s did not store its log within 20 s: %+v, %v", l.id, st, err)
		}
	}
}

// TestNodeBarrier: raft's barrier returns once the state machine applied
// every entry before it, and fails on a node that does not lead; the
// leadership promotes the writer only after it returned nil.
func TestNodeBarrier(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 3)
	l := c.leader()
	for id := uint64(1); id <= 3; id++ {
		if _, err := c.submit(l, id); err != nil {
			t.Fatal(err)
		}
	}
	last := l.node.Raft.LastIndex()
	if err := l.node.Barrier(5 * time.Second); err != nil {
		t.Fatalf("Barrier on the leader: %v", err)
	}
	if got := l.fsm.Applied(); got < last {
		t.Fatalf("after the barrier the leader's store applied %d, the log held %d", got, last)
	}
	for _, m := range c.members {
		if m == l {
			continue
		}
		if err := m.node.Barrier(time.Second); !errors.Is(err, raft.ErrNotLeader) {
			t.Errorf("Barrier on follower %s: %v, want raft.ErrNotLeader", m.id, err)
		}
	}
}

// secondProposer is raft with another proposer beside this node's
// committer: before each entry, it has first committed, an entry
// evaluated on the same base.
type secondProposer struct {
	cluster.Raft
	first []byte
}

func (s *secondProposer) Apply(entry []byte, timeout time.Duration) (any, error) {
	if _, err := s.Raft.Apply(s.first, timeout); err != nil {
		return nil, err
	}
	return s.Raft.Apply(entry, timeout)
}

// TestCommitterRefusesAStaleBase: when another proposer's entry commits
// between the evaluation of a group and its entry, the state machine
// applies the group's entry as nothing (store.ErrStaleBase), and the
// committer must not acknowledge it: the writer is told it was not
// committed. An attempt that lost leadership (100 ms timeouts on a loaded
// machine) is made again on the next leader.
func TestCommitterRefusesAStaleBase(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 3)
	for try := uint64(0); try < 5; try++ {
		l := c.leader()
		other, refused := 10*try+1, 10*try+2
		tx := evaluateJob(t, l.st, other)
		first := append([]byte{1}, tx.WriteSet(l.fsm.LastGroup(), t0)...)
		if err := tx.Rollback(); err != nil {
			t.Fatal(err)
		}
		committer := cluster.NewCommitter(&secondProposer{Raft: l.node, first: first}, l.fsm, time.Second)
		err := committer.Commit(evaluateJob(t, l.st, refused), t0)
		if err == nil {
			t.Fatal("Commit of a group whose base another entry moved past: acknowledged")
		}
		if !errors.Is(err, store.ErrStaleBase) {
			if errors.Is(err, engine.ErrNotLeader) || errors.Is(err, engine.ErrOutcomeUnknown) {
				continue
			}
			t.Fatal(err)
		}
		if !errors.Is(err, engine.ErrNotLeader) {
			t.Fatalf("Commit of a group on a stale base: %v, want ErrNotLeader", err)
		}
		err = l.st.View(func(tx *store.Tx) error {
			if _, found, err := tx.Job(other); err != nil || !found {
				return fmt.Errorf("the other proposer's job is missing (%v)", err)
			}
			if _, found, _ := tx.Job(refused); found {
				return errors.New("the refused group's job is stored")
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Fatal("leadership was lost in every attempt")
}
