package coordinator

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/hashicorp/raft"
	"github.com/leasehold/leasehold/coordinator/internal/cluster"
	"github.com/leasehold/leasehold/coordinator/internal/engine"
	"github.com/leasehold/leasehold/coordinator/internal/server"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// LeaderHealthName is the health service name that is SERVING on the
// leader only (a single node always leads): clients health-check it to
// send their calls to the leader.
const LeaderHealthName = "leasehold.v1.Leader"

// RaftDir is the directory under DataDir that holds a replica's raft log
// and snapshots.
const RaftDir = "raft"

// Cluster makes the coordinator one voter of a replicated cluster on
// hashicorp/raft. Every node gets the same Peers; nodes whose data
// directories hold no raft state bootstrap the cluster together on first
// start. Without it the coordinator is a single node: no raft, no raft
// files, no extra port.
type Cluster struct {
	// NodeID is this node's id among Peers.
	NodeID string
	// RaftListen is the raft listener's address; RaftAdvertise what peers
	// dial (default: this node's address in Peers).
	RaftListen, RaftAdvertise string
	// GRPCAdvertise is the gRPC address this node announces when it leads,
	// for followers to name in their NOT_LEADER answers (default: this
	// node's gRPC address in Peers, or else Listen).
	GRPCAdvertise string
	Peers         []cluster.Peer
	// Join makes a node whose data directory holds no raft state wait to
	// be added by the cluster's leader (ClusterService.AddVoter) instead
	// of bootstrapping a cluster of Peers: a node that joins a running
	// cluster, whose configuration is no longer the first one.
	Join bool
	// TLS, when set, is mutual TLS between peers (this node's certificate,
	// the cluster CA both ways).
	TLS *tls.Config

	// HeartbeatTimeout, ElectionTimeout and LeaderLeaseTimeout are raft's
	// (defaults in package replica: 500, 500 and 250 ms).
	HeartbeatTimeout, ElectionTimeout, LeaderLeaseTimeout time.Duration
	// transport replaces the network transport (tests).
	transport raft.Transport
}

// clusterGroupBytes bounds the bytes one writer group carries in a
// replicated coordinator: each group is one raft entry, sent to every
// follower and kept in every log.
const clusterGroupBytes = 4 << 20

// replicated is a replicated coordinator's raft side.
type replicated struct {
	node      *cluster.Node
	fsm       *cluster.FSM
	committer *cluster.Committer
	extend    time.Duration
	advertise string
	// live is how recently a member must have answered the leader to
	// count towards a quorum (see clusterOps).
	live time.Duration
	// repromote is how long a leader whose writer is down waits before
	// it tries again to promote it (an election timeout).
	repromote time.Duration
}

// startReplica opens the FSM over the store and starts this node's raft,
// with its metrics in reg.
func (c *Coordinator) startReplica(reg prometheus.Registerer, undo *undoStack) error {
	cl := c.cfg.Cluster
	fsm, err := cluster.NewFSM(c.st)
	if err != nil {
		return err
	}
	fsm.Fatal = c.replicaFailed
	node, err := cluster.StartNode(cluster.NodeConfig{
		ID: cl.NodeID, Listen: cl.RaftListen, Advertise: cl.RaftAdvertise, Peers: cl.Peers,
		Dir: filepath.Join(c.cfg.DataDir, RaftDir), TLS: cl.TLS, Transport: cl.transport, Join: cl.Join,
		HeartbeatTimeout: cl.HeartbeatTimeout, ElectionTimeout: cl.ElectionTimeout, LeaderLeaseTimeout: cl.LeaderLeaseTimeout,
		Metrics: cluster.NewMetrics(reg), Logger: c.log.With("component", "raft"),
	}, fsm)
	if err != nil {
		return fmt.Errorf("starting raft: %w", err)
	}
	undo.push(func() { _ = node.Shutdown() })
	election := cl.ElectionTimeout
	if election == 0 {
		election = cluster.DefaultElectionTimeout
	}
	hb := cl.HeartbeatTimeout
	if hb == 0 {
		hb = cluster.DefaultHeartbeatTimeout
	}
	c.replica = &replicated{
		node: node, fsm: fsm, committer: cluster.NewCommitter(node.Raft, fsm, 0),
		// A failover takes a heartbeat timeout to notice and an election
		// to settle: live leases get both, on top of their TTL.
		extend:    hb + 2*election,
		advertise: cl.GRPCAdvertise,
		live:      max(3*hb, time.Second),
		repromote: election,
	}
	if c.replica.advertise == "" {
		c.replica.advertise = c.cfg.Listen
		for _, p := range cl.Peers {
			if p.ID == cl.NodeID && p.GRPCAddr != "" {
				c.replica.advertise = p.GRPCAddr
			}
		}
	}
	return nil
}

