package coordinator

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// selfSigned returns a TLS config with a certificate for 127.0.0.1, and a
// pool that trusts it.
func selfSigned(t *testing.T) (*tls.Config, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}, pool
}

// writePrincipals writes a principals file of one operator of every team
// and one submitter of team alpha, and returns its path.
func writePrincipals(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "principals.json")
	data := `{"principals":[
		{"name":"ops","token":"ops-token-0123456789abcdef","roles":["operator"],"scope":["*"]},
		{"name":"alpha-svc","token":"alpha-token-0123456789abcdef","team":"alpha","roles":["submitter"]}]}`
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestConsoleConfig(t *testing.T) {
	t.Parallel()

	t.Run("The console needs the metrics address", func(t *testing.T) {
		t.Parallel()
		_, err := New(Config{Listen: "127.0.0.1:0", DataDir: filepath.Join(t.TempDir(), "d"), Console: true})
		if err == nil || !strings.Contains(err.Error(), "metrics address") {
			t.Errorf("New = %v, want a refusal naming the metrics address", err)
		}
	})

	t.Run("Off loopback the console needs TLS", func(t *testing.T) {
		t.Parallel()
		_, err := New(Config{Listen: "127.0.0.1:0", DataDir: filepath.Join(t.TempDir(), "d"), Console: true, MetricsListen: "0.0.0.0:0",
			TokensFile: writePrincipals(t)})
		if err == nil || !strings.Contains(err.Error(), "without TLS") {
			t.Errorf("New = %v, want a refusal without TLS", err)
		}
	})

	t.Run("Off loopback the console never serves the development tokens, even under TLS", func(t *testing.T) {
		t.Parallel()
		cfg, _ := selfSigned(t)
		_, err := New(Config{Listen: "127.0.0.1:0", DataDir: filepath.Join(t.TempDir(), "d"), Console: true, MetricsListen: "0.0.0.0:0", HTTPTLS: cfg})
		if err == nil || !strings.Contains(err.Error(), "public development tokens") {
			t.Errorf("New = %v, want a refusal of the development tokens", err)
		}
	})

	t.Run("Under TLS the console serves HTTPS and its cookie is Secure", func(t *testing.T) {
		t.Parallel()
		cfg, pool := selfSigned(t)
		c, err := New(Config{Listen: "127.0.0.1:0", DataDir: filepath.Join(t.TempDir(), "d"), Console: true,
			MetricsListen: "127.0.0.1:0", HTTPTLS: cfg})
		if err != nil {
			t.Fatal(err)
		}
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
		u := c.ConsoleURL()
		if !strings.HasPrefix(u, "https://127.0.0.1:") || !strings.HasSuffix(u, "/console/") {
			t.Fatalf("ConsoleURL = %q, want https on loopback", u)
		}
		tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}
		defer tr.CloseIdleConnections()
		hc := &http.Client{Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
		resp, err := hc.PostForm(u+"signin", url.Values{"token": {"dev-operator"}})
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		ck := resp.Header.Get("Set-Cookie")
		if resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(ck, "__Host-leasehold-console-"+strings.TrimSuffix(strings.TrimPrefix(u, "https://127.0.0.1:"), "/console/")+"=") || !strings.Contains(ck, "Secure") {
			t.Errorf("sign-in over TLS = %d, Set-Cookie %q; want 303 and a Secure __Host- cookie", resp.StatusCode, ck)
		}
	})
}
