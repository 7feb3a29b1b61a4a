package lincheck_test

import (
	"cmp"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/leasehold/leasehold/coordinator/lincheck"
	"github.com/leasehold/leasehold/internal/clustertest"
	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
)

var (
	long        = flag.Bool("long", false, "record and check a long history (50,000 calls; see LEASEHOLD_LINCHECK_OPS); with -cluster, under 10 leader kills, 2 isolations and 2 pauses")
	clusterMode = flag.Bool("cluster", false, "also run TestLinearizableCluster: three coordinator processes under leader faults")
)

// Defaults of the two modes. The short one is for CI: a few thousand calls,
// well under 30 s under -race on two cores.
const (
	shortOps = 2000
	longOps  = 50000
)

// The budgets of a cluster run: calls, leader kills, isolations and
// pauses. The short one is for CI, well under 45 s on two cores.
var (
	shortClusterBudget = budget{ops: 3000, kills: 1}
	longClusterBudget  = budget{ops: longOps, kills: 10, isolations: 2, pauses: 2}
)

// budget is the size of a cluster run.
type budget struct{ ops, kills, isolations, pauses int }

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		removeBins()
		os.Exit(code)
	}))
}

// envInt reads a positive integer from the environment, or returns def.
func envInt(t *testing.T, name string, def int) int {
	t.Helper()
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil || n <= 0 {
		t.Fatalf("%s=%q: want a positive integer", name, s)
	}
	return n
}

// TestLinearizable runs concurrent submitters, renderers and an operator
// against one coordinator over real gRPC, records every call, and checks
// the history against the model.
//
// Environment: LEASEHOLD_LINCHECK_OPS (calls to record; -long means
// 50,000), LEASEHOLD_LINCHECK_CLIENTS (8 to 16), LEASEHOLD_LINCHECK_SEED,
// LEASEHOLD_LINCHECK_WRONG_HOLDER=0 (do not complete current leases under
// another renderer's id, which the workload otherwise does now and then).
func TestLinearizable(t *testing.T) {
	ops := shortOps
	if *long {
		ops = longOps
	}
	opts := options{
		ops:         envInt(t, "LEASEHOLD_LINCHECK_OPS", ops),
		clients:     envInt(t, "LEASEHOLD_LINCHECK_CLIENTS", 12),
		cutRate:     0.02,
		liveJobs:    64,
		wrongHolder: os.Getenv("LEASEHOLD_LINCHECK_WRONG_HOLDER") != "0",
		seed:        uint64(envInt(t, "LEASEHOLD_LINCHECK_SEED", int(time.Now().UnixNano()%(1<<31)))),
	}
	if opts.clients < 8 || opts.clients > 16 {
		t.Fatalf("LEASEHOLD_LINCHECK_CLIENTS=%d: want 8 to 16", opts.clients)
	}
	spec := lincheck.Spec{MaxAttempts: maxAttempts}
	t.Logf("seed %d, %d clients, %d calls, wrong holders %v", opts.seed, opts.clients, opts.ops, opts.wrongHolder)

	logs := &syncBuffer{}
	addr, stop := startCoordinator(t, t.TempDir(), slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn})))
	start := time.Now()
	w := run(t, addr, opts)
	elapsed := time.Since(start)
	stop()
	records := w.rec.Records()
	t.Logf("recorded %d calls in %v (%.0f calls/s)", len(records), elapsed.Round(time.Millisecond), float64(len(records))/elapsed.Seconds())
	t.Logf("calls: %s", summarize(records))
	t.Logf("calls cut short on purpose: %v", w.cuts)

	for _, p := range check(t, records, spec, true) {
		t.Error(p)
	}
	if len(w.faults) > 0 {
		t.Errorf("calls that lost their answer without being cut short: %v", w.faults)
	}
	if t.Failed() {
		t.Logf("coordinator warnings and errors:\n%s", logs.String())
	}
}

