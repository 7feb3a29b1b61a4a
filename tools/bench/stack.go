package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/leasehold/leasehold/internal/proctest"
	lstack "github.com/leasehold/leasehold/internal/stack"
	"github.com/leasehold/leasehold/internal/testbin"
)

// binaries are the paths of the programs the harness runs.
type binaries struct {
	coordinator string
	renderer    string
	// devFlag says the coordinator takes --dev for the development tokens
	// (a build from before it used them without being asked, which -compare
	// may run).
	devFlag bool
}

// prepareBinaries returns the binaries in dir, building them there with go
// build (from the current directory, the repository root) when one is
// missing or rebuild is set.
func prepareBinaries(ctx context.Context, dir string, rebuild bool, lg *logger) (binaries, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return binaries{}, err
	}
	b := binaries{coordinator: filepath.Join(abs, "coordinator"), renderer: filepath.Join(abs, "renderer")}
	missing := false
	for _, p := range []string{b.coordinator, b.renderer} {
		if _, err := os.Stat(p); err != nil {
			missing = true
		}
	}
	if missing || rebuild {
		lg.printf("building the coordinator and renderer into %s", abs)
		if err := os.MkdirAll(abs, 0o755); err != nil {
			return binaries{}, err
		}
		cmd := exec.CommandContext(ctx, "go", "build", "-o", abs+string(filepath.Separator),
			"./coordinator/cmd/coordinator", "./renderer/cmd/renderer")
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			return binaries{}, fmt.Errorf("building the binaries (run from the repository root): %w", err)
		}
	}
	for _, p := range []string{b.coordinator, b.renderer} {
		info, err := os.Stat(p)
		if err != nil {
			return binaries{}, err
		}
		lg.printf("using %s (built %s)", p, info.ModTime().Format("2006-01-02 15:04:05"))
	}
	help, _ := exec.CommandContext(ctx, b.coordinator, "--help").CombinedOutput()
	b.devFlag = strings.Contains(string(help), "-dev")
	return b, nil
}

// stack is a coordinator (or a cluster) and its renderers, in one
// temporary directory, started through internal/stack.
type stack struct {
	cfg  config
	bins binaries
	lg   *logger
	dir  string
	data string

	// prog is the TB procs reports to; procs lays out and starts the
	// processes.
	prog  *proctest.Program
	procs *lstack.Stack

	addr        string
	metricsAddr string

	coord     *proctest.Proc
	renderers []*proctest.Proc
	// followers are the cluster's other nodes (-cluster), coord its leader.
	followers []*proctest.Proc
	// nodes are a cluster's nodes, leader the one coord runs.
	nodes  []*lstack.Node
	leader *lstack.Node
	// store is a cluster's S3-compatible artifact store, nil on a single
	// node (whose directory store is inside the coordinator).
	store *storeServer

	// ctx ends when the run must stop: the caller's context, or a child
	// exiting unexpectedly (its cause says which).
	ctx    context.Context
	cancel context.CancelCauseFunc
}

