package cluster

import (
	"cmp"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"github.com/leasehold/leasehold/internal/ratelog"
	"github.com/leasehold/leasehold/internal/security"
)

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

// transportConfig configures a peerTransport.
type transportConfig struct {
	// Listen is the address to listen on; Advertise what peers dial (the
	// listener's own when empty).
	Listen, Advertise string
	// TLS is mutual TLS under the peer CA (security.PeerTLS), or nil for
	// plaintext.
	TLS *tls.Config
	// AnyHost lets plaintext listen and dial off loopback (the opt-out).
	AnyHost bool
	// Members returns the cluster's members as far as this node knows
	// them; until setMembers replaces it.
	Members func() []raft.Server
	Logger  hclog.Logger
	Log     *slog.Logger
	Metrics *Metrics
	// ProofTimeout replaces raftProofTimeout (tests).
	ProofTimeout time.Duration
	// Now is the clock of the refusal log (tests; nil: time.Now).
	Now func() time.Time
}

// peerTransport is raft's transport between nodes over TCP: mutual TLS,
// or plaintext on loopback (or, by the opt-out, on a network that
// encrypts and authenticates by itself).
//
// What this node sends goes through raft's NetworkTransport, embedded,
// which dials through dial. What it receives comes through an accept
// loop of its own (inbound.go), because raft's transport gives a
// connection a 256 KiB reader as soon as it is accepted and never asks
// who is at the other end: the loop bounds the connections that have not
// proven themselves (in all and per source address) and how long they
// may take, then hands each connection that did to a NetworkTransport of
// the identity it proved (the member ids its certificate names; one for
// every plaintext peer), and passes an RPC on to raft only when its
// header claims a member at that member's address, and one the identity
// names (checkRPC).
type peerTransport struct {
	*raft.NetworkTransport
	lis       net.Listener
	advertise net.Addr
	tls       *tls.Config
	anyHost   bool
	members   atomic.Pointer[func() []raft.Server]
	logger    hclog.Logger
	log       *slog.Logger
	metrics   *Metrics
	// refusals limits the refusal log (refuse).
	refusals *ratelog.Limiter
	// proofTimeout bounds the proof of a connection (raftProofTimeout).
	proofTimeout time.Duration

	consumeCh chan raft.RPC
	done      chan struct{}
	closeOnce sync.Once
	wg        sync.WaitGroup

	// mu guards what follows: the transports of the identities seen, the
	// heartbeat handler raft set, the counts of the connections and the
	// open ones.
	mu        sync.Mutex
	inbound   map[string]*inboundPeer
	heartbeat func(raft.RPC)
	adm       admission
	// proving are the connections proving themselves, open the proven
	// ones: Close closes both.
	proving map[net.Conn]struct{}
	open    map[*peerConn]struct{}
}

// newPeerTransport listens as cfg says and starts accepting. Without TLS
// and without AnyHost, a listener bound to an address other machines can
// reach is refused (ErrPlaintextRaft), whatever name it was given.
func newPeerTransport(cfg transportConfig) (*peerTransport, error) {
	l, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("raft listener: %w", err)
	}
	if cfg.TLS == nil && !cfg.AnyHost && !security.LocalAddr(l.Addr()) {
		l.Close()
		return nil, fmt.Errorf("%w: the raft listener %s (bound to %s) is not on loopback; %s", ErrPlaintextRaft, cfg.Listen, l.Addr(), plaintextFix)
	}
	t := &peerTransport{lis: l, advertise: l.Addr(), tls: cfg.TLS, anyHost: cfg.AnyHost, logger: cfg.Logger,
		log: cmp.Or(cfg.Log, slog.New(slog.DiscardHandler)), metrics: cfg.Metrics, refusals: ratelog.New(refusalLogEvery, cfg.Now),
		consumeCh: make(chan raft.RPC), done: make(chan struct{}), inbound: map[string]*inboundPeer{},
		adm: newAdmission(), proving: map[net.Conn]struct{}{}, open: map[*peerConn]struct{}{}, proofTimeout: cmp.Or(cfg.ProofTimeout, raftProofTimeout)}
	if cfg.Advertise != "" {
		if _, err := net.ResolveTCPAddr("tcp", cfg.Advertise); err != nil {
			l.Close()
			return nil, fmt.Errorf("raft advertise address %q: %w", cfg.Advertise, err)
		}
		t.advertise = advertised(cfg.Advertise)
	}
	t.setMembers(cfg.Members)
	t.NetworkTransport = raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
		Stream: newStream(t.advertise, t.dial), MaxPool: 3, Timeout: 10 * time.Second, Logger: cfg.Logger,
	})
	t.wg.Add(1)
	go t.accept()
	return t, nil
}

// setMembers tells the transport who the cluster's members are.
func (t *peerTransport) setMembers(members func() []raft.Server) { t.members.Store(&members) }

