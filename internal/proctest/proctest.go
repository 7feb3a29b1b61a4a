// Package proctest is a test helper for tests that run the built binaries
// as real processes: it starts one with its stdout and stderr kept in
// memory, lets a test wait for a log line without sleeping, reads the
// key=value attributes of slog's text lines, stops the process when the
// test ends and shows its last lines when the test failed. It is imported
// by tests only.
package proctest

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/leasehold/leasehold/internal/testbin"
)

// Main is the body of TestMain for a package of such tests: it prepares
// the named binaries (see testbin.Main), gives their directory to setup,
// runs the tests and fails the run if they left a goroutine running.
func Main(m *testing.M, pkg string, names []string, setup func(dir string)) {
	testbin.Main(pkg, func(_, dir string) int {
		setup(dir)
		code := 0
		goleak.VerifyTestMain(m, goleak.Cleanup(func(c int) { code = c }))
		return code
	}, names...)
}

// Options are a test package's settings for the processes it starts.
type Options struct {
	// Timeout is the failsafe bound of every wait on a process. Waits end
	// as soon as what they wait for happens; this only stops a broken
	// build from hanging the tests.
	Timeout time.Duration
	// Tail is how many of a process's last lines a failed test logs.
	Tail int
}

// Proc is a process under test.
type Proc struct {
	t       testing.TB
	name    string
	cmd     *exec.Cmd
	timeout time.Duration
	logs    *logLines
	exited  chan struct{} // closed once the process has been waited for
	state   *os.ProcessState
	logEOF  chan struct{} // closed once its output is fully read
}

// Start starts bin with args, its stdout and stderr read through one
// pipe, logging in slog's text format, which LogAttr reads. Its
// environment is the test's without LEASEHOLD_* variables (see
// testbin.Env). It is killed with SIGKILL when the test ends, and its
// last lines are logged if the test failed.
func (o Options) Start(t testing.TB, name, bin string, args ...string) *Proc {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatalf("pipe for %s: %v", name, err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(testbin.Env(), "LEASEHOLD_LOG_FORMAT=text")
	cmd.Stdout, cmd.Stderr = w, w
	if err := cmd.Start(); err != nil {
		r.Close()
		w.Close()
		t.Fatalf("starting %s: %v", name, err)
	}
	w.Close()
	p := &Proc{t: t, name: name, cmd: cmd, timeout: o.Timeout, logs: newLogLines(),
		exited: make(chan struct{}), logEOF: make(chan struct{})}
	go func() {
		defer close(p.logEOF)
		defer r.Close()
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 64<<10), 4<<20)
		for sc.Scan() {
			p.logs.add(sc.Text())
		}
		p.logs.close()
	}()
	go func() {
		defer close(p.exited)
		_ = cmd.Wait()
		p.state = cmd.ProcessState
	}()
	t.Cleanup(func() {
		p.Kill()
		if t.Failed() {
			lines := p.Lines()
			if len(lines) > o.Tail {
				lines = lines[len(lines)-o.Tail:]
			}
			t.Logf("last lines of %s:\n%s", name, strings.Join(lines, "\n"))
		}
	})
	return p
}

// Exited is closed once the process has exited and been waited for.
func (p *Proc) Exited() <-chan struct{} { return p.exited }

// Kill sends SIGKILL (which also ends a stopped process) and waits until
// the process is reaped and its output read.
func (p *Proc) Kill() {
	select {
	case <-p.exited:
	default:
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
	}
	p.WaitGone()
}

// WaitGone waits for the process to be reaped and its output read.
func (p *Proc) WaitGone() {
	timer := time.NewTimer(p.timeout)
	defer timer.Stop()
	select {
	case <-p.exited:
	case <-timer.C:
		p.t.Errorf("%s did not exit within %v", p.name, p.timeout)
		return
	}
	select {
	case <-p.logEOF:
	case <-timer.C:
		p.t.Errorf("output of %s did not end after it exited", p.name)
	}
}

// Signal sends sig to the process.
func (p *Proc) Signal(sig syscall.Signal) {
	p.t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		p.t.Fatalf("sending %v to %s: %v", sig, p.name, err)
	}
}

// WaitExit waits for the process to exit on its own and returns its exit
// code.
func (p *Proc) WaitExit() int {
	p.t.Helper()
	select {
	case <-p.exited:
	case <-time.After(p.timeout):
		p.t.Fatalf("%s did not exit within %v", p.name, p.timeout)
	}
	<-p.logEOF
	return p.state.ExitCode()
}

// Lines returns the lines the process wrote so far.
func (p *Proc) Lines() []string {
	lines, _, _ := p.logs.snapshot()
	return lines
}

