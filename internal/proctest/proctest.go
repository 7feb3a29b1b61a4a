// Package proctest runs the built binaries as real processes, for tests
// and for the programs under tools/ and tests/ alike. A Proc reads the
// process's stdout and stderr through one pipe, keeps its lines (and
// appends them to a log file where one is named), lets its caller wait
// for a log line without sleeping, reads the key=value attributes of
// slog's text lines, and stops the process with SIGTERM or SIGKILL.
//
// Exec starts one for a program, with errors returned and a failure
// callback for the waits that cannot return one; Options.Start starts one
// for a test (or a Program, which stands in for one), failing the test,
// killing the process when the test ends and showing its last lines when
// the test failed.
package proctest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"slices"
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

// DefaultTimeout is a Spec's failsafe bound of every wait when it names
// none.
const DefaultTimeout = time.Minute

// keepWithLog is how many of its last lines a Proc with a log file keeps
// in memory; one without keeps them all.
const keepWithLog = 2000

// Spec is a process to start.
type Spec struct {
	// Name names it in errors.
	Name string
	// Path is the program.
	Path string
	// Args are its arguments.
	Args []string
	// Env is added to its environment, which is the caller's without
	// LEASEHOLD_* and GOFAIL_* variables: only flags and Env configure it.
	Env []string
	// Log, if not empty, is a file its output is appended to, after a line
	// naming the command. A Proc with a log file keeps only its last lines
	// in memory.
	Log string
	// Timeout is the failsafe bound of every wait on it (DefaultTimeout if
	// zero). Waits end as soon as what they wait for happens; this only
	// stops a broken build from hanging the caller.
	Timeout time.Duration
	// Unexpected, if not nil, is called once it exits before Stop or Kill.
	Unexpected func(error)
	// Fail is called with a message when a wait that returns no error
	// (WaitFor, WaitFrom, WaitAny, WaitExit, WaitGone, Signal) fails; it
	// should not return (testing.TB's Fatal does not). Without it such a
	// failure panics.
	Fail func(msg string)
}

// Proc is a running (or exited) process. It is safe for concurrent use.
type Proc struct {
	spec    Spec
	cmd     *exec.Cmd
	started time.Time
	helper  func() // testing.TB's Helper, or a no-op
	logs    *logLines
	exited  chan struct{} // closed once it has been waited for and its output read
	err     error         // its exit error, set before exited is closed
	state   *os.ProcessState

	mu       sync.Mutex
	stopping bool
}

// Exec starts the process s describes, in its own process group (so that
// a Ctrl-C in the terminal reaches the caller only, which stops its
// processes in order) and with SIGKILL sent to it when the caller dies.
func Exec(s Spec) (*Proc, error) {
	if s.Timeout == 0 {
		s.Timeout = DefaultTimeout
	}
	var logFile *os.File
	if s.Log != "" {
		f, err := os.OpenFile(s.Log, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(f, "# %s\n", strings.Join(slices.Concat(s.Env, []string{s.Path}, s.Args), " "))
		logFile = f
	}
	r, w, err := os.Pipe()
	if err != nil {
		if logFile != nil {
			logFile.Close()
		}
		return nil, fmt.Errorf("pipe for %s: %w", s.Name, err)
	}
	cmd := exec.Command(s.Path, s.Args...)
	cmd.Stdout, cmd.Stderr = w, w
	cmd.Env = childEnv(os.Environ(), s.Env)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	keep := 0
	if logFile != nil {
		keep = keepWithLog
	}
	p := &Proc{spec: s, cmd: cmd, helper: func() {}, logs: newLogLines(keep), exited: make(chan struct{})}
	p.started = time.Now()
	if err := cmd.Start(); err != nil {
		r.Close()
		w.Close()
		if logFile != nil {
			logFile.Close()
		}
		return nil, fmt.Errorf("starting %s: %w", s.Name, err)
	}
	w.Close()
	logEOF := make(chan struct{})
	go func() {
		defer close(logEOF)
		defer r.Close()
		if logFile != nil {
			defer logFile.Close()
		}
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 64<<10), 4<<20)
		var line []byte
		for sc.Scan() {
			if logFile != nil {
				// One write a line keeps the file as current as the
				// process, for whoever reads it while it runs.
				line = append(append(line[:0], sc.Bytes()...), '\n')
				_, _ = logFile.Write(line)
			}
			p.logs.add(sc.Text())
		}
		p.logs.close()
	}()
	go func() {
		err := cmd.Wait()
		<-logEOF
		p.err, p.state = err, cmd.ProcessState
		close(p.exited)
		p.mu.Lock()
		stopping := p.stopping
		p.mu.Unlock()
		if !stopping && s.Unexpected != nil {
			s.Unexpected(fmt.Errorf("%s (pid %d) exited unexpectedly: %v%s", s.Name, p.Pid(), err, p.where()))
		}
	}()
	return p, nil
}

