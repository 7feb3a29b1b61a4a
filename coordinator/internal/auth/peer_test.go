package auth

import (
	"context"
	"net"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/leasehold/leasehold/client/reason"
)

// pipeAddr is the address of a connection of no IP network, as an
// in-memory listener gives.
type pipeAddr struct{}

func (pipeAddr) Network() string { return "pipe" }
func (pipeAddr) String() string  { return "pipe" }

// fromLoopback returns a context whose call came from a loopback peer, as
// gRPC gives its interceptors.
func fromLoopback() context.Context {
	return peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 50000}})
}

func TestLocalPeer(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		addr net.Addr
		want bool
	}{
		{&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1}, true},
		{&net.TCPAddr{IP: net.IPv4(127, 9, 8, 7), Port: 1}, true},
		{&net.TCPAddr{IP: net.IPv6loopback, Port: 1}, true},
		{&net.TCPAddr{IP: net.IPv4(10, 1, 2, 3), Port: 1}, false},
		{&net.TCPAddr{IP: net.ParseIP("::ffff:10.1.2.3"), Port: 1}, false},
		{&net.TCPAddr{IP: net.IPv4zero, Port: 1}, false},
		{&net.UDPAddr{IP: net.IPv4(192, 168, 1, 1), Port: 1}, false},
		{&net.UnixAddr{Name: "/run/leasehold.sock", Net: "unix"}, true},
		{pipeAddr{}, true},
		{nil, false},
	} {
		if got := LocalPeer(tc.addr); got != tc.want {
			t.Errorf("LocalPeer(%v) = %v, want %v", tc.addr, got, tc.want)
		}
	}
	for addr, want := range map[string]bool{
		"127.0.0.1:5000": true, "[::1]:5000": true, "10.1.2.3:5000": false, "[::ffff:10.1.2.3]:5000": false,
		"localhost:5000": false, "": false, "@": false,
	} {
		if got := LocalHostPort(addr); got != want {
			t.Errorf("LocalHostPort(%q) = %v, want %v", addr, got, want)
		}
	}
}

// TestDevelopmentTokensFromThisMachineOnly calls the interceptor as gRPC
// does, with the connection's peer in the context: a development token is
// refused from another machine's address, and from a context without a
// peer; a token of a principals file is not.
func TestDevelopmentTokensFromThisMachineOnly(t *testing.T) {
	t.Parallel()
	set := NewSet(map[string]Principal{
		"dev-alpha":                   {Name: "dev-alpha", Team: "alpha", Roles: []Role{RoleSubmitter}, LoopbackOnly: true},
		"a-token-of-the-file-1234567": {Name: "alpha-svc", Team: "alpha", Roles: []Role{RoleSubmitter}},
	})
	icpt := set.UnaryServerInterceptor()
	call := func(addr net.Addr, token string) error {
		ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("authorization", "Bearer "+token))
		if addr != nil {
			ctx = peer.NewContext(ctx, &peer.Peer{Addr: addr})
		}
		_, err := icpt(ctx, nil, &grpc.UnaryServerInfo{FullMethod: "/leasehold.v1.JobService/GetJob"},
			func(context.Context, any) (any, error) { return nil, nil })
		return err
	}
	remote := &net.TCPAddr{IP: net.IPv4(10, 1, 2, 3), Port: 40000}
	for _, tc := range []struct {
		name  string
		addr  net.Addr
		token string
		ok    bool
	}{
		{"A development token from loopback is accepted", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 40000}, "dev-alpha", true},
		{"A development token over an in-process connection is accepted", pipeAddr{}, "dev-alpha", true},
		{"A development token from another machine is refused", remote, "dev-alpha", false},
		{"A development token without a peer is refused", nil, "dev-alpha", false},
		{"A principals file's token from another machine is accepted", remote, "a-token-of-the-file-1234567", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := call(tc.addr, tc.token)
			if tc.ok {
				if err != nil {
					t.Errorf("call = %v, want it accepted", err)
				}
				return
			}
			st := status.Convert(err)
			var got string
			for _, d := range st.Details() {
				if info, ok := d.(*errdetails.ErrorInfo); ok {
					got = info.GetReason()
				}
			}
			if st.Code() != codes.Unauthenticated || got != string(reason.Unauthenticated) {
				t.Errorf("call = %v (reason %q), want UNAUTHENTICATED %s", err, got, reason.Unauthenticated)
			}
		})
	}
	for _, p := range []string{DevAlphaToken, DevBetaToken, DevRendererToken, DevOperatorToken, DevOperatorAlphaToken} {
		if got, ok := DevPrincipals().Lookup(p); !ok || !got.LoopbackOnly {
			t.Errorf("development principal %s: LoopbackOnly = %v, want true", p, got.LoopbackOnly)
		}
	}
}
