package client

import (
	"context"

	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
)

// cluster is the ClusterService stub: the calls go where the others go,
// to the leader of a cluster (whose answer holds every member's progress).
func (c *Client) cluster() leaseholdv1.ClusterServiceClient {
	return leaseholdv1.NewClusterServiceClient(c.conn)
}

// GetCluster returns the replicated coordinator's members, leader and
// replication progress as the node that answers sees it (the leader's
// answer has every member's progress); a single-node coordinator answers
// with Replicated unset. It needs an operator whose scope is every team.
func (c *Client) GetCluster(ctx context.Context) (*leaseholdv1.GetClusterResponse, error) {
	resp, err := c.cluster().GetCluster(ctx, &leaseholdv1.GetClusterRequest{})
	return resp, wrapError(err)
}

// TransferLeadership hands the cluster's leadership to the voter toID, or
// to the most up-to-date one when toID is empty; it must reach the leader.
func (c *Client) TransferLeadership(ctx context.Context, toID, reason string) (*leaseholdv1.TransferLeadershipResponse, error) {
	resp, err := c.cluster().TransferLeadership(ctx, &leaseholdv1.TransferLeadershipRequest{ToId: toID, Reason: reason})
	return resp, wrapError(err)
}

// AddVoter adds the node id, whose raft listener is at raftAddr, to the
// cluster as a voter; it needs the backup role as well, since the new
// member receives the whole database.
func (c *Client) AddVoter(ctx context.Context, req *leaseholdv1.AddVoterRequest) (*leaseholdv1.AddVoterResponse, error) {
	resp, err := c.cluster().AddVoter(ctx, req)
	return resp, wrapError(err)
}

// RemoveServer removes a member from the cluster.
func (c *Client) RemoveServer(ctx context.Context, req *leaseholdv1.RemoveServerRequest) (*leaseholdv1.RemoveServerResponse, error) {
	resp, err := c.cluster().RemoveServer(ctx, req)
	return resp, wrapError(err)
}
