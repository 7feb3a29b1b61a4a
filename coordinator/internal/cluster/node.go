package cluster

import (
	"cmp"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	wal "github.com/hashicorp/raft-wal"
	walfs "github.com/hashicorp/raft-wal/fs"
	"github.com/hashicorp/raft-wal/segment"
)

// Timing defaults of a node. Failover is about a heartbeat timeout (a
// follower notices) plus an election: 500 ms keeps it well under 3 s in
// the worst case, where raft's default of 1 s does not. The leader lease
// (how long a leader goes on without a quorum's answer before it steps
// down) is as long as the heartbeat timeout, raft's own ratio: at 250 ms
// a leader on a machine loaded well past its cores (load 13 to 19 on 2)
// stepped down three times in three minutes for answers merely late, at
// 500 ms none did; only a partitioned leader waits the longer for it.
const (
	DefaultHeartbeatTimeout   = 500 * time.Millisecond
	DefaultElectionTimeout    = 500 * time.Millisecond
	DefaultLeaderLeaseTimeout = 500 * time.Millisecond
	// DefaultBarrierTimeout bounds the wait, on gaining leadership, for
	// every entry of earlier terms to be applied.
	DefaultBarrierTimeout = 10 * time.Second
	// snapshotsRetained is how many snapshots a node keeps on disk.
	snapshotsRetained = 2
	// logCacheEntries is how many of the last entries appended raft keeps
	// in memory (raft.LogCache): enough for the leader to send what it
	// just appended, and for a follower to apply what it just stored,
	// without reading either back from raft-wal. Each costs its data, a
	// writer group of a few hundred KiB under load: Consul's and Vault's
	// 512 kept about 200 MiB per node, and a node spent more CPU on that
	// memory (fresh pages, a larger heap) than the cache saved (measured
	// against 32 and none: docs/performance.md).
	logCacheEntries = 32
)

// NodeConfig configures a Node.
type NodeConfig struct {
	// ID is this node's id, one of Peers.
	ID string
	// Listen is the raft listener's bind address; Advertise what peers dial
	// (default: this node's RaftAddr in Peers).
	Listen, Advertise string
	// Peers is every voter, this node included; every node gets the same.
	Peers []Peer
	// Dir holds the raft log (wal/) and snapshots (snapshots/).
	Dir string
	// TLS, when set, is mutual TLS between peers: it must hold this node's
	// certificate and verify peers' against the cluster CA both ways.
	// Without it raft is plaintext, and its listener, advertised address
	// and peers must be on loopback (CheckPlaintext) unless
	// InsecurePlaintext is set.
	TLS *tls.Config
	// InsecurePlaintext lets raft without TLS listen and dial off
	// loopback, for a network that encrypts and authenticates by itself:
	// whoever reaches the raft port can then write into the cluster's log.
	// Every start logs a warning.
	InsecurePlaintext bool
	// Transport replaces the network transport (tests: raft's in-memory
	// transport); Listen, Advertise and TLS are then unused.
	Transport raft.Transport
	// InmemStore keeps the log in memory (tests).
	InmemStore bool
	// Join starts a node whose directory holds no raft state without
	// bootstrapping: it waits for the cluster's leader to add it
	// (Node.AddVoter there), as a node that joins a running cluster must
	// (one bootstrapped with another configuration would disagree with
	// the cluster's log from its first entry).
	Join bool
	// Metrics, when set, are the node's Prometheus metrics (NewMetrics).
	Metrics *Metrics

	HeartbeatTimeout, ElectionTimeout, LeaderLeaseTimeout time.Duration
	// SnapshotThreshold and TrailingLogs: raft's settings of the same
	// names (entries carry whole groups, so both are far below raft's
	// defaults).
	SnapshotThreshold, TrailingLogs uint64
	Logger                          *slog.Logger
}

