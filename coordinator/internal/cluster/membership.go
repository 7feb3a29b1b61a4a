package cluster

import (
	"context"
	"fmt"
	"time"

	"github.com/hashicorp/raft"
	"github.com/leasehold/leasehold/coordinator/internal/server"
)

// Status is the cluster as one node sees it (server.ClusterStatus, whose
// members' Live the Replica judges), and since when this node leads.
type Status struct {
	server.ClusterStatus
	// LeadingSince is when this node began to lead; zero when it does not.
	LeadingSince time.Time
}

// Status returns the cluster as this node sees it. It fails only when
// raft has shut down.
func (n *Node) Status() (Status, error) {
	f := n.Raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return Status{}, err
	}
	_, lid := n.Raft.LeaderWithID()
	s := Status{ClusterStatus: server.ClusterStatus{
		NodeID: n.cfg.ID, LeaderID: string(lid), Leading: n.IsLeader(),
		Term: n.Raft.CurrentTerm(), LastIndex: n.Raft.LastIndex(), CommitIndex: n.Raft.CommitIndex(),
		AppliedIndex: n.Raft.AppliedIndex(),
	}}
	if ns := n.leadingSince.Load(); s.Leading && ns != 0 {
		s.LeadingSince = time.Unix(0, ns)
	}
	for _, srv := range f.Configuration().Servers {
		m := server.ClusterMember{ID: string(srv.ID), RaftAddr: string(srv.Address), Voter: srv.Suffrage == raft.Voter}
		for _, p := range n.cfg.Peers {
			if p.ID == m.ID {
				m.GRPCAddr = p.GRPCAddr
			}
		}
		if s.Leading {
			if m.ID == s.NodeID {
				m.Known, m.Match = true, s.LastIndex
			} else {
				m.Match, m.LastContact, m.Known = n.progress.of(srv.ID, s.Term)
			}
		}
		s.Members = append(s.Members, m)
	}
	return s, nil
}

// LeaderChangesSeen returns how many times this node has learnt of a new
// leader (itself included) since it started.
func (n *Node) LeaderChangesSeen() uint64 { return n.leaderChanges.Load() }

// watchLeaders counts the leaders this node learns of, notes when it
// begins to lead, and tells LeaderObserved, until Shutdown.
func (n *Node) watchLeaders() {
	obs := make(chan raft.Observation, 16)
	o := raft.NewObserver(obs, false, func(o *raft.Observation) bool {
		_, ok := o.Data.(raft.LeaderObservation)
		return ok
	})
	n.Raft.RegisterObserver(o)
	n.observed.Add(1)
	go func() {
		defer n.observed.Done()
		defer n.Raft.DeregisterObserver(o)
		for {
			select {
			case ob := <-obs:
				lo := ob.Data.(raft.LeaderObservation)
				select {
				case n.observedC <- struct{}{}:
				default:
				}
				if lo.LeaderID == "" {
					n.leadingSince.Store(0)
					continue
				}
				n.leaderChanges.Add(1)
				if string(lo.LeaderID) == n.cfg.ID {
					n.leadingSince.Store(time.Now().UnixNano())
				} else {
					n.leadingSince.Store(0)
				}
			case <-n.doneC:
				return
			}
		}
	}()
}

// changeTimeout bounds the wait to hand a membership change to raft.
const changeTimeout = 5 * time.Second

// AddVoter adds id at the raft address addr as a voter, in two steps: as
// a nonvoter, which receives the log without counting towards the quorum,
// then, once it has stored the log up to what the leader had committed
// when it began, as a voter. So a node that is not running, or is slow to
// catch up, never counts towards the quorum meanwhile. The address of a
// voter already in the configuration is changed in one step. It returns
// the log index of the configuration that made id a voter, once that is
// committed. When ctx ends first, id stays a nonvoter (or the last change
// may still be made). (raft's GetConfiguration does not say the index of
// the configuration it returns, so changes cannot be made conditional on
// it.)
func (n *Node) AddVoter(ctx context.Context, id, addr string) (uint64, error) {
	st, err := n.Status()
	if err != nil {
		return 0, changeOutcome(err)
	}
	if !st.Leading {
		return 0, changeOutcome(raft.ErrNotLeader)
	}
	for _, m := range st.Members {
		if m.ID == id && m.Voter {
			return n.change(ctx, n.Raft.AddVoter(raft.ServerID(id), raft.ServerAddress(addr), 0, changeTimeout))
		}
	}
	if _, err := n.change(ctx, n.Raft.AddNonvoter(raft.ServerID(id), raft.ServerAddress(addr), 0, changeTimeout)); err != nil {
		return 0, err
	}
	if err := n.caughtUp(ctx, id, st.CommitIndex); err != nil {
		return 0, err
	}
	return n.change(ctx, n.Raft.AddVoter(raft.ServerID(id), raft.ServerAddress(addr), 0, changeTimeout))
}

// caughtUp waits, while this node leads, until id has stored the log up
// to index.
func (n *Node) caughtUp(ctx context.Context, id string, index uint64) error {
	for {
		next := n.progress.next()
		if !n.IsLeader() {
			return changeOutcome(fmt.Errorf("%w while %s caught up", raft.ErrLeadershipLost, id))
		}
		if match, _, ok := n.progress.of(raft.ServerID(id), n.Raft.CurrentTerm()); ok && match >= index {
			return nil
		}
		select {
		case <-next:
		case <-ctx.Done():
			return fmt.Errorf("%s has not caught up with the leader; it stays a nonvoter until it is added again: %w", id, ctx.Err())
		case <-n.doneC:
			return changeOutcome(raft.ErrRaftShutdown)
		}
	}
}

// RemoveServer removes id from the configuration, as AddVoter adds.
func (n *Node) RemoveServer(ctx context.Context, id string) (uint64, error) {
	return n.change(ctx, n.Raft.RemoveServer(raft.ServerID(id), 0, changeTimeout))
}

// change waits for a membership change.
func (n *Node) change(ctx context.Context, f raft.IndexFuture) (uint64, error) {
	if err := wait(ctx, f); err != nil {
		return 0, changeOutcome(err)
	}
	return f.Index(), nil
}

// TransferLeadership hands leadership to the voter id at addr, and
// returns the new leader's id once this node has learnt of it, within
// timeout. A transfer that raft reports done but after which no other
// leader shows within timeout fails with server.ErrTransferFailed.
func (n *Node) TransferLeadership(ctx context.Context, id, addr string, timeout time.Duration) (string, error) {
	obs := make(chan raft.Observation, 16)
	o := raft.NewObserver(obs, false, func(o *raft.Observation) bool {
		_, ok := o.Data.(raft.LeaderObservation)
		return ok
	})
	n.Raft.RegisterObserver(o)
	defer n.Raft.DeregisterObserver(o)
	if err := wait(ctx, n.Raft.LeadershipTransferToServer(raft.ServerID(id), raft.ServerAddress(addr))); err != nil {
		return "", changeOutcome(err)
	}
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		if _, lid := n.Raft.LeaderWithID(); lid != "" && string(lid) != n.cfg.ID {
			return string(lid), nil
		}
		select {
		case <-obs:
		case <-timer.C:
			return "", fmt.Errorf("%w: no other leader within %v", server.ErrTransferFailed, timeout)
		case <-ctx.Done():
			return "", ctx.Err()
		case <-n.doneC:
			return "", changeOutcome(raft.ErrRaftShutdown)
		}
	}
}
