// Package e2e tests the built binaries together: a coordinator process,
// renderer processes and the leasehold CLI, talking real gRPC on loopback.
//
// TestMain builds bin/coordinator, bin/renderer, bin/leasehold and grpcurl
// once into a temporary directory, or uses the binaries in $LEASEHOLD_BIN
// (a path relative to the module root, such as ./bin, or absolute). Every
// test starts its own processes on free ports with their own data
// directories, and every process is killed when the test ends.
package e2e

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
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

	"github.com/leasehold/leasehold/client"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
)

// Development tokens the coordinator accepts on loopback without a
// principals file.
const (
	tokenAlpha         = "dev-alpha"
	tokenBeta          = "dev-beta"
	tokenRenderer      = "dev-renderer"
	tokenOperator      = "dev-operator"
	tokenOperatorAlpha = "dev-operator-alpha"
)

// waitTimeout is the failsafe bound of every wait in these tests. Waits end
// as soon as what they wait for happens; this only stops a broken build
// from hanging the suite.
const waitTimeout = 45 * time.Second

// bins holds the absolute paths of the binaries under test.
var bins struct {
	coordinator, renderer, cli, grpcurl string
}

// moduleRoot is the repository root, two levels above this package.
var moduleRoot = func() string {
	dir, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		panic(err)
	}
	return dir
}()

func TestMain(m *testing.M) {
	tmp, err := prepareBinaries()
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		if tmp != "" {
			os.RemoveAll(tmp)
		}
		os.Exit(1)
	}
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		if tmp != "" {
			os.RemoveAll(tmp)
		}
		os.Exit(code)
	}))
}

// prepareBinaries fills bins, building what $LEASEHOLD_BIN does not
// provide. It returns the temporary directory it built into, if any.
func prepareBinaries() (string, error) {
	if dir := os.Getenv("LEASEHOLD_BIN"); dir != "" {
		if !filepath.IsAbs(dir) {
			dir = filepath.Join(moduleRoot, dir)
		}
		setBins(dir)
		for _, p := range []string{bins.coordinator, bins.renderer, bins.cli, bins.grpcurl} {
			if _, err := os.Stat(p); err != nil {
				return "", fmt.Errorf("LEASEHOLD_BIN=%s: %w", os.Getenv("LEASEHOLD_BIN"), err)
			}
		}
		return "", nil
	}
	tmp, err := os.MkdirTemp("", "leasehold-e2e-bin-")
	if err != nil {
		return "", err
	}
	setBins(tmp)
	build := exec.Command("go", "build", "-o", tmp+string(filepath.Separator),
		"./coordinator/cmd/coordinator", "./renderer/cmd/renderer", "./client/cmd/leasehold")
	build.Dir = moduleRoot
	if out, err := build.CombinedOutput(); err != nil {
		return tmp, fmt.Errorf("building the binaries: %v\n%s", err, out)
	}
	tools := exec.Command("go", "-C", filepath.Join(moduleRoot, "scripts", "tools"), "build",
		"-o", tmp+string(filepath.Separator), "github.com/fullstorydev/grpcurl/cmd/grpcurl")
	if out, err := tools.CombinedOutput(); err != nil {
		return tmp, fmt.Errorf("building grpcurl: %v\n%s", err, out)
	}
	return tmp, nil
}

