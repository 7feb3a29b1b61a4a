package coordinator

import (
	"crypto/tls"
	"errors"
	"os"
	"path/filepath"
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/cluster"
	"github.com/leasehold/leasehold/coordinator/internal/server"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
)

// RaftDir is the directory under DataDir that holds a replica's raft log
// and snapshots.
const RaftDir = "raft"

// Peer is one voter of a cluster: its id, the address its raft listener
// is reached at, and its gRPC address (for followers to name the leader).
// It is the replication package's own type, so that the command's
// --peers list, RecoverCluster and Cluster all speak of one member.
type Peer = cluster.Peer

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
	Peers         []Peer
	// Join makes a node whose data directory holds no raft state wait to
	// be added by the cluster's leader (ClusterService.AddVoter) instead
	// of bootstrapping a cluster of Peers: a node that joins a running
	// cluster, whose configuration is no longer the first one.
	Join bool
	// TLS, when set, is mutual TLS between peers (this node's certificate,
	// the cluster CA both ways). Without it raft is plaintext, on loopback
	// only unless InsecurePlaintext is set.
	TLS *tls.Config
	// InsecurePlaintext lets raft without TLS listen and dial off
	// loopback, for a network that encrypts and authenticates by itself
	// (cluster.NodeConfig.InsecurePlaintext); every start warns of it.
	InsecurePlaintext bool

	// HeartbeatTimeout, ElectionTimeout and LeaderLeaseTimeout are raft's
	// (defaults in package cluster: 500, 500 and 250 ms).
	HeartbeatTimeout, ElectionTimeout, LeaderLeaseTimeout time.Duration
	// transport replaces the network transport (tests).
	transport cluster.Transport
}

// startReplica starts this node's member of the cluster over the store,
// with its metrics in reg.
func (c *Coordinator) startReplica(reg prometheus.Registerer, undo *undoStack) error {
	cl := c.cfg.Cluster
	r, err := cluster.Start(c.st, cluster.Config{
		Node: cluster.NodeConfig{
			ID: cl.NodeID, Listen: cl.RaftListen, Advertise: cl.RaftAdvertise, Peers: cl.Peers,
			Dir: filepath.Join(c.cfg.DataDir, RaftDir), TLS: cl.TLS, InsecurePlaintext: cl.InsecurePlaintext, Transport: cl.transport, Join: cl.Join,
			HeartbeatTimeout: cl.HeartbeatTimeout, ElectionTimeout: cl.ElectionTimeout, LeaderLeaseTimeout: cl.LeaderLeaseTimeout,
			Logger: c.log.With("component", "raft"),
		},
		GRPCAdvertise: cl.GRPCAdvertise, GRPCListen: c.cfg.Listen,
		Registerer: reg, Failed: c.replicaFailed, Logger: c.log,
	})
	if err != nil {
		return err
	}
	undo.push(func() { _ = r.Shutdown() })
	c.replica = r
	return nil
}

// consistency returns the read-mode interceptors of a replicated
// coordinator, or none.
func (c *Coordinator) consistency() ([]grpc.UnaryServerInterceptor, []grpc.StreamServerInterceptor) {
	if c.replica == nil {
		return nil, nil
	}
	u, s := server.Consistency(c.replica, c.log.With("component", "server"))
	return []grpc.UnaryServerInterceptor{u}, []grpc.StreamServerInterceptor{s}
}

// clusterOps is ClusterService's view of this node's raft, nil on a
// single node.
func (c *Coordinator) clusterOps() server.Cluster {
	if c.replica == nil {
		return nil
	}
	return c.replica
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
//
// An entry the node cannot apply (cluster.UnappliableError) is not mended
// by a restart: the error says what is, and the node refuses to start
// until it is done.
func (c *Coordinator) replicaFailed(err error) {
	if uerr := (*cluster.UnappliableError)(nil); errors.As(err, &uerr) {
		c.log.Error("this node cannot apply a replicated entry: stopping", "index", uerr.Index, "err", err)
	} else {
		c.log.Error("this node cannot store or apply the replicated log: stopping; the other nodes go on; "+
			"free the disk (or fix the fault) and restart it to catch up", "err", err)
	}
	os.Exit(exitReplicaFailed)
}
