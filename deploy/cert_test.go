package deploy

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestOpenSSLRecipe runs the openssl commands of deploy/README.md's
// "With openssl" and checks what they make: a certificate the CA signed
// that verifies under every name a client or a peer uses, for server and
// for client authentication, with its key. (The run test issues its
// certificate from the README's cert-manager Certificate.) It needs
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
	// A coordinator presents it when it dials a peer.
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("the recipe's certificate, as a peer's client certificate: %v", err)
	}
}
