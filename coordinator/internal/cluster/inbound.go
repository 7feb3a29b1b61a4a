package cluster

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/raft"
)

// Limits of the raft listener. A member holds a few connections to each
// other (raft pools three per peer, beside its pipeline and heartbeats),
// so a cluster of five needs a few dozen; the limits leave members far
// more than that, and bound what anyone who reaches the port can hold.
const (
	// raftProofTimeout bounds how long a connection may take to prove
	// itself: its TLS handshake, or its first byte in plaintext. Until
	// then it costs a goroutine and a descriptor, no raft buffer.
	raftProofTimeout = 5 * time.Second
	// raftMaxPending bounds the connections proving themselves at once,
	// and raftMaxPendingPerAddress those of one source address (an IPv4
	// address or an IPv6 /64), so that one address cannot keep members
	// out: a member's connection proves itself within milliseconds.
	raftMaxPending           = 64
	raftMaxPendingPerAddress = 8
	// raftMaxConns bounds the connections that proved themselves, each
	// with raft's buffers (about 260 KiB).
	raftMaxConns = 256
)

// Causes of a refused raft connection or RPC, the cause label of
// leasehold_raft_connections_refused_total.
const (
	causeTotal       = "total"
	causePerAddress  = "per_address"
	causeHandshake   = "handshake"
	causeNotAMember  = "not_a_member"
	causeEstablished = "established"
)

// refusalLogEvery is how often the raft listener logs its refusals of
// one cause at most: the first of a minute is logged with its source,
// and says how many went unlogged since the last line; the counter
// counts each.
const refusalLogEvery = time.Minute

// refuse counts and logs a refusal of cause of a connection from remote
// (err, when not nil, says what it did wrong), the log line at most once
// a minute per cause.
func (t *peerTransport) refuse(cause string, remote net.Addr, err error) {
	t.refuseFrom("connection", cause, "remote", remote.String(), err)
}

// refuseFrom counts a refusal of cause of a raft connection or RPC (what)
// and logs it with its source (the remote address, or the peer's
// identity) under key, at most once a minute per kind and cause.
func (t *peerTransport) refuseFrom(what, cause, key, source string, err error) {
	t.metrics.refusedConn(cause)
	ok, held := t.refusals.Allow(what + "/" + cause)
	if !ok {
		return
	}
	attrs := []any{"cause", cause, key, source, "unlogged", held}
	if err != nil {
		attrs = append(attrs, "err", err)
	}
	t.log.Warn("refused a raft "+what+" (logged once a minute per cause; leasehold_raft_connections_refused_total counts each)", attrs...)
}

// admission counts the raft listener's connections: those proving
// themselves, in all and per source address, and those that did. Its
// owner's mutex guards it.
type admission struct {
	pending, open int
	byAddr        map[string]int
}

func newAdmission() admission { return admission{byAddr: map[string]int{}} }

// sourceKey is the per-address key of a remote address: an IPv4 address,
// or the /64 of an IPv6 one, which one host commonly holds whole.
func sourceKey(a net.Addr) string {
	ta, ok := a.(*net.TCPAddr)
	if !ok {
		return a.String()
	}
	if v4 := ta.IP.To4(); v4 != nil {
		return v4.String()
	}
	return ta.IP.Mask(net.CIDRMask(64, 128)).String() + "/64"
}

// identity is who a proven connection is: the member ids its certificate
// names over TLS, none in plaintext (any member may then speak on it).
type identity struct {
	tls bool
	ids []string
}

// String names the identity, as the key of its transport.
func (id identity) String() string {
	if !id.tls {
		return "plaintext"
	}
	return strings.Join(id.ids, ",")
}

// inboundPeer is the NetworkTransport that reads the connections of one
// identity.
type inboundPeer struct {
	id     identity
	stream *stream
	trans  *raft.NetworkTransport
}

// accept takes connections until Close: each within the limits proves
// itself on a goroutine of its own, the others are closed at once.
func (t *peerTransport) accept() {
	defer t.wg.Done()
	var delay time.Duration
	for {
		c, err := t.lis.Accept()
		if err != nil {
			select {
			case <-t.done:
				return
			default:
			}
			// Out of descriptors, say: try again a little later.
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			t.log.Warn("accepting a raft connection", "err", err)
			select {
			case <-time.After(delay):
				continue
			case <-t.done:
				return
			}
		}
		delay = 0
		key := sourceKey(c.RemoteAddr())
		if cause := t.admit(key, c); cause != "" {
			t.refuse(cause, c.RemoteAddr(), nil)
			c.Close()
			continue
		}
		t.wg.Add(1)
		go t.prove(c, key)
	}
}

// admit counts c, a connection of source key, as proving itself, or says
// why it is refused.
func (t *peerTransport) admit(key string, c net.Conn) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case t.adm.pending >= raftMaxPending:
		return causeTotal
	case t.adm.byAddr[key] >= raftMaxPendingPerAddress:
		return causePerAddress
	}
	t.adm.pending++
	t.adm.byAddr[key]++
	t.proving[c] = struct{}{}
	return ""
}

// proven moves c, a connection of source key, from proving itself to
// open as pc, when there is room; it reports whether there was.
func (t *peerTransport) proven(key string, c net.Conn, pc *peerConn) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.unpendLocked(key, c)
	if t.adm.open >= raftMaxConns {
		return false
	}
	t.adm.open++
	t.open[pc] = struct{}{}
	return true
}

// unpend forgets c, a connection of source key that failed to prove
// itself.
func (t *peerTransport) unpend(key string, c net.Conn) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.unpendLocked(key, c)
}

func (t *peerTransport) unpendLocked(key string, c net.Conn) {
	delete(t.proving, c)
	t.adm.pending--
	if t.adm.byAddr[key]--; t.adm.byAddr[key] <= 0 {
		delete(t.adm.byAddr, key)
	}
}