// check checks records with porcupine, the cross-job checks and the
// stale-read checks, logs what it found and returns the violations. When
// porcupine finds no linearization it logs the calls of the first failing
// job, and with explain those of the first three and the visualisation of
// the partitions that fail.
func check(t *testing.T, records []lincheck.Record, spec lincheck.Spec, explain bool) []string {
	t.Helper()
	var bad []string
	if err := lincheck.CheckHistory(records); err != nil {
		bad = append(bad, fmt.Sprintf("cross-job checks failed:\n%v", err))
	}
	if err := lincheck.CheckStaleReads(records); err != nil {
		bad = append(bad, fmt.Sprintf("stale reads failed:\n%v", err))
	}
	model := lincheck.Model(spec)
	ops := lincheck.Operations(records)
	start := time.Now()
	res := porcupine.CheckOperationsTimeout(model, ops, 10*time.Minute)
	took := time.Since(start)
	jobs, lost := len(model.Partition(ops)), 0
	for _, op := range ops {
		if op.Input.(lincheck.Input).Kind == lincheck.Acquire && op.Output.(lincheck.Output).Pending {
			lost++
		}
	}
	t.Logf("porcupine: %d operations on %d jobs (%d placements of Acquires whose answer was lost): %s in %v",
		len(ops), jobs, lost, res, took.Round(time.Millisecond))
	if res == porcupine.Ok {
		return bad
	}
	bad = append(bad, fmt.Sprintf("the history is not linearizable (%s)", res))
	if res == porcupine.Illegal {
		failed := failing(model, ops)
		if !explain {
			logPartitions(t, model, failed, 1)
			return bad
		}
		logPartitions(t, model, failed, 3)
		if path := visualize(t, model, failed, outputDir(t)); path != "" {
			t.Logf("visualisation of the failing jobs: %s", path)
		}
	}
	return bad
}

// logPartitions logs the operations of the first n jobs of ops in call
// order, so that a failure can be read from the test log alone.
func logPartitions(t *testing.T, model porcupine.Model, ops []porcupine.Operation, n int) {
	t.Helper()
	for i, part := range model.Partition(ops) {
		if i == n {
			break
		}
		part = slices.Clone(part)
		slices.SortStableFunc(part, func(a, b porcupine.Operation) int { return cmp.Compare(a.Call, b.Call) })
		var b strings.Builder
		for _, op := range part {
			ret := "never"
			if op.Return != lincheck.Never {
				ret = time.Duration(op.Return).String()
			}
			fmt.Fprintf(&b, "\n  client %2d [%v, %s] %s", op.ClientId, time.Duration(op.Call), ret, model.DescribeOperation(op.Input, op.Output))
		}
		t.Logf("job %s:%s", part[0].Input.(lincheck.Input).Job, b.String())
	}
}

// failing returns the operations of the partitions (jobs) that fail on
// their own, at most 20 of them, so that the visualisation stays readable.
func failing(model porcupine.Model, ops []porcupine.Operation) []porcupine.Operation {
	var out []porcupine.Operation
	n := 0
	for _, part := range model.Partition(ops) {
		if porcupine.CheckOperations(model, part) {
			continue
		}
		out = append(out, part...)
		if n++; n == 20 {
			break
		}
	}
	return out
}

// outputDir returns where a failing check writes its visualisation: the
// test's artifact directory with -artifacts (go test -artifacts
// -outputdir DIR), else a new directory under os.TempDir that is kept.
func outputDir(t *testing.T) string {
	t.Helper()
	if f := flag.Lookup("test.artifacts"); f != nil && f.Value.String() == "true" {
		return t.ArtifactDir()
	}
	dir, err := os.MkdirTemp("", "lincheck-")
	if err != nil {
		t.Errorf("visualisation: %v", err)
		return ""
	}
	return dir
}

// visualize writes porcupine's HTML visualisation of ops into dir and
// returns its path ("" when it could not).
func visualize(t *testing.T, model porcupine.Model, ops []porcupine.Operation, dir string) string {
	t.Helper()
	if dir == "" {
		return ""
	}
	_, info := porcupine.CheckOperationsVerbose(model, ops, time.Minute)
	path := filepath.Join(dir, "linearizability.html")
	if err := porcupine.VisualizePath(model, info, path); err != nil {
		t.Errorf("visualisation: %v", err)
		return ""
	}
	return path
}

