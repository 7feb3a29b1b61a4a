package coordinator

import (
	"context"
	"fmt"
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"
)

// inProcessBufferBytes is the buffer of each direction of the in-process
// connection.
const inProcessBufferBytes = 1 << 20

// inProcess is the console's way into the coordinator: an in-memory
// listener that the coordinator's own *grpc.Server serves beside the
// network listener, and one client connection to it. A console call is
// therefore a gRPC call like any other: encoded and decoded by the same
// codec, counted and logged by the same interceptors (metrics, refusals,
// the "finished call" line), authenticated by the same interceptor from
// the bearer token it carries, bounded by the same stream caps and
// checked by the same malformed-request check. Only the transport
// differs: the bytes never leave the process, so the connection has no
// TLS (see serverCreds), and its peer address is of no IP network, which
// auth.LocalPeer counts as this machine; the console checks its browsers'
// addresses itself.
type inProcess struct {
	lis  *bufconn.Listener
	conn *grpc.ClientConn
}

// newInProcess returns the in-memory listener and a client connection to
// it that receives messages up to maxRecv bytes; nothing is served until
// serve.
func newInProcess(maxRecv int) (*inProcess, error) {
	lis := bufconn.Listen(inProcessBufferBytes)
	conn, err := grpc.NewClient("passthrough:///leasehold-in-process",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxRecv)))
	if err != nil {
		lis.Close()
		return nil, fmt.Errorf("connecting the console to the gRPC server: %w", err)
	}
	return &inProcess{lis: lis, conn: conn}, nil
}

// serve serves s on the in-memory listener until s stops.
func (p *inProcess) serve(s *grpc.Server) {
	_ = s.Serve(inProcessListener{p.lis})
}

// close closes the client connection and the listener.
func (p *inProcess) close() {
	p.conn.Close()
	p.lis.Close()
}

// inProcessListener is the in-memory listener, whose connections are
// marked as its own (inProcessConn).
type inProcessListener struct {
	*bufconn.Listener
}

// Accept implements net.Listener.
func (l inProcessListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return inProcessConn{c}, nil
}

// inProcessConn is a connection the in-memory listener accepted. Only code
// in this process can dial that listener, so no peer on the network can
// produce one.
type inProcessConn struct {
	net.Conn
}

// serverCreds are the gRPC server's transport credentials when it serves
// TLS: TLS for every connection but the in-process one, which needs no
// encryption and has no certificate to show under mutual TLS. The bearer
// token still authenticates every call on it.
type serverCreds struct {
	credentials.TransportCredentials
}

// ServerHandshake implements credentials.TransportCredentials.
func (c serverCreds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	if _, ok := raw.(inProcessConn); ok {
		return insecure.NewCredentials().ServerHandshake(raw)
	}
	return c.TransportCredentials.ServerHandshake(raw)
}

// Clone implements credentials.TransportCredentials.
func (c serverCreds) Clone() credentials.TransportCredentials {
	return serverCreds{c.TransportCredentials.Clone()}
}
