package coordinator

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/client"
	"github.com/leasehold/leasehold/coordinator/internal/artifacts"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"github.com/leasehold/leasehold/internal/leaderdial"
	"github.com/leasehold/leasehold/renderer"
	"github.com/leasehold/leasehold/renderer/mock"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// refusalLog returns a logger that signals on the returned channel each
// time the coordinator logs a connection refused by its listener's limits.
func refusalLog() (*slog.Logger, <-chan string) {
	msgs := make(chan string, 8)
	return slog.New(notifyHandler{slog.NewTextHandler(io.Discard, nil), "connection refused by the listener's limits", msgs}), msgs
}

// flood opens n TCP connections to addr from the loopback address from
// (127.0.0.x: every address of 127/8 is this machine's on Linux) that send
// nothing, held until the test ends.
func flood(t *testing.T, from, addr string, n int) {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
	for range n {
		c, err := d.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("dialing %s from %s: %v", addr, from, err)
		}
		t.Cleanup(func() { c.Close() })
	}
}

// waitFor waits for a message on msgs, failing the test after a failsafe.
func waitFor(t *testing.T, msgs <-chan string, what string) {
	t.Helper()
	select {
	case <-msgs:
	case <-time.After(20 * time.Second): // a failsafe: the refusal comes at once
		t.Fatalf("%s was never logged", what)
	}
}

// TestConnectionFloodFromOneAddress floods the gRPC listener from
// 127.0.0.2 with more connections than the listener serves, none making
// a call: the address holds its share and no more, and a client on
// 127.0.0.1 is served within a second. Without the per-address share the
// flood takes every connection and the client waits until its deadline.
func TestConnectionFloodFromOneAddress(t *testing.T) {
	t.Parallel()
	log, refused := refusalLog()
	b := setup(t, Config{MaxConnections: 16, MaxConnectionsPerAddress: 4, ConnAuthTimeout: time.Minute,
		MetricsListen: "127.0.0.1:0", Logger: log})
	flood(t, "127.0.0.2", b.addr, 20)
	waitFor(t, refused, "a refusal of the flood's connections")

	conn, err := grpc.NewClient(b.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(bearer(t.Context(), "dev-alpha"), time.Second)
	defer cancel()
	if _, err := leaseholdv1.NewJobServiceClient(conn).ListJobs(ctx, &leaseholdv1.ListJobsRequest{Team: "alpha"}); err != nil {
		t.Fatalf("a call from 127.0.0.1 while 127.0.0.2 floods: %v", err)
	}
	metrics := scrapeMetrics(t, b.c.MetricsAddr())
	for _, want := range []string{
		`leasehold_connections_refused_total{cause="per_address",listener="grpc"} 16`,
		`leasehold_connections_open{listener="grpc"} 5`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %s:\n%s", want, grep(metrics, "leasehold_connections_"))
		}
	}
}