// prove waits for c to prove itself, within raftProofTimeout, and hands
// it to the transport of its identity; a connection that does not is
// closed.
func (t *peerTransport) prove(c net.Conn, key string) {
	defer t.wg.Done()
	_ = c.SetDeadline(time.Now().Add(t.proofTimeout))
	conn, id, err := t.handshake(c)
	if err != nil {
		cause := causeHandshake
		if errors.Is(err, errNotAMember) {
			cause = causeNotAMember
		}
		t.refuse(cause, c.RemoteAddr(), err)
		c.Close()
		t.unpend(key, c)
		return
	}
	_ = c.SetDeadline(time.Time{})
	pc := &peerConn{Conn: conn, t: t}
	if !t.proven(key, c, pc) {
		t.refuse(causeEstablished, c.RemoteAddr(), nil)
		conn.Close()
		return
	}
	in, err := t.inboundFor(id)
	if err != nil {
		pc.Close()
		return
	}
	select {
	case in.stream.conns <- pc:
	case <-t.done:
		pc.Close()
	}
}

// handshake is c's proof: a TLS handshake whose client certificate chains
// to the peer CA and names a member (verifyAccepted), or in plaintext its
// first byte, read here so that an idle connection costs raft nothing.
func (t *peerTransport) handshake(c net.Conn) (net.Conn, identity, error) {
	if t.tls == nil {
		first := make([]byte, 1)
		if _, err := c.Read(first); err != nil {
			return nil, identity{}, err
		}
		return &prefixConn{Conn: c, prefix: first}, identity{}, nil
	}
	cfg := t.tls.Clone()
	cfg.VerifyConnection = verifyAccepted(t.memberList)
	tc := tls.Server(c, cfg)
	if err := tc.Handshake(); err != nil {
		if errors.Is(err, errNotAMember) {
			return nil, identity{}, err
		}
		return nil, identity{}, fmt.Errorf("TLS handshake: %w", err)
	}
	ids := memberIDs(certNodeIDs(tc.ConnectionState().PeerCertificates[0]), t.memberList())
	slices.Sort(ids)
	return tc, identity{tls: true, ids: ids}, nil
}

// inboundFor returns the transport of id, made on first use.
func (t *peerTransport) inboundFor(id identity) (*inboundPeer, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	select {
	case <-t.done:
		return nil, net.ErrClosed
	default:
	}
	if in := t.inbound[id.String()]; in != nil {
		return in, nil
	}
	in := &inboundPeer{id: id, stream: newStream(t.advertise, nil)}
	in.trans = raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
		Stream: in.stream, MaxPool: 1, Timeout: 10 * time.Second, Logger: t.logger,
	})
	in.trans.SetHeartbeatHandler(t.checkedHeartbeat(id, t.heartbeat))
	t.inbound[id.String()] = in
	t.wg.Add(1)
	go t.forward(in)
	return in, nil
}

// forward passes the RPCs of in's transport that checkRPC passes on to
// raft, and answers the others with the refusal.
func (t *peerTransport) forward(in *inboundPeer) {
	defer t.wg.Done()
	for {
		select {
		case rpc := <-in.trans.Consumer():
			if err := t.checkRPC(in.id, rpc.Command); err != nil {
				t.refusedRPC(in.id, err)
				rpc.Respond(nil, err)
				continue
			}
			select {
			case t.consumeCh <- rpc:
			case <-t.done:
				return
			}
		case <-t.done:
			return
		}
	}
}

// stream is the raft.StreamLayer of one of peerTransport's
// NetworkTransports: an identity's, which accepts the connections prove
// hands it and dials nothing, or the one that sends, which dials and
// accepts nothing (its conns stay empty).
type stream struct {
	conns     chan net.Conn
	closed    chan struct{}
	closeOnce sync.Once
	addr      net.Addr
	dial      func(raft.ServerAddress, time.Duration) (net.Conn, error)
}

// newStream returns a stream at addr dialling with dial (nil: none).
func newStream(addr net.Addr, dial func(raft.ServerAddress, time.Duration) (net.Conn, error)) *stream {
	return &stream{conns: make(chan net.Conn), closed: make(chan struct{}), addr: addr, dial: dial}
}

// Accept implements net.Listener.
func (s *stream) Accept() (net.Conn, error) {
	select {
	case c := <-s.conns:
		return c, nil
	case <-s.closed:
		return nil, net.ErrClosed
	}
}

// Close implements net.Listener.
func (s *stream) Close() error {
	s.closeOnce.Do(func() { close(s.closed) })
	return nil
}

// Addr implements net.Listener.
func (s *stream) Addr() net.Addr { return s.addr }

// Dial implements raft.StreamLayer.
func (s *stream) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	if s.dial == nil {
		return nil, errors.New("an inbound raft transport does not dial")
	}
	return s.dial(address, timeout)
}

// peerConn is a proven connection; closing it gives its slot back once.
type peerConn struct {
	net.Conn
	t    *peerTransport
	once sync.Once
}

// Close implements net.Conn.
func (c *peerConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.t.mu.Lock()
		defer c.t.mu.Unlock()
		c.t.adm.open--
		delete(c.t.open, c)
	})
	return err
}

// prefixConn is a connection whose first bytes were read already.
type prefixConn struct {
	net.Conn
	prefix []byte
}

// Read implements net.Conn: the bytes read already, then the rest.
func (c *prefixConn) Read(p []byte) (int, error) {
	if len(c.prefix) > 0 {
		n := copy(p, c.prefix)
		c.prefix = c.prefix[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}

var (
	_ raft.StreamLayer = (*stream)(nil)
	_ net.Conn         = (*peerConn)(nil)
)
