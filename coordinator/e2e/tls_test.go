package e2e

import (
	"crypto/tls"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/leasehold/leasehold/internal/proctest"
	"github.com/leasehold/leasehold/internal/security/securitytest"
	"github.com/leasehold/leasehold/internal/stack"
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

	opts := options()
	opts.TLS = &stack.TLS{Cert: serverCert, Key: serverKey, ClientCA: caFile, CA: caFile, ClientCert: clientCert, ClientKey: clientKey,
		Config: &tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{ca.Client(t, "probe")}}}
	opts.Renderers = []stack.Renderer{{ID: "r-tls", Record: stack.RecordIn(t, "r-tls")}}
	s := stack.Start(t, opts)
	addr := s.Addrs()
	if line := s.Coordinators[0].WaitFor("coordinator listening"); proctest.LogAttr(line, "tls") != "mtls" {
		t.Fatalf("listening line %q: tls=%q, want mtls", line, proctest.LogAttr(line, "tls"))
	}

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
