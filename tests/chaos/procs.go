package main

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
)

// binaries are the programs a run starts, built for it.
type binaries struct {
	coordinator string // built with the failpoints tag
	renderer    string
}

// build compiles the coordinator with the failpoints build tag and the
// renderer into dir, from the module that holds the working directory.
func build(ctx context.Context, dir string) (binaries, error) {
	out, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		return binaries{}, fmt.Errorf("finding the module: %w", err)
	}
	root := filepath.Dir(strings.TrimSpace(string(out)))
	b := binaries{coordinator: filepath.Join(dir, "coordinator"), renderer: filepath.Join(dir, "renderer")}
	for _, args := range [][]string{
		{"build", "-tags", "failpoints", "-o", b.coordinator, "./coordinator/cmd/coordinator"},
		{"build", "-o", b.renderer, "./renderer/cmd/renderer"},
	} {
		cmd := exec.CommandContext(ctx, "go", args...)
		cmd.Dir = root
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			return binaries{}, fmt.Errorf("go %s: %w", strings.Join(args, " "), err)
		}
	}
	return b, nil
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