// Node is this process's raft member: the log, the snapshots, the
// transport, and the leadership notifications.
type Node struct {
	cfg  NodeConfig
	Raft *raft.Raft
	// self is Raft for the transport's goroutines, once it is set.
	self  atomic.Pointer[raft.Raft]
	fsm   *FSM
	trans raft.Transport
	// raw is trans without what observe adds: it sends while muted
	// (HandOff).
	raw raft.Transport
	log *slog.Logger
	// closers close the log store and transport after raft shut down.
	closers []io.Closer

	leaderC chan bool
	// observedC receives, without blocking raft, after the leader this
	// node knows changed (LeaderObserved).
	observedC chan struct{}
	doneC     chan struct{}
	stopOnce  sync.Once

	// progress is what this node, leading, has learnt of the followers.
	progress *progress
	// muted, while set, fails every request this node's raft sends to its
	// peers (Mute).
	muted atomic.Bool
	// leaderChanges counts the leaders this node has learnt of;
	// leadingSince is when it began to lead (Unix ns, 0 when it does
	// not). The observer goroutine keeps both.
	leaderChanges atomic.Uint64
	leadingSince  atomic.Int64
	observed      sync.WaitGroup
}

// StartNode starts this node's raft over fsm. A node whose directory holds
// no raft state bootstraps the cluster with every peer as a voter: every
// node of a new cluster does the same, with the same configuration, so no
// separate step is needed; a node restarted on its directory rejoins, and
// one whose directory was wiped rejoins by snapshot from the leader.
func StartNode(cfg NodeConfig, fsm *FSM) (*Node, error) {
	cfg.HeartbeatTimeout = cmp.Or(cfg.HeartbeatTimeout, DefaultHeartbeatTimeout)
	cfg.ElectionTimeout = cmp.Or(cfg.ElectionTimeout, DefaultElectionTimeout)
	cfg.LeaderLeaseTimeout = cmp.Or(cfg.LeaderLeaseTimeout, DefaultLeaderLeaseTimeout)
	cfg.SnapshotThreshold = cmp.Or(cfg.SnapshotThreshold, 2048)
	cfg.TrailingLogs = cmp.Or(cfg.TrailingLogs, 1024)
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	self := -1
	for i, p := range cfg.Peers {
		if p.ID == cfg.ID {
			self = i
		}
	}
	if self < 0 {
		return nil, fmt.Errorf("node id %q is not one of the peers", cfg.ID)
	}
	n := &Node{cfg: cfg, fsm: fsm, log: cfg.Logger, leaderC: make(chan bool, 1), observedC: make(chan struct{}, 1),
		doneC: make(chan struct{}), progress: newProgress()}
	fsm.metrics = cfg.Metrics
	hl := hclogOf(cfg.Logger)

	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(cfg.ID)
	rc.HeartbeatTimeout, rc.ElectionTimeout, rc.LeaderLeaseTimeout = cfg.HeartbeatTimeout, cfg.ElectionTimeout, cfg.LeaderLeaseTimeout
	rc.SnapshotThreshold, rc.TrailingLogs = cfg.SnapshotThreshold, cfg.TrailingLogs
	rc.BatchApplyCh = true
	rc.MaxAppendEntries = maxAppendEntries
	// The FSM's store records what it applied, in the same transaction as
	// the writes: restoring the last snapshot at start-up would only throw
	// that away.
	rc.NoSnapshotRestoreOnStart = true
	rc.NotifyCh = n.leaderC
	rc.Logger = hl
	if err := raft.ValidateConfig(rc); err != nil {
		return nil, err
	}

	var (
		logs   raft.LogStore
		stable raft.StableStore
		snaps  raft.SnapshotStore
		err    error
		// explain adds the log's own reason to a write it refused.
		explain func(error) error
	)
	if cfg.InmemStore {
		s := raft.NewInmemStore()
		logs, stable, snaps = s, s, raft.NewInmemSnapshotStore()
	} else {
		walDir := filepath.Join(cfg.Dir, "wal")
		if err := os.MkdirAll(walDir, 0o700); err != nil {
			return nil, err
		}
		filer := &segmentFiler{SegmentFiler: segment.NewFiler(walDir, walfs.New())}
		w, err := wal.Open(walDir, wal.WithLogger(hl.Named("wal")), wal.WithSegmentFiler(filer))
		if err != nil {
			return nil, fmt.Errorf("opening the raft log: %w", err)
		}
		n.closers = append(n.closers, w)
		logs, stable, explain = w, w, filer.explain
		if snaps, err = raft.NewFileSnapshotStoreWithLogger(cfg.Dir, snapshotsRetained, hl.Named("snapshots")); err != nil {
			n.closeStores()
			return nil, fmt.Errorf("opening the snapshot store: %w", err)
		}
	}
	if err := checkBootstrap(cfg, fsm, logs, stable, snaps); err != nil {
		n.closeStores()
		return nil, err
	}
	n.trans = cfg.Transport
	var peers *peerTransport
	if n.trans == nil {
		advertise := cmp.Or(cfg.Advertise, cfg.Peers[self].RaftAddr)
		pt, err := n.listen(advertise, hl.Named("net"))
		if err != nil {
			n.closeStores()
			return nil, err
		}
		peers = pt
		n.trans = pt
		n.closers = append(n.closers, pt)
	}
	n.raw = n.trans
	n.trans = observe(n.trans, n.progress, &n.muted, &n.self)

	existing, err := raft.HasExistingState(logs, stable, snaps)
	if err != nil {
		n.closeStores()
		return nil, err
	}
	if !existing && cfg.Join {
		n.log.Info("raft: no state yet; waiting for the cluster's leader to add this node")
	}
	if !existing && !cfg.Join {
		servers := peerServers(cfg.Peers)
		if err := raft.BootstrapCluster(rc, logs, stable, snaps, n.trans, raft.Configuration{Servers: servers}); err != nil {
			n.closeStores()
			return nil, fmt.Errorf("bootstrapping: %w", err)
		}
		n.log.Info("raft: bootstrapped a new cluster", "voters", len(servers))
	}
	// A write to the log or stable store that fails stops the node, as an
	// entry its store cannot apply does (failStopLog).
	guarded := stopOnWriteError(logs, stable, fsm.fatal)
	guarded.explain = explain
	// The leader sends each entry to the followers right after appending
	// it, and a follower applies each right after storing it: the last
	// entries stay in memory rather than be read back from raft-wal's
	// segments.
	cached, err := raft.NewLogCache(logCacheEntries, guarded)
	if err != nil {
		n.closeStores()
		return nil, err
	}
	r, err := raft.NewRaft(rc, fsm, cached, guarded, snaps, n.trans)
	if err != nil {
		n.closeStores()
		return nil, fmt.Errorf("starting raft: %w", err)
	}
	n.Raft = r
	n.self.Store(r)
	fsm.holdBatches(n.IsLeader, batchInterval, batchIdle)
	if peers != nil {
		peers.setMembers(func() []raft.Server {
			servers := peerServers(cfg.Peers)
			if f := r.GetConfiguration(); f.Error() == nil {
				servers = append(servers, f.Configuration().Servers...)
			}
			return servers
		})
	}
	n.watchLeaders()
	if cfg.Metrics != nil {
		cfg.Metrics.node.Store(n)
	}
	return n, nil
}

