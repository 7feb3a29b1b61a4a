package stack

import (
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"github.com/leasehold/leasehold/internal/proctest"
)

var bins struct{ coordinator, renderer string }

func TestMain(m *testing.M) {
	proctest.Main(m, "stack", []string{"coordinator", "renderer"}, func(dir string) {
		bins.coordinator, bins.renderer = filepath.Join(dir, "coordinator"), filepath.Join(dir, "renderer")
	})
}

func options(nodes int) Options {
	return Options{Coordinator: bins.coordinator, Renderer: bins.renderer, Nodes: nodes,
		Procs: proctest.Options{Timeout: 45 * time.Second, Tail: 40}}
}

// render submits one document through s and waits until it succeeded.
func render(t *testing.T, s *Stack) {
	t.Helper()
	c := s.Client("dev-alpha")
	content := []byte("one page\n")
	resp, err := c.SubmitBatch(t.Context(), "alpha", "stack-"+t.Name(),
		[]*leaseholdv1.Document{{Name: "a.txt", ContentType: "text/plain", Content: content, SizeBytes: int64(len(content))}}, nil)
	if err != nil {
		t.Fatalf("SubmitBatch: %v", err)
	}
	id := resp.GetBatch().GetJobIds()[0]
	for msg, err := range c.BatchEvents(t.Context(), resp.GetBatch().GetId()) {
		if err != nil {
			t.Fatalf("watching: %v", err)
		}
		if msg.GetJobId() == id && msg.GetPhase() == leaseholdv1.Phase_PHASE_SUCCEEDED {
			return
		}
		for _, u := range msg.GetUpdates() {
			if u.GetJobId() == id && u.GetPhase() == leaseholdv1.Phase_PHASE_SUCCEEDED {
				return
			}
		}
	}
	t.Fatal("the batch ended before its job succeeded")
}

func TestSingleNodeServesRestartsOnItsAddressAndRenders(t *testing.T) {
	t.Parallel()
	opts := options(1)
	opts.Metrics = true
	opts.Renderers = []Renderer{{ID: "r1"}}
	s := Start(t, opts)
	n := s.Coordinators[0]
	if n.Addr == "127.0.0.1:0" || n.MetricsAddr == "" || s.Addrs() != n.Addr || s.Leader() != n {
		t.Fatalf("node %+v, Addrs %q", n, s.Addrs())
	}
	render(t, s)
	addr, first := n.Addr, n.Proc
	s.RestartWith(0, "--lease-ttl", "20s")
	if n.Addr != addr || n.Proc == first || !first.HasExited() {
		t.Errorf("after Restart: addr %s (was %s), the old process exited %v", n.Addr, addr, first.HasExited())
	}
	if got := s.health(n.Addr, ""); got != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health after Restart = %v", got)
	}
	if logs := s.Logs(); len(logs["coordinator"]) == 0 || len(logs["renderer r1"]) == 0 {
		t.Errorf("Logs has %d processes, want the coordinator's and the renderer's lines", len(logs))
	}
}

func TestClusterElectsALeaderAndAnotherAfterItsKill(t *testing.T) {
	t.Parallel()
	opts := options(3)
	opts.Renderers = []Renderer{{ID: "r1"}}
	s := Start(t, opts)
	leader := s.Leader()
	for _, n := range s.Coordinators {
		if n.Raft == "" || n.Addr == "" {
			t.Fatalf("node %s without addresses: %+v", n.ID, n)
		}
	}
	render(t, s)
	i := s.Index(leader)
	s.Kill(i)
	next := s.Leader(s.Others(leader)...)
	if next == leader {
		t.Fatalf("the killed %s still leads", leader.ID)
	}
	render(t, s)
	if n := s.StartNode(i); n.HasExited() || n.Addr != leader.Addr {
		t.Errorf("the restarted %s: exited %v, addr %s (was %s)", n.ID, n.HasExited(), n.Addr, leader.Addr)
	}
	render(t, s)
}

func TestUnexpectedHearsAnExitThatNoStopOrKillAskedFor(t *testing.T) {
	t.Parallel()
	exits := make(chan error, 4)
	opts := options(1)
	opts.Unexpected = func(err error) { exits <- err }
	opts.Renderers = []Renderer{{ID: "r1"}}
	s := Start(t, opts)
	s.Renderers[0].Kill()
	n := s.Coordinators[0]
	n.Signal(syscall.SIGTERM)
	n.WaitGone()
	select {
	case err := <-exits:
		if !strings.Contains(err.Error(), "coordinator") {
			t.Errorf("Unexpected got %v, want the coordinator's exit", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Unexpected was not called for the coordinator's exit")
	}
	if len(exits) != 0 {
		t.Errorf("Unexpected was also called for %v, which was killed", <-exits)
	}
}

func TestNoDevFlagLeavesDevOut(t *testing.T) {
	opts := options(1)
	if args := New(t, opts).NodeArgs(0); !slices.Contains(args, "--dev") {
		t.Errorf("NodeArgs %q without --dev", args)
	}
	opts.NoDevFlag = true
	if args := New(t, opts).NodeArgs(0); slices.Contains(args, "--dev") {
		t.Errorf("NodeArgs %q with NoDevFlag name --dev", args)
	}
}