// where names its log file for an error message, if it has one.
func (p *Proc) where() string {
	if p.spec.Log == "" {
		return ""
	}
	return "; its log: " + p.spec.Log
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

// Options are a test package's settings for the processes it starts.
type Options struct {
	// Timeout is the failsafe bound of every wait on a process.
	Timeout time.Duration
	// Tail is how many of a process's last lines a failed test logs.
	Tail int
}

// Start starts bin with args for the test t, logging in slog's text
// format, which LogAttr reads (see Exec for its environment). Failed
// waits fail the test. It is killed with SIGKILL when the test ends, and
// its last lines are logged if the test failed.
func (o Options) Start(t TB, name, bin string, args ...string) *Proc {
	t.Helper()
	return o.StartSpec(t, Spec{Name: name, Path: bin, Args: args})
}

// StartSpec is Start with a whole Spec; its Timeout and Fail are the
// Options' and the test's, and LEASEHOLD_LOG_FORMAT=text is added to its
// environment.
func (o Options) StartSpec(t TB, s Spec) *Proc {
	t.Helper()
	s.Timeout = o.Timeout
	s.Env = append([]string{"LEASEHOLD_LOG_FORMAT=text"}, s.Env...)
	s.Fail = func(msg string) {
		t.Helper()
		t.Fatal(msg)
	}
	p, err := Exec(s)
	if err != nil {
		t.Fatal(err)
	}
	p.helper = t.Helper
	t.Cleanup(func() {
		p.markStopping()
		select {
		case <-p.exited:
		default:
			_ = p.cmd.Process.Signal(syscall.SIGKILL)
		}
		if err := p.waitGone(); err != nil {
			t.Errorf("%v", err)
		}
		if t.Failed() {
			t.Logf("last lines of %s:\n%s", s.Name, p.Tail(o.Tail))
		}
	})
	return p
}

// fail reports a failed wait through the Spec's Fail.
func (p *Proc) fail(format string, args ...any) {
	p.helper()
	msg := fmt.Sprintf(format, args...)
	if p.spec.Fail == nil {
		panic(msg)
	}
	p.spec.Fail(msg)
}

// Name is the name it was started with.
func (p *Proc) Name() string { return p.spec.Name }

// LogPath is its log file, or "" if it has none.
func (p *Proc) LogPath() string { return p.spec.Log }

// Started is the time just before it was started.
func (p *Proc) Started() time.Time { return p.started }

// Pid is its process id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Exited is closed once the process has exited, been waited for and its
// output read.
func (p *Proc) Exited() <-chan struct{} { return p.exited }

// HasExited reports whether Exited is closed.
func (p *Proc) HasExited() bool {
	select {
	case <-p.exited:
		return true
	default:
		return false
	}
}

// Err is its exit error (nil for a clean exit), once Exited is closed.
func (p *Proc) Err() error { return p.err }

func (p *Proc) markStopping() {
	p.mu.Lock()
	p.stopping = true
	p.mu.Unlock()
}

// Kill sends SIGKILL (which also ends a stopped process) and waits until
// the process is reaped and its output read.
func (p *Proc) Kill() {
	p.helper()
	p.markStopping()
	select {
	case <-p.exited:
	default:
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
	}
	p.WaitGone()
}

// WaitGone waits for the process to be reaped and its output read.
func (p *Proc) WaitGone() {
	p.helper()
	if err := p.waitGone(); err != nil {
		p.fail("%v", err)
	}
}

func (p *Proc) waitGone() error {
	timer := time.NewTimer(p.spec.Timeout)
	defer timer.Stop()
	select {
	case <-p.exited:
		return nil
	case <-timer.C:
		return fmt.Errorf("%s did not exit and end its output within %v", p.spec.Name, p.spec.Timeout)
	}
}

// Stop sends SIGTERM and waits for the exit, sending SIGKILL after grace.
// It returns how long the exit took and the exit error (nil for a clean
// exit, an error saying so when it had to be killed). A process that had
// already exited answers at once, with its exit error unless Unexpected
// reported it. It is safe to call more than once.
func (p *Proc) Stop(grace time.Duration) (time.Duration, error) {
	p.markStopping()
	start := time.Now()
	if p.HasExited() {
		if p.spec.Unexpected != nil {
			return 0, nil
		}
		return 0, p.err
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.exited:
		return time.Since(start), p.err
	case <-t.C:
		_ = p.cmd.Process.Kill()
		<-p.exited
		return time.Since(start), fmt.Errorf("%s did not exit within %v of SIGTERM; killed", p.spec.Name, grace)
	}
}

// Signal sends sig to the process.
func (p *Proc) Signal(sig syscall.Signal) {
	p.helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		p.fail("sending %v to %s: %v", sig, p.spec.Name, err)
	}
}