// summarize counts records by kind and answer.
func summarize(records []lincheck.Record) string {
	counts := map[string]int{}
	for _, r := range records {
		k := r.Kind.String()
		switch {
		case r.Pending:
			k += " lost"
		case r.Code != codes.OK:
			k += " " + cmp.Or(r.Reason, r.Code.String())
		case r.Kind == lincheck.Acquire:
			k += fmt.Sprintf(" %d grants", len(r.Grants))
		case r.Replayed:
			k += " replayed"
		case r.Kind == lincheck.Cancel && r.AlreadyCancelled:
			k += " already"
		case r.Kind == lincheck.Cancel && r.RunningRenderer != "":
			k += " running"
		default:
			k += " OK"
		}
		counts[k]++
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(counts)) {
		parts = append(parts, fmt.Sprintf("%s=%d", k, counts[k]))
	}
	return strings.Join(parts, ", ")
}

// syncBuffer is a log sink safe for concurrent writers.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestLinearizableCluster runs the workload of TestLinearizable against
// three coordinator processes (-cluster), with the leader killed,
// isolated from its peers and paused meanwhile, and checks the history:
// clients call through a channel that follows the leader as the client
// library does, and also send linearizable and stale reads straight to
// every node. A call refused NOT_LEADER changed nothing; one whose answer
// was lost (a cut connection, OUTCOME_UNKNOWN) may or may not have taken
// effect.
//
// Environment, besides TestLinearizable's: LEASEHOLD_LINCHECK_KILLS,
// LEASEHOLD_LINCHECK_ISOLATIONS, LEASEHOLD_LINCHECK_PAUSES (the faults;
// -long means 10, 2 and 2).
func TestLinearizableCluster(t *testing.T) {
	if !*clusterMode {
		t.Skip("runs with -cluster")
	}
	b := shortClusterBudget
	if *long {
		b = longClusterBudget
	}
	b.ops = envInt(t, "LEASEHOLD_LINCHECK_OPS", b.ops)
	b.kills = envCount(t, "LEASEHOLD_LINCHECK_KILLS", b.kills)
	b.isolations = envCount(t, "LEASEHOLD_LINCHECK_ISOLATIONS", b.isolations)
	b.pauses = envCount(t, "LEASEHOLD_LINCHECK_PAUSES", b.pauses)
	r := runCluster(t, coordinatorBin(t), b)
	for _, p := range check(t, r.records, lincheck.Spec{MaxAttempts: maxAttempts}, true) {
		t.Error(p)
	}
	if want := b.kills + b.isolations + b.pauses; r.faults.total() != want {
		t.Errorf("%d faults done, want %d", r.faults.total(), want)
	}
}

// envCount reads a count (zero or more) from the environment, or returns
// def.
func envCount(t *testing.T, name string, def int) int {
	t.Helper()
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		t.Fatalf("%s=%q: want a count", name, s)
	}
	return n
}

// clusterRun is what runCluster recorded.
type clusterRun struct {
	records []lincheck.Record
	faults  *faultLog
}

func (f *faultLog) total() int { return f.done[faultKill] + f.done[faultIsolate] + f.done[faultPause] }