// TestConnectionsWithoutAuthenticatedCallsAreClosed checks the
// authentication timeout: a connection that sends nothing is closed and
// counted, while one that only polls the leader's health entry with its
// token, as the Go client and the renderer do on every replica (package
// leaderdial, the token sent as per-call credentials), stays open.
func TestConnectionsWithoutAuthenticatedCallsAreClosed(t *testing.T) {
	t.Parallel()
	const timeout = 300 * time.Millisecond
	b := setup(t, Config{ConnAuthTimeout: timeout, MetricsListen: "127.0.0.1:0"})
	conn, err := grpc.NewClient(b.addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithPerRPCCredentials(perCallToken("dev-renderer")))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second) // a failsafe
	defer cancel()
	polled := make(chan error, 1)
	go func() { polled <- pollLeader(ctx, conn, leaderdial.DefaultPollEvery) }()
	defer func() {
		cancel()
		if err := <-polled; err != nil {
			t.Errorf("polling the leader's health entry: %v", err)
		}
	}()
	for st := conn.GetState(); st != connectivity.Ready; st = conn.GetState() {
		if !conn.WaitForStateChange(ctx, st) {
			t.Fatalf("the polling connection never became ready (%v)", st)
		}
	}
	// Two connections in turn, each opened once the one before was
	// closed: by the end the health-checked connection has lived past
	// its timeout twice over.
	for range 2 {
		raw, err := net.Dial("tcp", b.addr)
		if err != nil {
			t.Fatal(err)
		}
		raw.SetReadDeadline(time.Now().Add(20 * time.Second)) // a failsafe: it is closed after the timeout
		// The server's HTTP/2 settings, then the end.
		if _, err := io.Copy(io.Discard, raw); err != nil {
			t.Fatalf("a connection without a call: %v, want it closed", err)
		}
		raw.Close()
	}
	metrics := scrapeMetrics(t, b.c.MetricsAddr())
	if want := `leasehold_connections_refused_total{cause="unauthenticated",listener="grpc"} 2`; !strings.Contains(metrics, want) {
		t.Errorf("metrics lack %s:\n%s", want, grep(metrics, "leasehold_connections_"))
	}
	if got := conn.GetState(); got != connectivity.Ready {
		t.Errorf("the polling connection is %v, want READY", got)
	}
	if got := b.c.conns.grpc.Open(); got != 1 {
		t.Errorf("open gRPC connections = %d, want 1 (the polling one)", got)
	}
}

// pollLeader asks conn for the leader's health entry every period until
// ctx ends, as leaderdial's polls do, and returns the first error other
// than ctx's.
func pollLeader(ctx context.Context, conn *grpc.ClientConn, every time.Duration) error {
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		_, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: leaderdial.HealthService})
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// perCallToken sends a bearer token with every call of a connection,
// health checks included, as package internal/security does.
type perCallToken string

func (p perCallToken) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(p)}, nil
}

func (perCallToken) RequireTransportSecurity() bool { return false }

