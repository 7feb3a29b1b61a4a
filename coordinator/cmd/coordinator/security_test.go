package main

import (
	"crypto/tls"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/leasehold/leasehold/internal/security/securitytest"
)

// TestTLSAndLogFlags checks that the TLS flags, from the command line or
// the environment, load the certificates, and that logs are JSON unless
// asked otherwise when stderr is not a terminal.
func TestTLSAndLogFlags(t *testing.T) {
	dir := t.TempDir()
	ca := securitytest.NewCA(t, "test CA")
	caFile := ca.File(t, dir)
	cert, key := securitytest.WriteKeyPair(t, dir, "server", ca.Server(t))

	t.Run("No TLS flag serves plaintext", func(t *testing.T) {
		cfg, _, err := parseFlags([]string{"--dev"}, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		if cfg.TLS != nil || cfg.HTTPTLS != nil {
			t.Errorf("TLS = %+v, HTTPTLS = %+v, want nil", cfg.TLS, cfg.HTTPTLS)
		}
	})
	t.Run("Certificate and key serve TLS without client certificates", func(t *testing.T) {
		cfg, _, err := parseFlags([]string{"--dev", "--tls-cert", cert, "--tls-key", key}, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		if cfg.TLS == nil || len(cfg.TLS.Certificates) != 1 || cfg.TLS.ClientAuth != tls.NoClientCert {
			t.Errorf("TLS = %+v, want one certificate and no client authentication", cfg.TLS)
		}
	})
	t.Run("The environment sets mutual TLS", func(t *testing.T) {
		t.Setenv("LEASEHOLD_TLS_CERT", cert)
		t.Setenv("LEASEHOLD_TLS_KEY", key)
		t.Setenv("LEASEHOLD_TLS_CLIENT_CA", caFile)
		cfg, _, err := parseFlags([]string{"--dev"}, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		if cfg.TLS == nil || cfg.TLS.ClientAuth != tls.RequireAndVerifyClientCert || cfg.TLS.ClientCAs == nil {
			t.Errorf("TLS = %+v, want client certificates required", cfg.TLS)
		}
		// The metrics address asks for none: Prometheus and browsers
		// come without one.
		if cfg.HTTPTLS == nil || len(cfg.HTTPTLS.Certificates) != 1 || cfg.HTTPTLS.ClientAuth != tls.NoClientCert {
			t.Errorf("HTTPTLS = %+v, want the certificate and no client authentication", cfg.HTTPTLS)
		}
	})
	for _, tc := range []struct {
		name string
		args []string
		json bool
	}{
		{"Logs are JSON by default off a terminal", nil, true},
		{"--log-format text writes text", []string{"--log-format", "text"}, false},
		{"--log-format json writes JSON", []string{"--log-format", "json"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out strings.Builder
			cfg, _, err := parseFlags(append([]string{"--dev"}, tc.args...), &out)
			if err != nil {
				t.Fatal(err)
			}
			cfg.Logger.Info("hello")
			var m map[string]any
			if got := json.Unmarshal([]byte(out.String()), &m) == nil; got != tc.json {
				t.Errorf("log line %q: JSON = %v, want %v", out.String(), got, tc.json)
			}
		})
	}
}

// TestInvalidSecurityConfigurationExitsTwo runs the command with TLS,
// log format and OTEL_* settings it must refuse, and checks that each
// prints one line naming the culprit, exits 2 and creates nothing.
func TestInvalidSecurityConfigurationExitsTwo(t *testing.T) {
	t.Parallel()
	files := t.TempDir()
	ca := securitytest.NewCA(t, "test CA")
	cert, key := securitytest.WriteKeyPair(t, files, "server", ca.Server(t))
	_, otherKey := securitytest.WriteKeyPair(t, files, "other", ca.Server(t))
	notPEM := filepath.Join(files, "not.pem")
	if err := os.WriteFile(notPEM, []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		args []string
		env  []string
		want string
	}{
		{"a certificate without its key", []string{"--tls-cert", cert}, nil, "--tls-cert and --tls-key go together"},
		{"a key without its certificate", []string{"--tls-key", key}, nil, "--tls-cert and --tls-key go together"},
		{"a client CA without a server certificate", []string{"--tls-client-ca", cert}, nil, "--tls-client-ca needs --tls-cert"},
		{"a certificate file that does not exist", []string{"--tls-cert", filepath.Join(files, "none.pem"), "--tls-key", key}, nil, "--tls-cert="},
		{"a key that does not match", []string{"--tls-cert", cert, "--tls-key", otherKey}, nil, "--tls-key="},
		{"a client CA that is not PEM", []string{"--tls-cert", cert, "--tls-key", key, "--tls-client-ca", notPEM}, nil, "--tls-client-ca="},
		{"a client CA from the environment that is not PEM", []string{"--tls-cert", cert, "--tls-key", key},
			[]string{"LEASEHOLD_TLS_CLIENT_CA=" + notPEM}, "LEASEHOLD_TLS_CLIENT_CA="},
		{"an unknown log format", []string{"--log-format", "xml"}, nil, "-log-format"},
		{"an unknown log format from the environment", nil, []string{"LEASEHOLD_LOG_FORMAT=xml"}, "LEASEHOLD_LOG_FORMAT="},
		{"a trace exporter this build lacks", nil, []string{"OTEL_TRACES_EXPORTER=zipkin"}, "OTEL_TRACES_EXPORTER="},
		{"an OTLP protocol this build lacks", nil, []string{"OTEL_TRACES_EXPORTER=otlp", "OTEL_EXPORTER_OTLP_PROTOCOL=http/json"}, "OTEL_EXPORTER_OTLP_PROTOCOL="},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			dataDir := filepath.Join(dir, "data")
			args := append([]string{"--data-dir", dataDir, "--listen", "127.0.0.1:0", "--metrics-listen", "", "--dev"}, tc.args...)
			code, stderr := runCommand(t, dir, args, tc.env)
			if code != 2 {
				t.Errorf("exit status = %d, want 2; stderr:\n%s", code, stderr)
			}
			lines := strings.Split(strings.TrimSpace(stderr), "\n")
			if len(lines) != 1 || !strings.Contains(lines[0], tc.want) {
				t.Errorf("stderr = %q, want one line containing %q", stderr, tc.want)
			}
			if _, err := os.Stat(dataDir); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("%s exists after a refused configuration", dataDir)
			}
		})
	}
}
