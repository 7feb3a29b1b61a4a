package cluster

import (
	"context"
	"log/slog"
	"time"

	"github.com/hashicorp/raft"
)

// Raft's errors that a stand-in for raft (the simulator's consensus)
// returns where raft would, for commitOutcome to read as it reads raft's.
var (
	// ErrRaftNotLeader: this node does not lead; nothing was appended.
	ErrRaftNotLeader = raft.ErrNotLeader
	// ErrRaftEnqueueTimeout: the entry was not taken in time.
	ErrRaftEnqueueTimeout = raft.ErrEnqueueTimeout
	// ErrRaftLeadershipLost: leadership was lost with the entry in the
	// log, or before a barrier or a quorum round completed.
	ErrRaftLeadershipLost = raft.ErrLeadershipLost
)

// Steps are the leadership's steps, one at a time, on the caller's
// goroutine, with no goroutine and no timer of their own: for a stand-in
// for raft (the simulator's consensus) that decides on its own clock when
// this node gains and loses leadership, and when a failed promotion is
// tried again. They are the code a Replica runs: Promote is what the
// leader's work does when this node gains leadership (raft's barrier, the
// writer promoted with the failover's lease extension and the store's
// wall floor, the Leader health entry, the announcement), Demote what
// follows a lost leadership, and VerifyLeader the read path's check. What
// they leave out is the following of raft's notifications (the run and
// lead goroutines, and their retry timer), which needs raft's own
// goroutines, and the watch of a leader that cannot commit
// (watchCommits, on a ticker); leadership_test.go tests both. r must
// answer at once.
type Steps struct{ l *leadership }

// NewSteps returns the steps of the leadership of node id (gRPC address
// advertise) over r, whose state machine is fsm, promoting and demoting
// eng and reporting to health; a promotion extends live leases by extend.
func NewSteps(r Raft, fsm *FSM, eng Engine, health Health, id, advertise string, extend time.Duration) *Steps {
	return &Steps{l: &leadership{raft: r, state: fsm, eng: eng, health: health, log: slog.New(slog.DiscardHandler),
		id: id, advertise: advertise, extend: extend}}
}

// Promote makes the writer lead once raft's barrier has applied every
// earlier entry, and reports whether it leads.
func (s *Steps) Promote() bool { return s.l.promote(nil) }

// Demote stops the writer.
func (s *Steps) Demote() { s.l.demote() }

// VerifyLeader implements server.Leadership's check, as a Replica does.
func (s *Steps) VerifyLeader(ctx context.Context) error { return s.l.verify(ctx) }

// Applied implements server.Leadership.
func (s *Steps) Applied() uint64 { return s.l.state.Applied() }

// LeaderHint names the leader for NOT_LEADER answers, as a Replica does.
func (s *Steps) LeaderHint() (id, addr string) { return s.l.leaderHint() }
