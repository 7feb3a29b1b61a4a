package main

import (
	"bytes"
	"crypto/tls"
	"os"

	"github.com/leasehold/leasehold/coordinator"
	"github.com/leasehold/leasehold/coordinator/internal/cluster"
	"github.com/leasehold/leasehold/internal/security"
)

// clusterConfig reads the cluster flags: none of them is the single node;
// --node-id, --raft-listen and --peers together make this coordinator one
// voter of a replicated cluster, and --join one that waits to be added to
// a running cluster rather than bootstrap a new one. With TLS on, peers speak mutual TLS under
// the node's peer certificate and a peer CA of its own (peerTLS); a cluster without TLS is
// plaintext between peers too, on loopback only (its listener, its
// advertised address and every peer), unless the loudly named opt-out
// says the network encrypts and authenticates by itself.
func clusterConfig(cfg coordinator.Config, fv flagValues, source map[string]string) (*coordinator.Cluster, error) {
	if fv.nodeID == "" && fv.raftListen == "" && fv.peers == "" && fv.raftAdvertise == "" && fv.grpcAdvertise == "" && fv.tlsPeerCA == "" &&
		fv.tlsPeerCert == "" && fv.tlsPeerKey == "" && !fv.join && !fv.raftInsecurePlaintext {
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
	if err := cluster.CheckEntryBound(int64(cfg.MaxRecvMsgSize()), cfg.MaxArtifactBytes); err != nil {
		return nil, usagef("%s=%d, %s=%d, %s=%d: %v", source["max-batch-inline-bytes"], cfg.MaxBatchInlineBytes,
			source["max-documents"], cfg.MaxDocuments, source["max-artifact-bytes"], cfg.MaxArtifactBytes, err)
	}
	cl := &coordinator.Cluster{NodeID: fv.nodeID, RaftListen: fv.raftListen, RaftAdvertise: fv.raftAdvertise,
		GRPCAdvertise: fv.grpcAdvertise, Peers: peers, Join: fv.join, InsecurePlaintext: fv.raftInsecurePlaintext}
	switch {
	case fv.tlsCert != "" && fv.raftInsecurePlaintext:
		return nil, usagef("%s excludes --tls-cert: with a certificate, peers speak mutual TLS", source[cluster.InsecurePlaintextFlag])
	case fv.tlsCert == "" && !fv.raftInsecurePlaintext:
		if err := cluster.CheckPlaintext(fv.raftListen, fv.raftAdvertise, peers); err != nil {
			return nil, usagef("%v", err)
		}
	}
	if fv.tlsCert != "" {
		if cl.TLS, err = peerTLS(fv, source); err != nil {
			return nil, err
		}
	} else if fv.tlsPeerCA != "" || fv.tlsPeerCert != "" || fv.tlsPeerKey != "" {
		return nil, usagef("the --tls-peer-* flags need --tls-cert and --tls-key")
	}
	return cl, nil
}

// peerTLS reads the mutual TLS of the raft port: the node's peer
// certificate (--tls-peer-cert, or the gRPC certificate) and the peer CA,
// which must be a CA of its own: not the CA of the renderers' and
// clients' certificates (--tls-client-ca), which would let them speak
// raft. The certificate must name this node's id (cluster.NodeURI), as
// the other members check.
func peerTLS(fv flagValues, source map[string]string) (*tls.Config, error) {
	switch {
	case fv.tlsPeerCA == "":
		return nil, usagef("a cluster with --tls-cert needs --tls-peer-ca: the CA of the nodes' peer certificates, a CA of its own " +
			"that signs nothing else (not --tls-client-ca, which signs renderers' and clients' certificates)")
	case (fv.tlsPeerCert == "") != (fv.tlsPeerKey == ""):
		return nil, usagef("--tls-peer-cert and --tls-peer-key go together: give both or neither (then the peers see --tls-cert)")
	case fv.tlsClientCA != "" && sameFile(fv.tlsPeerCA, fv.tlsClientCA):
		return nil, usagef("%s=%q is also --tls-client-ca: the peers need a CA of their own, or every renderer and client "+
			"certificate it signs could speak raft", source["tls-peer-ca"], fv.tlsPeerCA)
	}
	certFile, keyFile, certSource := fv.tlsCert, fv.tlsKey, source["tls-cert"]
	if fv.tlsPeerCert != "" {
		certFile, keyFile, certSource = fv.tlsPeerCert, fv.tlsPeerKey, source["tls-peer-cert"]
	}
	cfg, err := security.PeerTLS(certFile, keyFile, fv.tlsPeerCA)
	if err != nil {
		return nil, usagef("peer TLS: %v", err)
	}
	if err := cluster.CheckPeerCertificate(cfg.Certificates[0], fv.nodeID); err != nil {
		return nil, usagef("%s=%q: %v", certSource, certFile, err)
	}
	return cfg, nil
}

// sameFile reports whether the files a and b are one, or hold the same
// bytes.
func sameFile(a, b string) bool {
	if a == b {
		return true
	}
	da, errA := os.ReadFile(a)
	db, errB := os.ReadFile(b)
	return errA == nil && errB == nil && bytes.Equal(bytes.TrimSpace(da), bytes.TrimSpace(db))
}
