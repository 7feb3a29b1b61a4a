package security_test

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/leasehold/leasehold/internal/security"
	"github.com/leasehold/leasehold/internal/security/securitytest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestRemoteTarget(t *testing.T) {
	t.Parallel()
	tests := []struct {
		target string
		remote bool
	}{
		{"127.0.0.1:7070", false},
		{"127.8.9.10:7070", false},
		{"[::1]:7070", false},
		{"localhost:7070", false},
		{"LOCALHOST:7070", false},
		{"dns:///localhost:7070", false},
		{"passthrough:///127.0.0.1:7070", false},
		{"unix:///run/leasehold.sock", false},
		{"passthrough:///bufconn", false},
		{"10.0.0.5:7070", true},
		{"[2001:db8::1]:7070", true},
		{"coordinator.prod:7070", true},
		{"dns:///coordinator.prod:7070", true},
		{"0.0.0.0:7070", true},
	}
	for _, tc := range tests {
		if _, got := security.RemoteTarget(tc.target); got != tc.remote {
			t.Errorf("RemoteTarget(%q) remote = %v, want %v", tc.target, got, tc.remote)
		}
	}
}

func TestLocalAddr(t *testing.T) {
	t.Parallel()
	tests := []struct {
		addr  net.Addr
		local bool
	}{
		{&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1}, true},
		{&net.TCPAddr{IP: net.IPv6loopback, Port: 1}, true},
		{&net.TCPAddr{IP: net.IPv4(10, 0, 0, 1), Port: 1}, false},
		{&net.UnixAddr{Name: "/run/x.sock", Net: "unix"}, true},
		{fakeAddr{"tcp", "192.168.1.1:1"}, false},
		{fakeAddr{"tcp", "127.0.0.1:1"}, true},
		{fakeAddr{"bufconn", "bufconn"}, true},
	}
	for _, tc := range tests {
		if got := security.LocalAddr(tc.addr); got != tc.local {
			t.Errorf("LocalAddr(%s %s) = %v, want %v", tc.addr.Network(), tc.addr, got, tc.local)
		}
	}
}

type fakeAddr struct{ network, addr string }

func (a fakeAddr) Network() string { return a.network }
func (a fakeAddr) String() string  { return a.addr }

// TestDialOptions checks the bearer token rule: no plaintext token to
// another host unless allowed, TLS anywhere.
func TestDialOptions(t *testing.T) {
	t.Parallel()
	tlsCreds := credentials.NewTLS(&tls.Config{})
	tests := []struct {
		name    string
		targets []string
		c       security.Client
		wantErr error
	}{
		{"a token in plaintext to loopback", []string{"127.0.0.1:7070"}, security.Client{Token: "t"}, nil},
		{"a token in plaintext to another host", []string{"10.0.0.5:7070"}, security.Client{Token: "t"}, security.ErrPlaintextToken},
		{"a token in plaintext to a name", []string{"coordinator:7070"}, security.Client{Token: "t"}, security.ErrPlaintextToken},
		{"a token in plaintext to another host, allowed", []string{"10.0.0.5:7070"}, security.Client{Token: "t", InsecurePlaintext: true}, nil},
		{"a token over TLS to another host", []string{"10.0.0.5:7070"}, security.Client{Token: "t", Creds: tlsCreds}, nil},
		{"no token in plaintext to another host", []string{"10.0.0.5:7070"}, security.Client{}, nil},
		{"TLS and insecure plaintext together", []string{"10.0.0.5:7070"}, security.Client{Creds: tlsCreds, InsecurePlaintext: true}, errors.New("any")},
		{"explicitly insecure credentials", []string{"10.0.0.5:7070"}, security.Client{Token: "t", Creds: insecure.NewCredentials()}, nil},
		{"a token in plaintext to replicas on loopback", []string{"127.0.0.1:7070", "localhost:7071", "[::1]:7072"}, security.Client{Token: "t"}, nil},
		{"a token in plaintext to replicas, one on another host", []string{"127.0.0.1:7070", "10.0.0.5:7070", "127.0.0.1:7072"}, security.Client{Token: "t"}, security.ErrPlaintextToken},
		{"a token over TLS to replicas on other hosts", []string{"10.0.0.5:7070", "10.0.0.6:7070"}, security.Client{Token: "t", Creds: tlsCreds}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			opts, err := tc.c.DialOptions(tc.targets...)
			switch {
			case tc.wantErr == nil && err != nil:
				t.Errorf("DialOptions = %v, want no error", err)
			case tc.wantErr == nil && len(opts) == 0:
				t.Errorf("DialOptions returned no options")
			case tc.wantErr != nil && err == nil:
				t.Errorf("DialOptions succeeded, want an error")
			case errors.Is(tc.wantErr, security.ErrPlaintextToken) && !errors.Is(err, security.ErrPlaintextToken):
				t.Errorf("DialOptions = %v, want ErrPlaintextToken", err)
			}
		})
	}
}

