package sim

import (
	"context"
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/cluster"
)

// nodeRaft is raft on one node as package cluster sees it (cluster.Raft),
// played by the consensus oracle: the real Committer proposes through it,
// and the real leadership's steps (cluster.Steps) ask it for the barrier
// and for a quorum round. It answers at once, with raft's own errors,
// which the real commitOutcome reads.
type nodeRaft struct{ c *coordinator }

var _ cluster.Raft = nodeRaft{}

// Apply proposes entry to the oracle. While raft replicates it the
// handlers run: they deliver what the writer published before (nothing,
// unless a bug published before the commit).
func (r nodeRaft) Apply(entry []byte, _ time.Duration) (any, error) {
	r.c.push()
	return r.c.w.raft.propose(r.c, entry)
}

// Barrier is an entry appended to the leader's log: it commits only while
// the node leads a quorum, and with it every entry before it, which the
// store then applies; otherwise raft fails it (the oracle does so at once,
// and the node's coordinator tries again later).
func (r nodeRaft) Barrier(time.Duration) error {
	k := r.c.w.raft
	switch {
	case !r.c.raftLeader:
		return cluster.ErrRaftNotLeader
	case !k.leads(r.c):
		return cluster.ErrRaftLeadershipLost
	}
	k.commitAll(r.c)
	return nil
}

// VerifyLeader is raft's quorum round: it succeeds only while the node
// leads the latest term and reaches a quorum.
func (r nodeRaft) VerifyLeader(context.Context) error {
	if !r.c.w.raft.leads(r.c) {
		return cluster.ErrRaftNotLeader
	}
	return nil
}

// IsLeader is raft's own belief that the node leads.
func (r nodeRaft) IsLeader() bool { return r.c.raftLeader }

// Leader names the leader the node knows: the elected one, once it has
// heard of its term.
func (r nodeRaft) Leader() (id, grpcAddr string) {
	k := r.c.w.raft
	if l := k.leader; l != nil && r.c.term == k.term {
		return l.name, l.name + ":7500"
	}
	return "", ""
}

func (r nodeRaft) Term() uint64 { return r.c.term }

// LeaderChanges and LeaderObserved are not read: the oracle calls the
// leadership's steps itself. Mute and HandOff belong to the watch of a
// leader that cannot commit, a goroutine on a timer the simulator does
// not run (the oracle's leaders always commit or lose leadership).
func (nodeRaft) LeaderChanges() <-chan bool      { return nil }
func (nodeRaft) LeaderObserved() <-chan struct{} { return nil }
func (nodeRaft) Mute(bool)                       {}
func (nodeRaft) HandOff() (string, error)        { return "", cluster.ErrRaftNotLeader }

// steppedEngine is the writer as the leadership sees it (cluster.Engine),
// driven by the node's Stepper: the announcement is queued for the next
// group instead of waited for, since the caller's goroutine is the writer.
type steppedEngine struct{ c *coordinator }

var _ cluster.Engine = steppedEngine{}

func (e steppedEngine) Promote(extend time.Duration, wallFloor time.Time) error {
	return e.c.s.Promote(extend, wallFloor)
}

// Demote ends the writer's term; a quarter of the commands queued are
// sent on by callers racing the term's end (engine.Stepper.DemoteRacing),
// which the next term must refuse.
func (e steppedEngine) Demote() {
	w := e.c.w
	e.c.s.DemoteRacing(func() bool { return w.chance(pRaced) })
}

// pRaced is the share of the commands queued at a demotion whose callers'
// sends race the term's end.
const pRaced = 0.25

func (e steppedEngine) Leading() bool         { return e.c.e.Leading() }
func (e steppedEngine) Busy() time.Duration   { return e.c.e.Busy() }
func (e steppedEngine) Lost() <-chan struct{} { return e.c.e.Lost() }

func (e steppedEngine) Announce(_ context.Context, id, addr string) error {
	e.c.s.Announce(id, addr)
	e.c.queued(kindOther)
	return nil
}

// health is the node's health service as the leadership reports to it:
// what clients see of its Leader entry.
type health struct{ c *coordinator }

func (h health) SetLeading(leading bool) { h.c.serving = leading }
func (health) SetLeaderKnown(bool)       {}
