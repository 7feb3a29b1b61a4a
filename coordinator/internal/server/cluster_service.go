package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/auth"
	"github.com/leasehold/leasehold/coordinator/internal/engine"
	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"
)

// ClusterServiceName is ClusterService's name, as the health service
// reports it.
const ClusterServiceName = "leasehold.v1.ClusterService"

// Cluster is what ClusterService needs of a replicated coordinator's raft
// node; a single node has none. Besides context errors, its methods fail
// with errors wrapping engine.ErrNotLeader (an *engine.NotLeaderError
// naming the leader, when known) or ErrTransferFailed.
type Cluster interface {
	// Status returns the cluster as this node sees it.
	Status() (ClusterStatus, error)
	// TransferLeadership hands leadership to the voter id and returns the
	// new leader's id.
	TransferLeadership(ctx context.Context, id string) (string, error)
	// AddVoter adds the voter id at raftAddr (or moves it there) and
	// RemoveServer removes id; both return the new configuration's log
	// index once it is committed.
	AddVoter(ctx context.Context, id, raftAddr string) (uint64, error)
	RemoveServer(ctx context.Context, id string) (uint64, error)
}

// ClusterStatus is the cluster as one node sees it.
type ClusterStatus struct {
	// NodeID is the answering node; LeaderID the leader it knows ("" for
	// none); Leading whether it is the leader.
	NodeID, LeaderID string
	Leading          bool
	// The answering node's raft term, last log index, commit index and
	// applied index.
	Term, LastIndex, CommitIndex, AppliedIndex uint64
	// Members are the servers of the latest configuration.
	Members []ClusterMember
}

// ClusterMember is one member of the configuration.
type ClusterMember struct {
	ID, RaftAddr string
	// GRPCAddr is its gRPC address when known.
	GRPCAddr string
	Voter    bool
	// Known reports whether Match and LastContact are known: on the
	// leader, for itself and the members that answered it in its term.
	Known bool
	// Match is its match index; LastContact when it last answered the
	// leader (zero for the leader itself).
	Match       uint64
	LastContact time.Time
	// Live reports whether it counts towards a quorum now: the leader
	// itself, and each member that answered it recently enough.
	Live bool
}

// ErrTransferFailed is returned by a Cluster when no other voter took
// over leadership in time.
var ErrTransferFailed = errors.New("the leadership transfer failed")

// ClusterEngine is what ClusterService needs of the writer: the audit
// record of each change.
type ClusterEngine interface {
	RecordAudit(ctx context.Context, rec jobs.AuditRecord) error
}

// ClusterServer implements leasehold.v1.ClusterService.
type ClusterServer struct {
	leaseholdv1.UnimplementedClusterServiceServer
	*core
	e  ClusterEngine
	cl Cluster
	// changing holds one change at a time, from the status it is decided
	// on to its end, so that each is decided on the configuration the one
	// before left. A change made through another node (after a new
	// leader) is not held back; raft makes those one at a time itself.
	changing sync.Mutex
}

// clusterForAll is why the cluster calls need every team.
const clusterForAll = "the cluster serves every team"

// GetCluster implements ClusterService.GetCluster.
func (s *ClusterServer) GetCluster(ctx context.Context, _ *leaseholdv1.GetClusterRequest) (*leaseholdv1.GetClusterResponse, error) {
	if _, err := requireAllTeams(ctx, clusterForAll); err != nil {
		return nil, s.status(err)
	}
	if s.cl == nil {
		return &leaseholdv1.GetClusterResponse{}, nil
	}
	st, err := s.cl.Status()
	if err != nil {
		return nil, s.status(err)
	}
	return clusterToProto(st, time.Now()), nil
}

// clusterToProto converts a status as of now.
func clusterToProto(st ClusterStatus, now time.Time) *leaseholdv1.GetClusterResponse {
	resp := &leaseholdv1.GetClusterResponse{
		Replicated: true, NodeId: st.NodeID, LeaderId: st.LeaderID, FromLeader: st.Leading, Term: st.Term,
		LastLogIndex: st.LastIndex, CommitIndex: st.CommitIndex, AppliedIndex: st.AppliedIndex,
	}
	for _, m := range st.Members {
		pm := &leaseholdv1.ClusterMember{Id: m.ID, RaftAddress: m.RaftAddr, GrpcAddress: m.GRPCAddr,
			Suffrage: leaseholdv1.Suffrage_SUFFRAGE_NONVOTER, Leader: m.ID == st.LeaderID, Self: m.ID == st.NodeID}
		if m.Voter {
			pm.Suffrage = leaseholdv1.Suffrage_SUFFRAGE_VOTER
		}
		if st.Leading && m.Known {
			pm.Progress = &leaseholdv1.ReplicationProgress{MatchIndex: m.Match, LagEntries: st.LastIndex - min(m.Match, st.LastIndex)}
			if !m.LastContact.IsZero() {
				pm.Progress.LastContact = durationpb.New(max(now.Sub(m.LastContact), 0))
			}
		}
		resp.Members = append(resp.Members, pm)
	}
	return resp
}

