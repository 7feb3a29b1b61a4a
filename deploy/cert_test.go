package deploy

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/leasehold/leasehold/internal/security"
)

// TestOpenSSLRecipe runs the openssl commands of deploy/README.md's
// "With openssl" and checks what they make: a certificate the CA signed
// that verifies under every name a client uses, with its key; and a peer
// certificate the peer CA (not the first) signed for both ends of a raft
// connection, naming every voter. (The run test issues its certificates
// from the README's cert-manager Certificates.) It needs
// OpenSSL 3, as the README says, and skips without it.
func TestOpenSSLRecipe(t *testing.T) {
	t.Parallel()
	version, err := exec.Command("openssl", "version").Output()
	if err != nil || !regexp.MustCompile(`^OpenSSL ([3-9]|[1-9][0-9])\.`).Match(version) {
		t.Skipf("the README's recipe needs OpenSSL 3 or later: %q, %v", version, err)
	}
	d := loadDeployment(t)
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := bytes.Cut(readme, []byte("**With openssl**"))
	m := regexp.MustCompile("(?s)```sh\n(.*?)```").FindSubmatch(after)
	if !ok || m == nil {
		t.Fatal(`deploy/README.md has no shell block after "**With openssl**"`)
	}
	dir := t.TempDir()
	ran := 0
	for line := range strings.Lines(strings.ReplaceAll(string(m[1]), "\\\n", " ")) {
		if !strings.HasPrefix(line, "openssl ") {
			continue
		}
		cmd := exec.Command("sh", "-c", line)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", line, err, out)
		}
		ran++
	}
	if ran == 0 {
		t.Fatal("the recipe runs no openssl command")
	}
	pair, err := tls.LoadX509KeyPair(filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"))
	if err != nil {
		t.Fatalf("the recipe's tls.crt and tls.key: %v", err)
	}
	caPEM, err := os.ReadFile(filepath.Join(dir, caKey))
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(caPEM) {
		t.Fatal("the recipe's ca.crt holds no certificate")
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range d.certNames(t) {
		if _, err := leaf.Verify(x509.VerifyOptions{DNSName: name, Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
			t.Errorf("the recipe's certificate, as a server %s: %v", name, err)
		}
	}
	checkPeerRecipe(t, d, dir)
}

// checkPeerRecipe checks the recipe's peer certificate in dir: signed by
// the peer CA, another than the clients', for both ends of a raft
// connection, naming every voter.
func checkPeerRecipe(t *testing.T, d *deployment, dir string) {
	t.Helper()
	pair, err := tls.LoadX509KeyPair(filepath.Join(dir, "peer.crt"), filepath.Join(dir, "peer.key"))
	if err != nil {
		t.Fatalf("the recipe's peer.crt and peer.key: %v", err)
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	for _, ca := range []struct {
		file   string
		passes bool
	}{{"peer-ca.crt", true}, {caKey, false}} {
		pem, err := os.ReadFile(filepath.Join(dir, ca.file))
		if err != nil {
			t.Fatal(err)
		}
		roots := x509.NewCertPool()
		roots.AppendCertsFromPEM(pem)
		for _, usage := range []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth} {
			if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{usage}}); (err == nil) != ca.passes {
				t.Errorf("the recipe's peer certificate under %s for usage %v: %v, want verified %v", ca.file, usage, err, ca.passes)
			}
		}
	}
	for _, p := range d.peers {
		if !slices.Contains(security.NodeIDs(leaf), p.id) {
			t.Errorf("the recipe's peer certificate names %q, not voter %s", security.NodeIDs(leaf), p.id)
		}
	}
}
