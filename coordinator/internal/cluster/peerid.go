package cluster

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"slices"

	"github.com/hashicorp/raft"

	"github.com/leasehold/leasehold/internal/security"
)

// NodeURI returns the URI subject alternative name a peer certificate
// carries for the node id (security.NodeURI): the name the raft port
// checks, on both ends of a connection, against the id a member claims.
// A certificate the peer CA signed but that names no member this way (a
// renderer's, a client's, or a node's for a host name only) cannot speak
// raft.
func NodeURI(id string) string { return security.NodeURI(id) }

// certNodeIDs returns the node ids a certificate names.
func certNodeIDs(c *x509.Certificate) []string { return security.NodeIDs(c) }

// errNotAMember refuses a peer that is not the member it claims: a
// certificate naming no member, or an RPC whose header claims another
// member than the certificate names, or a member at another address.
var errNotAMember = errors.New("the raft peer is not the member it claims")

// CheckPeerCertificate checks that cert, this node's peer certificate,
// names id as NodeURI does and serves both ends of a raft connection
// (client and server authentication): without either, the other members
// refuse it.
func CheckPeerCertificate(cert tls.Certificate, id string) error {
	leaf := cert.Leaf
	if leaf == nil {
		if len(cert.Certificate) == 0 {
			return errors.New("no certificate")
		}
		var err error
		if leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return err
		}
	}
	if !slices.Contains(certNodeIDs(leaf), id) {
		return fmt.Errorf("the peer certificate names nodes %q, not %q: it must carry the URI %s (a subject alternative name), "+
			"which the other members check", certNodeIDs(leaf), id, NodeURI(id))
	}
	usages := leaf.ExtKeyUsage
	if len(usages) > 0 && !slices.Contains(usages, x509.ExtKeyUsageAny) &&
		(!slices.Contains(usages, x509.ExtKeyUsageClientAuth) || !slices.Contains(usages, x509.ExtKeyUsageServerAuth)) {
		return errors.New("the peer certificate must allow client and server authentication both: a node presents it when it dials and when it is dialled")
	}
	return nil
}

// memberIDs returns the ids among ids that are members.
func memberIDs(ids []string, members []raft.Server) []string {
	var out []string
	for _, id := range ids {
		if slices.ContainsFunc(members, func(m raft.Server) bool { return string(m.ID) == id }) {
			out = append(out, id)
		}
	}
	return out
}

// verifyDialled returns the TLS check of the dialling end: the server's
// certificate must chain to roots for server authentication (no host
// name is checked: raft addresses may be IPs or names the certificate
// does not carry) and name one of the members whose raft address is the
// one dialled.
func verifyDialled(roots *x509.CertPool, address raft.ServerAddress, members []raft.Server) func(tls.ConnectionState) error {
	return func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return fmt.Errorf("%w: %s presented no certificate", errNotAMember, address)
		}
		leaf := cs.PeerCertificates[0]
		inter := x509.NewCertPool()
		for _, c := range cs.PeerCertificates[1:] {
			inter.AddCert(c)
		}
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
			return fmt.Errorf("raft peer %s: %w", address, err)
		}
		var want []string
		for _, m := range members {
			if m.Address == address {
				want = append(want, string(m.ID))
			}
		}
		for _, id := range certNodeIDs(leaf) {
			if slices.Contains(want, id) {
				return nil
			}
		}
		return fmt.Errorf("%w: %s is the address of %q, and its certificate names %q", errNotAMember, address, want, certNodeIDs(leaf))
	}
}

// verifyAccepted returns the TLS check of the accepting end, once the
// client's certificate chained to the peer CA: it must name a member.
func verifyAccepted(members func() []raft.Server) func(tls.ConnectionState) error {
	return func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return fmt.Errorf("%w: no certificate", errNotAMember)
		}
		leaf := cs.PeerCertificates[0]
		if len(memberIDs(certNodeIDs(leaf), members())) == 0 {
			return fmt.Errorf("%w: the certificate of %q names nodes %q, none a member", errNotAMember, leaf.Subject.CommonName, certNodeIDs(leaf))
		}
		return nil
	}
}
