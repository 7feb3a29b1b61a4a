package chaos

import (
	"bytes"
	"context"
	"debug/buildinfo"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
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
	b := binaries{coordinator: filepath.Join(dir, "coordinator"), renderer: filepath.Join(dir, "renderer")}
	builds := map[string][]string{
		"coordinator": {"build", "-tags", "failpoints", "-o", b.coordinator, "./coordinator/cmd/coordinator"},
		"renderer":    {"build", "-o", b.renderer, "./renderer/cmd/renderer"},
	}
	if bin := os.Getenv("LEASEHOLD_BIN"); bin != "" {
		if !filepath.IsAbs(bin) {
			bin = filepath.Join(root, bin)
		}
		if p := filepath.Join(bin, "renderer"); exists(p) {
			b.renderer = p
			delete(builds, "renderer")
		}
		if p := filepath.Join(bin, "coordinator"); hasFailpoints(p) {
			b.coordinator = p
			delete(builds, "coordinator")
		}
	}
	for _, name := range []string{"coordinator", "renderer"} {
		args, ok := builds[name]
		if !ok {
			continue
		}
		cmd := exec.CommandContext(ctx, "go", args...)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			return binaries{}, fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, out)
		}
	}
	return b, nil
}

// exists reports whether path names a file.
func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// hasFailpoints reports whether the Go program at path was built with the
// failpoints build tag, as its build information records.
func hasFailpoints(path string) bool {
	info, err := buildinfo.ReadFile(path)
	if err != nil {
		return false
	}
	for _, s := range info.Settings {
		if s.Key == "-tags" && slices.Contains(strings.Split(s.Value, ","), "failpoints") {
			return true
		}
	}
	return false
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
