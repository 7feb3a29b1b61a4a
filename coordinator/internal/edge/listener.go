package edge

import (
	"net"
	"sync"
)

// DefaultMaxConnections is how many connections one gRPC listener serves
// at once by default: far more than the renderers and client processes of
// a deployment (each holds one connection, with many calls on it), and
// few enough that connections alone cannot exhaust the process's memory
// or file descriptors.
const DefaultMaxConnections = 1024

// LimitListener returns a listener that lets at most n of lis's
// connections be open at once. When n are open, Accept waits for one of
// them to close before it takes the next from lis, so further clients
// wait in the kernel's accept queue (and time out there if it lasts)
// rather than each costing the server a connection. full, when not nil,
// is called each time Accept starts waiting, from Accept's goroutine.
// Closing the listener ends a waiting Accept.
func LimitListener(lis net.Listener, n int, full func()) net.Listener {
	return &limitListener{Listener: lis, slots: make(chan struct{}, n), full: full, done: make(chan struct{})}
}

type limitListener struct {
	net.Listener
	slots     chan struct{}
	full      func()
	done      chan struct{}
	closeOnce sync.Once
}

// Accept implements net.Listener.
func (l *limitListener) Accept() (net.Conn, error) {
	select {
	case l.slots <- struct{}{}:
	default:
		if l.full != nil {
			l.full()
		}
		select {
		case l.slots <- struct{}{}:
		case <-l.done:
			return nil, net.ErrClosed
		}
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.slots
		return nil, err
	}
	return &limitConn{Conn: c, release: func() { <-l.slots }}, nil
}

// Close implements net.Listener.
func (l *limitListener) Close() error {
	l.closeOnce.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// limitConn gives its slot back once, when closed.
type limitConn struct {
	net.Conn
	once    sync.Once
	release func()
}

// Close implements net.Conn.
func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
