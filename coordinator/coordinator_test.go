package coordinator

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/server"
	"github.com/leasehold/leasehold/coordinator/internal/store"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// raft's in-memory transport times an RPC to a node that already
		// stopped out on its own timer (a leader handing over as the test's
		// cluster closes), and the leadership transfer waiting on it ends
		// with it: raft's goroutines, which end by themselves.
		goleak.IgnoreTopFunction("github.com/hashicorp/raft.(*InmemTransport).makeRPC"),
		goleak.IgnoreTopFunction("github.com/hashicorp/raft.(*Raft).leaderLoop.func2"),
		// raft's apply channel is buffered (BatchApplyCh): a barrier put
		// in it as the node shuts down is never taken, and its future,
		// which has no shutdown channel, is never answered. The leader's
		// work has long moved on (until); the goroutine waiting on the
		// future ends with the process.
		goleak.IgnoreTopFunction("github.com/hashicorp/raft.(*deferError).Error"),
	)
}

// syncBuffer is a log sink safe for concurrent writers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestServeAndClose runs a coordinator on loopback TCP with the
// development tokens and checks health, an authenticated call, metrics,
// the listening log line and a clean Close.
func TestServeAndClose(t *testing.T) {
	t.Parallel()
	logs := &syncBuffer{}
	c, err := New(Config{
		Listen:        "127.0.0.1:0",
		DataDir:       filepath.Join(t.TempDir(), "data"),
		MetricsListen: "127.0.0.1:0",
		Logger:        slog.New(slog.NewTextHandler(logs, nil)),
	})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- c.Serve(lis) }()

	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	t.Run("Health reports SERVING for the server and each service", func(t *testing.T) {
		hc := healthpb.NewHealthClient(conn)
		for _, name := range serviceNames {
			resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: name})
			if err != nil {
				t.Fatalf("Check(%q): %v", name, err)
			}
			if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
				t.Errorf("Check(%q) = %v, want SERVING", name, resp.GetStatus())
			}
		}
	})
	t.Run("Calls need a token and the development tokens work", func(t *testing.T) {
		jc := leaseholdv1.NewJobServiceClient(conn)
		_, err := jc.GetJob(ctx, &leaseholdv1.GetJobRequest{JobId: "j-1"})
		if got := status.Code(err); got != codes.Unauthenticated {
			t.Errorf("without a token: %v, want Unauthenticated", got)
		}
		authed := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer dev-alpha")
		resp, err := jc.SubmitBatch(authed, &leaseholdv1.SubmitBatchRequest{Team: "alpha", RequestId: "r",
			Documents: []*leaseholdv1.Document{{Name: "a.pdf", Content: []byte("%PDF")}}})
		if err != nil {
			t.Fatalf("SubmitBatch: %v", err)
		}
		if got := resp.GetBatch().GetJobIds(); len(got) != 1 || got[0] != "j-1" {
			t.Errorf("job ids = %v, want [j-1]", got)
		}
	})
	t.Run("Pausing dispatch turns only the dispatch health entry NOT_SERVING", func(t *testing.T) {
		hc := healthpb.NewHealthClient(conn)
		oc := leaseholdv1.NewOperatorServiceClient(conn)
		op := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer dev-operator")
		check := func(name string) healthpb.HealthCheckResponse_ServingStatus {
			t.Helper()
			resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: name})
			if err != nil {
				t.Fatalf("Check(%q): %v", name, err)
			}
			return resp.GetStatus()
		}
		if got := check(DispatchHealthName); got != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("dispatch health before the pause = %v, want SERVING", got)
		}
		if _, err := oc.PauseDispatch(op, &leaseholdv1.PauseDispatchRequest{Reason: "rollback"}); err != nil {
			t.Fatal(err)
		}
		if got := check(DispatchHealthName); got != healthpb.HealthCheckResponse_NOT_SERVING {
			t.Errorf("dispatch health while paused = %v, want NOT_SERVING", got)
		}
		if got := check(""); got != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("server health while paused = %v, want SERVING", got)
		}
		for _, path := range []string{healthzPath, readyzPath} {
			if code, body := getHealth(t, c.MetricsAddr(), path); code != http.StatusOK || body != "SERVING\n" {
				t.Errorf("GET %s while paused = %d %q, want 200 SERVING", path, code, body)
			}
		}
		if _, err := oc.ResumeDispatch(op, &leaseholdv1.ResumeDispatchRequest{Reason: "done"}); err != nil {
			t.Fatal(err)
		}
		if got := check(DispatchHealthName); got != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("dispatch health after resume = %v, want SERVING", got)
		}
	})
	t.Run("Metrics are served with gRPC, engine and refusal series", func(t *testing.T) {
		body := scrapeMetrics(t, c.MetricsAddr())
		for _, want := range []string{"grpc_server_handled_total", "leasehold_dispatch_paused 0", `leasehold_refused_calls_total{code="Unauthenticated"} 1`} {
			if !strings.Contains(body, want) {
				t.Errorf("metrics lack %q", want)
			}
		}
	})

	if err := c.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := <-served; err != nil {
		t.Errorf("Serve after Close = %v, want nil", err)
	}
	if err := c.Close(); err != nil {
		t.Errorf("second Close = %v, want nil", err)
	}
	for _, want := range []string{"development tokens", `msg="coordinator listening" addr=` + lis.Addr().String()} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("logs lack %q:\n%s", want, logs.String())
		}
	}
}