// runCluster starts a cluster of coordinator processes from bin and runs
// the workload against it for b.ops calls, with b's faults spread over
// the run: fault i of n starts once (i+1)/(n+1) of the calls are
// recorded, and the run goes on until the last one is over.
func runCluster(t *testing.T, bin string, b budget, env ...string) clusterRun {
	t.Helper()
	opts := options{
		ops:           b.ops,
		clients:       envInt(t, "LEASEHOLD_LINCHECK_CLIENTS", 12),
		cutRate:       0.02,
		liveJobs:      64,
		wrongHolder:   os.Getenv("LEASEHOLD_LINCHECK_WRONG_HOLDER") != "0",
		seed:          uint64(envInt(t, "LEASEHOLD_LINCHECK_SEED", int(time.Now().UnixNano()%(1<<31)))),
		directReads:   0.3,
		staleReads:    0.15,
		directCancels: 0.1,
	}
	if opts.clients < 8 || opts.clients > 16 {
		t.Fatalf("LEASEHOLD_LINCHECK_CLIENTS=%d: want 8 to 16", opts.clients)
	}
	sched := schedule(b.kills, b.isolations, b.pauses)
	t.Logf("seed %d, %d clients, %d calls, faults %v", opts.seed, opts.clients, opts.ops, sched)

	// The coordinators' CPU time is known once they are reaped: at the
	// cluster's cleanup, which runs before this one.
	childrenBefore := cpuTime(syscall.RUSAGE_CHILDREN)
	var docs int
	t.Cleanup(func() {
		cpu := cpuTime(syscall.RUSAGE_CHILDREN) - childrenBefore
		t.Logf("coordinator processes: %.2f CPU-s in all, %.2f CPU-s per 1,000 documents (%d documents), %.2f per process on average",
			cpu.Seconds(), cpu.Seconds()*1000/float64(max(docs, 1)), docs, cpu.Seconds()*1000/float64(max(docs, 1))/3)
	})
	c := clustertest.Start(t, clustertest.Options{Coordinator: bin, Args: clusterArgs(), Procs: procs, Env: env})
	c.WaitLeader()
	opts.nodes = nodeAddrs(c)
	marks := make([]chan struct{}, len(sched))
	for i := range marks {
		marks[i] = make(chan struct{})
	}
	var next sync.Mutex
	reached := 0
	opts.progress = func(n int) {
		next.Lock()
		defer next.Unlock()
		for reached < len(marks) && n >= opts.ops*(reached+1)/(len(marks)+1) {
			close(marks[reached])
			reached++
		}
	}
	// The clients run on their own goroutines and the faults on the
	// test's, as clustertest wants; a fault that fails the test ends the
	// clients before the cluster stops.
	over, abort := make(chan struct{}), make(chan struct{})
	opts.until, opts.abort = over, abort
	done, ended := make(chan *workload, 1), make(chan struct{})
	start, selfBefore := time.Now(), cpuTime(syscall.RUSAGE_SELF)
	go func() {
		defer close(ended)
		done <- run(t, c.Addrs(), opts)
	}()
	finished := false
	t.Cleanup(func() {
		if !finished {
			close(abort)
			<-done
		}
	})
	flog := &faultLog{done: map[faultKind]int{}}
	for i, kind := range sched {
		select {
		case <-marks[i]:
		case <-ended:
			t.Fatalf("the clients stopped before fault %d", i+1)
		}
		inject(t, c, kind, flog)
	}
	close(over)
	w := <-done
	finished = true
	elapsed, self := time.Since(start), cpuTime(syscall.RUSAGE_SELF)-selfBefore
	records := w.rec.Records()
	dump(t, records)
	t.Logf("recorded %d calls in %v (%.0f calls/s)", len(records), elapsed.Round(time.Millisecond), float64(len(records))/elapsed.Seconds())
	t.Logf("calls: %s", summarize(records))
	docs = documents(records)
	t.Logf("the test process (clients, raft proxies): %.2f CPU-s, %.2f per 1,000 documents", self.Seconds(), self.Seconds()*1000/float64(max(docs, 1)))
	t.Logf("calls cut short on purpose: %v", w.cuts)
	t.Logf("faults done: %d kills, %d isolations, %d pauses; a leader among the others within %v", flog.done[faultKill],
		flog.done[faultIsolate], flog.done[faultPause], roundAll(flog.failovers))
	if len(w.faults) > 0 {
		t.Logf("calls that lost their answer to the faults: %d", len(w.faults))
	}
	return clusterRun{records: records, faults: flog}
}

// roundAll rounds each duration to the millisecond.
func roundAll(ds []time.Duration) []time.Duration {
	out := make([]time.Duration, len(ds))
	for i, d := range ds {
		out[i] = d.Round(time.Millisecond)
	}
	return out
}

// cpuTime returns the user and system CPU time of who (RUSAGE_SELF, or
// RUSAGE_CHILDREN: the child processes waited for).
func cpuTime(who int) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(who, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// documents counts the jobs the records' submissions created.
func documents(records []lincheck.Record) int {
	ids := map[string]bool{}
	for _, r := range records {
		if r.Kind == lincheck.Submit {
			for _, id := range r.JobIDs {
				ids[id] = true
			}
		}
	}
	return len(ids)
}

// dump writes records as JSON lines to $LEASEHOLD_LINCHECK_DUMP, when set,
// for reading a failed history call by call.
func dump(t *testing.T, records []lincheck.Record) {
	t.Helper()
	path := os.Getenv("LEASEHOLD_LINCHECK_DUMP")
	if path == "" {
		return
	}
	var b strings.Builder
	enc := json.NewEncoder(&b)
	for _, r := range records {
		if err := enc.Encode(r); err != nil {
			t.Errorf("dumping the history: %v", err)
			return
		}
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Errorf("dumping the history: %v", err)
	}
}