func setBins(dir string) {
	bins.coordinator = filepath.Join(dir, "coordinator")
	bins.renderer = filepath.Join(dir, "renderer")
	bins.cli = filepath.Join(dir, "leasehold")
	bins.grpcurl = filepath.Join(dir, "grpcurl")
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

// proc is a process under test.
type proc struct {
	t      testing.TB
	name   string
	cmd    *exec.Cmd
	logs   *logLines
	exited chan struct{} // closed once the process has been waited for
	state  *os.ProcessState
	logEOF chan struct{} // closed once its output is fully read
}

// startProc starts bin with args, its stdout and stderr read through one
// pipe, logging in slog's text format, which the tests read. It is killed
// with SIGKILL when the test ends.
func startProc(t testing.TB, name, bin string, args ...string) *proc {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatalf("pipe for %s: %v", name, err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(childEnv(), "LEASEHOLD_LOG_FORMAT=text")
	cmd.Stdout, cmd.Stderr = w, w
	if err := cmd.Start(); err != nil {
		r.Close()
		w.Close()
		t.Fatalf("starting %s: %v", name, err)
	}
	w.Close()
	p := &proc{t: t, name: name, cmd: cmd, logs: newLogLines(), exited: make(chan struct{}), logEOF: make(chan struct{})}
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
		p.kill()
		if t.Failed() {
			lines, _, _ := p.logs.snapshot()
			if len(lines) > 60 {
				lines = lines[len(lines)-60:]
			}
			t.Logf("last lines of %s:\n%s", name, strings.Join(lines, "\n"))
		}
	})
	return p
}

// childEnv returns this process's environment without LEASEHOLD_*
// variables, so that the processes under test see only the flags and
// variables a test gives them.
func childEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "LEASEHOLD_") {
			env = append(env, kv)
		}
	}
	return env
}

// kill sends SIGKILL (which also ends a stopped process) and waits until
// the process is reaped and its output is read.
func (p *proc) kill() {
	select {
	case <-p.exited:
	default:
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
	}
	timer := time.NewTimer(waitTimeout)
	defer timer.Stop()
	select {
	case <-p.exited:
	case <-timer.C:
		p.t.Errorf("%s did not exit after SIGKILL", p.name)
		return
	}
	select {
	case <-p.logEOF:
	case <-timer.C:
		p.t.Errorf("output of %s did not end after it exited", p.name)
	}
}

// signal sends sig to the process.
func (p *proc) signal(sig syscall.Signal) {
	p.t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		p.t.Fatalf("sending %v to %s: %v", sig, p.name, err)
	}
}

// waitExit waits for the process to exit on its own and returns its exit code.
func (p *proc) waitExit() int {
	p.t.Helper()
	select {
	case <-p.exited:
	case <-time.After(waitTimeout):
		p.t.Fatalf("%s did not exit within %v", p.name, waitTimeout)
	}
	<-p.logEOF
	return p.state.ExitCode()
}

// mark returns the number of lines seen so far, for waitFrom.
func (p *proc) mark() int {
	lines, _, _ := p.logs.snapshot()
	return len(lines)
}

// waitFor waits for a line containing every one of parts and returns it.
func (p *proc) waitFor(parts ...string) string {
	p.t.Helper()
	return p.waitFrom(0, parts...)
}

// waitFrom waits for a line at or after index from containing every one of
// parts, and returns it. It fails the test if the output ends first or the
// failsafe timeout passes.
func (p *proc) waitFrom(from int, parts ...string) string {
	p.t.Helper()
	timer := time.NewTimer(waitTimeout)
	defer timer.Stop()
	for {
		lines, eof, changed := p.logs.snapshot()
		for _, line := range lines[min(from, len(lines)):] {
			if containsAll(line, parts) {
				return line
			}
		}
		if eof {
			p.t.Fatalf("%s ended its output without a line containing %q", p.name, parts)
		}
		select {
		case <-changed:
		case <-timer.C:
			p.t.Fatalf("no line of %s contained %q within %v", p.name, parts, waitTimeout)
		}
	}
}

