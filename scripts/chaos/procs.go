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
	"syscall"
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

// proc is a child process; its output goes to a log file.
type proc struct {
	name string
	log  string
	cmd  *exec.Cmd
	// exec is just before the process was started.
	exec time.Time
	// done is closed once the process has exited; err is then its exit
	// error.
	done chan struct{}
	err  error
}

// startProc starts path with args, its output appended to logPath, its
// environment the harness's without LEASEHOLD_* and GOFAIL_* variables and
// with env added. The child has its own process group, so a Ctrl-C reaches
// the harness only, and it gets SIGKILL if the harness dies.
func startProc(name, path string, args, env []string, logPath string) (*proc, error) {
	f, err := os.OpenFile(logPath, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fmt.Fprintf(f, "# %s %s %s\n", strings.Join(env, " "), path, strings.Join(args, " "))
	cmd := exec.Command(path, args...)
	cmd.Stdout, cmd.Stderr = f, f
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "LEASEHOLD_") && !strings.HasPrefix(kv, "GOFAIL_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	p := &proc{name: name, log: logPath, cmd: cmd, done: make(chan struct{})}
	p.exec = time.Now()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// kill sends SIGKILL and waits for the exit.
func (p *proc) kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// terminate sends SIGTERM and waits for the exit, killing the process
// after grace. It returns the exit error, or one saying it was killed.
func (p *proc) terminate(grace time.Duration) error {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.done:
		return p.err
	case <-t.C:
		p.kill()
		return fmt.Errorf("%s did not exit within %v of SIGTERM; killed", p.name, grace)
	}
}

// exited reports whether the process has exited.
func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// logText returns the process's log.
func (p *proc) logText() string {
	data, _ := os.ReadFile(p.log)
	return string(data)
}

// tail returns the last lines of the process's log.
func (p *proc) tail(lines int) string {
	all := strings.Split(strings.TrimRight(p.logText(), "\n"), "\n")
	return strings.Join(all[max(0, len(all)-lines):], "\n")
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