// memberList returns the members as the transport knows them now.
func (t *peerTransport) memberList() []raft.Server { return (*t.members.Load())() }

// protection says how the transport protects raft's traffic, for the
// start-up line.
func (t *peerTransport) protection() string {
	switch {
	case t.tls != nil:
		return "mutual TLS"
	case t.anyHost:
		return "plaintext by opt-out (--" + InsecurePlaintextFlag + ")"
	}
	return "plaintext on loopback only"
}

// Consumer implements raft.Transport: the RPCs of every peer that passed
// checkRPC.
func (t *peerTransport) Consumer() <-chan raft.RPC { return t.consumeCh }

// SetHeartbeatHandler implements raft.Transport: heartbeats take raft's
// fast path on every identity's transport, after checkRPC.
func (t *peerTransport) SetHeartbeatHandler(cb func(raft.RPC)) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.heartbeat = cb
	for _, in := range t.inbound {
		in.trans.SetHeartbeatHandler(t.checkedHeartbeat(in.id, cb))
	}
}

// checkedHeartbeat is cb behind checkRPC for the identity id.
func (t *peerTransport) checkedHeartbeat(id identity, cb func(raft.RPC)) func(raft.RPC) {
	if cb == nil {
		return nil
	}
	return func(rpc raft.RPC) {
		if err := t.checkRPC(id, rpc.Command); err != nil {
			t.refusedRPC(id, err)
			rpc.Respond(nil, err)
			return
		}
		cb(rpc)
	}
}

// checkRPC passes an RPC whose header claims a member at that member's
// address (in the configured peers or raft's configuration), and, over
// TLS, one of the members the peer's certificate names.
func (t *peerTransport) checkRPC(id identity, cmd any) error {
	h, ok := cmd.(raft.WithRPCHeader)
	if !ok {
		return fmt.Errorf("%w: an RPC without a header", errNotAMember)
	}
	hdr := h.GetRPCHeader()
	claimed, addr := string(hdr.ID), string(hdr.Addr)
	if id.tls && !slices.Contains(id.ids, claimed) {
		return fmt.Errorf("%w: its certificate names %q, and it claims to be %q", errNotAMember, id.ids, claimed)
	}
	for _, m := range t.memberList() {
		if string(m.ID) == claimed && string(m.Address) == addr {
			return nil
		}
	}
	return fmt.Errorf("%w: it claims to be %q at %q, not a member at that address", errNotAMember, claimed, addr)
}

// refusedRPC counts and logs an RPC refused by checkRPC: the peer is
// the identity its connection proved (its certificate's member ids).
func (t *peerTransport) refusedRPC(id identity, err error) {
	t.refuseFrom("RPC", causeNotAMember, "peer", id.String(), err)
}

// Close implements raft.WithClose: it stops accepting, closes every
// connection and every transport.
func (t *peerTransport) Close() error {
	t.closeOnce.Do(func() {
		close(t.done)
		t.lis.Close()
		t.mu.Lock()
		for c := range t.proving {
			c.Close()
		}
		for c := range t.open {
			c.Conn.Close()
		}
		inbound := t.inbound
		t.mu.Unlock()
		for _, in := range inbound {
			in.trans.Close()
		}
		t.NetworkTransport.Close()
	})
	t.wg.Wait()
	return nil
}

// advertised is the address peers dial, as configured: raft puts it in
// the header of every RPC this node sends, where the peers compare it with
// the member's address in their configuration, so a name stays a name.
type advertised string

// Network implements net.Addr.
func (advertised) Network() string { return "tcp" }

// String implements net.Addr.
func (a advertised) String() string { return string(a) }

// dial dials a peer for raft's NetworkTransport. Over TLS, the peer must
// be the member whose address it dials (verifyDialled). Without TLS and
// without the opt-out, a connection that reached another host than this
// one (a name that resolved elsewhere) is closed before anything is sent
// on it.
func (t *peerTransport) dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	nd := &net.Dialer{Timeout: timeout}
	if cfg := t.tls; cfg != nil {
		cfg = cfg.Clone()
		cfg.InsecureSkipVerify = true // verifyDialled checks the chain, and the member instead of a host name
		cfg.VerifyConnection = verifyDialled(cfg.RootCAs, address, t.memberList())
		c, err := tls.DialWithDialer(nd, "tcp", string(address), cfg)
		if err != nil {
			return nil, err
		}
		return c, nil
	}
	c, err := nd.Dial("tcp", string(address))
	if err != nil || t.anyHost || security.LocalAddr(c.RemoteAddr()) {
		return c, err
	}
	c.Close()
	return nil, fmt.Errorf("%w: peer %s is at %s, not on loopback; %s", ErrPlaintextRaft, address, c.RemoteAddr(), plaintextFix)
}

var (
	_ raft.Transport   = (*peerTransport)(nil)
	_ raft.WithClose   = (*peerTransport)(nil)
	_ raft.WithPreVote = (*peerTransport)(nil)
)
