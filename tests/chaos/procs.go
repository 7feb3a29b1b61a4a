package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/leasehold/leasehold/internal/testbin"
)

// binaries are the programs a run starts.
type binaries struct {
	coordinator string // built with the failpoints tag
	renderer    string
}

// prepare returns the programs a run starts. $LEASEHOLD_BIN (a directory,
// relative to the module root or absolute, as package testbin reads it)
// gives the renderer, and the coordinator too when that one was built with
// the failpoints build tag; scripts/build's is not. What it does not give
// is built into dir: the coordinator with the failpoints tag, from the
// module that holds the working directory.
func prepare(ctx context.Context, dir string) (binaries, error) {
	root, err := testbin.ModuleRoot(".")
	if err != nil {
		return binaries{}, err
	}
	b := binaries{renderer: filepath.Join(dir, "renderer")}
	var candidate string
	if bin := os.Getenv("LEASEHOLD_BIN"); bin != "" {
		if !filepath.IsAbs(bin) {
			bin = filepath.Join(root, bin)
		}
		candidate = filepath.Join(bin, "coordinator")
		if p := filepath.Join(bin, "renderer"); exists(p) {
			b.renderer = p
		}
	}
	if b.coordinator, err = testbin.FailpointsCoordinator(ctx, root, candidate, dir); err != nil {
		return binaries{}, err
	}
	if !exists(b.renderer) {
		cmd := exec.CommandContext(ctx, "go", "build", "-o", b.renderer, "./renderer/cmd/renderer")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			return binaries{}, fmt.Errorf("building the renderer: %w\n%s", err, out)
		}
	}
	return b, nil
}

// exists reports whether path names a file.
func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// healthPoll is how often testbin.WaitServing asks; restart times are late by at
// most about this much.
const healthPoll = 5 * time.Millisecond

// checkReport is the JSON "coordinator check --json" prints.
type checkReport struct {
	Schema    uint64   `json:"schema"`
	Jobs      int      `json:"jobs"`
	LastToken uint64   `json:"last_token"`
	Problems  []string `json:"problems"`
	Omitted   int      `json:"omitted"`
}

// checkStore runs "coordinator check --json" on the data directory of a
// stopped coordinator. Problems found are in the report; the error is for
// a check that could not run.
func checkStore(ctx context.Context, coordinator, dataDir string) (checkReport, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, coordinator, "check", "--data-dir", dataDir, "--json")
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	runErr := cmd.Run()
	var rep checkReport
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
		return rep, fmt.Errorf("coordinator check: %v: %s", errors.Join(runErr, err), strings.TrimSpace(stderr.String()))
	}
	if rep.Omitted > 0 {
		rep.Problems = append(rep.Problems, fmt.Sprintf("%d more problems not listed", rep.Omitted))
	}
	return rep, nil
}