// TestLoopbackOnly checks that the plaintext transport refuses, before
// anything is written, a connection that reached another host.
func TestLoopbackOnly(t *testing.T) {
	t.Parallel()
	creds := security.LoopbackOnly().Clone()
	remote := &recordingConn{remote: &net.TCPAddr{IP: net.IPv4(10, 0, 0, 5), Port: 7070}}
	if _, _, err := creds.ClientHandshake(context.Background(), "x", remote); !errors.Is(err, security.ErrPlaintextToken) {
		t.Errorf("handshake with %s = %v, want ErrPlaintextToken", remote.remote, err)
	}
	if !remote.closed || remote.written > 0 {
		t.Errorf("refused connection closed %v with %d bytes written, want closed with none", remote.closed, remote.written)
	}
	local := &recordingConn{remote: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 7070}}
	if _, _, err := creds.ClientHandshake(context.Background(), "x", local); err != nil {
		t.Errorf("handshake with loopback = %v", err)
	}
}

// recordingConn is a net.Conn that records writes and Close.
type recordingConn struct {
	net.Conn
	remote  net.Addr
	written int
	closed  bool
}

func (c *recordingConn) RemoteAddr() net.Addr        { return c.remote }
func (c *recordingConn) Write(b []byte) (int, error) { c.written += len(b); return len(b), nil }
func (c *recordingConn) Close() error                { c.closed = true; return nil }

// TestLoadingFiles checks the TLS configurations built from PEM files and
// the errors for files that are missing, mismatched or not PEM.
func TestLoadingFiles(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca := securitytest.NewCA(t, "test CA")
	caFile := ca.File(t, dir)
	certFile, keyFile := securitytest.WriteKeyPair(t, dir, "server", ca.Server(t))
	clientCert, clientKey := securitytest.WriteKeyPair(t, dir, "client", ca.Client(t, "c"))
	notPEM := filepath.Join(dir, "not.pem")
	if err := os.WriteFile(notPEM, []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}

	t.Run("A server with a client CA requires client certificates", func(t *testing.T) {
		t.Parallel()
		cfg, err := security.ServerTLS(certFile, keyFile, caFile)
		if err != nil {
			t.Fatal(err)
		}
		if cfg.ClientAuth != tls.RequireAndVerifyClientCert || cfg.ClientCAs == nil || len(cfg.Certificates) != 1 || cfg.MinVersion != tls.VersionTLS12 {
			t.Errorf("config = %+v", cfg)
		}
	})
	t.Run("A server without a client CA does not ask for certificates", func(t *testing.T) {
		t.Parallel()
		cfg, err := security.ServerTLS(certFile, keyFile, "")
		if err != nil {
			t.Fatal(err)
		}
		if cfg.ClientAuth != tls.NoClientCert {
			t.Errorf("ClientAuth = %v, want none", cfg.ClientAuth)
		}
	})
	t.Run("A client carries its CA, certificate and server name", func(t *testing.T) {
		t.Parallel()
		cfg, err := security.ClientTLS(caFile, clientCert, clientKey, "coordinator.internal")
		if err != nil {
			t.Fatal(err)
		}
		if cfg.RootCAs == nil || len(cfg.Certificates) != 1 || cfg.ServerName != "coordinator.internal" {
			t.Errorf("config = %+v", cfg)
		}
	})
	errs := []struct {
		name string
		load func() error
		want string
	}{
		{"a server key that does not match", func() error { _, err := security.ServerTLS(certFile, clientKey, ""); return err }, "key pair"},
		{"a server without a key", func() error { _, err := security.ServerTLS(certFile, "", ""); return err }, "key file"},
		{"a client CA that is not PEM", func() error { _, err := security.ServerTLS(certFile, keyFile, notPEM); return err }, "no PEM certificate"},
		{"a missing CA file", func() error { _, err := security.ClientTLS(filepath.Join(dir, "none.pem"), "", "", ""); return err }, "none.pem"},
		{"a client certificate without its key", func() error { _, err := security.ClientTLS("", clientCert, "", ""); return err }, "key file"},
	}
	for _, tc := range errs {
		t.Run("Refused: "+tc.name, func(t *testing.T) {
			t.Parallel()
			err := tc.load()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error = %v, want one mentioning %q", err, tc.want)
			}
		})
	}
}