// TestHealthProbesSurviveAFlood floods the metrics address from 127.0.0.2
// with more connections than it serves, each sending nothing: a probe of
// /healthz from 127.0.0.1 is answered within a second. Without the
// per-address share the flood holds every connection and the probe waits.
func TestHealthProbesSurviveAFlood(t *testing.T) {
	t.Parallel()
	log, refused := refusalLog()
	limits := defaultHTTPLimits
	limits.MaxConns, limits.PerAddress = 16, 4
	b := setup(t, Config{MetricsListen: "127.0.0.1:0", Logger: log, httpLimits: &limits})
	flood(t, "127.0.0.2", b.c.MetricsAddr(), 20)
	waitFor(t, refused, "a refusal of the flood's connections")

	client := &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Get("http://" + b.c.MetricsAddr() + healthzPath)
	if err != nil {
		t.Fatalf("a probe from 127.0.0.1 while 127.0.0.2 floods: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("probe status = %d, want 200", resp.StatusCode)
	}
	if want := `leasehold_connections_refused_total{cause="per_address",listener="http"} 16`; !strings.Contains(scrapeMetrics(t, b.c.MetricsAddr()), want) {
		t.Errorf("metrics lack %s", want)
	}
}

// grep returns the lines of text that contain s.
func grep(text, s string) string {
	var b strings.Builder
	for line := range strings.Lines(text) {
		if strings.Contains(line, s) {
			fmt.Fprint(&b, line)
		}
	}
	return b.String()
}

// TestMetricsAddressChecksTheHost asks the metrics address's every kind
// of page under a Host an attacker's page would send after rebinding its
// own name to the coordinator's address: each is refused 421, and
// answered under the address itself or localhost.
func TestMetricsAddressChecksTheHost(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{MetricsListen: "127.0.0.1:0", Pprof: true})
	addr := b.c.MetricsAddr()
	_, port, _ := net.SplitHostPort(addr)
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	get := func(path, host string) int {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, "http://"+addr+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Host = host
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, path := range []string{"/metrics", healthzPath, readyzPath, "/debug/pprof/"} {
		if got := get(path, "rebind.attacker.example:"+port); got != http.StatusMisdirectedRequest {
			t.Errorf("GET %s under a rebound name = %d, want 421", path, got)
		}
		for _, host := range []string{addr, "localhost:" + port} {
			if got := get(path, host); got != http.StatusOK {
				t.Errorf("GET %s under %s = %d, want 200", path, host, got)
			}
		}
	}
}

// TestConnectionAgeKeepsWorkGoing serves with connections asked to go
// after 300 ms and closed 200 ms later, through a batch a renderer needs
// several connection lifetimes for: its session is cut at the end of each
// grace and reopened on a new connection, with its leases in its hello,
// and the client's watch resumes, so every job succeeds.
func TestConnectionAgeKeepsWorkGoing(t *testing.T) {
	t.Parallel()
	aged := keepaliveParams
	aged.MaxConnectionAge, aged.MaxConnectionAgeGrace = 300*time.Millisecond, 200*time.Millisecond
	s := startStack(t, Config{keepalive: &aged, LeaseTTL: time.Second})
	sessions := make(chan string, 64)
	log := slog.New(notifyHandler{slog.NewTextHandler(io.Discard, nil), "session started", sessions})
	p, err := mock.New(mock.Config{Latency: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	s.startRenderer(t, renderer.Config{Capacity: 2, Provider: p, Logger: log})
	cl, err := client.Dial(s.addr, client.WithToken("dev-alpha"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second) // a failsafe
	defer cancel()
	docs := make([]*leaseholdv1.Document, 60)
	for i := range docs {
		docs[i] = &leaseholdv1.Document{Name: fmt.Sprintf("d-%02d.pdf", i), Content: []byte("%PDF-1.7")}
	}
	resp, err := cl.SubmitBatch(ctx, "alpha", t.Name(), docs, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, err := range cl.FollowBatch(ctx, resp.GetBatch().GetId(), client.FollowOptions{TerminalOnly: true}) {
		if err != nil {
			t.Fatalf("following the batch across connection ages: %v", err)
		}
	}
	for _, id := range resp.GetBatch().GetJobIds() {
		j, err := cl.GetJob(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if j.GetPhase() != leaseholdv1.Phase_PHASE_SUCCEEDED {
			t.Errorf("job %s ended %v across connection ages, want SUCCEEDED", id, j.GetPhase())
		}
	}
	if n := len(sessions); n < 2 {
		t.Errorf("the renderer opened %d sessions, want a new one after a connection aged out", n)
	}
}

// TestFileDescriptorsCountTheStoresConnections checks that the open files
// the coordinator warns about include the idle connections it keeps to an
// S3 artifact store, and only for one.
func TestFileDescriptorsCountTheStoresConnections(t *testing.T) {
	local := Config{}.FileDescriptors()
	dir := Config{Artifacts: ArtifactConfig{Store: "file:///var/lib/previews"}}.FileDescriptors()
	if dir != local {
		t.Errorf("FileDescriptors: %d with a directory, want %d as with no store given", dir, local)
	}
	// The scheme as the store reads it: a URL's scheme is case-blind.
	for _, store := range []string{"s3://previews?endpoint=http://127.0.0.1:9000", "S3://previews"} {
		if got := (Config{Artifacts: ArtifactConfig{Store: store}}).FileDescriptors(); got != local+artifacts.IdleStoreConns {
			t.Errorf("FileDescriptors with the store %s = %d, want %d more than with no store given (%d)", store, got, artifacts.IdleStoreConns, local)
		}
	}
}

// TestSingleNodeStorePageSize checks that a single node creates its store
// with the operating system's page size: only a cluster's nodes make
// larger pages (cluster.StorePageSize).
func TestSingleNodeStorePageSize(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	if st, err := b.c.st.Stats(); err != nil || st.PageSize != os.Getpagesize() {
		t.Errorf("the store has pages of %d bytes (%v), want %d", st.PageSize, err, os.Getpagesize())
	}
}
