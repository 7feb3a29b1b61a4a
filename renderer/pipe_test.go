package renderer_test

import (
	"context"
	"net"
	"sync"

	"google.golang.org/grpc"
)

// pipeListener is an in-memory listener of net.Pipe connections. A gRPC
// server and its clients connected through it run inside a synctest
// bubble, on the bubble's fake clock, as they would over TCP: net.Pipe
// waits on channels and its own timers, which the bubble controls.
type pipeListener struct {
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func newPipeListener() *pipeListener {
	return &pipeListener{conns: make(chan net.Conn), done: make(chan struct{})}
}

// Accept implements net.Listener.
func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// Close implements net.Listener.
func (l *pipeListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

// Addr implements net.Listener.
func (l *pipeListener) Addr() net.Addr { return pipeAddr{} }

// dialOption connects a gRPC client to the listener, whatever its target.
func (l *pipeListener) dialOption() grpc.DialOption {
	return grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
		server, client := net.Pipe()
		select {
		case l.conns <- server:
			return client, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-l.done:
			return nil, net.ErrClosed
		}
	})
}

// pipeAddr is the address of both ends of a pipe connection: of no IP
// network, so on this machine.
type pipeAddr struct{}

func (pipeAddr) Network() string { return "pipe" }
func (pipeAddr) String() string  { return "pipe" }
