package main

import (
	"context"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold/coordinator"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"github.com/leasehold/leasehold/renderer"
	"github.com/leasehold/leasehold/renderer/mock"
)

// startLocal starts a coordinator on a loopback port with the development
// tokens and one renderer of package mock (capacity 4, zero latency), both
// in the test process, and returns the coordinator's address. Both stop
// when the test ends.
func startLocal(t *testing.T) string {
	t.Helper()
	quiet := slog.New(slog.DiscardHandler)
	coord, err := coordinator.New(coordinator.Config{DataDir: t.TempDir(), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		coord.Close()
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- coord.Serve(lis) }()
	t.Cleanup(func() {
		coord.Close()
		<-served
	})
	addr := lis.Addr().String()
	provider, err := mock.New(mock.Config{})
	if err != nil {
		t.Fatal(err)
	}
	w, err := renderer.New(renderer.Config{
		Coordinator: addr, ID: "bench-test", Token: "dev-renderer", Capacity: 4, Provider: provider, Logger: quiet,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, drain := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- w.Run(ctx) }()
	t.Cleanup(func() {
		drain()
		<-ran
	})
	return addr
}

// arrivals records what a follower reported, safe for concurrent use.
type arrivals struct {
	mu     sync.Mutex
	phases map[leaseholdv1.Phase]int
	times  []time.Time
}

func (a *arrivals) terminal(at time.Time, p leaseholdv1.Phase) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.phases == nil {
		a.phases = map[leaseholdv1.Phase]int{}
	}
	a.phases[p]++
	a.times = append(a.times, at)
}

func (a *arrivals) count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.times)
}

// pausedBatch dials the coordinator at addr, pauses dispatch and submits
// one batch of n documents.
func pausedBatch(t *testing.T, addr string, n int) (*generator, *batch) {
	t.Helper()
	g, err := newGenerator(addr, 64)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.close)
	if _, err := g.operator.PauseDispatch(t.Context(), "test"); err != nil {
		t.Fatal(err)
	}
	b, err := g.submit(t.Context(), "test", n)
	if err != nil {
		t.Fatal(err)
	}
	return g, b
}

// followAfterOpening follows b, resumes dispatch once every job's opening
// snapshot has been reported, and returns how many jobs it had reported
// terminal before the resumption and the follow's result.
func followAfterOpening(t *testing.T, g *generator, b *batch, got *arrivals) (early int, err error) {
	t.Helper()
	opened := make(chan struct{})
	followed := make(chan error, 1)
	go func() {
		followed <- g.follow(t.Context(), b, followHooks{terminal: got.terminal, opened: func() { close(opened) }})
	}()
	select {
	case <-opened:
	case err := <-followed:
		t.Fatalf("follow ended before every job was reported: %v", err)
	}
	early = got.count()
	if _, err := g.operator.ResumeDispatch(t.Context(), "test"); err != nil {
		t.Fatal(err)
	}
	return early, <-followed
}

// TestFollow checks the bench's follower on client.FollowBatch against a
// real coordinator and renderer: the opening snapshots are reported before
// anything renders, and every job's terminal phase once, timed at its
// arrival, after the batch's acknowledgement. The subtests run in turn:
// they pause and resume the one coordinator's dispatch.
func TestFollow(t *testing.T) {
	t.Parallel()
	addr := startLocal(t)
	const n = 25

	t.Run("Every job's end is reported once, after the opening and the acknowledgement", func(t *testing.T) {
		g, b := pausedBatch(t, addr, n)
		var got arrivals
		early, err := followAfterOpening(t, g, b, &got)
		if err != nil {
			t.Fatalf("follow: %v", err)
		}
		if early != 0 {
			t.Errorf("%d jobs reported terminal with dispatch paused, want 0", early)
		}
		if got.phases[leaseholdv1.Phase_PHASE_SUCCEEDED] != n || len(got.times) != n {
			t.Errorf("reported %v in %d calls, want %d SUCCEEDED", got.phases, len(got.times), n)
		}
		for _, at := range got.times {
			if at.Before(b.ack) {
				t.Errorf("a job's end arrived at %v, before its batch's acknowledgement at %v", at, b.ack)
			}
		}
	})

	t.Run("A batch already done is reported from its snapshots", func(t *testing.T) {
		g, b := pausedBatch(t, addr, n)
		var first arrivals
		if _, err := followAfterOpening(t, g, b, &first); err != nil {
			t.Fatalf("follow: %v", err)
		}
		var got arrivals
		if err := g.follow(t.Context(), b, followHooks{terminal: got.terminal}); err != nil {
			t.Fatalf("following a done batch: %v", err)
		}
		if got.phases[leaseholdv1.Phase_PHASE_SUCCEEDED] != n {
			t.Errorf("reported %v, want %d SUCCEEDED", got.phases, n)
		}
	})

	t.Run("A watch refused with TOO_MANY_STREAMS is followed again", func(t *testing.T) {
		g, b := pausedBatch(t, addr, n)
		// Hold every watch stream the coordinator allows the submitter,
		// each open once its first message has arrived; the first refusal
		// gives them back.
		hold, release := context.WithCancel(t.Context())
		defer release()
		for range 64 {
			s, err := g.jobs.Jobs.WatchBatch(hold, &leaseholdv1.WatchBatchRequest{BatchId: b.id})
			if err == nil {
				_, err = s.Recv()
			}
			if err != nil {
				t.Fatalf("holding a watch: %v", err)
			}
		}
		refused := make(chan struct{})
		var once sync.Once
		g.refusedWait = func(ctx context.Context) error {
			once.Do(func() {
				close(refused)
				release()
			})
			return sleep(ctx, time.Millisecond)
		}
		var got arrivals
		followed := make(chan error, 1)
		go func() { followed <- g.follow(t.Context(), b, followHooks{terminal: got.terminal}) }()
		select {
		case <-refused:
		case err := <-followed:
			t.Fatalf("follow with every stream held ended with %v, want it to wait for a stream", err)
		}
		if _, err := g.operator.ResumeDispatch(t.Context(), "test"); err != nil {
			t.Fatal(err)
		}
		if err := <-followed; err != nil {
			t.Fatalf("follow: %v", err)
		}
		if got.phases[leaseholdv1.Phase_PHASE_SUCCEEDED] != n {
			t.Errorf("reported %v, want %d SUCCEEDED", got.phases, n)
		}
	})
}