// leaderHint names the leader for NOT_LEADER answers: raft's view of who
// leads, with the gRPC address the leader announced (or the peers list's).
func (c *Coordinator) leaderHint() (string, string) {
	id, addr := c.replica.node.Leader()
	if id == "" {
		return "", ""
	}
	if aid, aaddr := c.eng.AnnouncedLeader(); aid == id && aaddr != "" {
		addr = aaddr
	}
	return id, addr
}

// consistency returns the read-mode interceptors of a replicated
// coordinator, or none.
func (c *Coordinator) consistency() ([]grpc.UnaryServerInterceptor, []grpc.StreamServerInterceptor) {
	if c.replica == nil {
		return nil, nil
	}
	u, s := server.Consistency(c, c.log.With("component", "server"))
	return []grpc.UnaryServerInterceptor{u}, []grpc.StreamServerInterceptor{s}
}

// VerifyLeader implements server.Leadership.
func (c *Coordinator) VerifyLeader(ctx context.Context) error {
	if !c.eng.Leading() {
		id, addr := c.leaderHint()
		return &engine.NotLeaderError{LeaderID: id, LeaderAddr: addr, Err: engine.ErrNotLeader}
	}
	if err := c.replica.node.VerifyLeader(ctx); err != nil {
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			return err
		}
		id, addr := c.leaderHint()
		return &engine.NotLeaderError{LeaderID: id, LeaderAddr: addr, Err: err}
	}
	return nil
}

// Applied implements server.Leadership.
func (c *Coordinator) Applied() uint64 { return c.replica.fsm.Applied() }

// followLeadership promotes and demotes the engine as raft's leadership
// comes and goes, and re-promotes it when the writer stepped down by
// itself while raft still says this node leads. A promotion that fails
// while raft still says this node leads (its barrier refused during a
// leadership transfer, which may then fail and leave this node the
// leader, with no change for raft to tell) is tried again after an
// election timeout, until the writer runs or raft says another leads.
// It runs until Close.
func (c *Coordinator) followLeadership() {
	defer c.watcher.Done()
	r := c.replica
	c.eng.Demote() // a follower until raft says otherwise
	obs := make(chan raft.Observation, 8)
	observer := raft.NewObserver(obs, false, func(o *raft.Observation) bool {
		_, ok := o.Data.(raft.LeaderObservation)
		return ok
	})
	r.node.Raft.RegisterObserver(observer)
	defer r.node.Raft.DeregisterObserver(observer)
	c.setClusterHealth()
	var retry *time.Timer
	defer func() {
		if retry != nil {
			retry.Stop()
		}
	}()
	var retryC <-chan time.Time
	// settle arms the retry when raft says this node leads and the
	// writer does not run, and disarms it otherwise.
	settle := func() {
		if retry != nil {
			retry.Stop()
			retry, retryC = nil, nil
		}
		if r.node.IsLeader() && !c.eng.Leading() {
			retry = time.NewTimer(r.repromote)
			retryC = retry.C
		}
	}
	for {
		select {
		case <-c.done:
			return
		case leading := <-r.node.LeaderChanges():
			if leading {
				c.promote()
			} else {
				c.demote()
			}
			settle()
		case <-c.eng.Lost():
			c.demote()
			if r.node.IsLeader() {
				c.promote()
			}
			settle()
		case <-retryC:
			retry, retryC = nil, nil
			if r.node.IsLeader() && !c.eng.Leading() {
				c.promote()
			}
			settle()
		case <-obs:
			c.setClusterHealth()
		}
	}
}

