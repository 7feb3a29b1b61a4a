package connlimit

import (
	"cmp"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultMaxConnections is how many connections one gRPC listener serves
// at once by default: far more than the renderers and client processes of
// a deployment (each holds one connection, with many calls on it), and
// few enough that connections alone cannot exhaust the process's memory
// or file descriptors.
const DefaultMaxConnections = 1024

// DefaultAddressShare divides a listener's connection cap into the share
// one source address may hold by default: an eighth (128 of the gRPC
// listener's 1,024), so that one peer, however many connections it opens,
// leaves seven eighths to everyone else.
const DefaultAddressShare = 8

// DefaultAuthTimeout is how long a gRPC connection may stay open without
// an authenticated call by default. Clients call as soon as they connect
// (the Go client and the renderer send their token on their first call,
// health checks included), so a connection that has not within it is
// one that holds a slot and does nothing.
const DefaultAuthTimeout = 5 * time.Second

// The causes of a refused or closed connection, the cause label of
// leasehold_connections_refused_total.
const (
	// CauseTotal: the listener had as many connections open as it serves.
	CauseTotal = "total"
	// CausePerAddress: the connection's source address held its share.
	CausePerAddress = "per_address"
	// CauseUnauthenticated: the connection made no authenticated call
	// within Limits.AuthTimeout and was closed.
	CauseUnauthenticated = "unauthenticated"
)

// Limits bound the connections of one listener.
type Limits struct {
	// Max bounds the connections open at once; 0 means
	// DefaultMaxConnections.
	Max int
	// PerAddress bounds the connections of one source address (an IPv4
	// address, or an IPv6 /64, which one host commonly holds whole); 0
	// means Max / DefaultAddressShare, at least 1. Peers without an IP
	// address (a Unix socket, an in-process connection) are on this
	// machine and not counted per address.
	PerAddress int
	// AuthTimeout, when positive, closes a connection for which
	// Conns.Authenticated has not been called within it. Zero closes none.
	AuthTimeout time.Duration
	// Refused, when not nil, is told of every connection refused or
	// closed, with its cause and remote address. It runs on the accepting
	// goroutine or on a timer's, and must not block.
	Refused func(cause string, remote net.Addr)
}

// Conns tracks the connections of the listeners it wraps and enforces
// Limits on them: a connection past Max, or past its source address's
// PerAddress, is accepted from the kernel and closed at once, so that the
// client learns of the refusal at once and retries with its own backoff,
// rather than waiting in the accept queue with no word; and a connection
// that makes no authenticated call within AuthTimeout is closed. It is
// safe for concurrent use.
type Conns struct {
	limits Limits

	mu     sync.Mutex
	open   int
	byAddr map[string]int
	// byPeer finds a connection by its two ends, for Authenticated.
	byPeer map[peerKey]*trackedConn
}

// peerKey names a connection by its local and remote addresses.
type peerKey struct{ local, remote string }

// New returns a tracker with the given limits, its zero fields set
// to their defaults.
func New(l Limits) *Conns {
	l.Max = cmp.Or(l.Max, DefaultMaxConnections)
	l.PerAddress = cmp.Or(l.PerAddress, max(l.Max/DefaultAddressShare, 1))
	return &Conns{limits: l, byAddr: make(map[string]int), byPeer: make(map[peerKey]*trackedConn)}
}

// Limits returns the limits in force, defaults filled in.
func (c *Conns) Limits() Limits { return c.limits }

// Open returns the number of connections open now.
func (c *Conns) Open() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.open
}

// Listen returns lis with c's limits on the connections it accepts.
// Closing it closes lis; the connections it handed out stay open.
func (c *Conns) Listen(lis net.Listener) net.Listener {
	return &limitListener{Listener: lis, conns: c}
}

// Authenticated records that the connection between local and remote (a
// call's peer) made an authenticated call: AuthTimeout no longer applies
// to it. A connection c does not track is ignored.
func (c *Conns) Authenticated(local, remote net.Addr) {
	if local == nil || remote == nil {
		return
	}
	c.mu.Lock()
	tc := c.byPeer[peerKey{local.String(), remote.String()}]
	c.mu.Unlock()
	if tc != nil && tc.state.CompareAndSwap(authPending, authDone) {
		tc.timer.Stop()
	}
}

// addressKey returns the per-address key of a remote address, or "" for
// one without an IP address.
func addressKey(a net.Addr) string {
	ta, ok := a.(*net.TCPAddr)
	if !ok {
		return ""
	}
	if v4 := ta.IP.To4(); v4 != nil {
		return v4.String()
	}
	return (&net.IPNet{IP: ta.IP.Mask(net.CIDRMask(64, 128)), Mask: net.CIDRMask(64, 128)}).String()
}

// admit registers nc, or returns why it is refused.
func (c *Conns) admit(nc net.Conn) (*trackedConn, string) {
	key := addressKey(nc.RemoteAddr())
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.open >= c.limits.Max:
		return nil, CauseTotal
	case key != "" && c.byAddr[key] >= c.limits.PerAddress:
		return nil, CausePerAddress
	}
	tc := &trackedConn{Conn: nc, conns: c, addr: key, peer: peerKey{nc.LocalAddr().String(), nc.RemoteAddr().String()}}
	c.open++
	if key != "" {
		c.byAddr[key]++
	}
	c.byPeer[tc.peer] = tc
	if c.limits.AuthTimeout > 0 {
		tc.timer = time.AfterFunc(c.limits.AuthTimeout, tc.expire)
	} else {
		tc.state.Store(authDone)
	}
	return tc, ""
}

// release forgets a closed connection.
func (c *Conns) release(tc *trackedConn) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.open--
	if tc.addr != "" {
		if c.byAddr[tc.addr]--; c.byAddr[tc.addr] <= 0 {
			delete(c.byAddr, tc.addr)
		}
	}
	if c.byPeer[tc.peer] == tc {
		delete(c.byPeer, tc.peer)
	}
}

// refused tells Limits.Refused of a refusal.
func (c *Conns) refused(cause string, remote net.Addr) {
	if c.limits.Refused != nil {
		c.limits.Refused(cause, remote)
	}
}

// limitListener is a listener whose connections Conns limits.
type limitListener struct {
	net.Listener
	conns *Conns
}

// Accept implements net.Listener: it returns the next connection within
// the limits, closing the refused ones on the way.
func (l *limitListener) Accept() (net.Conn, error) {
	for {
		nc, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		tc, cause := l.conns.admit(nc)
		if tc != nil {
			return tc, nil
		}
		nc.Close()
		l.conns.refused(cause, nc.RemoteAddr())
	}
}

// The states of a connection's authentication.
const (
	authPending int32 = iota
	authDone
	authExpired
)

// trackedConn is a connection Conns counts; closing it gives its slot
// back once.
type trackedConn struct {
	net.Conn
	conns *Conns
	addr  string
	peer  peerKey
	// state moves from authPending to authDone (Authenticated, or no
	// AuthTimeout) or authExpired (the timer), once.
	state atomic.Int32
	timer *time.Timer
	once  sync.Once
}

// expire closes the connection if it has not authenticated by now.
func (tc *trackedConn) expire() {
	if tc.state.CompareAndSwap(authPending, authExpired) {
		tc.conns.refused(CauseUnauthenticated, tc.RemoteAddr())
		tc.Close()
	}
}

// Close implements net.Conn.
func (tc *trackedConn) Close() error {
	err := tc.Conn.Close()
	tc.once.Do(func() {
		if tc.timer != nil {
			tc.timer.Stop()
		}
		tc.conns.release(tc)
	})
	return err
}