// scrapeMetrics returns the text of the /metrics endpoint at addr.
func scrapeMetrics(t *testing.T, addr string) string {
	t.Helper()
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	return string(body)
}

// getHealth returns the status and body of GET path on the metrics
// address addr.
func getHealth(t *testing.T, addr, path string) (int, string) {
	t.Helper()
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Get("http://" + addr + path)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(body)
}

// TestDevelopmentTokensOnlyOnLoopback checks that the public development
// tokens are never served on a network address.
func TestDevelopmentTokensOnlyOnLoopback(t *testing.T) {
	t.Parallel()
	quiet := slog.New(slog.DiscardHandler)

	t.Run("A non-loopback listen address without a principals file is refused", func(t *testing.T) {
		t.Parallel()
		_, err := New(Config{Listen: "0.0.0.0:7070", DataDir: t.TempDir(), Logger: quiet})
		if err == nil || !strings.Contains(err.Error(), "not loopback") {
			t.Errorf("New = %v, want a refusal naming loopback", err)
		}
	})
	t.Run("Serving the development tokens on a wildcard listener is refused", func(t *testing.T) {
		t.Parallel()
		c, err := New(Config{DataDir: t.TempDir(), Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		lis, err := net.Listen("tcp", ":0")
		if err != nil {
			t.Fatal(err)
		}
		defer lis.Close()
		if err := c.Serve(lis); err == nil {
			t.Errorf("Serve on %s with development tokens succeeded", lis.Addr())
		}
	})
	t.Run("A principals file allows any address", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		tokens := filepath.Join(dir, "principals.json")
		if err := os.WriteFile(tokens, []byte(`{"principals":[{"name":"pool","token":"pool-secret-token-1","roles":["renderer"],"renderer_id_prefix":"pool-"}]}`), 0o600); err != nil {
			t.Fatal(err)
		}
		c, err := New(Config{Listen: "0.0.0.0:7070", DataDir: filepath.Join(dir, "data"), TokensFile: tokens, Logger: quiet})
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		if err := c.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	t.Run("A second coordinator on the same data directory fails fast, saying it is in use", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		c, err := New(Config{DataDir: dir, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_, err = New(Config{DataDir: dir, Logger: quiet})
		if !errors.Is(err, ErrDataDirInUse) {
			t.Fatalf("a second New on the same data directory = %v, want ErrDataDirInUse", err)
		}
		if msg := err.Error(); !strings.Contains(msg, dir) || !strings.Contains(msg, "in use by another coordinator") || strings.Contains(msg, "timeout") {
			t.Errorf("error = %q, want it to name %s as in use by another coordinator, without \"timeout\"", msg, dir)
		}
	})
}

// TestLocalAddr checks which listener addresses count as local.
func TestLocalAddr(t *testing.T) {
	t.Parallel()
	tests := []struct {
		addr net.Addr
		want bool
	}{
		{&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1}, true},
		{&net.TCPAddr{IP: net.IPv6loopback, Port: 1}, true},
		{&net.TCPAddr{IP: net.IPv4zero, Port: 1}, false},
		{&net.TCPAddr{IP: net.IPv4(10, 0, 0, 1), Port: 1}, false},
		{&net.UnixAddr{Name: "/tmp/x.sock", Net: "unix"}, true},
	}
	for _, tc := range tests {
		if got := localAddr(tc.addr); got != tc.want {
			t.Errorf("localAddr(%v) = %v, want %v", tc.addr, got, tc.want)
		}
	}
	for addr, want := range map[string]bool{"127.0.0.1:7070": true, "localhost:1": true, "[::1]:1": true, ":7070": false, "0.0.0.0:1": false, "example.com:1": false} {
		if got := loopbackHost(addr); got != want {
			t.Errorf("loopbackHost(%q) = %v, want %v", addr, got, want)
		}
	}
}

// TestFailStopTurnsHealthNotServing checks that a failed commit turns every
// health status NOT_SERVING, the dispatch entry's included, and
// leasehold_writer_stopped from 0 to 1.
func TestFailStopTurnsHealthNotServing(t *testing.T) {
	t.Parallel()
	var broken atomic.Bool
	c, err := New(Config{
		DataDir:       t.TempDir(),
		MetricsListen: "127.0.0.1:0",
		Logger:        slog.New(slog.DiscardHandler),
		storeOptions: []store.Option{store.WithFault(func(string) error {
			if broken.Load() {
				return store.ErrInjected
			}
			return nil
		})},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- c.Serve(lis) }()
	defer func() {
		c.Close()
		<-served
	}()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	hc := healthpb.NewHealthClient(conn)
	names := []string{server.RendererServiceName, DispatchHealthName}
	watches := make([]healthpb.Health_WatchClient, len(names))
	for i, name := range names {
		watch, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{Service: name})
		if err != nil {
			t.Fatal(err)
		}
		if first, err := watch.Recv(); err != nil || first.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("first %s health status = %v, %v; want SERVING", name, first.GetStatus(), err)
		}
		watches[i] = watch
	}

	if body := scrapeMetrics(t, c.MetricsAddr()); !strings.Contains(body, "\nleasehold_writer_stopped 0\n") {
		t.Errorf("metrics before the failure lack leasehold_writer_stopped 0:\n%s", body)
	}
	for _, path := range []string{healthzPath, readyzPath} {
		if code, body := getHealth(t, c.MetricsAddr(), path); code != http.StatusOK || body != "SERVING\n" {
			t.Errorf("GET %s before the failure = %d %q, want 200 SERVING", path, code, body)
		}
	}

	broken.Store(true)
	authed := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer dev-alpha")
	_, err = leaseholdv1.NewJobServiceClient(conn).SubmitBatch(authed, &leaseholdv1.SubmitBatchRequest{Team: "alpha", RequestId: "r",
		Documents: []*leaseholdv1.Document{{Name: "a.pdf", Content: []byte("%PDF")}}})
	if got := status.Code(err); got != codes.Unavailable {
		t.Fatalf("SubmitBatch with a failing store: %v, want Unavailable", err)
	}
	for i, watch := range watches {
		next, err := watch.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if next.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
			t.Errorf("%s health after fail-stop = %v, want NOT_SERVING", names[i], next.GetStatus())
		}
	}
	// The HTTP endpoints read the entries the watches just saw change.
	for _, path := range []string{healthzPath, readyzPath} {
		if code, body := getHealth(t, c.MetricsAddr(), path); code != http.StatusServiceUnavailable || body != "NOT_SERVING\n" {
			t.Errorf("GET %s after fail-stop = %d %q, want 503 NOT_SERVING", path, code, body)
		}
	}
	// Health turns NOT_SERVING after the flag behind the gauge is set.
	if body := scrapeMetrics(t, c.MetricsAddr()); !strings.Contains(body, "\nleasehold_writer_stopped 1\n") {
		t.Errorf("metrics after fail-stop lack leasehold_writer_stopped 1:\n%s", body)
	}
}
