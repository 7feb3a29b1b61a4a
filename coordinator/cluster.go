package coordinator

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/hashicorp/raft"
	"github.com/leasehold/leasehold/coordinator/internal/engine"
	"github.com/leasehold/leasehold/coordinator/internal/replica"
	"github.com/leasehold/leasehold/coordinator/internal/server"
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
	// for followers to name in their NOT_LEADER answers (default: Listen).
	GRPCAdvertise string
	Peers         []replica.Peer
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
	node      *replica.Node
	fsm       *replica.FSM
	committer *replica.Committer
	extend    time.Duration
	advertise string
}

// startReplica opens the FSM over the store and starts this node's raft.
func (c *Coordinator) startReplica(undo *undoStack) error {
	cl := c.cfg.Cluster
	fsm, err := replica.NewFSM(c.st)
	if err != nil {
		return err
	}
	node, err := replica.StartNode(replica.NodeConfig{
		ID: cl.NodeID, Listen: cl.RaftListen, Advertise: cl.RaftAdvertise, Peers: cl.Peers,
		Dir: filepath.Join(c.cfg.DataDir, RaftDir), TLS: cl.TLS, Transport: cl.transport,
		HeartbeatTimeout: cl.HeartbeatTimeout, ElectionTimeout: cl.ElectionTimeout, LeaderLeaseTimeout: cl.LeaderLeaseTimeout,
		Logger: c.log.With("component", "raft"),
	}, fsm)
	if err != nil {
		return fmt.Errorf("starting raft: %w", err)
	}
	undo.push(func() { _ = node.Shutdown() })
	election := cl.ElectionTimeout
	if election == 0 {
		election = replica.DefaultElectionTimeout
	}
	hb := cl.HeartbeatTimeout
	if hb == 0 {
		hb = replica.DefaultHeartbeatTimeout
	}
	c.replica = &replicated{
		node: node, fsm: fsm, committer: replica.NewCommitter(node.Raft, fsm, 0),
		// A failover takes a heartbeat timeout to notice and an election
		// to settle: live leases get both, on top of their TTL.
		extend:    hb + 2*election,
		advertise: cl.GRPCAdvertise,
	}
	if c.replica.advertise == "" {
		c.replica.advertise = c.cfg.Listen
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
// itself while raft still says this node leads. It runs until Close.
func (c *Coordinator) followLeadership() {
	defer c.watcher.Done()
	r := c.replica
	obs := make(chan raft.Observation, 8)
	observer := raft.NewObserver(obs, false, func(o *raft.Observation) bool {
		_, ok := o.Data.(raft.LeaderObservation)
		return ok
	})
	r.node.Raft.RegisterObserver(observer)
	defer r.node.Raft.DeregisterObserver(observer)
	c.setClusterHealth()
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
		case <-c.eng.Lost():
			c.demote()
			if r.node.IsLeader() {
				c.promote()
			}
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
const DefaultBarrierTimeout = replica.DefaultBarrierTimeout

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
