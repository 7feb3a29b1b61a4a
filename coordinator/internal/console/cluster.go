package console

import (
	"strconv"
	"time"

	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
)

// clusterView is the overview's cluster panel: the members of a replicated
// coordinator, the leader and each member's lag.
type clusterView struct {
	Leader, Node string
	FromLeader   bool
	Term, Commit uint64
	Members      []memberView
}

// memberView is one member's row; match, lag and last contact are "-"
// where the answering node does not know them (only the leader does).
type memberView struct {
	ID, Role, RaftAddr, GRPCAddr string
	Match, Lag, Contact          string
}

// cluster returns the cluster panel for r's principal: nil on a single
// node, and for anyone but an operator of every team, as ClusterService
// answers only those.
func (c *Console) cluster(r *request) (*clusterView, error) {
	if !r.sess.principal.AllScope() {
		return nil, nil
	}
	cl, err := c.svc.Cluster.GetCluster(r.ctx, &leaseholdv1.GetClusterRequest{})
	if err != nil || !cl.GetReplicated() {
		return nil, err
	}
	v := &clusterView{Leader: cl.GetLeaderId(), Node: cl.GetNodeId(), FromLeader: cl.GetFromLeader(), Term: cl.GetTerm(), Commit: cl.GetCommitIndex()}
	for _, m := range cl.GetMembers() {
		mv := memberView{ID: m.GetId(), Role: "follower", RaftAddr: m.GetRaftAddress(), GRPCAddr: m.GetGrpcAddress(), Match: "-", Lag: "-", Contact: "-"}
		if m.GetLeader() {
			mv.Role = "leader"
		}
		if p := m.GetProgress(); p != nil {
			mv.Match, mv.Lag = strconv.FormatUint(p.GetMatchIndex(), 10), strconv.FormatUint(p.GetLagEntries(), 10)
			if lc := p.GetLastContact(); lc != nil {
				mv.Contact = lc.AsDuration().Round(time.Millisecond).String() + " ago"
			}
		}
		v.Members = append(v.Members, mv)
	}
	return v, nil
}
