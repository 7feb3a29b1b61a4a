// Package faults tests the built coordinator and renderer processes under
// the faults of production: a network that delays, stalls, drops and cuts
// the renderers' session streams (through a userspace TCP proxy,
// internal/tcpproxy), renderers frozen with SIGSTOP past their lease TTL
// while others work, a coordinator whose disk fills up, and one whose
// disk freezes (fsfreeze) for longer than the TTL while renderers hold
// leases; a cluster of three, one of whose followers fills its disk,
// restarted one node at a time with its leadership handed on while
// renderers hold leases; and a cluster whose S3-compatible artifact store
// (versitygw) hangs and then goes away in the middle of a drain.
//
// TestMain builds bin/coordinator, bin/renderer and bin/versitygw once into a temporary
// directory, or uses those in $LEASEHOLD_BIN (relative to the module root,
// or absolute). Every test starts its own processes on free ports with
// their own data directories (on a tmpfs where the test may mount one, so
// that only TestDiskFull, TestFollowerDiskFull and TestStorageStall test
// the disk); every
// process is killed when its test ends. Waits follow log lines, watch
// streams and proxy counters; their timeouts are failsafe bounds only.
//
// The default run fits CI (tens of leases per fault, about 30 s); -long
// measures over hundreds. Each test logs its results on a FIGURE line:
//
//	go test ./coordinator/faults -v -long
package faults

import (
	"context"
	"flag"
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold/client"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"github.com/leasehold/leasehold/internal/proctest"
	"github.com/leasehold/leasehold/internal/stack"
	"github.com/leasehold/leasehold/internal/testbin"
)

var long = flag.Bool("long", false, "measure over hundreds of leases and pauses instead of tens")

// Development tokens the coordinator accepts on loopback.
const (
	tokenAlpha    = "dev-alpha"
	tokenBeta     = "dev-beta"
	tokenRenderer = "dev-renderer"
	tokenOperator = "dev-operator"
)

// waitTimeout is the failsafe bound of every wait.
const waitTimeout = 60 * time.Second

// bins holds the absolute paths of the binaries under test.
var bins struct{ coordinator, renderer, versitygw string }

func TestMain(m *testing.M) {
	flag.Parse()
	proctest.Main(m, "faults", []string{"coordinator", "renderer", testbin.S3Server}, func(dir string) {
		bins.coordinator, bins.renderer = filepath.Join(dir, "coordinator"), filepath.Join(dir, "renderer")
		bins.versitygw = filepath.Join(dir, testbin.S3Server)
	})
}

// procs starts the processes under test.
var procs = proctest.Options{Timeout: waitTimeout, Tail: 40}

// coordinator is a single coordinator process of its own stack.
type coordinator struct {
	*stack.Node
}

// options are the stack options of these tests.
func options() stack.Options {
	return stack.Options{Coordinator: bins.coordinator, Renderer: bins.renderer, Procs: procs, RendererToken: tokenRenderer}
}

// startCoordinator starts a coordinator on listen with dataDir and waits
// until its health check answers SERVING.
func startCoordinator(t testing.TB, listen, dataDir string, args ...string) *coordinator {
	t.Helper()
	opts := options()
	opts.Listen, opts.DataDirs, opts.Args = listen, []string{dataDir}, args
	return &coordinator{Node: stack.Start(t, opts).Coordinators[0]}
}

// dataDir returns a data directory for a coordinator whose disk is not
// under test: on a tmpfs where one can be mounted, so that a busy disk
// shared with other tests cannot stall its commits (a stall longer than
// the time a lease has left expires it, heartbeats or not), and in a
// temporary directory otherwise.
func dataDir(t *testing.T) string {
	t.Helper()
	dir, err := mountTmpfs(t, 256<<20)
	if err != nil {
		return t.TempDir()
	}
	return dir
}

// renderer is a renderer process.
type renderer struct {
	*stack.RendererProc
	id string
}

// startRenderer starts a renderer named id against addr, logging at debug
// level (every lease and completion), and waits for its start line.
func startRenderer(t testing.TB, addr, id string, args ...string) *renderer {
	t.Helper()
	return &renderer{RendererProc: stack.StartRenderer(t, options(), stack.Renderer{ID: id, Coordinator: addr, Args: args}), id: id}
}

