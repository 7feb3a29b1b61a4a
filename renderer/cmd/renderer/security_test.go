package main

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/leasehold/leasehold/internal/logformat"
	"github.com/leasehold/leasehold/internal/security/securitytest"
)

// TestParseOptionsTransport checks the TLS, plaintext and log format
// flags and variables, and that every mistake among them is a usage
// error naming the flag.
func TestParseOptionsTransport(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca := securitytest.NewCA(t, "test CA")
	caFile := ca.File(t, dir)
	cert, key := securitytest.WriteKeyPair(t, dir, "client", ca.Client(t, "renderer"))

	t.Run("no TLS flag connects in plaintext with auto logs", func(t *testing.T) {
		t.Parallel()
		o, err := parseOptions(nil, envOf(nil), &bytes.Buffer{})
		if err != nil {
			t.Fatal(err)
		}
		if o.worker.TLS != nil || o.worker.InsecurePlaintext || o.logFormat != logformat.Auto {
			t.Errorf("TLS %+v, insecure plaintext %v, log format %q; want none, false, auto", o.worker.TLS, o.worker.InsecurePlaintext, o.logFormat)
		}
	})
	t.Run("--tls alone verifies with the system's roots", func(t *testing.T) {
		t.Parallel()
		o, err := parseOptions([]string{"--tls"}, envOf(nil), &bytes.Buffer{})
		if err != nil {
			t.Fatal(err)
		}
		if o.worker.TLS == nil || o.worker.TLS.RootCAs != nil {
			t.Errorf("TLS = %+v, want TLS with the system's roots", o.worker.TLS)
		}
	})
	t.Run("the environment sets mutual TLS and the server name", func(t *testing.T) {
		t.Parallel()
		o, err := parseOptions(nil, envOf(map[string]string{
			"LEASEHOLD_TLS_CA": caFile, "LEASEHOLD_TLS_CERT": cert, "LEASEHOLD_TLS_KEY": key,
			"LEASEHOLD_TLS_SERVER_NAME": "coordinator.internal", "LEASEHOLD_LOG_FORMAT": "json",
		}), &bytes.Buffer{})
		if err != nil {
			t.Fatal(err)
		}
		c := o.worker.TLS
		if c == nil || c.RootCAs == nil || len(c.Certificates) != 1 || c.ServerName != "coordinator.internal" || o.logFormat != logformat.JSON {
			t.Errorf("TLS = %+v, log format %q; want the CA, a certificate, the server name and JSON", c, o.logFormat)
		}
	})
	t.Run("--insecure-plaintext from the environment", func(t *testing.T) {
		t.Parallel()
		o, err := parseOptions(nil, envOf(map[string]string{"LEASEHOLD_INSECURE_PLAINTEXT": "true"}), &bytes.Buffer{})
		if err != nil {
			t.Fatal(err)
		}
		if !o.worker.InsecurePlaintext {
			t.Errorf("insecure plaintext not set")
		}
	})
	refused := []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"a certificate without its key", []string{"--tls-cert", cert}, nil, "--tls-cert and --tls-key"},
		{"TLS with insecure plaintext", []string{"--tls-ca", caFile, "--insecure-plaintext"}, nil, "--insecure-plaintext"},
		{"a CA file that does not exist", []string{"--tls-ca", dir + "/none.pem"}, nil, "none.pem"},
		{"an unknown log format", []string{"--log-format", "xml"}, nil, "--log-format"},
		{"a malformed boolean variable", nil, map[string]string{"LEASEHOLD_INSECURE_PLAINTEXT": "maybe"}, "LEASEHOLD_INSECURE_PLAINTEXT"},
	}
	for _, tc := range refused {
		t.Run("refused: "+tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := parseOptions(tc.args, envOf(tc.env), &bytes.Buffer{})
			if _, ok := errors.AsType[*usageError](err); !ok || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("parseOptions = %v, want a usage error naming %q", err, tc.want)
			}
		})
	}
}
