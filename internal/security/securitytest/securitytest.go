// Package securitytest issues certificates for tests from a certificate
// authority that lives in memory for one test: nothing is committed to the
// repository, and every test gets keys of its own. Files, where a command
// line needs them, are written under the test's temporary directory.
package securitytest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// CA is a test certificate authority.
type CA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	der  []byte
}

// NewCA returns a new CA named name, valid for the next hour.
func NewCA(t testing.TB, name string) *CA {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber:          serial(t),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Minute),
		NotAfter:              time.Now().Add(time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatalf("creating the CA certificate: %v", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &CA{cert: cert, key: key, der: der}
}

// Pool returns a pool holding the CA's certificate.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.cert)
	return p
}

// PEM returns the CA's certificate in PEM.
func (ca *CA) PEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.der})
}

// Server issues a server certificate for localhost, 127.0.0.1 and ::1.
func (ca *CA) Server(t testing.TB) tls.Certificate {
	t.Helper()
	return ca.issue(t, "localhost", x509.ExtKeyUsageServerAuth)
}

// ServerFor issues a server certificate for the DNS names given and no IP
// address, as a certificate for a Kubernetes Service's names is.
func (ca *CA) ServerFor(t testing.TB, names ...string) tls.Certificate {
	t.Helper()
	if len(names) == 0 {
		t.Fatal("ServerFor needs at least one name")
	}
	return ca.issueFor(t, names[0], x509.ExtKeyUsageServerAuth, names, nil)
}

// IssueFor issues a certificate for the DNS names given with the extended
// key usages given, as a certificate request names them: a cluster node's
// serves clients and its peers and authenticates it to them, so it
// carries server and client authentication both.
func (ca *CA) IssueFor(t testing.TB, usages []x509.ExtKeyUsage, names ...string) tls.Certificate {
	t.Helper()
	if len(names) == 0 {
		t.Fatal("IssueFor needs at least one name")
	}
	return ca.issueWith(t, names[0], usages, names, nil)
}

// IssueWithURIs issues a certificate for the URIs given (subject
// alternative names) and the DNS names given, with the extended key
// usages given: a cluster node's peer certificate names the node ids it
// may speak raft as in URIs (cluster.NodeURI).
func (ca *CA) IssueWithURIs(t testing.TB, usages []x509.ExtKeyUsage, uris []string, names ...string) tls.Certificate {
	t.Helper()
	var us []*url.URL
	for _, u := range uris {
		parsed, err := url.Parse(u)
		if err != nil {
			t.Fatalf("URI %q: %v", u, err)
		}
		us = append(us, parsed)
	}
	cn := "peer"
	if len(names) > 0 {
		cn = names[0]
	}
	return ca.issueTmpl(t, cn, usages, names, nil, us)
}

// Client issues a client certificate with common name name.
func (ca *CA) Client(t testing.TB, name string) tls.Certificate {
	t.Helper()
	return ca.issue(t, name, x509.ExtKeyUsageClientAuth)
}

func (ca *CA) issue(t testing.TB, name string, usage x509.ExtKeyUsage) tls.Certificate {
	t.Helper()
	if usage == x509.ExtKeyUsageServerAuth {
		return ca.issueFor(t, name, usage, []string{"localhost"}, []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback})
	}
	return ca.issueFor(t, name, usage, nil, nil)
}

func (ca *CA) issueFor(t testing.TB, name string, usage x509.ExtKeyUsage, dnsNames []string, ips []net.IP) tls.Certificate {
	t.Helper()
	return ca.issueWith(t, name, []x509.ExtKeyUsage{usage}, dnsNames, ips)
}

func (ca *CA) issueWith(t testing.TB, name string, usages []x509.ExtKeyUsage, dnsNames []string, ips []net.IP) tls.Certificate {
	t.Helper()
	return ca.issueTmpl(t, name, usages, dnsNames, ips, nil)
}

func (ca *CA) issueTmpl(t testing.TB, name string, usages []x509.ExtKeyUsage, dnsNames []string, ips []net.IP, uris []*url.URL) tls.Certificate {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber: serial(t),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Minute),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  usages,
		DNSNames:     dnsNames,
		IPAddresses:  ips,
		URIs:         uris,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatalf("issuing a certificate for %s: %v", name, err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// File writes the CA's certificate to a file under dir and returns its
// path.
func (ca *CA) File(t testing.TB, dir string) string {
	t.Helper()
	path := filepath.Join(dir, "ca.pem")
	write(t, path, ca.PEM())
	return path
}

// WriteKeyPair writes cert and its key as PEM files named name.pem and
// name-key.pem under dir and returns their paths.
func WriteKeyPair(t testing.TB, dir, name string, cert tls.Certificate) (certFile, keyFile string) {
	t.Helper()
	certPEM, keyPEM := KeyPairPEM(t, cert)
	certFile = filepath.Join(dir, name+".pem")
	keyFile = filepath.Join(dir, name+"-key.pem")
	write(t, certFile, certPEM)
	write(t, keyFile, keyPEM)
	return certFile, keyFile
}

// KeyPairPEM returns cert's chain and its key (PKCS #8) in PEM.
func KeyPairPEM(t testing.TB, cert tls.Certificate) (certPEM, keyPEM []byte) {
	t.Helper()
	for _, der := range cert.Certificate {
		certPEM = append(certPEM, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})...)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(cert.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	return certPEM, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})
}

func write(t testing.TB, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

func serial(t testing.TB) *big.Int {
	t.Helper()
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		t.Fatal(err)
	}
	return n
}
