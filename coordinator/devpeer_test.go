package coordinator

import (
	"context"
	"log/slog"
	"net"
	"testing"

	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// nonLoopbackIP returns an IPv4 address of this machine that is not
// loopback, or skips the test.
func nonLoopbackIP(t *testing.T) net.IP {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Skipf("no interface addresses: %v", err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && !n.IP.IsLoopback() && n.IP.To4() != nil && !n.IP.IsLinkLocalUnicast() {
			return n.IP
		}
	}
	t.Skip("this machine has no non-loopback IPv4 address to call from")
	return nil
}

// loopbackLooking is a listener that says it listens on loopback whatever
// it is bound to, as a listener handed over by a supervisor or a
// port-forward might look to the coordinator.
type loopbackLooking struct {
	net.Listener
}

func (l loopbackLooking) Addr() net.Addr {
	return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: l.Listener.Addr().(*net.TCPAddr).Port}
}

// TestDevelopmentTokenFromAnotherMachineIsRefused serves the development
// tokens on a listener that looks like loopback but takes connections on
// one of this machine's network addresses: a call whose peer is that
// address is refused UNAUTHENTICATED, however the listener looks, while
// the same token over loopback is authenticated.
func TestDevelopmentTokenFromAnotherMachineIsRefused(t *testing.T) {
	t.Parallel()
	ip := nonLoopbackIP(t)
	c, err := New(Config{DataDir: t.TempDir(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	network, err := net.Listen("tcp", net.JoinHostPort(ip.String(), "0"))
	if err != nil {
		c.Close()
		t.Skipf("cannot listen on %s: %v", ip, err)
	}
	loopback, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		c.Close()
		t.Fatal(err)
	}
	served := make(chan error, 2)
	go func() { served <- c.Serve(loopbackLooking{network}) }()
	go func() { served <- c.Serve(loopback) }()
	t.Cleanup(func() {
		c.Close()
		for range 2 {
			if err := <-served; err != nil {
				t.Errorf("Serve: %v", err)
			}
		}
	})
	getJob := func(addr string) error {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		_, err = leaseholdv1.NewJobServiceClient(conn).GetJob(bearer(context.Background(), "dev-alpha"), &leaseholdv1.GetJobRequest{JobId: "j-1"})
		return err
	}
	err = getJob(network.Addr().String())
	if info, _ := errorInfo(err); status.Code(err) != codes.Unauthenticated || info.GetReason() != "UNAUTHENTICATED" {
		t.Errorf("dev-alpha from %s = %v, want UNAUTHENTICATED", ip, err)
	}
	if err := getJob(loopback.Addr().String()); status.Code(err) != codes.NotFound {
		t.Errorf("dev-alpha from loopback = %v, want NOT_FOUND (authenticated, no such job)", err)
	}
}