// TransferLeadership implements ClusterService.TransferLeadership.
func (s *ClusterServer) TransferLeadership(ctx context.Context, req *leaseholdv1.TransferLeadershipRequest) (*leaseholdv1.TransferLeadershipResponse, error) {
	p, st, err := s.prepare(ctx, req.GetReason(), false)
	if err != nil {
		return nil, s.status(err)
	}
	defer s.changing.Unlock()
	to := req.GetToId()
	if to != "" {
		if err := checkMemberID("to_id", to); err != nil {
			return nil, s.status(err)
		}
	}
	if st, err = s.leaderStatus(st); err != nil {
		return nil, s.status(err)
	}
	if to == st.NodeID {
		return &leaseholdv1.TransferLeadershipResponse{PreviousLeaderId: st.NodeID, LeaderId: st.NodeID, Term: st.Term}, nil
	}
	target, err := transferTarget(st, to)
	if err != nil {
		return nil, s.status(err)
	}
	if err := s.audit(ctx, p, jobs.AuditTransferLeadership, req.GetReason(), st.NodeID+" to "+target); err != nil {
		return nil, s.status(err)
	}
	leader, err := s.cl.TransferLeadership(ctx, target)
	if err != nil {
		return nil, s.status(err)
	}
	resp := &leaseholdv1.TransferLeadershipResponse{Changed: true, PreviousLeaderId: st.NodeID, LeaderId: leader}
	if after, err := s.cl.Status(); err == nil {
		resp.Term = after.Term
	}
	return resp, nil
}

// transferTarget returns the voter to hand leadership to: to, which must
// be a voter that answers the leader, or when empty the answering voter
// with the highest match index.
func transferTarget(st ClusterStatus, to string) (string, error) {
	if to != "" {
		m, ok := member(st, to)
		switch {
		case !ok || !m.Voter:
			return "", memberNotFound(to)
		case !m.Live:
			return "", failedPrecondition(reasonMemberUnreachable, "%s has not answered the leader lately; it cannot take over", to)
		}
		return to, nil
	}
	var best *ClusterMember
	for i, m := range st.Members {
		if m.ID != st.NodeID && m.Voter && m.Live && (best == nil || m.Match > best.Match) {
			best = &st.Members[i]
		}
	}
	if best == nil {
		return "", failedPrecondition(reasonNoTransferTarget, "no other voter answers the leader: there is none to hand leadership to")
	}
	return best.ID, nil
}

// AddVoter implements ClusterService.AddVoter. It needs the backup role
// besides an operator of every team: the new member receives the whole
// database.
func (s *ClusterServer) AddVoter(ctx context.Context, req *leaseholdv1.AddVoterRequest) (*leaseholdv1.AddVoterResponse, error) {
	p, st, err := s.prepare(ctx, req.GetReason(), true)
	if err != nil {
		return nil, s.status(err)
	}
	defer s.changing.Unlock()
	id, addr := req.GetId(), req.GetRaftAddress()
	if err := checkMemberID("id", id); err != nil {
		return nil, s.status(err)
	}
	if err := checkRaftAddress("raft_address", addr); err != nil {
		return nil, s.status(err)
	}
	if st, err = s.leaderStatus(st); err != nil {
		return nil, s.status(err)
	}
	if m, ok := member(st, id); ok && m.Voter && m.RaftAddr == addr {
		return &leaseholdv1.AddVoterResponse{}, nil
	}
	voters, live := 0, 0
	for _, m := range st.Members {
		if m.RaftAddr == addr && m.ID != id {
			return nil, s.status(failedPrecondition(reasonRaftAddressInUse, "%s is the raft address of %s", addr, m.ID))
		}
		if m.Voter && m.ID != id {
			voters++
			if m.Live {
				live++
			}
		}
	}
	// A new member votes only once it has caught up, and so answers; a
	// voter moved to another address votes at once, and answers there
	// only once it runs there.
	if m, ok := member(st, id); !ok || !m.Voter {
		live++
	}
	if err := checkQuorum(voters+1, live, req.GetForce(), "adding "+id); err != nil {
		return nil, s.status(err)
	}
	if err := s.audit(ctx, p, jobs.AuditAddVoter, req.GetReason(), id+" at "+addr); err != nil {
		return nil, s.status(err)
	}
	index, err := s.cl.AddVoter(ctx, id, addr)
	if err != nil {
		return nil, s.status(err)
	}
	return &leaseholdv1.AddVoterResponse{ConfigurationIndex: index, Changed: true}, nil
}

