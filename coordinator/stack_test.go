package coordinator

import (
	"context"
	"log/slog"
	"net"
	"testing"

	"github.com/leasehold/leasehold/client"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"github.com/leasehold/leasehold/renderer"
	"github.com/leasehold/leasehold/renderer/mock"
)

// stack is a coordinator serving on loopback TCP with renderers working
// for it in this process; everything stops when the test ends, renderers
// first.
type stack struct {
	c    *Coordinator
	addr string
}

// startStack starts a coordinator with cfg (a temporary data directory
// and a discarding logger unless set) on a loopback port.
func startStack(t *testing.T, cfg Config) *stack {
	t.Helper()
	if cfg.DataDir == "" {
		cfg.DataDir = t.TempDir()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	c, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		c.Close()
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- c.Serve(lis) }()
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return &stack{c: c, addr: lis.Addr().String()}
}

// startRenderer runs a renderer with rc against the stack: the mock
// provider, the development renderer token, id "r-1" and a discarding
// logger unless set. It drains and stops when the test ends.
func (s *stack) startRenderer(t *testing.T, rc renderer.Config) {
	t.Helper()
	rc.Coordinator = s.addr
	if rc.ID == "" {
		rc.ID = "r-1"
	}
	if rc.Token == "" {
		rc.Token = "dev-renderer"
	}
	if rc.Logger == nil {
		rc.Logger = slog.New(slog.DiscardHandler)
	}
	if rc.Provider == nil {
		p, err := mock.New(mock.Config{})
		if err != nil {
			t.Fatal(err)
		}
		rc.Provider = p
	}
	w, err := renderer.New(rc)
	if err != nil {
		t.Fatalf("renderer.New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- w.Run(ctx) }()
	t.Cleanup(func() {
		w.EndDrain()
		cancel()
		if err := <-ran; err != nil {
			t.Errorf("renderer Run: %v", err)
		}
	})
}

// submitAndWait submits one document for team as cl's principal and
// follows its batch until every job is terminal; every job must end
// SUCCEEDED. It returns the batch.
func submitAndWait(t *testing.T, ctx context.Context, cl *client.Client, team string, doc *leaseholdv1.Document) *leaseholdv1.Batch {
	t.Helper()
	resp, err := cl.SubmitBatch(ctx, team, t.Name(), []*leaseholdv1.Document{doc}, nil)
	if err != nil {
		t.Fatalf("SubmitBatch: %v", err)
	}
	for _, err := range cl.FollowBatch(ctx, resp.GetBatch().GetId(), client.FollowOptions{TerminalOnly: true}) {
		if err != nil {
			t.Fatalf("following %s: %v", resp.GetBatch().GetId(), err)
		}
	}
	for _, id := range resp.GetBatch().GetJobIds() {
		j, err := cl.GetJob(ctx, id)
		if err != nil {
			t.Fatalf("GetJob(%s): %v", id, err)
		}
		if got := j.GetPhase(); got != leaseholdv1.Phase_PHASE_SUCCEEDED {
			t.Fatalf("job %s ended %v, want SUCCEEDED", id, got)
		}
	}
	return resp.GetBatch()
}
