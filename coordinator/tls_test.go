package coordinator

import (
	"context"
	"crypto/tls"
	"errors"
	"testing"
	"time"

	"github.com/leasehold/leasehold/client"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"github.com/leasehold/leasehold/internal/security/securitytest"
	"github.com/leasehold/leasehold/renderer"
)

// TestTransportSecurity serves mutual TLS with certificates from a CA made
// for the test, and checks who gets through: a client with a certificate
// the CA signed, not one without a certificate, not a plaintext one, not
// one that does not trust the server; and a renderer over mutual TLS
// completes a job.
func TestTransportSecurity(t *testing.T) {
	t.Parallel()
	ca := securitytest.NewCA(t, "leasehold test CA")
	s := startStack(t, Config{TLS: &tls.Config{
		Certificates: []tls.Certificate{ca.Server(t)},
		ClientCAs:    ca.Pool(),
		ClientAuth:   tls.RequireAndVerifyClientCert,
		MinVersion:   tls.VersionTLS12,
	}})
	withCert := &tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{ca.Client(t, "alpha-svc")}}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	dial := func(t *testing.T, opts ...client.Option) *client.Client {
		t.Helper()
		cl, err := client.Dial(s.addr, append(opts, client.WithToken("dev-alpha"))...)
		if err != nil {
			t.Fatalf("Dial: %v", err)
		}
		t.Cleanup(func() { cl.Close() })
		return cl
	}
	t.Run("A client with a certificate the CA signed completes the handshake and authenticates", func(t *testing.T) {
		_, err := dial(t, client.WithTLS(withCert)).GetBatch(ctx, "b-404")
		if !errors.Is(err, client.ErrNotFound) {
			t.Errorf("GetBatch = %v, want ErrNotFound from the service", err)
		}
	})
	refused := []struct {
		name string
		opts []client.Option
	}{
		{"A client without a certificate is refused", []client.Option{client.WithTLS(&tls.Config{RootCAs: ca.Pool()})}},
		{"A plaintext client is refused", nil},
		{"A client with a certificate of another CA is refused", []client.Option{client.WithTLS(&tls.Config{
			RootCAs: ca.Pool(), Certificates: []tls.Certificate{securitytest.NewCA(t, "other CA").Client(t, "mallory")}})}},
		{"A client that does not trust the server's CA is refused", []client.Option{client.WithTLS(&tls.Config{
			Certificates: []tls.Certificate{ca.Client(t, "alpha-svc")}})}},
	}
	for _, tc := range refused {
		t.Run(tc.name, func(t *testing.T) {
			_, err := dial(t, tc.opts...).GetBatch(ctx, "b-404")
			if !errors.Is(err, client.ErrUnavailable) {
				t.Errorf("GetBatch = %v, want ErrUnavailable: no connection", err)
			}
		})
	}
	t.Run("A renderer over mutual TLS completes a job end to end", func(t *testing.T) {
		s.startRenderer(t, renderer.Config{TLS: &tls.Config{
			RootCAs: ca.Pool(), Certificates: []tls.Certificate{ca.Client(t, "renderer")}}})
		submitAndWait(t, ctx, dial(t, client.WithTLS(withCert)), "alpha",
			&leaseholdv1.Document{Name: "a.pdf", ContentType: "application/pdf", Content: []byte("%PDF-1.7")})
	})
}

// TestTLSWithoutClientCertificates serves TLS without requiring client
// certificates: a client that trusts the CA gets through without one.
func TestTLSWithoutClientCertificates(t *testing.T) {
	t.Parallel()
	ca := securitytest.NewCA(t, "leasehold test CA")
	s := startStack(t, Config{TLS: &tls.Config{Certificates: []tls.Certificate{ca.Server(t)}, MinVersion: tls.VersionTLS12}})
	if got := s.c.tlsMode(); got != "tls" {
		t.Errorf("tlsMode = %q, want tls", got)
	}
	cl, err := client.Dial(s.addr, client.WithTLS(&tls.Config{RootCAs: ca.Pool()}), client.WithToken("dev-alpha"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := cl.GetBatch(ctx, "b-404"); !errors.Is(err, client.ErrNotFound) {
		t.Errorf("GetBatch = %v, want ErrNotFound from the service", err)
	}
}
