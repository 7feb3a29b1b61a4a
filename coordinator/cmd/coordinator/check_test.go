package main

import (
	"encoding/json"
	"errors"
	"flag"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"github.com/leasehold/leasehold/coordinator"
)

// TestCheckCommand runs "coordinator check" on a data directory a
// coordinator created and closed, in text and JSON, and on a directory
// without a database.
func TestCheckCommand(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "data")
	c, err := coordinator.New(coordinator.Config{Listen: "127.0.0.1:0", DataDir: dir, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}

	t.Run("A consistent database is reported and exits 0", func(t *testing.T) {
		t.Parallel()
		var out strings.Builder
		if err := runCheck([]string{"--data-dir", dir}, &out, io.Discard); err != nil {
			t.Fatalf("runCheck = %v, want nil", err)
		}
		want := filepath.Join(dir, coordinator.DBFile) + ": schema 2, 0 jobs (0 unfinished), 0 batches, last token 0\nconsistent\n"
		if out.String() != want {
			t.Errorf("output = %q, want %q", out.String(), want)
		}
	})

	t.Run("JSON carries the same report", func(t *testing.T) {
		t.Parallel()
		var out strings.Builder
		if err := runCheck([]string{"--data-dir", dir, "--json"}, &out, io.Discard); err != nil {
			t.Fatalf("runCheck = %v, want nil", err)
		}
		var got coordinator.CheckReport
		if err := json.Unmarshal([]byte(out.String()), &got); err != nil {
			t.Fatalf("decoding %q: %v", out.String(), err)
		}
		if got.Schema != 2 || got.Path != filepath.Join(dir, coordinator.DBFile) || !got.OK() {
			t.Errorf("report = %+v, want schema 2, the file's path and no problems", got)
		}
	})

	t.Run("A directory without a database exits 1", func(t *testing.T) {
		t.Parallel()
		status, stderr := runCommand(t, t.TempDir(), []string{"check", "--data-dir", "nowhere"}, nil)
		if status != exitFailure || !strings.Contains(stderr, "nowhere") {
			t.Errorf("exit %d, stderr %q; want %d naming the directory", status, stderr, exitFailure)
		}
	})

	t.Run("LEASEHOLD_DATA_DIR names the directory, and the flag wins", func(t *testing.T) {
		t.Parallel()
		if status, stderr := runCommand(t, t.TempDir(), []string{"check"}, []string{"LEASEHOLD_DATA_DIR=" + dir}); status != 0 {
			t.Errorf("check with LEASEHOLD_DATA_DIR = exit %d, stderr %q; want 0", status, stderr)
		}
		if status, _ := runCommand(t, t.TempDir(), []string{"check", "--data-dir", dir}, []string{"LEASEHOLD_DATA_DIR=nowhere"}); status != 0 {
			t.Errorf("check with --data-dir over LEASEHOLD_DATA_DIR = exit %d, want 0", status)
		}
	})

	t.Run("Arguments are usage errors and help is not", func(t *testing.T) {
		t.Parallel()
		var uerr *usageError
		if err := runCheck([]string{"extra"}, io.Discard, io.Discard); !errors.As(err, &uerr) {
			t.Errorf("runCheck(extra) = %v, want a usage error", err)
		}
		var help strings.Builder
		if err := runCheck([]string{"--help"}, io.Discard, &help); !errors.Is(err, flag.ErrHelp) || !strings.Contains(help.String(), "-data-dir") {
			t.Errorf("runCheck(--help) = %v printing %q, want flag.ErrHelp and the flags", err, help.String())
		}
	})
}
