package cluster

import (
	"cmp"
	"fmt"
	"log/slog"
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/server"
	"github.com/leasehold/leasehold/coordinator/internal/store"
	"github.com/prometheus/client_golang/prometheus"
)

// MaxGroupBytes bounds the bytes one writer group carries in a replicated
// coordinator (engine.Config.MaxGroupBytes): each group is one raft entry,
// sent to every follower and kept in every log. The writer stops gathering
// commands once theirs pass it, and stops taking the ones gathered once
// the group's recorded write set passes it (what grants and completions
// write is more than their requests carry).
const MaxGroupBytes = 4 << 20

// StorePageSize is the page size of the store a replicated node creates
// (store.WithPageSize; a file keeps the size it was made with, so a
// single node's store taken into a cluster keeps the operating system's 4
// KiB). bbolt writes each dirty page with a call of its own, and each
// node of a cluster writes every group twice over (its raft log, and its
// store once the entry is applied): with 8 KiB pages the leader and each
// follower spent 11% less CPU per document in a drain, and the cluster
// drained 11% faster, for 16% more bytes written on the leader and none
// more on the followers, whose batches share their pages. A single node
// commits each group on its own and would write 28% more for a CPU
// saving within noise, so it keeps 4 KiB (docs/performance.md).
const StorePageSize = 8 << 10

// MaxEntryBytes bounds the raft entry a writer group makes from requests:
// what it gathers (MaxGroupBytes, checked as commands arrive, so one
// command past it) and its largest command (CommandBytes). A coordinator
// whose limits would let a request make a larger entry refuses to start
// (CheckEntryBound). With maxAppendEntries to a message, an AppendEntries
// carries at most 384 MiB, and under a steady load a few MiB.
const MaxEntryBytes = 48 << 20

// maxAppendEntries is how many entries one AppendEntries carries
// (raft.Config.MaxAppendEntries; raft's default of 64 entries of
// MaxEntryBytes would make a message of 3 GiB).
const maxAppendEntries = 8

// CheckEntryBound refuses limits under which one request could make an
// entry over MaxEntryBytes: recvBytes is the largest gRPC message the
// coordinator receives, artifactBytes the largest preview.
func CheckEntryBound(recvBytes, artifactBytes int64) error {
	if n := MaxGroupBytes + CommandBytes(recvBytes, artifactBytes); n > MaxEntryBytes {
		return fmt.Errorf("in a cluster each writer group is one raft entry, at most %d MiB: the largest request (%d MiB) or preview (%d MiB) "+
			"would make one of up to %d MiB; lower the batch limits or the largest preview", MaxEntryBytes>>20, recvBytes>>20, artifactBytes>>20, n>>20)
	}
	return nil
}

// CommandBytes bounds the entry bytes of one command: its request, which
// gRPC bounds at recvBytes (a batch, a renderer's session message), or a
// preview uploaded whole, of at most artifactBytes, and the records the
// writer derives from it, which carry its bytes about once more.
func CommandBytes(recvBytes, artifactBytes int64) int64 { return 2 * max(recvBytes, artifactBytes) }

// Config configures a Replica.
type Config struct {
	// Node is this node's raft: its id, listener, peers, directory and
	// timing. Its Metrics are made here (Registerer), and its FSM's Fatal
	// is Failed.
	Node NodeConfig
	// GRPCAdvertise is the gRPC address this node announces when it
	// leads, for followers to name in their NOT_LEADER answers; empty
	// takes this node's gRPC address in the peers list, or else
	// GRPCListen.
	GRPCAdvertise, GRPCListen string
	// Registerer, when set, receives the replica's metrics.
	Registerer prometheus.Registerer
	// Failed is called, and must not return, when this node cannot store
	// or apply the replicated log (a full disk; an entry it cannot apply,
	// an *UnappliableError): it stops the process, and the other nodes go
	// on. Start refuses a node that stopped at an entry it still cannot
	// apply (FSM.CheckHalt).
	Failed func(error)
	// Logger receives the replica's own lines (leadership); raft's go to
	// Node.Logger.
	Logger *slog.Logger
	// StuckAfter is how long the leader's writer may wait for one group's
	// commit before the node steps down (default two election timeouts;
	// negative never); see leadership.watchCommits.
	StuckAfter time.Duration
}

