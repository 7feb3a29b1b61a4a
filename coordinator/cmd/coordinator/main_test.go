package main

import (
	"context"
	"errors"
	"flag"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/leasehold/leasehold/coordinator"
	"go.uber.org/goleak"
)

// runMainEnv, set in a child process of the test binary, makes it run main
// with its arguments instead of the tests.
const runMainEnv = "COORDINATOR_TEST_RUN_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(runMainEnv) == "1" {
		main()
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

// TestParseFlags checks defaults, environment defaults and the command
// line's precedence over them.
func TestParseFlags(t *testing.T) {
	t.Run("Defaults match the documented ones", func(t *testing.T) {
		cfg, level, err := parseFlags([]string{"--dev"}, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		if cfg.Listen != "127.0.0.1:7070" || cfg.LeaseTTL != 15*time.Second || cfg.MaxAttempts != 5 || cfg.DisableRunningCancel || level != slog.LevelInfo {
			t.Errorf("defaults = %+v level %v", cfg, level)
		}
		if cfg.MetricsListen != "127.0.0.1:7071" {
			t.Errorf("metrics address = %q, want 127.0.0.1:7071 (not Prometheus's own 9090)", cfg.MetricsListen)
		}
		if cfg.MaxBatchInlineBytes != 16<<20 {
			t.Errorf("max batch inline bytes = %d, want 16 MiB", cfg.MaxBatchInlineBytes)
		}
		if len(cfg.Unsupported) == 0 {
			t.Errorf("no default unsupported formats")
		}
		if got, want := []time.Duration{cfg.Retention, cfg.RejectionRetention, cfg.AuditRetention}, []time.Duration{7 * day, 30 * day, 365 * day}; !cmp.Equal(got, want) {
			t.Errorf("retention of jobs, rejections, audit = %v, want %v", got, want)
		}
	})
	t.Run("Retention takes days, durations and 0 for forever", func(t *testing.T) {
		t.Setenv("LEASEHOLD_AUDIT_RETENTION", "0")
		cfg, _, err := parseFlags([]string{"--dev", "--retention", "14d", "--rejection-retention", "36h"}, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := []time.Duration{cfg.Retention, cfg.RejectionRetention, cfg.AuditRetention}, []time.Duration{14 * day, 36 * time.Hour, 0}; !cmp.Equal(got, want) {
			t.Errorf("retention = %v, want %v", got, want)
		}
	})
	t.Run("The environment sets defaults and flags override them", func(t *testing.T) {
		t.Setenv("LEASEHOLD_LEASE_TTL", "30s")
		t.Setenv("LEASEHOLD_LISTEN", "127.0.0.1:1")
		t.Setenv("LEASEHOLD_RUNNING_CANCEL", "false")
		t.Setenv("LEASEHOLD_MAX_BATCH_INLINE_BYTES", "1048576")
		t.Setenv("LEASEHOLD_TEAM_SHARE", "1")
		cfg, _, err := parseFlags([]string{"--dev", "--listen", "127.0.0.1:2", "--team-weights", "alpha=3, beta=1", "--unsupported", ".exe, ,.js", "--log-level", "debug"}, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		if cfg.LeaseTTL != 30*time.Second || cfg.Listen != "127.0.0.1:2" || !cfg.DisableRunningCancel {
			t.Errorf("lease ttl %v listen %s disable running cancel %v; want 30s, 127.0.0.1:2, true", cfg.LeaseTTL, cfg.Listen, cfg.DisableRunningCancel)
		}
		if cfg.MaxBatchInlineBytes != 1<<20 || cfg.TeamShare != 1 {
			t.Errorf("max batch inline bytes %d team share %v; want 1 MiB, 1", cfg.MaxBatchInlineBytes, cfg.TeamShare)
		}
		if diff := cmp.Diff(map[string]int{"alpha": 3, "beta": 1}, cfg.TeamWeights); diff != "" {
			t.Errorf("weights (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff([]string{".exe", ".js"}, cfg.Unsupported); diff != "" {
			t.Errorf("unsupported (-want +got):\n%s", diff)
		}
	})
	t.Run("A malformed environment value is a usage error", func(t *testing.T) {
		t.Setenv("LEASEHOLD_MAX_ATTEMPTS", "many")
		_, _, err := parseFlags(nil, io.Discard)
		var uerr *usageError
		if !errors.As(err, &uerr) {
			t.Errorf("parseFlags with LEASEHOLD_MAX_ATTEMPTS=many = %v, want a usage error", err)
		}
	})
	t.Run("Malformed team weights are an error", func(t *testing.T) {
		for _, s := range []string{"alpha", "alpha=0", "=3", "alpha=x"} {
			if _, err := parseWeights(s); err == nil {
				t.Errorf("parseWeights(%q) succeeded", s)
			}
		}
	})
	t.Run("Help prints the usage, with the metrics default and the receive limit formula", func(t *testing.T) {
		var out strings.Builder
		if _, _, err := parseFlags([]string{"--help"}, &out); !errors.Is(err, flag.ErrHelp) {
			t.Fatalf("parseFlags(--help) = %v, want flag.ErrHelp", err)
		}
		for _, want := range []string{"127.0.0.1:7071", "--max-documents × 4 KiB", "LEASEHOLD_MAX_BATCH_INLINE_BYTES"} {
			if !strings.Contains(out.String(), want) {
				t.Errorf("usage lacks %q", want)
			}
		}
		if strings.Contains(out.String(), "9090\"") || strings.Contains(out.String(), ":9090") {
			t.Errorf("usage still offers port 9090")
		}
	})
}

// TestInvalidConfigurationExitsTwo runs the command with one invalid value
// at a time, from a flag or the environment, and checks that it prints one
// line naming it, exits with status 2 and creates no data directory.
func TestInvalidConfigurationExitsTwo(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		args []string
		env  []string
		want string
	}{
		{"zero lease TTL", []string{"--lease-ttl", "0s"}, nil, "--lease-ttl=0s"},
		{"negative lease TTL", []string{"--lease-ttl", "-1s"}, nil, "--lease-ttl=-1s"},
		{"lease TTL below the floor", []string{"--lease-ttl", "1ms"}, nil, "--lease-ttl=1ms: want at least 100ms"},
		{"negative replay limit", []string{"--replay-limit", "-1"}, nil, "--replay-limit=-1"},
		{"zero replay limit", []string{"--replay-limit", "0"}, nil, "--replay-limit=0"},
		{"negative team share", []string{"--team-share", "-0.5"}, nil, "--team-share=-0.5"},
		{"zero team share", []string{"--team-share", "0"}, nil, "--team-share=0"},
		{"team share above 1", []string{"--team-share", "1.5"}, nil, "--team-share=1.5"},
		{"team share not a number", []string{"--team-share", "NaN"}, nil, "--team-share=NaN"},
		{"team weights that do not parse", []string{"--team-weights", "alpha=x"}, nil, "--team-weights="},
		{"a zero team weight", []string{"--team-weights", "alpha=0"}, nil, "--team-weights="},
		{"zero max attempts", []string{"--max-attempts", "0"}, nil, "--max-attempts=0"},
		{"negative max attempts", []string{"--max-attempts", "-1"}, nil, "-max-attempts"},
		{"max attempts over 32 bits", []string{"--max-attempts", "4294967296"}, nil, "--max-attempts=4294967296"},
		{"negative max documents", []string{"--max-documents", "-5"}, nil, "--max-documents=-5"},
		{"zero max document bytes", []string{"--max-document-bytes", "0"}, nil, "--max-document-bytes=0"},
		{"negative max batch bytes", []string{"--max-batch-bytes", "-1"}, nil, "--max-batch-bytes=-1"},
		{"negative max inline bytes", []string{"--max-inline-bytes", "-1"}, nil, "--max-inline-bytes=-1"},
		{"negative max batch inline bytes", []string{"--max-batch-inline-bytes", "-1"}, nil, "--max-batch-inline-bytes=-1"},
		{"a receive limit over 2 GiB", []string{"--max-batch-inline-bytes", "2147483647"}, nil, "--max-batch-inline-bytes=2147483647"},
		{"zero max team queue", []string{"--max-team-queue", "0"}, nil, "--max-team-queue=0"},
		{"negative max artifact bytes", []string{"--max-artifact-bytes", "-1"}, nil, "--max-artifact-bytes=-1"},
		{"an upload buffer smaller than one preview", []string{"--max-upload-buffer-bytes", "1024"}, nil, "--max-upload-buffer-bytes=1024: want at least --max-artifact-bytes"},
		{"backoff base above its cap", []string{"--backoff-base", "10m", "--backoff-cap", "1m"}, nil, "--backoff-base=10m0s: want at most --backoff-cap"},
		{"zero backoff cap", []string{"--backoff-cap", "0s"}, nil, "--backoff-cap=0s"},
		{"negative backoff base", []string{"--backoff-base", "-1s"}, nil, "--backoff-base=-1s"},
		{"zero shutdown timeout", []string{"--shutdown-timeout", "0s"}, nil, "--shutdown-timeout=0s"},
		{"a listen address without a port", []string{"--listen", "localhost"}, nil, `--listen="localhost"`},
		{"a metrics address without a port", []string{"--metrics-listen", "127.0.0.1"}, nil, `--metrics-listen="127.0.0.1"`},
		{"metrics on the gRPC address", []string{"--listen", "127.0.0.1:7070", "--metrics-listen", "127.0.0.1:7070"}, nil, "--metrics-listen="},
		{"an empty data directory", []string{"--data-dir", ""}, nil, `--data-dir=""`},
		{"an unknown log level", []string{"--log-level", "loud"}, nil, "-log-level"},
		{"an unknown flag", []string{"--no-such-flag"}, nil, "no-such-flag"},
		{"a stray argument", []string{"serve"}, nil, "unexpected arguments"},
		{"a retention under an hour", []string{"--retention", "30m"}, nil, "--retention=30m0s: want 0 (keep forever) or at least 1h"},
		{"a retention that does not parse", []string{"--audit-retention", "1y"}, nil, "-audit-retention"},
		{"a negative retention from the environment", nil, []string{"LEASEHOLD_REJECTION_RETENTION=-1h"}, "LEASEHOLD_REJECTION_RETENTION=-1h0m0s: want 0"},
		{"a negative team share from the environment", nil, []string{"LEASEHOLD_TEAM_SHARE=-0.5"}, "LEASEHOLD_TEAM_SHARE=-0.5"},
		{"a malformed number from the environment", nil, []string{"LEASEHOLD_MAX_ATTEMPTS=many"}, "LEASEHOLD_MAX_ATTEMPTS"},
		{"a zero lease TTL from the environment", nil, []string{"LEASEHOLD_LEASE_TTL=0s"}, "LEASEHOLD_LEASE_TTL=0s"},
		{"team weights from the environment", nil, []string{"LEASEHOLD_TEAM_WEIGHTS=alpha"}, "LEASEHOLD_TEAM_WEIGHTS="},
		{"a plaintext raft listener on every interface", raftArgs("0.0.0.0:7201", "n1=127.0.0.1:7201"), nil,
			"the raft listener 0.0.0.0:7201 is not on loopback; give the peers mutual TLS"},
		{"a plaintext raft listener with no host", raftArgs(":7201", "n1=127.0.0.1:7201"), nil, "the raft listener :7201 is not on loopback"},
		{"a plaintext raft listener on another address", raftArgs("192.0.2.1:7201", "n1=192.0.2.1:7201"), nil,
			"--raft-insecure-plaintext-trusted-network where the network encrypts"},
		{"a plaintext raft peer on another host", raftArgs("127.0.0.1:7201", "n1=127.0.0.1:7201,n2=192.0.2.2:7201,n3=127.0.0.1:7203"), nil,
			"peer n2's raft address 192.0.2.2:7201 is not on loopback"},
		{"a batch too large for one raft entry", append(raftArgs("127.0.0.1:7201", "n1=127.0.0.1:7201"), "--max-batch-inline-bytes", "33554432"), nil,
			"--max-batch-inline-bytes=33554432, --max-documents=500, --max-artifact-bytes=8388608: in a cluster each writer group is one raft entry, at most 48 MiB"},
		{"the plaintext opt-out alone", []string{"--raft-insecure-plaintext-trusted-network"}, nil, "needs --node-id, --raft-listen and --peers"},
		{"a flag over a valid environment value is named as the flag", []string{"--replay-limit", "-3"}, []string{"LEASEHOLD_REPLAY_LIMIT=5"}, "--replay-limit=-3"},
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
			for _, d := range []string{dataDir, filepath.Join(dir, "data")} {
				if _, err := os.Stat(d); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("%s exists after a refused configuration", d)
				}
			}
		})
	}
}

