package console

import (
	"context"
	"net"
	"sync"
	"testing"

	"github.com/leasehold/leasehold/coordinator/internal/auth"
	"github.com/leasehold/leasehold/coordinator/internal/edge"
	"github.com/leasehold/leasehold/coordinator/internal/server"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"
)

// serveInProcess serves svc on a gRPC server of its own over an in-memory
// connection, with the coordinator's codec and the interceptors that
// decide what a call may do (authentication and the malformed-request
// check), and returns a client connection to it and the function that
// stops both. The coordinator's own wiring, with its whole chain, is
// tested in package coordinator.
func serveInProcess(t *testing.T, svc *server.Services, principals *auth.Set) (*grpc.ClientConn, func()) {
	t.Helper()
	gs := grpc.NewServer(grpc.ForceServerCodecV2(edge.ServerCodec()),
		grpc.ChainUnaryInterceptor(principals.UnaryServerInterceptor(), edge.MalformedUnaryInterceptor()),
		grpc.ChainStreamInterceptor(principals.StreamServerInterceptor(), edge.MalformedStreamInterceptor()))
	svc.Register(gs)
	lis := bufconn.Listen(1 << 20)
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = gs.Serve(lis)
	}()
	conn, err := grpc.NewClient("passthrough:///console-test",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	return conn, func() {
		once.Do(func() {
			conn.Close()
			gs.Stop()
			<-served
		})
	}
}
