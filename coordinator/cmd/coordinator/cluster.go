package main

import (
	"cmp"

	"github.com/leasehold/leasehold/coordinator"
	"github.com/leasehold/leasehold/coordinator/internal/cluster"
	"github.com/leasehold/leasehold/internal/security"
)

// clusterConfig reads the cluster flags: none of them is the single node;
// --node-id, --raft-listen and --peers together make this coordinator one
// voter of a replicated cluster, and --join one that waits to be added to
// a running cluster rather than bootstrap a new one. With TLS on, peers speak mutual TLS under
// the node's certificate and the cluster CA; a cluster without TLS is
// plaintext between peers too, for loopback and trusted networks only.
func clusterConfig(cfg coordinator.Config, fv flagValues, source map[string]string) (*coordinator.Cluster, error) {
	if fv.nodeID == "" && fv.raftListen == "" && fv.peers == "" && fv.raftAdvertise == "" && fv.grpcAdvertise == "" && fv.tlsPeerCA == "" && !fv.join {
		return nil, nil
	}
	switch {
	case fv.nodeID == "" || fv.raftListen == "" || fv.peers == "":
		return nil, usagef("a cluster node needs --node-id, --raft-listen and --peers together")
	case !hostPort(fv.raftListen):
		return nil, usagef("%s=%q: want a host:port address", source["raft-listen"], fv.raftListen)
	case fv.raftAdvertise != "" && !hostPort(fv.raftAdvertise):
		return nil, usagef("%s=%q: want a host:port address", source["raft-advertise"], fv.raftAdvertise)
	case fv.grpcAdvertise != "" && !hostPort(fv.grpcAdvertise):
		return nil, usagef("%s=%q: want a host:port address", source["grpc-advertise"], fv.grpcAdvertise)
	}
	peers, err := cluster.ParsePeers(fv.peers)
	if err != nil {
		return nil, usagef("%s=%q: %v", source["peers"], fv.peers, err)
	}
	if err := checkPeers(peers, fv.nodeID, source); err != nil {
		return nil, err
	}
	cl := &coordinator.Cluster{NodeID: fv.nodeID, RaftListen: fv.raftListen, RaftAdvertise: fv.raftAdvertise,
		GRPCAdvertise: fv.grpcAdvertise, Peers: peers, Join: fv.join}
	if fv.tlsCert != "" {
		ca := cmp.Or(fv.tlsPeerCA, fv.tlsClientCA)
		if ca == "" {
			return nil, usagef("a cluster with --tls-cert needs --tls-peer-ca (the CA of every node's certificate) or --tls-client-ca")
		}
		if cl.TLS, err = security.PeerTLS(fv.tlsCert, fv.tlsKey, ca); err != nil {
			return nil, usagef("peer TLS: %v", err)
		}
	} else if fv.tlsPeerCA != "" {
		return nil, usagef("%s needs --tls-cert and --tls-key", source["tls-peer-ca"])
	}
	return cl, nil
}