// raftArgs are the flags of cluster node n1 listening for raft on listen.
func raftArgs(listen, peers string) []string {
	return []string{"--node-id", "n1", "--raft-listen", listen, "--peers", peers}
}

// runCommand runs the test binary as the command in dir with args and the
// environment (LEASEHOLD_* variables of the test's own environment
// removed, env added), and returns its exit status and standard error.
func runCommand(t *testing.T, dir string, args, env []string) (int, string) {
	t.Helper()
	// Failsafe only: a refused configuration exits at once.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], args...)
	cmd.Dir = dir
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "LEASEHOLD_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(append(cmd.Env, runMainEnv+"=1"), env...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return 0, stderr.String()
	case errors.As(err, &exit):
		return exit.ExitCode(), stderr.String()
	}
	t.Fatalf("running the command: %v", err)
	return 0, ""
}

// TestOfflineCommands runs compact and restore on a data directory, and on
// one a running coordinator holds.
func TestOfflineCommands(t *testing.T) {
	t.Parallel()
	// A data directory with a database in it, closed.
	dir := t.TempDir()
	c, err := coordinator.New(coordinator.Config{DataDir: dir, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	backup := filepath.Join(t.TempDir(), "backup.db")
	data, err := os.ReadFile(filepath.Join(dir, coordinator.DBFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(backup, data, 0o600); err != nil {
		t.Fatal(err)
	}

	t.Run("Compact and restore work offline", func(t *testing.T) {
		var out strings.Builder
		if err := run([]string{"compact", "--data-dir", dir}, &out); err != nil {
			t.Fatalf("compact: %v", err)
		}
		if err := run([]string{"restore", "--data-dir", dir, "--from", backup}, &out); err != nil {
			t.Fatalf("restore: %v", err)
		}
		for _, want := range []string{"compacted " + filepath.Join(dir, coordinator.DBFile), "restored " + backup, "is kept as"} {
			if !strings.Contains(out.String(), want) {
				t.Errorf("output %q lacks %q", out.String(), want)
			}
		}
	})
	t.Run("A running coordinator's directory is refused", func(t *testing.T) {
		held := t.TempDir()
		c, err := coordinator.New(coordinator.Config{DataDir: held, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		for _, args := range [][]string{{"compact", "--data-dir", held}, {"restore", "--data-dir", held, "--from", backup}} {
			err := run(args, io.Discard)
			if !errors.Is(err, coordinator.ErrDataDirInUse) || !strings.Contains(err.Error(), "locked by a running coordinator") {
				t.Errorf("%s: %v, want ErrDataDirInUse saying the database is locked by a running coordinator", args[0], err)
			}
		}
	})
	t.Run("Restore needs a backup file", func(t *testing.T) {
		var uerr *usageError
		if err := run([]string{"restore", "--data-dir", dir}, io.Discard); !errors.As(err, &uerr) {
			t.Errorf("restore without --from: %v, want a usage error", err)
		}
	})
}
