package testbin

import (
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Child is a program a harness (the benchmark, the chaos run) started, its
// output appended to a log file. It is safe for concurrent use.
type Child struct {
	// Name names it in errors.
	Name string
	// Log is the path of its log file.
	Log string
	// Started is just before the exec.
	Started time.Time

	cmd        *exec.Cmd
	unexpected func(error)
	done       chan struct{} // closed once it has exited and err is set
	err        error

	mu       sync.Mutex
	stopping bool
}

// StartChild starts path with args, its output appended to logPath after a
// line naming the command. Its environment is the harness's without
// LEASEHOLD_* and GOFAIL_* variables (only flags and env configure it),
// with env added. It gets its own process group, so that a Ctrl-C in the
// terminal reaches the harness only and the harness stops its children in
// order, and SIGKILL when the harness dies. unexpected, if not nil, is
// called when it exits before Stop or Kill.
func StartChild(name, path string, args, env []string, logPath string, unexpected func(error)) (*Child, error) {
	f, err := os.OpenFile(logPath, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fmt.Fprintf(f, "# %s\n", strings.Join(slices.Concat(env, []string{path}, args), " "))
	cmd := exec.Command(path, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = childEnv(os.Environ(), env)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	c := &Child{Name: name, Log: logPath, cmd: cmd, unexpected: unexpected, done: make(chan struct{})}
	c.Started = time.Now()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	go func() {
		c.err = cmd.Wait()
		close(c.done)
		c.mu.Lock()
		stopping := c.stopping
		c.mu.Unlock()
		if !stopping && unexpected != nil {
			unexpected(fmt.Errorf("%s (pid %d) exited unexpectedly: %v; its log: %s", name, c.Pid(), c.err, logPath))
		}
	}()
	return c, nil
}

// childEnv is environ without LEASEHOLD_* and GOFAIL_* variables, with
// env added.
func childEnv(environ, env []string) []string {
	out := make([]string, 0, len(environ)+len(env))
	for _, kv := range environ {
		if !strings.HasPrefix(kv, "LEASEHOLD_") && !strings.HasPrefix(kv, "GOFAIL_") {
			out = append(out, kv)
		}
	}
	return append(out, env...)
}

// Pid is its process id.
func (c *Child) Pid() int { return c.cmd.Process.Pid }

// Done is closed once it has exited.
func (c *Child) Done() <-chan struct{} { return c.done }

// Err is its exit error (nil for a clean exit), once Done is closed.
func (c *Child) Err() error { return c.err }

// Exited reports whether it has exited.
func (c *Child) Exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

func (c *Child) markStopping() {
	c.mu.Lock()
	c.stopping = true
	c.mu.Unlock()
}

// Kill sends SIGKILL and waits for the exit.
func (c *Child) Kill() {
	c.markStopping()
	_ = c.cmd.Process.Signal(syscall.SIGKILL)
	<-c.done
}

// Stop sends SIGTERM and waits for the exit, sending SIGKILL after grace.
// It returns how long the exit took and the exit error (nil for a clean
// exit, an error saying so when it had to be killed). A child that had
// already exited answers at once, with its exit error unless unexpected
// reported it. It is safe to call more than once.
func (c *Child) Stop(grace time.Duration) (time.Duration, error) {
	c.markStopping()
	start := time.Now()
	if c.Exited() {
		if c.unexpected != nil {
			return 0, nil
		}
		return 0, c.err
	}
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-c.done:
		return time.Since(start), c.err
	case <-t.C:
		_ = c.cmd.Process.Kill()
		<-c.done
		return time.Since(start), fmt.Errorf("%s did not exit within %v of SIGTERM; killed", c.Name, grace)
	}
}

// LogText returns its log.
func (c *Child) LogText() string {
	data, _ := os.ReadFile(c.Log)
	return string(data)
}

// Tail returns the last lines of its log.
func (c *Child) Tail(lines int) string {
	all := strings.Split(strings.TrimRight(c.LogText(), "\n"), "\n")
	return strings.Join(all[max(0, len(all)-lines):], "\n")
}