// linesWith returns every line so far that contains every one of parts.
func (p *proc) linesWith(parts ...string) []string {
	lines, _, _ := p.logs.snapshot()
	var out []string
	for _, line := range lines {
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

// logAttr returns the value of key=value in an slog text line.
func logAttr(line, key string) string {
	for _, m := range attrPattern.FindAllStringSubmatch(line, -1) {
		if m[1] == key {
			return strings.Trim(m[2], `"`)
		}
	}
	return ""
}

// coordinator is a coordinator process.
type coordinator struct {
	*proc
	addr    string
	dataDir string
}

// startCoordinator starts a coordinator on a free loopback port with a new
// data directory, and waits until it serves.
func startCoordinator(t testing.TB, args ...string) *coordinator {
	t.Helper()
	return startCoordinatorAt(t, "127.0.0.1:0", t.TempDir(), args...)
}

// startCoordinatorAt starts a coordinator on listen with dataDir, waits for
// its "coordinator listening" line and for its health check to answer
// SERVING.
func startCoordinatorAt(t testing.TB, listen, dataDir string, args ...string) *coordinator {
	t.Helper()
	all := append([]string{"--listen", listen, "--metrics-listen", "", "--data-dir", dataDir}, args...)
	p := startProc(t, "coordinator", bins.coordinator, all...)
	line := p.waitFor("coordinator listening")
	c := &coordinator{proc: p, addr: logAttr(line, "addr"), dataDir: dataDir}
	if c.addr == "" {
		t.Fatalf("no addr in %q", line)
	}
	waitServing(t, c.addr)
	return c
}

// restart kills the coordinator with SIGKILL and starts a new one on the
// same address and data directory.
func (c *coordinator) restart(t testing.TB, args ...string) *coordinator {
	t.Helper()
	c.kill()
	return startCoordinatorAt(t, c.addr, c.dataDir, args...)
}

// waitServing waits until the health service answers SERVING.
func waitServing(t testing.TB, addr string) {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("dialing %s: %v", addr, err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
	if err != nil {
		t.Fatalf("health check of %s: %v", addr, err)
	}
	if got, want := resp.GetStatus(), healthpb.HealthCheckResponse_SERVING; got != want {
		t.Fatalf("health of %s = %v, want %v", addr, got, want)
	}
}

// renderer is a renderer process.
type renderer struct {
	*proc
	id     string
	record string
}

// startRenderer starts a renderer named id against addr with a record file
// in a temporary directory, and waits for its start line.
func startRenderer(t testing.TB, addr, id string, args ...string) *renderer {
	t.Helper()
	record := filepath.Join(t.TempDir(), id+".record")
	return startRendererRecording(t, addr, id, record, args...)
}

// startRendererRecording is startRenderer with a given record file, so a
// restarted renderer appends to the same one.
func startRendererRecording(t testing.TB, addr, id, record string, args ...string) *renderer {
	t.Helper()
	// Debug logs name every lease and completion, which the tests follow.
	all := append([]string{"--coordinator", addr, "--id", id, "--token", tokenRenderer, "--record", record,
		"--log-level", "debug"}, args...)
	p := startProc(t, "renderer "+id, bins.renderer, all...)
	p.waitFor("renderer started")
	return &renderer{proc: p, id: id, record: record}
}

// recordedJobs returns the set of job ids in the renderer's record file.
func (r *renderer) recordedJobs(t testing.TB) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(r.record)
	if os.IsNotExist(err) {
		return map[string]bool{}
	}
	if err != nil {
		t.Fatalf("reading %s: %v", r.record, err)
	}
	jobs := map[string]bool{}
	for line := range strings.Lines(string(b)) {
		if f := strings.Fields(line); len(f) > 0 {
			jobs[f[0]] = true
		}
	}
	return jobs
}

// cliResult is the outcome of one CLI run.
type cliResult struct {
	stdout, stderr string
	code           int
}

// runCLI runs the leasehold CLI against addr as token and returns its
// output and exit code.
func runCLI(t testing.TB, addr, token string, args ...string) cliResult {
	t.Helper()
	return runTool(t, bins.cli, []string{"LEASEHOLD_ADDR=" + addr, "LEASEHOLD_TOKEN=" + token}, args...)
}

// runTool runs bin to completion with a failsafe timeout.
func runTool(t testing.TB, bin string, env []string, args ...string) cliResult {
	t.Helper()
	res, err := execTool(bin, env, args...)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// execTool runs bin to completion with a failsafe timeout. Unlike runTool
// it may be called from any goroutine. An exit status other than 0 is not
// an error: it is in the result.
func execTool(bin string, env []string, args ...string) (cliResult, error) {
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(childEnv(), env...)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	res := cliResult{stdout: stdout.String(), stderr: stderr.String()}
	if ctx.Err() != nil {
		return res, fmt.Errorf("%s %q did not finish within %v", filepath.Base(bin), args, waitTimeout)
	}
	if exit, ok := errors.AsType[*exec.ExitError](err); ok {
		res.code = exit.ExitCode()
	} else if err != nil {
		return res, fmt.Errorf("running %s %q: %w", filepath.Base(bin), args, err)
	}
	return res, nil
}

// dial returns a typed client for addr authenticated as token, closed when
// the test ends.
func dial(t testing.TB, addr, token string) *client.Client {
	t.Helper()
	c, err := client.Dial(addr, client.WithToken(token))
	if err != nil {
		t.Fatalf("dialing %s: %v", addr, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// bearer is per-RPC credentials for the raw clients.
type bearer string

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}

func (bearer) RequireTransportSecurity() bool { return false }

// dialRenderer returns a raw RendererService client authenticated as the
// development renderer, closed when the test ends.
func dialRenderer(t testing.TB, addr string) leaseholdv1.RendererServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithPerRPCCredentials(bearer(tokenRenderer)))
	if err != nil {
		t.Fatalf("dialing %s: %v", addr, err)
	}
	t.Cleanup(func() { conn.Close() })
	return leaseholdv1.NewRendererServiceClient(conn)
}

// testContext returns a context bounded by the failsafe timeout.
func testContext(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
	t.Cleanup(cancel)
	return ctx
}

// waitBatchDone follows the batch's events until every job is terminal and
// returns the batch.
func waitBatchDone(t testing.TB, c *client.Client, batchID string) *leaseholdv1.Batch {
	t.Helper()
	ctx := testContext(t)
	for {
		err := c.WatchBatch(ctx, batchID, func(*leaseholdv1.WatchBatchResponse) error { return nil })
		if err != nil && ctx.Err() == nil {
			t.Logf("watching batch %s: %v; watching again", batchID, err)
		} else if err != nil {
			t.Fatalf("batch %s not done within %v: %v", batchID, waitTimeout, err)
		}
		b, err := c.GetBatch(ctx, batchID)
		if err != nil {
			t.Fatalf("GetBatch(%s): %v", batchID, err)
		}
		if b.GetDone() {
			return b
		}
	}
}

// phaseCounts returns a batch's counts as a map.
func phaseCounts(b *leaseholdv1.Batch) map[leaseholdv1.Phase]uint32 {
	m := map[leaseholdv1.Phase]uint32{}
	for _, pc := range b.GetCounts() {
		m[pc.GetPhase()] = pc.GetCount()
	}
	return m
}

// batchJobs returns every job of a batch, without history.
func batchJobs(t testing.TB, c *client.Client, batchID string) []*leaseholdv1.Job {
	t.Helper()
	var jobs []*leaseholdv1.Job
	for j, err := range c.AllJobs(testContext(t), &leaseholdv1.ListJobsRequest{BatchId: batchID, PageSize: 1000}) {
		if err != nil {
			t.Fatalf("listing jobs of %s: %v", batchID, err)
		}
		jobs = append(jobs, j)
	}
	return jobs
}

// writeDocs writes n small documents named prefix-i.ext into a new
// temporary directory and returns it.
func writeDocs(t testing.TB, prefix, ext string, n int) string {
	t.Helper()
	dir := t.TempDir()
	for i := range n {
		name := filepath.Join(dir, fmt.Sprintf("%s-%03d%s", prefix, i, ext))
		if err := os.WriteFile(name, fmt.Appendf(nil, "document %s %d\n", prefix, i), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// doc returns an inline document.
func doc(name, content string) *leaseholdv1.Document {
	return &leaseholdv1.Document{Name: name, ContentType: client.ContentType(name), Content: []byte(content), SizeBytes: int64(len(content))}
}