// newStack creates the temporary directory and lays out the nodes (their
// ports and data directories); it starts nothing. extraFlags are
// coordinator flags the mode needs.
func newStack(ctx context.Context, cfg config, bins binaries, lg *logger, extraFlags []string) (*stack, error) {
	dir, err := os.MkdirTemp(cfg.tmp, "leasehold-bench-*")
	if err != nil {
		return nil, err
	}
	s := &stack{cfg: cfg, bins: bins, lg: lg, dir: dir}
	s.ctx, s.cancel = context.WithCancelCause(ctx)
	s.prog = proctest.NewProgram(s.ctx, dir, os.Stderr)
	nodes := max(cfg.cluster, 1)
	opts := lstack.Options{
		Coordinator: bins.coordinator, Renderer: bins.renderer,
		Nodes: nodes, NoDevFlag: !bins.devFlag, Metrics: true, LogDir: dir,
		RendererLogLevel: cmp.Or(cfg.logLevel, "info"), Unexpected: s.fail,
	}
	if nodes == 1 {
		opts.DataDirs = []string{filepath.Join(dir, "data")}
		if opts.Listen, err = testbin.FreeAddr(); err != nil {
			return nil, err
		}
	} else {
		for i := range nodes {
			opts.DataDirs = append(opts.DataDirs, filepath.Join(dir, fmt.Sprintf("data-n%d", i+1)))
		}
	}
	if cfg.logLevel != "" {
		opts.Args = append(opts.Args, "--log-level", cfg.logLevel)
	}
	if nodes > 1 {
		args, env, err := s.startStoreServer(ctx)
		if err != nil {
			return nil, err
		}
		opts.Args, opts.Env = append(opts.Args, args...), env
	}
	opts.Args = slices.Concat(opts.Args, extraFlags, cfg.coordinatorFlags)
	if err := s.prog.Run(func() { s.procs = lstack.New(s.prog, opts) }); err != nil {
		return nil, err
	}
	if nodes == 1 {
		n := s.procs.Coordinators[0]
		s.addr, s.metricsAddr, s.data = n.Addr, n.MetricsAddr, n.DataDir
	}
	if fs := fsType(dir); fs == "tmpfs" || fs == "ramfs" {
		lg.printf("warning: %s is on %s, where fsync costs nothing; use -tmp on a disk for real figures", dir, fs)
	}
	return s, nil
}

// launch starts node i's process again, without waiting for it.
func (s *stack) launch(i int) (*lstack.Node, error) {
	var n *lstack.Node
	err := s.prog.Run(func() { n = s.procs.Launch(i, s.procs.NodeArgs(i)) })
	return n, err
}

// fsType names the file system of path when it is one whose fsync is free.
func fsType(path string) string {
	var st syscall.Statfs_t
	if err := syscall.Statfs(path, &st); err != nil {
		return ""
	}
	switch st.Type {
	case 0x01021994:
		return "tmpfs"
	case 0x858458f6:
		return "ramfs"
	}
	return ""
}

// startCoordinator starts the coordinator on the stack's data directory and
// waits until it is SERVING. It returns the time from exec to SERVING.
// With -cluster N it starts N nodes instead and points the stack at the
// one that leads.
func (s *stack) startCoordinator() (time.Duration, error) {
	if s.cfg.cluster > 0 {
		return s.startCluster()
	}
	n, err := s.launch(0)
	if err != nil {
		return 0, err
	}
	s.coord = n.Proc
	at, err := testbin.WaitServing(s.ctx, s.addr, s.cfg.healthPoll, n.Exited())
	if err != nil {
		return 0, fmt.Errorf("waiting for the coordinator to serve: %w\n%s", err, n.Tail(20))
	}
	return at.Sub(n.Started()), nil
}

// stopCoordinator stops the coordinator (every node of a cluster) with
// SIGTERM and waits for it.
func (s *stack) stopCoordinator() (time.Duration, error) {
	for _, f := range s.followers {
		if _, err := f.Stop(s.cfg.stopGrace); err != nil {
			return 0, fmt.Errorf("%s: %w", f.Name(), err)
		}
	}
	s.followers = nil
	if s.coord == nil {
		return 0, nil
	}
	d, err := s.coord.Stop(s.cfg.stopGrace)
	s.coord = nil
	return d, err
}

// recordPath is renderer i's --record file.
func (s *stack) recordPath(i int) string {
	return filepath.Join(s.dir, fmt.Sprintf("renderer-%d.record", i))
}