// Freeze stops the process with SIGSTOP and returns once every thread of
// it is stopped, as /proc shows (a signal is delivered to each thread on
// its own, after kill returns): a request sent afterwards finds it frozen.
// Signal(SIGCONT) thaws it.
func (p *Proc) Freeze() {
	p.helper()
	p.Signal(syscall.SIGSTOP)
	deadline := time.Now().Add(p.spec.Timeout)
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for !allStopped(p.Pid()) {
		if time.Now().After(deadline) {
			p.fail("%s did not stop within %v of SIGSTOP", p.spec.Name, p.spec.Timeout)
			return
		}
		<-tick.C
	}
}

// allStopped reports whether every thread of pid is stopped (state T), as
// far as /proc tells; false when it cannot tell.
func allStopped(pid int) bool {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil || len(tasks) == 0 {
		return false
	}
	for _, task := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, task.Name()))
		if err != nil {
			return false
		}
		// The state follows the command name, which is in parentheses.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 || i+2 >= len(b) || b[i+2] != 'T' {
			return false
		}
	}
	return true
}

// WaitExit waits for the process to exit on its own and returns its exit
// code.
func (p *Proc) WaitExit() int {
	p.helper()
	timer := time.NewTimer(p.spec.Timeout)
	defer timer.Stop()
	select {
	case <-p.exited:
	case <-timer.C:
		p.fail("%s did not exit within %v", p.spec.Name, p.spec.Timeout)
	}
	return p.state.ExitCode()
}

// Lines returns the lines the process wrote so far (with a log file, the
// last ones only).
func (p *Proc) Lines() []string {
	lines, _, _, _ := p.logs.snapshot()
	return lines
}

// Mark returns the number of lines seen so far, for WaitFrom.
func (p *Proc) Mark() int {
	lines, base, _, _ := p.logs.snapshot()
	return base + len(lines)
}