// dial returns a client for addr as token, closed when the test ends.
func dial(t testing.TB, addr, token string) *client.Client {
	t.Helper()
	c, err := client.Dial(addr, client.WithToken(token))
	if err != nil {
		t.Fatalf("dialing %s: %v", addr, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// testContext returns a context bounded by the failsafe timeout.
func testContext(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
	t.Cleanup(cancel)
	return ctx
}

// docs returns n small inline documents named prefix-i.txt.
func docs(prefix string, n int) []*leaseholdv1.Document {
	out := make([]*leaseholdv1.Document, n)
	for i := range out {
		content := fmt.Sprintf("document %s %d\n", prefix, i)
		out[i] = &leaseholdv1.Document{Name: fmt.Sprintf("%s-%03d.txt", prefix, i), ContentType: "text/plain",
			Content: []byte(content), SizeBytes: int64(len(content))}
	}
	return out
}

// submit submits docs as one batch and returns its job ids.
func submit(t testing.TB, c *client.Client, team, requestID string, d []*leaseholdv1.Document) (batchID string, jobIDs []string) {
	t.Helper()
	resp, err := c.SubmitBatch(testContext(t), team, requestID, d, nil)
	if err != nil {
		t.Fatalf("SubmitBatch(%s): %v", requestID, err)
	}
	return resp.GetBatch().GetId(), resp.GetBatch().GetJobIds()
}

// runConcurrently runs one subtest per case, all at once, and returns
// when all have ended. The cases wait on processes, not on the CPU, so
// t.Parallel's bound (-parallel, GOMAXPROCS by default) would only queue
// their waits one behind the other.
func runConcurrently[C any](t *testing.T, cases []C, name func(C) string, run func(*testing.T, C)) {
	t.Helper()
	var wg sync.WaitGroup
	for _, c := range cases {
		wg.Go(func() { t.Run(name(c), func(t *testing.T) { run(t, c) }) })
	}
	wg.Wait()
}

// watchBatch follows one watch of the batch, keeping each job's phase,
// until until returns true (it is asked after every message, with the
// phases so far) or the batch is done. It reports whether until held.
func watchBatch(ctx context.Context, c *client.Client, batchID string, until func(map[string]leaseholdv1.Phase) bool) (bool, error) {
	phases := map[string]leaseholdv1.Phase{}
	for msg, err := range c.BatchEvents(ctx, batchID) {
		if err != nil {
			return false, fmt.Errorf("watching batch %s: %w", batchID, err)
		}
		if msg.GetJobId() != "" {
			phases[msg.GetJobId()] = msg.GetPhase()
		}
		for _, u := range msg.GetUpdates() {
			phases[u.GetJobId()] = u.GetPhase()
		}
		if until != nil && until(phases) {
			return true, nil
		}
	}
	return until != nil && until(phases), nil
}

// waitPhases waits until the batch's jobs satisfy until.
func waitPhases(t testing.TB, c *client.Client, batchID, what string, until func(map[string]leaseholdv1.Phase) bool) {
	t.Helper()
	ok, err := watchBatch(testContext(t), c, batchID, until)
	if err != nil {
		t.Fatal(err)
	}
	if !ok {
		t.Fatalf("batch %s ended before %s", batchID, what)
	}
}

// countPhase returns how many jobs are in phase.
func countPhase(phases map[string]leaseholdv1.Phase, phase leaseholdv1.Phase) int {
	n := 0
	for _, p := range phases {
		if p == phase {
			n++
		}
	}
	return n
}

// waitBatchDone follows the batch until every job is terminal.
func waitBatchDone(t testing.TB, c *client.Client, batchID string) {
	t.Helper()
	if _, err := watchBatch(testContext(t), c, batchID, nil); err != nil {
		t.Fatal(err)
	}
}

// getJob returns a job with its history.
func getJob(t testing.TB, c *client.Client, id string) *leaseholdv1.Job {
	t.Helper()
	j, err := c.GetJob(testContext(t), id)
	if err != nil {
		t.Fatalf("GetJob(%s): %v", id, err)
	}
	return j
}

// eventsOf returns the job's events of one kind.
func eventsOf(j *leaseholdv1.Job, kind leaseholdv1.EventKind) []*leaseholdv1.JobEvent {
	var out []*leaseholdv1.JobEvent
	for _, ev := range j.GetEvents() {
		if ev.GetKind() == kind {
			out = append(out, ev)
		}
	}
	return out
}

// teamJobs returns every job of a team, with its history.
func teamJobs(t testing.TB, c *client.Client, team string) []*leaseholdv1.Job {
	t.Helper()
	var out []*leaseholdv1.Job
	for j, err := range c.AllJobs(testContext(t), &leaseholdv1.ListJobsRequest{Team: team, PageSize: 1000}) {
		if err != nil {
			t.Fatalf("listing the jobs of %s: %v", team, err)
		}
		out = append(out, j)
	}
	return out
}

// percentile returns the nearest-rank q-quantile (0 < q <= 1) of xs.
func percentile(xs []time.Duration, q float64) time.Duration {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[max(i, 0)]
}

// history formats a job's events, one a line, for failure messages.
func history(j *leaseholdv1.Job) string {
	var b strings.Builder
	for _, ev := range j.GetEvents() {
		fmt.Fprintf(&b, "  %s %v token=%d renderer=%s attempt=%d reason=%s %s\n", ev.GetAt().AsTime().Format("15:04:05.000"),
			ev.GetKind(), ev.GetToken(), ev.GetRendererId(), ev.GetAttempt(), ev.GetReason(), ev.GetMessage())
	}
	return b.String()
}
