package leaderdial_test

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/leasehold/leasehold/internal/leaderdial"
	"github.com/leasehold/leasehold/internal/security/securitytest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestParse(t *testing.T) {
	t.Parallel()
	tests := []struct {
		addr       string
		replicated bool
		hosts      []string
		dial       string
	}{
		{"127.0.0.1:7070", false, []string{"127.0.0.1:7070"}, "127.0.0.1:7070"},
		{" coordinator:7070 ", false, []string{"coordinator:7070"}, "coordinator:7070"},
		{"passthrough:///bufnet", false, []string{"passthrough:///bufnet"}, "passthrough:///bufnet"},
		{"unix:///run/leasehold.sock", false, []string{"unix:///run/leasehold.sock"}, "unix:///run/leasehold.sock"},
		{"dns:///leasehold-coordinator:7070", true, []string{"dns:///leasehold-coordinator:7070"}, "dns:///leasehold-coordinator:7070"},
		{"a:7070,b:7070, c:7070", true, []string{"a:7070", "b:7070", "c:7070"}, "leasehold-replicas:///a:7070,b:7070,c:7070"},
		{"[::1]:7070,127.0.0.1:7071", true, []string{"[::1]:7070", "127.0.0.1:7071"}, "leasehold-replicas:///[::1]:7070,127.0.0.1:7071"},
	}
	for _, tc := range tests {
		got, err := leaderdial.Parse(tc.addr)
		if err != nil {
			t.Errorf("Parse(%q): %v", tc.addr, err)
			continue
		}
		if got.Replicated() != tc.replicated || got.DialTarget() != tc.dial {
			t.Errorf("Parse(%q) = replicated %v, target %q; want %v, %q", tc.addr, got.Replicated(), got.DialTarget(), tc.replicated, tc.dial)
		}
		if diff := cmp.Diff(tc.hosts, got.Hosts()); diff != "" {
			t.Errorf("Parse(%q).Hosts() (-want +got):\n%s", tc.addr, diff)
		}
		if n := len(got.Leader().DialOptions()); got.Replicated() != (n > 0) {
			t.Errorf("Parse(%q): replicated %v with %d dial options", tc.addr, got.Replicated(), n)
		}
	}
	for _, bad := range []string{"", " ", "a:1,", ",a:1", "a:1,,b:2", "a:1,b", "a:1,:2", "a:1,b:", "a:1,dns:///b:2", "a:1,b:2,a:1"} {
		if _, err := leaderdial.Parse(bad); !errors.Is(err, leaderdial.ErrBadAddress) {
			t.Errorf("Parse(%q) = %v, want ErrBadAddress", bad, err)
		}
	}
}

// replica is one TLS server with a health service whose certificate names
// only its own host. Besides leaderdial.HealthService it reports its own
// name SERVING, so that a health check of that name tells which replica
// answered.
type replica struct {
	name   string
	port   string
	health *health.Server
}

// TestListVerifiesEachReplica ensures a listed channel verifies each
// replica's certificate against the host it is listed under (no single
// name would verify all three), and sends calls to the one that reports
// itself the leader, following it when it moves.
func TestListVerifiesEachReplica(t *testing.T) {
	t.Parallel()
	ca := securitytest.NewCA(t, "test CA")
	var replicas []*replica
	for _, name := range []string{"n0.test", "n1.test", "n2.test"} {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		_, port, _ := net.SplitHostPort(lis.Addr().String())
		cert := ca.ServerFor(t, name)
		srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})))
		r := &replica{name: name, port: port, health: health.NewServer()}
		healthpb.RegisterHealthServer(srv, r.health)
		r.health.SetServingStatus(name, healthpb.HealthCheckResponse_SERVING)
		r.health.SetServingStatus(leaderdial.HealthService, healthpb.HealthCheckResponse_NOT_SERVING)
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = srv.Serve(lis)
		}()
		t.Cleanup(func() {
			srv.Stop()
			<-done
		})
		replicas = append(replicas, r)
	}
	var list []string
	for _, r := range replicas {
		list = append(list, r.name+":"+r.port)
	}
	target, err := leaderdial.Parse(strings.Join(list, ","))
	if err != nil {
		t.Fatal(err)
	}
	// The names resolve to this machine's loopback address.
	toLoopback := grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
		_, port, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, err
		}
		return (&net.Dialer{}).DialContext(ctx, "tcp", net.JoinHostPort("127.0.0.1", port))
	})
	creds := credentials.NewTLS(&tls.Config{RootCAs: ca.Pool(), MinVersion: tls.VersionTLS12})
	transport := []grpc.DialOption{grpc.WithTransportCredentials(creds), toLoopback}
	leader := target.Leader(transport...)
	conn, err := grpc.NewClient(leader.DialTarget(), append(leader.DialOptions(), transport...)...)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)

	for _, leader := range []int{1, 2, 0} {
		for i, r := range replicas {
			st := healthpb.HealthCheckResponse_NOT_SERVING
			if i == leader {
				st = healthpb.HealthCheckResponse_SERVING
			}
			r.health.SetServingStatus(leaderdial.HealthService, st)
		}
		// The channel learns of the move from its polls, with no event to
		// wait on from here: ask until the new leader answers, within a
		// deadline.
		want := replicas[leader].name
		deadline := time.Now().Add(20 * time.Second)
		for {
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: want}, grpc.WaitForReady(true))
			cancel()
			if err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("replica %s, the leader, never answered: last %v, %v", want, resp, err)
			}
		}
	}
}
