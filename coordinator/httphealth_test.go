package coordinator

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/leasehold/leasehold/coordinator/internal/server"
	"github.com/leasehold/leasehold/internal/leaderdial"
)

// startLoneNode starts node n1 of a cluster of voters peers (n1, n2, ...)
// over raft's in-memory transport, with no link to any other: with one
// voter it leads itself, with more it never learns of a leader.
func startLoneNode(t *testing.T, voters int) (*Coordinator, healthpb.HealthClient) {
	t.Helper()
	var peers []Peer
	for i := range voters {
		peers = append(peers, Peer{ID: fmt.Sprintf("n%d", i+1), RaftAddr: fmt.Sprintf("n%d", i+1)})
	}
	_, trans := raft.NewInmemTransportWithTimeout("n1", 300*time.Millisecond)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c, err := New(Config{
		Listen:        lis.Addr().String(),
		DataDir:       filepath.Join(t.TempDir(), "n1"),
		MetricsListen: "127.0.0.1:0",
		Logger:        slog.New(slog.NewTextHandler(io.Discard, nil)),
		Cluster: &Cluster{NodeID: "n1", Peers: peers, transport: trans,
			HeartbeatTimeout: 100 * time.Millisecond, ElectionTimeout: 100 * time.Millisecond, LeaderLeaseTimeout: 50 * time.Millisecond},
	})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	served := make(chan error, 1)
	go func() { served <- c.Serve(lis) }()
	t.Cleanup(func() {
		c.Close()
		if err := <-served; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			t.Errorf("Serve: %v", err)
		}
	})
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return c, healthpb.NewHealthClient(conn)
}

// TestHTTPHealthOfAClusterNode checks what a kubelet's probes read of a
// replicated coordinator: liveness (/healthz) passes whether or not the
// cluster has a leader, since restarting a node cannot give it one;
// readiness (/readyz) passes once this node knows a leader.
func TestHTTPHealthOfAClusterNode(t *testing.T) {
	t.Parallel()
	t.Run("A node whose peers are away is alive and not ready", func(t *testing.T) {
		t.Parallel()
		c, hc := startLoneNode(t, 3)
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
		defer cancel()
		// The gRPC server answers once it serves; the metrics address was
		// bound before it.
		for name, want := range map[string]healthpb.HealthCheckResponse_ServingStatus{
			"":                       healthpb.HealthCheckResponse_NOT_SERVING,
			server.JobServiceName:    healthpb.HealthCheckResponse_SERVING,
			leaderdial.HealthService: healthpb.HealthCheckResponse_NOT_SERVING,
		} {
			resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: name}, grpc.WaitForReady(true))
			if err != nil || resp.GetStatus() != want {
				t.Errorf("health of %q = %v, %v; want %v", name, resp.GetStatus(), err, want)
			}
		}
		if code, body := getHealth(t, c.MetricsAddr(), healthzPath); code != http.StatusOK || body != "SERVING\n" {
			t.Errorf("GET %s with no leader = %d %q, want 200 SERVING: a liveness probe would restart the node for its peers' absence", healthzPath, code, body)
		}
		if code, body := getHealth(t, c.MetricsAddr(), readyzPath); code != http.StatusServiceUnavailable || body != "NOT_SERVING\n" {
			t.Errorf("GET %s with no leader = %d %q, want 503 NOT_SERVING", readyzPath, code, body)
		}
	})
	t.Run("A node of a cluster that has a leader is alive and ready", func(t *testing.T) {
		t.Parallel()
		c, hc := startLoneNode(t, 1)
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
		defer cancel()
		watch, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
		if err != nil {
			t.Fatal(err)
		}
		for {
			resp, err := watch.Recv()
			if err != nil {
				t.Fatalf("watching the server's health for a leader: %v", err)
			}
			if resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
				break
			}
		}
		for _, path := range []string{healthzPath, readyzPath} {
			if code, body := getHealth(t, c.MetricsAddr(), path); code != http.StatusOK || body != "SERVING\n" {
				t.Errorf("GET %s with a leader = %d %q, want 200 SERVING", path, code, body)
			}
		}
	})
}