// listen opens the raft listener as cfg says, refusing plaintext off
// loopback without the opt-out, and says on which address it listens and
// how the traffic is protected.
func (n *Node) listen(advertise string, logger hclog.Logger) (*peerTransport, error) {
	cfg := n.cfg
	if cfg.TLS == nil && !cfg.InsecurePlaintext {
		if err := CheckPlaintext(cfg.Listen, cfg.Advertise, cfg.Peers); err != nil {
			return nil, err
		}
	}
	t, err := newPeerTransport(transportConfig{Listen: cfg.Listen, Advertise: advertise, TLS: cfg.TLS, AnyHost: cfg.InsecurePlaintext,
		Members: func() []raft.Server { return peerServers(cfg.Peers) }, Logger: logger, Log: n.log, Metrics: cfg.Metrics})
	if err != nil {
		return nil, err
	}
	n.log.Info("raft listening", "addr", t.lis.Addr().String(), "advertise", t.advertise.String(), "protection", t.protection())
	if cfg.TLS == nil && cfg.InsecurePlaintext {
		n.log.Warn("raft runs without TLS off loopback (--"+InsecurePlaintextFlag+"): whoever reaches "+
			"the raft port can vote, take leadership and write into the cluster's log; the network must encrypt "+
			"and authenticate every peer by itself", "addr", t.lis.Addr().String())
	}
	return t, nil
}

// Shutdown stops raft, commits the state machine's open batch, and closes
// the log, the snapshots and the transport. It is safe to call twice.
func (n *Node) Shutdown() error {
	var err error
	n.stopOnce.Do(func() {
		close(n.doneC)
		n.observed.Wait()
		err = n.Raft.Shutdown().Error()
		n.fsm.Flush()
		n.closeStores()
	})
	return err
}

func (n *Node) closeStores() {
	for _, c := range n.closers {
		_ = c.Close()
	}
	n.closers = nil
}