// Tail returns its last lines, one a line.
func (p *Proc) Tail(n int) string {
	lines := p.Lines()
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// LogText returns its whole output: its log file where it has one.
func (p *Proc) LogText() string {
	if p.spec.Log != "" {
		data, _ := os.ReadFile(p.spec.Log)
		return string(data)
	}
	return strings.Join(p.Lines(), "\n")
}

// WaitFor waits for a line containing every one of parts and returns it.
func (p *Proc) WaitFor(parts ...string) string {
	p.helper()
	return p.WaitAny(0, parts)
}

// WaitFrom waits for a line at or after index from containing every one
// of parts, and returns it.
func (p *Proc) WaitFrom(from int, parts ...string) string {
	p.helper()
	return p.WaitAny(from, parts)
}

// WaitAny waits for a line at or after index from that contains every
// part of one of alternatives, and returns it. It fails if the output
// ends first or the failsafe timeout passes.
func (p *Proc) WaitAny(from int, alternatives ...[]string) string {
	p.helper()
	ctx, cancel := context.WithTimeout(context.Background(), p.spec.Timeout)
	defer cancel()
	line, err := p.WaitLine(ctx, from, alternatives...)
	if err != nil {
		p.fail("%v", err)
	}
	return line
}

// ErrOutputEnded is WaitLine's error when the output ends without the line.
var ErrOutputEnded = errors.New("output ended")

// WaitLine waits for a line at or after index from that contains every
// part of one of alternatives, and returns it. It fails with an error
// wrapping ErrOutputEnded when the output ends first, or with the
// context's error.
func (p *Proc) WaitLine(ctx context.Context, from int, alternatives ...[]string) (string, error) {
	want := fmt.Sprintf("containing any of %q", alternatives)
	if len(alternatives) == 1 {
		want = fmt.Sprintf("containing %q", alternatives[0])
	}
	for {
		lines, base, eof, changed := p.logs.snapshot()
		for _, line := range lines[min(max(from-base, 0), len(lines)):] {
			for _, parts := range alternatives {
				if containsAll(line, parts) {
					return line, nil
				}
			}
		}
		if eof {
			return "", fmt.Errorf("%s ended its output without a line %s: %w", p.spec.Name, want, ErrOutputEnded)
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return "", fmt.Errorf("no line of %s %s: %w", p.spec.Name, want, context.Cause(ctx))
		}
	}
}

// Await is WaitAny without failing the test: it waits until deadline for
// a line at or after index from that contains every part of one of
// alternatives, and reports false if none came by then or the output
// ended. It may be called from any goroutine.
func (p *Proc) Await(from int, deadline time.Time, alternatives ...[]string) (string, bool) {
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	line, err := p.WaitLine(ctx, from, alternatives...)
	return line, err == nil
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
// lets a caller wait for one.
type logLines struct {
	mu      sync.Mutex
	keep    int // lines kept; 0 keeps all
	base    int // index of lines[0] among all lines written
	lines   []string
	changed chan struct{} // closed and replaced on every new line and at EOF
	eof     bool
}

func newLogLines(keep int) *logLines { return &logLines{keep: keep, changed: make(chan struct{})} }

func (l *logLines) add(line string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.keep > 0 && len(l.lines) >= 2*l.keep {
		drop := len(l.lines) - l.keep
		l.lines = slices.Clone(l.lines[drop:])
		l.base += drop
	}
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

// snapshot returns the lines kept so far, the index of the first, whether
// the output ended, and a channel closed at the next change.
func (l *logLines) snapshot() (lines []string, base int, eof bool, changed <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lines[:len(l.lines):len(l.lines)], l.base, l.eof, l.changed
}

// Health asks the gRPC health service at addr (plaintext) for the
// server's status as a whole; with waitReady it first waits, up to the
// Options' Timeout, for addr to accept connections. It fails the test when
// the check fails.
func (o Options) Health(t TB, addr string, waitReady bool) healthpb.HealthCheckResponse_ServingStatus {
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
