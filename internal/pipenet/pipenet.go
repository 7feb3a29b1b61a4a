// Package pipenet is an in-memory network for tests: a listener whose
// connections are net.Pipe pairs. A server and its clients connected
// through it run inside a synctest bubble, on the bubble's fake clock, as
// they would over TCP: net.Pipe waits on channels and its own timers,
// which the bubble controls.
package pipenet

import (
	"context"
	"net"
	"sync"
)

// Listener is an in-memory listener. It is safe for concurrent use.
type Listener struct {
	addr  net.Addr
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

// Listen returns a listener whose address, and the local address of the
// connections it accepts, is addr (a net.Pipe address when nil).
func Listen(addr net.Addr) *Listener {
	return &Listener{addr: addr, conns: make(chan net.Conn), done: make(chan struct{})}
}

// Accept implements net.Listener.
func (l *Listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// Close implements net.Listener; connections already made stay open.
func (l *Listener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

// Addr implements net.Listener.
func (l *Listener) Addr() net.Addr {
	if l.addr == nil {
		return pipeAddr{}
	}
	return l.addr
}

// Dial connects a client whose address the server sees as remote (a
// net.Pipe address when nil), waits until the listener accepts it, and
// returns the client's end. It fails once the listener is closed or ctx
// ends.
func (l *Listener) Dial(ctx context.Context, remote net.Addr) (net.Conn, error) {
	client, server := net.Pipe()
	sc := &conn{Conn: server, local: l.Addr(), remote: remote}
	if remote == nil {
		sc.remote = pipeAddr{}
	}
	select {
	case l.conns <- sc:
		return client, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// conn is the server's end of a connection, with the addresses it was
// made with.
type conn struct {
	net.Conn
	local, remote net.Addr
}

func (c *conn) LocalAddr() net.Addr  { return c.local }
func (c *conn) RemoteAddr() net.Addr { return c.remote }

// pipeAddr is the address of a pipe's end: of no IP network, so on this
// machine.
type pipeAddr struct{}

func (pipeAddr) Network() string { return "pipe" }
func (pipeAddr) String() string  { return "pipe" }
