package cluster

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/engine"
	"github.com/leasehold/leasehold/coordinator/internal/server"
)

// transferWait bounds the wait, after raft handed leadership over, for
// this node to learn of the new leader.
const transferWait = 5 * time.Second

// Status implements server.Cluster. The leader's gRPC address is the one
// it announced when known, this node's its own; a member counts as live
// when it answered the leader within the last three heartbeat timeouts
// (at least a second).
func (r *Replica) Status() (server.ClusterStatus, error) {
	st, err := r.node.Status()
	if err != nil {
		return server.ClusterStatus{}, r.lead.notLeader(changeOutcome(err))
	}
	leaderID, leaderAddr := r.LeaderHint()
	now := time.Now()
	for i := range st.Members {
		m := &st.Members[i]
		switch m.ID {
		case st.NodeID:
			m.GRPCAddr = r.advertise
		case leaderID:
			m.GRPCAddr = cmp.Or(leaderAddr, m.GRPCAddr)
		}
		m.Live = st.Leading && (m.ID == st.NodeID || m.Known && now.Sub(m.LastContact) <= r.live)
	}
	return st.ClusterStatus, nil
}

// TransferLeadership implements server.Cluster.
func (r *Replica) TransferLeadership(ctx context.Context, id string) (string, error) {
	st, err := r.node.Status()
	if err != nil {
		return "", r.lead.notLeader(changeOutcome(err))
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
	leader, err := r.node.TransferLeadership(ctx, id, addr, transferWait)
	if err != nil {
		return "", r.hinted(err)
	}
	r.log.Info("handed leadership over", "to", leader)
	return leader, nil
}

// AddVoter implements server.Cluster.
func (r *Replica) AddVoter(ctx context.Context, id, raftAddr string) (uint64, error) {
	index, err := r.node.AddVoter(ctx, id, raftAddr)
	if err != nil {
		return 0, r.hinted(err)
	}
	r.log.Info("added a voter", "node", id, "raft_addr", raftAddr, "configuration_index", index)
	return index, nil
}

// RemoveServer implements server.Cluster.
func (r *Replica) RemoveServer(ctx context.Context, id string) (uint64, error) {
	index, err := r.node.RemoveServer(ctx, id)
	if err != nil {
		return 0, r.hinted(err)
	}
	r.log.Info("removed a member", "node", id, "configuration_index", index)
	return index, nil
}

// hinted names the leader this node knows in a change's not-leader error.
func (r *Replica) hinted(err error) error {
	if errors.Is(err, engine.ErrNotLeader) {
		return r.lead.notLeader(err)
	}
	return err
}
