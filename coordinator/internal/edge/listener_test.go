package edge

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// TestLimitListener serves gRPC health over TCP behind a listener limited
// to two connections: a third client is not served while two are open,
// and is served as soon as one closes.
func TestLimitListener(t *testing.T) {
	t.Parallel()
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	full := make(chan struct{}, 8)
	lis := LimitListener(tcp, 2, func() { full <- struct{}{} })
	s := grpc.NewServer()
	healthpb.RegisterHealthServer(s, health.NewServer())
	served := make(chan error, 1)
	go func() { served <- s.Serve(lis) }()
	t.Cleanup(func() {
		s.Stop()
		<-served
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	dial := func() *grpc.ClientConn {
		t.Helper()
		conn, err := grpc.NewClient(tcp.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return conn
	}
	check := func(conn *grpc.ClientConn) <-chan error {
		done := make(chan error, 1)
		go func() {
			_, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
			done <- err
		}()
		return done
	}

	a, b := dial(), dial()
	for _, conn := range []*grpc.ClientConn{a, b} {
		if err := <-check(conn); err != nil {
			t.Fatalf("Check within the limit: %v", err)
		}
	}
	// Two are open: the server waits for a slot before it accepts again.
	<-full
	third := check(dial())
	select {
	case err := <-third:
		t.Fatalf("a third connection was served while two were open (Check = %v)", err)
	default:
	}
	a.Close()
	if err := <-third; err != nil {
		t.Errorf("Check once a connection closed: %v", err)
	}
}

// TestLimitListenerClose checks that closing the listener ends an Accept
// waiting for a slot.
func TestLimitListenerClose(t *testing.T) {
	t.Parallel()
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	full := make(chan struct{}, 1)
	lis := LimitListener(tcp, 1, func() { full <- struct{}{} })
	client, err := net.Dial("tcp", tcp.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	conn, err := lis.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	accepted := make(chan error, 1)
	go func() {
		_, err := lis.Accept()
		accepted <- err
	}()
	<-full
	lis.Close()
	if err := <-accepted; err == nil {
		t.Errorf("Accept after Close succeeded")
	}
}