// Mark returns the number of lines seen so far, for WaitFrom.
func (p *Proc) Mark() int { return len(p.Lines()) }

// WaitFor waits for a line containing every one of parts and returns it.
func (p *Proc) WaitFor(parts ...string) string {
	p.t.Helper()
	return p.WaitAny(0, parts)
}

// WaitFrom waits for a line at or after index from containing every one
// of parts, and returns it.
func (p *Proc) WaitFrom(from int, parts ...string) string {
	p.t.Helper()
	return p.WaitAny(from, parts)
}

// WaitAny waits for a line at or after index from that contains every
// part of one of alternatives, and returns it. It fails the test if the
// output ends first or the failsafe timeout passes.
func (p *Proc) WaitAny(from int, alternatives ...[]string) string {
	p.t.Helper()
	want := fmt.Sprintf("containing any of %q", alternatives)
	if len(alternatives) == 1 {
		want = fmt.Sprintf("containing %q", alternatives[0])
	}
	timer := time.NewTimer(p.timeout)
	defer timer.Stop()
	for {
		lines, eof, changed := p.logs.snapshot()
		for _, line := range lines[min(from, len(lines)):] {
			for _, parts := range alternatives {
				if containsAll(line, parts) {
					return line
				}
			}
		}
		if eof {
			p.t.Fatalf("%s ended its output without a line %s", p.name, want)
		}
		select {
		case <-changed:
		case <-timer.C:
			p.t.Fatalf("no line of %s %s within %v", p.name, want, p.timeout)
		}
	}
}

// Await is WaitAny without failing the test: it waits until deadline for
// a line at or after index from that contains every part of one of
// alternatives, and reports false if none came by then or the output
// ended. It may be called from any goroutine.
func (p *Proc) Await(from int, deadline time.Time, alternatives ...[]string) (string, bool) {
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	for {
		lines, eof, changed := p.logs.snapshot()
		for _, line := range lines[min(from, len(lines)):] {
			for _, parts := range alternatives {
				if containsAll(line, parts) {
					return line, true
				}
			}
		}
		if eof {
			return "", false
		}
		select {
		case <-changed:
		case <-timer.C:
			return "", false
		}
	}
}

// LinesWith returns every line so far that contains every one of parts.
func (p *Proc) LinesWith(parts ...string) []string {
	var out []string
	for _, line := range p.Lines() {
		if containsAll(line, parts) {
			out = append(out, line)
		}
	}
	return out
}

func containsAll(line string, parts []string) bool {
	for _, s := range parts {
		if !strings.Contains(line, s) {
			return false
		}
	}
	return true
}

var attrPattern = regexp.MustCompile(`(?:^| )([a-z_.]+)=("(?:[^"\\]|\\.)*"|[^ ]*)`)

// LogAttr returns the value of key=value in an slog text line.
func LogAttr(line, key string) string {
	for _, m := range attrPattern.FindAllStringSubmatch(line, -1) {
		if m[1] == key {
			return strings.Trim(m[2], `"`)
		}
	}
	return ""
}

// logLines collects the lines a process writes to stdout and stderr, and
// lets a test wait for one.
type logLines struct {
	mu      sync.Mutex
	lines   []string
	changed chan struct{} // closed and replaced on every new line and at EOF
	eof     bool
}

func newLogLines() *logLines { return &logLines{changed: make(chan struct{})} }

func (l *logLines) add(line string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, line)
	close(l.changed)
	l.changed = make(chan struct{})
}

func (l *logLines) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.eof = true
	close(l.changed)
	l.changed = make(chan struct{})
}

// snapshot returns the lines so far, whether the output ended, and a
// channel closed at the next change.
func (l *logLines) snapshot() ([]string, bool, <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lines[:len(l.lines):len(l.lines)], l.eof, l.changed
}

// Health asks the gRPC health service at addr (plaintext) for the
// server's status as a whole; with waitReady it first waits, up to the
// Options' Timeout, for addr to accept connections. It fails the test when
// the check fails.
func (o Options) Health(t testing.TB, addr string, waitReady bool) healthpb.HealthCheckResponse_ServingStatus {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("dialing %s: %v", addr, err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), o.Timeout)
	defer cancel()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(waitReady))
	if err != nil {
		t.Fatalf("health check of %s: %v", addr, err)
	}
	return resp.GetStatus()
}

// CoordinatorPrincipals returns a coordinator's arguments with --dev in
// front, for the public development tokens, unless they name a principals
// file with --tokens: the coordinator needs exactly one of the two.
func CoordinatorPrincipals(args []string) []string {
	for _, a := range args {
		if a == "--tokens" || strings.HasPrefix(a, "--tokens=") {
			return args
		}
	}
	return append([]string{"--dev"}, args...)
}