// promote makes the engine the writer once every entry of earlier terms
// is applied, then tells clients (the Leader health entry) and followers
// (the announced leader).
func (c *Coordinator) promote() {
	r := c.replica
	start := time.Now()
	if err := r.node.Barrier(DefaultBarrierTimeout); err != nil {
		c.log.Warn("leadership gained, but the barrier failed; waiting for the next change", "err", err)
		return
	}
	if err := c.eng.Promote(r.extend, r.fsm.WallFloor()); err != nil {
		c.log.Error("promoting the writer", "err", err)
		return
	}
	c.health.SetServingStatus(LeaderHealthName, healthpb.HealthCheckResponse_SERVING)
	c.setDispatchHealth(c.eng.DispatchState().Paused)
	c.setClusterHealth()
	c.log.Info("leading", "node", c.cfg.Cluster.NodeID, "term", r.node.Raft.CurrentTerm(), "took", time.Since(start))
	ctx, cancel := context.WithTimeout(context.Background(), DefaultBarrierTimeout)
	defer cancel()
	if err := c.eng.Announce(ctx, c.cfg.Cluster.NodeID, r.advertise); err != nil {
		c.log.Warn("announcing this node as the leader", "err", err)
	}
}

// demote stops the writer: new calls find the leader elsewhere first.
func (c *Coordinator) demote() {
	c.health.SetServingStatus(LeaderHealthName, healthpb.HealthCheckResponse_NOT_SERVING)
	c.eng.Demote()
	c.setClusterHealth()
}

// setClusterHealth sets the overall health of a replicated coordinator:
// SERVING while it is part of a cluster that has a leader.
func (c *Coordinator) setClusterHealth() {
	if c.failed.Load() {
		return
	}
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if id, _ := c.replica.node.Leader(); id != "" {
		st = healthpb.HealthCheckResponse_SERVING
	}
	c.health.SetServingStatus("", st)
}

// DefaultBarrierTimeout bounds a new leader's wait for every earlier entry
// to be applied.
const DefaultBarrierTimeout = cluster.DefaultBarrierTimeout

// handOverTimeout bounds the leadership transfer of a leader that stops.
const handOverTimeout = 3 * time.Second

// handOver gives leadership to another voter before a leader stops, so
// that a planned stop (a rolling restart, a pod's SIGTERM) costs the
// cluster a transfer, not an election after a heartbeat timeout.
func (c *Coordinator) handOver() {
	if c.replica == nil || !c.replica.node.IsLeader() {
		return
	}
	f := c.replica.node.Raft.LeadershipTransfer()
	done := make(chan error, 1)
	go func() { done <- f.Error() }()
	select {
	case err := <-done:
		if err != nil {
			c.log.Warn("handing leadership over before stopping", "err", err)
			return
		}
		c.log.Info("handed leadership over before stopping")
	case <-time.After(handOverTimeout):
		c.log.Warn("handing leadership over before stopping: timed out", "after", handOverTimeout)
	}
}

// clusterOps is ClusterService's view of this node's raft (server.Cluster),
// nil on a single node.
func (c *Coordinator) clusterOps() server.Cluster {
	if c.replica == nil {
		return nil
	}
	return clusterOps{c: c}
}

// clusterOps implements server.Cluster over the replica node.
type clusterOps struct{ c *Coordinator }

// transferWait bounds the wait, after raft handed leadership over, for
// this node to learn of the new leader.
const transferWait = 5 * time.Second