// startRenderers starts the renderers, each appending its grants to its
// record file when record is set, and waits until the coordinator counts
// their capacity (when its metrics expose it).
func (s *stack) startRenderers(record bool) error {
	for i := 1; i <= s.cfg.renderers; i++ {
		args := []string{"--capacity", strconv.Itoa(s.cfg.capacity), "--latency", s.cfg.renderLatency.String()}
		if s.cfg.previewBytes > 0 {
			args = append(args, "--preview-bytes", strconv.Itoa(s.cfg.previewBytes))
		}
		r := lstack.Renderer{ID: fmt.Sprintf("bench-%d", i), Args: append(args, s.cfg.rendererFlags...)}
		if record {
			r.Record = s.recordPath(i)
		}
		var rp *lstack.RendererProc
		if err := s.prog.Run(func() { rp = s.procs.StartRenderer(r) }); err != nil {
			return err
		}
		s.renderers = append(s.renderers, rp.Proc)
	}
	return s.waitCapacity(s.cfg.renderers * s.cfg.capacity)
}

// waitCapacity waits up to 10 s for the coordinator's
// leasehold_live_renderer_capacity gauge to read want. When the gauge
// cannot be read, the renderers get one second instead.
func (s *stack) waitCapacity(want int) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, err := scrapeGauge(s.ctx, s.metricsURL(), "leasehold_live_renderer_capacity")
		switch {
		case s.ctx.Err() != nil:
			return context.Cause(s.ctx)
		case err != nil:
			s.lg.printf("warning: cannot tell when the renderers are connected (%v); giving them a second", err)
			return sleep(s.ctx, time.Second)
		case int(got) == want:
			return nil
		case time.Now().After(deadline):
			s.lg.printf("warning: the coordinator counts %v renderer slots, want %d; going on", got, want)
			return nil
		}
		if err := sleep(s.ctx, 10*time.Millisecond); err != nil {
			return err
		}
	}
}

// stopRenderers stops every renderer and waits for them.
func (s *stack) stopRenderers() error {
	var errs []error
	var wg sync.WaitGroup
	var mu sync.Mutex
	for _, r := range s.renderers {
		wg.Go(func() {
			if _, err := r.Stop(s.cfg.stopGrace); err != nil {
				mu.Lock()
				errs = append(errs, fmt.Errorf("%s: %w", r.Name(), err))
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	s.renderers = nil
	return errors.Join(errs...)
}

// fail ends the run because a child exited on its own.
func (s *stack) fail(err error) { s.cancel(err) }

// metricsURL is the coordinator's /metrics page.
func (s *stack) metricsURL() string { return "http://" + s.metricsAddr + "/metrics" }

// close stops every child, renderers first, prints the log tail of a child
// that failed, and removes the directory unless keep.
func (s *stack) close(failed bool, w io.Writer) {
	if cause := context.Cause(s.ctx); failed && cause != nil && !errors.Is(cause, context.Canceled) {
		for _, c := range slices.Concat([]*proctest.Proc{s.coord}, s.followers, s.renderers) {
			if c == nil {
				continue
			}
			select {
			case <-c.Exited():
				fmt.Fprintf(w, "--- last lines of %s:\n%s\n", c.LogPath(), c.Tail(30))
			default:
			}
		}
	}
	if err := s.stopRenderers(); err != nil {
		fmt.Fprintln(w, "bench: stopping the renderers:", err)
	}
	if _, err := s.stopCoordinator(); err != nil {
		fmt.Fprintln(w, "bench: stopping the coordinator:", err)
	}
	s.prog.Close()
	s.cancel(context.Canceled)
	if s.cfg.keep {
		fmt.Fprintf(w, "bench: kept %s (data, logs)\n", s.dir)
		return
	}
	if err := os.RemoveAll(s.dir); err != nil {
		fmt.Fprintln(w, "bench: removing the temporary directory:", err)
	}
}

// pids returns the coordinator's (a cluster's leader's) and the renderers'
// process ids.
func (s *stack) pids() (coord int, renderers []int) {
	if s.coord != nil {
		coord = s.coord.Pid()
	}
	for _, r := range s.renderers {
		renderers = append(renderers, r.Pid())
	}
	return coord, renderers
}

// followerPids returns the process ids of a cluster's followers.
func (s *stack) followerPids() []int {
	var out []int
	for _, f := range s.followers {
		out = append(out, f.Pid())
	}
	return out
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-t.C:
		return nil
	}
}