// RemoveServer implements ClusterService.RemoveServer.
func (s *ClusterServer) RemoveServer(ctx context.Context, req *leaseholdv1.RemoveServerRequest) (*leaseholdv1.RemoveServerResponse, error) {
	p, st, err := s.prepare(ctx, req.GetReason(), false)
	if err != nil {
		return nil, s.status(err)
	}
	defer s.changing.Unlock()
	id := req.GetId()
	if err := checkMemberID("id", id); err != nil {
		return nil, s.status(err)
	}
	if st, err = s.leaderStatus(st); err != nil {
		return nil, s.status(err)
	}
	target, ok := member(st, id)
	if !ok {
		return nil, s.status(memberNotFound(id))
	}
	voters, live := 0, 0
	for _, m := range st.Members {
		if m.Voter && m.ID != id {
			voters++
			if m.Live {
				live++
			}
		}
	}
	if target.Voter && voters == 0 {
		return nil, s.status(failedPrecondition(reasonLastVoter, "%s is the only voter: a cluster needs one", id))
	}
	if err := checkQuorum(voters, live, req.GetForce(), "removing "+id); err != nil {
		return nil, s.status(err)
	}
	if err := s.audit(ctx, p, jobs.AuditRemoveServer, req.GetReason(), id); err != nil {
		return nil, s.status(err)
	}
	index, err := s.cl.RemoveServer(ctx, id)
	if err != nil {
		return nil, s.status(err)
	}
	return &leaseholdv1.RemoveServerResponse{ConfigurationIndex: index}, nil
}

// prepare runs the checks every change starts with, in order: the caller
// (an operator of every team, and with backup the backup role too), the
// reason, a replicated coordinator. It returns the caller and the status,
// holding s.changing when it succeeds, which the handler releases.
func (s *ClusterServer) prepare(ctx context.Context, reason string, backup bool) (auth.Principal, ClusterStatus, error) {
	p, err := requireAllTeams(ctx, clusterForAll)
	if err != nil {
		return p, ClusterStatus{}, err
	}
	if backup && !p.Can(auth.RoleBackup) {
		return p, ClusterStatus{}, denied("%s does not have the backup role, which adding a member needs: the member receives the whole database", p.Name)
	}
	if err := checkReason("reason", reason, true); err != nil {
		return p, ClusterStatus{}, err
	}
	if s.cl == nil {
		return p, ClusterStatus{}, failedPrecondition(reasonNotReplicated, "this coordinator runs as a single node: it has no cluster to change")
	}
	s.changing.Lock()
	st, err := s.cl.Status()
	if err != nil {
		s.changing.Unlock()
	}
	return p, st, err
}

// leaderStatus returns st when the answering node leads, and NOT_LEADER
// naming the leader it knows otherwise.
func (s *ClusterServer) leaderStatus(st ClusterStatus) (ClusterStatus, error) {
	if st.Leading {
		return st, nil
	}
	m, _ := member(st, st.LeaderID)
	return st, engine.NotLeader(st.LeaderID, m.GRPCAddr, nil)
}

// audit writes the record of a change through the writer, before the
// change is made: a change the trail could not record is not made.
func (s *ClusterServer) audit(ctx context.Context, p auth.Principal, action, reason, target string) error {
	return s.e.RecordAudit(ctx, jobs.AuditRecord{Principal: p.Name, Action: action, Reason: reason, Target: target})
}

// member returns the member id of st.
func member(st ClusterStatus, id string) (ClusterMember, bool) {
	for _, m := range st.Members {
		if m.ID == id && id != "" {
			return m, true
		}
	}
	return ClusterMember{}, false
}

// checkQuorum refuses, unless forced, a configuration of voters of which
// fewer than a majority answer the leader (live): it would commit nothing
// until more of them do.
func checkQuorum(voters, live int, force bool, what string) error {
	if force || live >= voters/2+1 {
		return nil
	}
	return failedPrecondition(reasonQuorumAtRisk, "%s leaves %d voters of which %d answer the leader, fewer than the %d a quorum needs; "+
		"bring members back first, or force the change", what, voters, live, voters/2+1)
}

func memberNotFound(id string) error {
	return &requestError{code: codes.NotFound, reason: reasonMemberNotFound, msg: fmt.Sprintf("%s is not a member of the cluster", id)}
}

// maxMemberIDBytes bounds a member id.
const maxMemberIDBytes = 64

// CheckMemberID refuses a node id that is empty, longer than 64 bytes, or
// holds a byte other than a letter, digit, '.', '_' or '-': ids appear in
// metric labels, logs and audit records.
func CheckMemberID(id string) error {
	if id == "" || len(id) > maxMemberIDBytes {
		return fmt.Errorf("a node id is 1 to %d bytes", maxMemberIDBytes)
	}
	for _, c := range []byte(id) {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-'
		if !ok {
			return fmt.Errorf("a node id holds letters, digits, '.', '_' and '-' only, not %q", c)
		}
	}
	return nil
}

func checkMemberID(field, id string) error {
	if err := CheckMemberID(id); err != nil {
		return invalidArg(field, reasonInvalidMemberID, "%s: %v", field, err)
	}
	return nil
}

// checkRaftAddress refuses an address that is not host:port with a port
// from 1 to 65535.
func checkRaftAddress(field, addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err == nil {
		n, perr := strconv.ParseUint(port, 10, 16)
		if perr != nil || n == 0 || host == "" {
			err = errors.New("want a host and a port from 1 to 65535")
		}
	}
	if err != nil || len(addr) > 255 {
		return invalidArg(field, reasonInvalidRaftAddress, "%s %q is not a host:port address", field, addr)
	}
	return nil
}
