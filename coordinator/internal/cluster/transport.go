package cluster

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"

	"github.com/leasehold/leasehold/internal/security"
)

// streamLayer is raft's transport over mutual TLS, or over plaintext TCP
// on loopback (or, by an explicit opt-out, on a network that encrypts and
// authenticates by itself). With TLS, peers then present certificates the cluster CA signed, and each end
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
	// anyHost lets a plaintext layer dial peers off loopback (the
	// opt-out); without it, and without tls, a dial that reaches another
	// host is closed before anything is sent.
	anyHost bool
	// members returns the raft addresses of the cluster's members.
	members atomic.Pointer[func() []raft.ServerAddress]
}

// errNotAMember refuses a peer whose certificate names no member.
var errNotAMember = errors.New("the raft peer's certificate names no member of the cluster")

// ErrPlaintextRaft refuses raft without TLS off loopback: the raft port
// takes log entries, votes and snapshots from whoever speaks to it, so
// without mutual TLS only this machine may reach it.
var ErrPlaintextRaft = errors.New("raft without TLS takes any peer that reaches its port")

// plaintextFix is what a refused plaintext configuration may do instead.
const plaintextFix = "give the peers mutual TLS (--tls-cert, --tls-key, --tls-peer-ca), or keep raft on loopback, " +
	"or pass --" + InsecurePlaintextFlag + " where the network encrypts and authenticates by itself"

// InsecurePlaintextFlag is the command's flag that lets raft run without
// TLS off loopback (NodeConfig.InsecurePlaintext): long, so that nobody
// sets it by accident.
const InsecurePlaintextFlag = "raft-insecure-plaintext-trusted-network"

// CheckPlaintext refuses, before anything is opened, a raft node without
// TLS whose listener, advertised address or peers are not on loopback: a
// host other than a loopback IP or "localhost", or no host at all (":7201"
// listens on every interface). Each error wraps ErrPlaintextRaft and says
// what to do instead.
func CheckPlaintext(listen, advertise string, peers []Peer) error {
	addrs := [][2]string{{"the raft listener", listen}}
	if advertise != "" {
		addrs = append(addrs, [2]string{"the advertised raft address", advertise})
	}
	for _, p := range peers {
		addrs = append(addrs, [2]string{"peer " + p.ID + "'s raft address", p.RaftAddr})
	}
	for _, a := range addrs {
		if _, remote := security.RemoteTarget(a[1]); remote {
			return fmt.Errorf("%w: %s %s is not on loopback; %s", ErrPlaintextRaft, a[0], a[1], plaintextFix)
		}
	}
	return nil
}

// listen opens the raft listener on addr; advertise is the address peers
// dial (the listener's own when empty). Without cfg (plaintext) and
// without anyHost, a listener bound to an address other machines can
// reach is refused (ErrPlaintextRaft), whatever name it was given.
func listen(addr, advertise string, cfg *tls.Config, anyHost bool) (*streamLayer, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("raft listener: %w", err)
	}
	if cfg == nil && !anyHost && !security.LocalAddr(l.Addr()) {
		l.Close()
		return nil, fmt.Errorf("%w: the raft listener %s (bound to %s) is not on loopback; %s", ErrPlaintextRaft, addr, l.Addr(), plaintextFix)
	}
	s := &streamLayer{Listener: l, advertise: l.Addr(), tls: cfg, anyHost: anyHost}
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

// Dial implements raft.StreamLayer. Without TLS and without the opt-out,
// a connection that reached another host than this one (a name that
// resolved elsewhere) is closed before anything is sent on it.
func (s *streamLayer) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	d := &net.Dialer{Timeout: timeout}
	if s.tls != nil {
		return tls.DialWithDialer(d, "tcp", string(address), s.tls)
	}
	c, err := d.Dial("tcp", string(address))
	if err != nil || s.anyHost || security.LocalAddr(c.RemoteAddr()) {
		return c, err
	}
	c.Close()
	return nil, fmt.Errorf("%w: peer %s is at %s, not on loopback; %s", ErrPlaintextRaft, address, c.RemoteAddr(), plaintextFix)
}

// protection says how the layer protects raft's traffic, for the
// start-up line.
func (s *streamLayer) protection() string {
	switch {
	case s.tls != nil:
		return "mutual TLS"
	case s.anyHost:
		return "plaintext by opt-out (--" + InsecurePlaintextFlag + ")"
	}
	return "plaintext on loopback only"
}

var _ raft.StreamLayer = (*streamLayer)(nil)
