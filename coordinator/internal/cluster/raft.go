package cluster

import (
	"context"
	"errors"
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/mutation"

	"github.com/hashicorp/raft"
)

// Raft is what the committer and the leadership need of consensus, and
// all they know of it: a Node is this face of hashicorp/raft, and a
// seeded stand-in (a simulator's) may be another. Errors are raft's own:
// commitOutcome and changeOutcome read them.
type Raft interface {
	// Apply appends entry to the log and waits until it is committed and
	// applied to this node's state machine, whose response it returns.
	// timeout bounds the wait to enqueue it (0: none).
	Apply(entry []byte, timeout time.Duration) (any, error)
	// Barrier waits until every entry committed before it is applied
	// to this node's state machine; a new leader calls it before its
	// writer evaluates anything.
	Barrier(timeout time.Duration) error
	// VerifyLeader confirms with a quorum that this node still leads:
	// a read served after it is linearizable.
	VerifyLeader(ctx context.Context) error
	// IsLeader reports whether consensus says this node leads.
	IsLeader() bool
	// Leader returns the id of the leader this node knows and its gRPC
	// address as the peers list gives it, empty when none is known.
	Leader() (id, grpcAddr string)
	// Term is this node's current term.
	Term() uint64
	// LeaderChanges delivers true when this node becomes the leader and
	// false when it stops being one, in order; raft blocks until it is
	// read, so the caller must read it promptly.
	LeaderChanges() <-chan bool
	// LeaderObserved receives after the leader this node knows changes
	// (changes close together may be told once).
	LeaderObserved() <-chan struct{}
	// Mute stops, or lets go again, every request this node sends to its
	// peers, heartbeats included: a leader that cannot commit is muted so
	// that its followers stop hearing it and elect another, whatever
	// raft's own leader loop is blocked on.
	Mute(on bool)
	// HandOff asks the follower most up to date with this leader's log to
	// stand for election at once, without raft's leader loop, and returns
	// its id.
	HandOff() (string, error)
}

var _ Raft = (*Node)(nil)

// Apply implements Raft.
func (n *Node) Apply(entry []byte, timeout time.Duration) (any, error) {
	f := n.Raft.Apply(entry, timeout)
	if err := f.Error(); err != nil {
		return nil, err
	}
	return f.Response(), nil
}

// Barrier implements Raft.
func (n *Node) Barrier(timeout time.Duration) error {
	f := n.Raft.Barrier(timeout)
	if mutation.On(mutation.BarrierUnawaited) {
		return nil
	}
	return f.Error()
}

// VerifyLeader implements Raft: it returns ctx's error if ctx ends first.
func (n *Node) VerifyLeader(ctx context.Context) error { return wait(ctx, n.Raft.VerifyLeader()) }

// IsLeader implements Raft.
func (n *Node) IsLeader() bool { return n.Raft.State() == raft.Leader }

// Leader implements Raft.
func (n *Node) Leader() (id, grpcAddr string) {
	_, lid := n.Raft.LeaderWithID()
	for _, p := range n.cfg.Peers {
		if p.ID == string(lid) {
			return p.ID, p.GRPCAddr
		}
	}
	return string(lid), ""
}

// Term implements Raft.
func (n *Node) Term() uint64 { return n.Raft.CurrentTerm() }

// LeaderChanges implements Raft.
func (n *Node) LeaderChanges() <-chan bool { return n.leaderC }

// LeaderObserved implements Raft.
func (n *Node) LeaderObserved() <-chan struct{} { return n.observedC }

// Mute implements Raft.
func (n *Node) Mute(on bool) { n.muted.Store(on) }

// errNoFollower refuses a hand-off when no follower answered lately.
var errNoFollower = errors.New("no follower has answered this leader lately")

// HandOff implements Raft: it sends raft's TimeoutNow (what a leadership
// transfer ends with: the follower starts an election at once, which the
// other voters take although they know a leader) to the voter that holds
// most of this leader's log among those that answered it within two
// heartbeat timeouts. It is sent from here, past the mute, because raft's
// own leader loop, which a transfer needs, may be the thing blocked.
func (n *Node) HandOff() (string, error) {
	term := n.Raft.CurrentTerm()
	var best raft.Server
	var bestMatch uint64
	found := false
	for _, s := range n.Raft.GetConfiguration().Configuration().Servers {
		if string(s.ID) == n.cfg.ID || s.Suffrage != raft.Voter {
			continue
		}
		match, contact, ok := n.progress.of(s.ID, term)
		if !ok || time.Since(contact) > 2*n.cfg.HeartbeatTimeout || (found && match <= bestMatch) {
			continue
		}
		best, bestMatch, found = s, match, true
	}
	if !found {
		return "", errNoFollower
	}
	self := raft.ServerID(n.cfg.ID)
	req := &raft.TimeoutNowRequest{RPCHeader: raft.RPCHeader{
		ProtocolVersion: raft.ProtocolVersionMax, ID: []byte(self), Addr: n.raw.EncodePeer(self, n.raw.LocalAddr()),
	}}
	if err := n.raw.TimeoutNow(best.ID, best.Address, req, &raft.TimeoutNowResponse{}); err != nil {
		return string(best.ID), err
	}
	return string(best.ID), nil
}

// Done is closed when Shutdown begins.
func (n *Node) Done() <-chan struct{} { return n.doneC }

// wait waits for f or ctx.
func wait(ctx context.Context, f raft.Future) error {
	done := make(chan error, 1)
	go func() { done <- f.Error() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Transport is raft's transport between nodes, named here so that the
// wiring's tests can hand a node raft's in-memory one (NodeConfig).
type Transport = raft.Transport