// Status implements server.Cluster. The leader's gRPC address is the one
// it announced when known, this node's its own; a member counts as live
// when it answered the leader within the last three heartbeat timeouts
// (at least a second).
func (o clusterOps) Status() (server.ClusterStatus, error) {
	r := o.c.replica
	st, err := r.node.Status()
	if err != nil {
		return server.ClusterStatus{}, o.notLeader(err)
	}
	out := server.ClusterStatus{NodeID: st.ID, LeaderID: st.LeaderID, Leading: st.Leading, Term: st.Term, LastIndex: st.LastIndex,
		CommitIndex: st.CommitIndex, AppliedIndex: st.AppliedIndex}
	leaderID, leaderAddr := o.c.leaderHint()
	now := time.Now()
	for _, m := range st.Members {
		sm := server.ClusterMember{ID: m.ID, RaftAddr: m.RaftAddr, GRPCAddr: m.GRPCAddr, Voter: m.Voter, Known: m.Known,
			Match: m.Match, LastContact: m.LastContact}
		switch m.ID {
		case st.ID:
			sm.GRPCAddr = r.advertise
		case leaderID:
			sm.GRPCAddr = cmp.Or(leaderAddr, sm.GRPCAddr)
		}
		sm.Live = st.Leading && (m.ID == st.ID || m.Known && now.Sub(m.LastContact) <= r.live)
		out.Members = append(out.Members, sm)
	}
	return out, nil
}

// TransferLeadership implements server.Cluster.
func (o clusterOps) TransferLeadership(ctx context.Context, id string) (string, error) {
	st, err := o.c.replica.node.Status()
	if err != nil {
		return "", o.notLeader(err)
	}
	var addr string
	for _, m := range st.Members {
		if m.ID == id {
			addr = m.RaftAddr
		}
	}
	if addr == "" {
		return "", fmt.Errorf("%w: %s is no longer a member", server.ErrTransferFailed, id)
	}
	leader, err := o.c.replica.node.TransferLeadership(ctx, id, addr, transferWait)
	if err != nil {
		return "", o.classify(err)
	}
	o.c.log.Info("handed leadership over", "to", leader)
	return leader, nil
}

// AddVoter implements server.Cluster.
func (o clusterOps) AddVoter(ctx context.Context, id, raftAddr string) (uint64, error) {
	index, err := o.c.replica.node.AddVoter(ctx, id, raftAddr)
	if err != nil {
		return 0, o.classify(err)
	}
	o.c.log.Info("added a voter", "node", id, "raft_addr", raftAddr, "configuration_index", index)
	return index, nil
}

// RemoveServer implements server.Cluster.
func (o clusterOps) RemoveServer(ctx context.Context, id string) (uint64, error) {
	index, err := o.c.replica.node.RemoveServer(ctx, id)
	if err != nil {
		return 0, o.classify(err)
	}
	o.c.log.Info("removed a member", "node", id, "configuration_index", index)
	return index, nil
}

// classify turns the replica's errors into the server's.
func (o clusterOps) classify(err error) error {
	switch {
	case errors.Is(err, cluster.ErrNotLeader):
		return o.notLeader(err)
	case errors.Is(err, cluster.ErrTransferFailed):
		return fmt.Errorf("%w: %w", server.ErrTransferFailed, err)
	}
	return err
}

// notLeader is NOT_LEADER naming the leader this node knows.
func (o clusterOps) notLeader(err error) error {
	id, addr := o.c.leaderHint()
	return &engine.NotLeaderError{LeaderID: id, LeaderAddr: addr, Err: err}
}

// exitReplicaFailed is the exit status of a node whose store could not
// apply a committed entry, or whose raft log refused a write.
const exitReplicaFailed = 3

// replicaFailed stops the process when this node's store cannot apply a
// committed entry, or its raft log cannot take an entry (a full disk,
// say): it may not go on with a state the log no longer describes, nor
// stay a member that cannot store what it is sent, and the other nodes go
// on without it. It logs why, with the fix, and exits; restarted once the
// fault is mended, the node goes on from its last stored entry and
// applies the log from where its store stopped.
func (c *Coordinator) replicaFailed(err error) {
	c.log.Error("this node cannot store or apply the replicated log: stopping; the other nodes go on; "+
		"free the disk (or fix the fault) and restart it to catch up", "err", err)
	os.Exit(exitReplicaFailed)
}