// Replica is this coordinator's member of the cluster: the raft node, its
// state machine over the store, the replicated committer the writer
// commits through, and the leadership that promotes and demotes the
// writer as raft's leadership comes and goes. It implements what the
// gRPC services need of replication: server.Cluster (ClusterService) and
// server.Leadership (the read path).
type Replica struct {
	node      *Node
	fsm       *FSM
	committer *Committer
	log       *slog.Logger
	// advertise is this node's gRPC address, announced when it leads.
	advertise string
	// live is how recently a member must have answered the leader to
	// count towards a quorum (Status).
	live time.Duration
	// lead follows raft's leadership once Follow has given it the engine.
	lead *leadership
}

var (
	_ server.Cluster    = (*Replica)(nil)
	_ server.Leadership = (*Replica)(nil)
)

// Start opens the state machine over st and starts this node's raft. The
// writer commits through Committer, and Follow then hands the replica the
// engine to promote and demote.
func Start(st *store.Store, cfg Config) (*Replica, error) {
	nc := cfg.Node
	nc.HeartbeatTimeout = cmp.Or(nc.HeartbeatTimeout, DefaultHeartbeatTimeout)
	nc.ElectionTimeout = cmp.Or(nc.ElectionTimeout, DefaultElectionTimeout)
	if cfg.Registerer != nil {
		nc.Metrics = NewMetrics(cfg.Registerer)
	}
	fsm, err := NewFSM(st)
	if err != nil {
		return nil, err
	}
	if err := fsm.CheckHalt(); err != nil {
		return nil, err
	}
	log := cmp.Or(cfg.Logger, slog.New(slog.DiscardHandler))
	fsm.Fatal = cfg.Failed
	fsm.Skipped = func(index uint64, why error) {
		log.Warn("applied a replicated entry as nothing, as the operator allowed (coordinator cluster recover --skip-entry)",
			"index", index, "why", why)
	}
	node, err := StartNode(nc, fsm)
	if err != nil {
		return nil, fmt.Errorf("starting raft: %w", err)
	}
	r := &Replica{
		node: node, fsm: fsm, committer: NewCommitter(node, fsm, 0),
		log:       log,
		advertise: cmp.Or(cfg.GRPCAdvertise, selfGRPC(nc), cfg.GRPCListen),
		live:      max(3*nc.HeartbeatTimeout, time.Second),
	}
	r.lead = &leadership{
		raft: node, state: fsm, log: r.log, id: nc.ID, advertise: r.advertise,
		// A failover takes a heartbeat timeout to notice and an election
		// to settle: live leases get both, on top of their TTL.
		extend:    nc.HeartbeatTimeout + 2*nc.ElectionTimeout,
		repromote: nc.ElectionTimeout,
		// Two election timeouts: far above a group's commit on a healthy
		// node (milliseconds), and short enough that a failover caused by
		// a frozen disk costs about what one caused by a dead process does,
		// plus this.
		stuckAfter: cmp.Or(cfg.StuckAfter, 2*nc.ElectionTimeout),
		metrics:    nc.Metrics,
	}
	return r, nil
}

// selfGRPC is this node's gRPC address in the peers list, if any.
func selfGRPC(nc NodeConfig) string {
	for _, p := range nc.Peers {
		if p.ID == nc.ID {
			return p.GRPCAddr
		}
	}
	return ""
}

// Committer is the committer the writer commits its groups through
// (engine.Config.Committer).
func (r *Replica) Committer() *Committer { return r.committer }

// Follow makes the replica promote eng to the leader's writer whenever
// this node leads, and demote it whenever it stops, reporting both to
// health, until StopFollowing. eng begins as a follower. It must be
// called once, before the services are served.
func (r *Replica) Follow(eng Engine, health Health) {
	r.lead.follow(eng, health)
}

// StopFollowing stops following raft's leadership and waits for it; the
// writer is left as it was, for the caller to stop.
func (r *Replica) StopFollowing() { r.lead.stopFollowing() }

// Shutdown stops raft and closes its files and transport. It is safe to
// call twice.
func (r *Replica) Shutdown() error { return r.node.Shutdown() }

// Node returns the raft node (tests).
func (r *Replica) Node() *Node { return r.node }

// FSM returns the state machine (tests).
func (r *Replica) FSM() *FSM { return r.fsm }
