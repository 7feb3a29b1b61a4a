package e2e

import (
	"context"
	"crypto/tls"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/leasehold/leasehold/internal/proctest"
	"github.com/leasehold/leasehold/internal/security/securitytest"
)

// TestMutualTLS runs the three binaries with mutual TLS configured from
// flags and the environment, with certificates made for the test: a
// document submitted with the CLI is rendered over TLS; a CLI without a
// client certificate gets nowhere; a renderer refuses to send its token in
// plaintext to another host.
func TestMutualTLS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca := securitytest.NewCA(t, "leasehold e2e CA")
	caFile := ca.File(t, dir)
	serverCert, serverKey := securitytest.WriteKeyPair(t, dir, "coordinator", ca.Server(t))
	clientCert, clientKey := securitytest.WriteKeyPair(t, dir, "client", ca.Client(t, "client"))

	p := procs.Start(t, "coordinator", bins.coordinator, "--dev", "--listen", "127.0.0.1:0", "--metrics-listen", "",
		"--data-dir", t.TempDir(), "--tls-cert", serverCert, "--tls-key", serverKey, "--tls-client-ca", caFile)
	line := p.WaitFor("coordinator listening")
	addr := proctest.LogAttr(line, "addr")
	if got := proctest.LogAttr(line, "tls"); got != "mtls" {
		t.Fatalf("listening line %q: tls=%q, want mtls", line, got)
	}
	waitServingTLS(t, addr, &tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{ca.Client(t, "probe")}})
	startRenderer(t, addr, "r-tls", "--tls-ca", caFile, "--tls-cert", clientCert, "--tls-key", clientKey)

	doc := filepath.Join(dir, "hello.txt")
	if err := os.WriteFile(doc, []byte("hello over TLS"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := []string{"LEASEHOLD_ADDR=" + addr, "LEASEHOLD_TOKEN=" + tokenAlpha, "LEASEHOLD_TLS_CA=" + caFile}
	r := runTool(t, bins.cli, append(env, "LEASEHOLD_TLS_CERT="+clientCert, "LEASEHOLD_TLS_KEY="+clientKey),
		"submit", "--team", "alpha", "--wait", doc)
	if r.code != 0 {
		t.Fatalf("submit --wait over mutual TLS: exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	if r := runTool(t, bins.cli, env, "get", "j-1", "--timeout", "10s"); r.code != 1 || !strings.Contains(r.stderr, "UNAVAILABLE") {
		t.Errorf("get without a client certificate: exit %d, stderr %q; want 1 and UNAVAILABLE", r.code, r.stderr)
	}
	if r := runTool(t, bins.renderer, nil, "--coordinator", "10.255.255.1:7070", "--id", "r-plain"); r.code != 2 ||
		!strings.Contains(r.stderr, "--insecure-plaintext") {
		t.Errorf("renderer with a plaintext token to another host: exit %d, stderr %q; want 2 naming --insecure-plaintext", r.code, r.stderr)
	}
}

// waitServingTLS waits until the health service answers SERVING over TLS.
func waitServingTLS(t *testing.T, addr string, cfg *tls.Config) {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
	if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health of %s over TLS: %v %v", addr, resp.GetStatus(), err)
	}
}
