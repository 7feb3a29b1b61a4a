package cluster

import (
	"errors"
	"fmt"
	"strings"

	"github.com/hashicorp/raft"
)

// Peer is one voter of the cluster: its id, the address its raft listener
// is reached at, and its gRPC address (for followers to name the leader).
type Peer struct {
	ID       string
	RaftAddr string
	GRPCAddr string
}

// ParsePeers reads the --peers list: comma-separated items
// id=raft_address, or id=raft_address/grpc_address to let followers name
// the leader's gRPC address when they refuse a write. A cluster has an odd
// number of voters.
func ParsePeers(s string) ([]Peer, error) {
	var peers []Peer
	seen := map[string]bool{}
	for item := range strings.SplitSeq(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		id, addrs, ok := strings.Cut(item, "=")
		if !ok || id == "" || addrs == "" {
			return nil, fmt.Errorf("peer %q: want id=raft_address or id=raft_address/grpc_address", item)
		}
		raftAddr, grpcAddr, _ := strings.Cut(addrs, "/")
		if seen[id] {
			return nil, fmt.Errorf("peer id %q appears twice", id)
		}
		seen[id] = true
		peers = append(peers, Peer{ID: id, RaftAddr: raftAddr, GRPCAddr: grpcAddr})
	}
	switch n := len(peers); {
	case n == 0:
		return nil, errors.New("no peers")
	case n%2 == 0:
		return nil, fmt.Errorf("%d peers: a cluster of an even size tolerates no more failures than one smaller; use 1, 3 or 5", n)
	}
	return peers, nil
}

// peerServers returns peers as raft's servers: their ids and raft
// addresses.
func peerServers(peers []Peer) []raft.Server {
	servers := make([]raft.Server, len(peers))
	for i, p := range peers {
		servers[i] = raft.Server{Suffrage: raft.Voter, ID: raft.ServerID(p.ID), Address: raft.ServerAddress(p.RaftAddr)}
	}
	return servers
}
