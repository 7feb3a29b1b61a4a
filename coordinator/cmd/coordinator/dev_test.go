package main

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/leasehold/leasehold/internal/security/securitytest"
)

// TestPrincipalsAreExplicit runs the command without a principals file:
// the public development tokens are served only when --dev asks for them,
// and even then never on a listener that accepts a token from other
// machines, the console's included.
func TestPrincipalsAreExplicit(t *testing.T) {
	t.Parallel()
	files := t.TempDir()
	ca := securitytest.NewCA(t, "test CA")
	cert, key := securitytest.WriteKeyPair(t, files, "server", ca.Server(t))
	tokens := filepath.Join(files, "principals.json")
	if err := os.WriteFile(tokens, []byte(`{"principals":[{"name":"ops","token":"ops-token-0123456789","roles":["operator"],"scope":["*"]}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	consoleOnEveryInterface := []string{"--listen", "127.0.0.1:0", "--metrics-listen", "0.0.0.0:0", "--console", "--tls-cert", cert, "--tls-key", key}
	tests := []struct {
		name string
		args []string
		env  []string
		code int
		want string
	}{
		{"Neither --tokens nor --dev is refused", []string{"--listen", "127.0.0.1:0", "--metrics-listen", ""}, nil, 2,
			"no principals: pass --tokens FILE (a principals file), or --dev for the public development tokens on loopback"},
		{"A console on every interface without --tokens is refused", consoleOnEveryInterface, nil, 2, "no principals"},
		{"A console on every interface with --dev is refused", append([]string{"--dev"}, consoleOnEveryInterface...), nil, 1,
			"refusing to serve the console with the public development tokens on "},
		{"LEASEHOLD_DEV counts as --dev", consoleOnEveryInterface, []string{"LEASEHOLD_DEV=true"}, 1,
			"refusing to serve the console with the public development tokens"},
		{"--dev on a network address is refused", []string{"--dev", "--listen", "0.0.0.0:0", "--metrics-listen", ""}, nil, 1,
			"listen address 0.0.0.0:0 is not loopback"},
		{"--dev with --tokens is refused", []string{"--dev", "--tokens", tokens, "--listen", "127.0.0.1:0", "--metrics-listen", ""}, nil, 2,
			"--dev and --tokens exclude each other"},
		{"--console-host without a metrics address is refused", []string{"--dev", "--listen", "127.0.0.1:0", "--metrics-listen", "", "--console-host", "coord.example"}, nil, 2,
			"--console-host needs a metrics address (--metrics-listen)"},
		{"A console host that is not a host is refused", []string{"--dev", "--listen", "127.0.0.1:0", "--console", "--console-host", "a:b:c"}, nil, 2,
			`--console-host="a:b:c": host "a:b:c" is not a host name or an IP address`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			dataDir := filepath.Join(dir, "data")
			code, stderr := runCommand(t, dir, append([]string{"--data-dir", dataDir}, tc.args...), tc.env)
			if code != tc.code || !strings.Contains(stderr, tc.want) {
				t.Errorf("exit status %d, stderr:\n%s\nwant %d and %q", code, stderr, tc.code, tc.want)
			}
			if code == 2 {
				if _, err := os.Stat(dataDir); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("%s exists after a refused configuration", dataDir)
				}
			}
		})
	}
}

func TestConsoleHostFlag(t *testing.T) {
	t.Setenv("LEASEHOLD_CONSOLE_HOST", "")
	cfg, _, err := parseFlags([]string{"--dev", "--console", "--console-host", "coord.example, coord.example:8443", "--console-host", "10.0.0.5"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"coord.example", "coord.example:8443", "10.0.0.5"}, cfg.ConsoleHosts); diff != "" {
		t.Errorf("console hosts (-want +got):\n%s", diff)
	}
}
