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
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/leasehold/leasehold/client"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"github.com/leasehold/leasehold/internal/proctest"
	"github.com/leasehold/leasehold/internal/stack"
	"github.com/leasehold/leasehold/internal/testbin"
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
	coordinator, renderer, cli, grpcurl, versitygw string
}

func TestMain(m *testing.M) {
	proctest.Main(m, "e2e", append(slices.Clone(testbin.Names), testbin.S3Server), setBins)
}

func setBins(dir string) {
	bins.coordinator = filepath.Join(dir, "coordinator")
	bins.renderer = filepath.Join(dir, "renderer")
	bins.cli = filepath.Join(dir, "leasehold")
	bins.grpcurl = filepath.Join(dir, "grpcurl")
	bins.versitygw = filepath.Join(dir, testbin.S3Server)
}

// procs starts the processes under test.
var procs = proctest.Options{Timeout: waitTimeout, Tail: 60}

// coordinator is a single coordinator process of its own stack.
type coordinator struct {
	*stack.Node
	stack *stack.Stack
}

// options are the stack options of these tests.
func options() stack.Options {
	return stack.Options{Coordinator: bins.coordinator, Renderer: bins.renderer, Procs: procs, RendererToken: tokenRenderer}
}

// startCoordinator starts a coordinator on a free loopback port with a new
// data directory, and waits until it serves.
func startCoordinator(t testing.TB, args ...string) *coordinator {
	t.Helper()
	return startCoordinatorAt(t, "", "", args...)
}

// startCoordinatorAt starts a coordinator on listen with dataDir (a free
// port and a new directory where empty), waits for its "coordinator
// listening" line and for its health check to answer SERVING.
func startCoordinatorAt(t testing.TB, listen, dataDir string, args ...string) *coordinator {
	t.Helper()
	opts := options()
	opts.Listen, opts.DataDirs, opts.Args = listen, []string{dataDir}, args
	s := stack.Start(t, opts)
	return &coordinator{Node: s.Coordinators[0], stack: s}
}

// restart kills the coordinator with SIGKILL and starts a new one on the
// same address and data directory, with args.
func (c *coordinator) restart(t testing.TB, args ...string) *coordinator {
	t.Helper()
	c.stack.RestartWith(0, args...)
	return c
}

// renderer is a renderer process.
type renderer struct {
	*stack.RendererProc
	id     string
	record string
}

// startRenderer starts a renderer named id against addr with a record file
// in a temporary directory, and waits for its start line.
func startRenderer(t testing.TB, addr, id string, args ...string) *renderer {
	t.Helper()
	return startRendererRecording(t, addr, id, stack.RecordIn(t, id), args...)
}

// startRendererRecording is startRenderer with a given record file, so a
// restarted renderer appends to the same one.
func startRendererRecording(t testing.TB, addr, id, record string, args ...string) *renderer {
	t.Helper()
	p := stack.StartRenderer(t, options(), stack.Renderer{ID: id, Coordinator: addr, Record: record, Args: args})
	return &renderer{RendererProc: p, id: id, record: record}
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
	cmd.Env = append(testbin.Env(), env...)
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
