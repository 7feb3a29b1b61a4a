package cluster

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
)

// streamLayer is raft's transport over TCP, or over mutual TLS when tls is
// set: peers then present certificates the cluster CA signed, and each end
// checks the other's names. The dialling end checks that the certificate
// names the host it dialled, as any TLS client does; the accepting end
// checks that it names the host of a member of the cluster (one of the
// peers the node started with, or of raft's latest configuration), so
// that a certificate the same CA signed for something else (a renderer's
// or a client's, when the peer CA is the client CA) cannot speak raft.
type streamLayer struct {
	net.Listener
	advertise net.Addr
	tls       *tls.Config
	// members returns the raft addresses of the cluster's members.
	members atomic.Pointer[func() []raft.ServerAddress]
}

// errNotAMember refuses a peer whose certificate names no member.
var errNotAMember = errors.New("the raft peer's certificate names no member of the cluster")

// listen opens the raft listener on addr; advertise is the address peers
// dial (the listener's own when empty).
func listen(addr, advertise string, cfg *tls.Config) (*streamLayer, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("raft listener: %w", err)
	}
	s := &streamLayer{Listener: l, advertise: l.Addr(), tls: cfg}
	if advertise != "" {
		a, err := net.ResolveTCPAddr("tcp", advertise)
		if err != nil {
			l.Close()
			return nil, fmt.Errorf("raft advertise address %q: %w", advertise, err)
		}
		s.advertise = a
	}
	if cfg != nil {
		srv := cfg.Clone()
		srv.VerifyConnection = s.verifyPeer
		s.Listener = tls.NewListener(l, srv)
	}
	return s, nil
}

// setMembers tells the listener who the cluster's members are.
func (s *streamLayer) setMembers(members func() []raft.ServerAddress) { s.members.Store(&members) }

// verifyPeer accepts a peer whose certificate (already verified against
// the cluster CA) names the host of a member's raft address.
func (s *streamLayer) verifyPeer(cs tls.ConnectionState) error {
	if len(cs.PeerCertificates) == 0 {
		return errNotAMember
	}
	leaf := cs.PeerCertificates[0]
	var members []raft.ServerAddress
	if m := s.members.Load(); m != nil {
		members = (*m)()
	}
	for _, a := range members {
		host, _, err := net.SplitHostPort(string(a))
		if err == nil && leaf.VerifyHostname(host) == nil {
			return nil
		}
	}
	return fmt.Errorf("%w: %q names %q and %v", errNotAMember, leaf.Subject.CommonName, leaf.DNSNames, leaf.IPAddresses)
}

// Addr implements net.Listener: the address peers dial.
func (s *streamLayer) Addr() net.Addr { return s.advertise }

// Dial implements raft.StreamLayer.
func (s *streamLayer) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	d := &net.Dialer{Timeout: timeout}
	if s.tls == nil {
		return d.Dial("tcp", string(address))
	}
	return tls.DialWithDialer(d, "tcp", string(address), s.tls)
}

var _ raft.StreamLayer = (*streamLayer)(nil)
