package sim

import (
	"strings"
	"testing"

	"github.com/leasehold/leasehold/coordinator/internal/engine"
	"github.com/leasehold/leasehold/coordinator/internal/jobs"
)

// checkerBundle is a checker outside any run: tests feed it events and
// answers directly and see whether it fails.
type checkerBundle struct {
	c *checker
}

func setupChecker(t *testing.T) *checkerBundle {
	t.Helper()
	w := &world{cfg: Config{Seed: 1}}
	w.check = newChecker(w)
	return &checkerBundle{c: w.check}
}

// feed checks events of job id in order, as a group does, and returns the
// failure it raised, or nil.
func (b *checkerBundle) feed(id uint64, evs ...jobs.Event) *Failure {
	c := b.c
	return catches(func() {
		for _, ev := range evs {
			t := c.jobs[id]
			if t == nil {
				t = &track{phase: jobs.PhaseUnspecified}
				c.jobs[id] = t
				c.ids = append(c.ids, id)
			}
			ev.Seq = t.seq + 1
			c.event(id, t, ev, false)
			t.seq, t.phase = ev.Seq, ev.Phase
		}
	})
}

// catches runs fn and returns the failure it raised, or nil.
func catches(fn func()) (f *Failure) {
	defer func() {
		if p := recover(); p != nil {
			var ok bool
			if f, ok = p.(*Failure); !ok {
				panic(p)
			}
		}
	}()
	fn()
	return nil
}

func leasedTo(token uint64, renderer string) []jobs.Event {
	return []jobs.Event{
		{Kind: jobs.EventSubmitted, Phase: jobs.PhaseQueued},
		{Kind: jobs.EventLeased, Phase: jobs.PhaseLeased, Token: token, Renderer: renderer},
	}
}

// TestCheckerEvents feeds the checker single events after a grant and
// checks that it accepts the legal one and fails on each illegal one.
func TestCheckerEvents(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		// end is the event after the job was leased under 5 to r-1.
		end      jobs.Event
		wantFail string
	}{
		{"An attempt failed by the holder is accepted",
			jobs.Event{Kind: jobs.EventAttemptFailed, Phase: jobs.PhaseLeased, Token: 5, Renderer: "r-1"}, ""},
		{"An attempt failed under the live token by another renderer is caught",
			jobs.Event{Kind: jobs.EventAttemptFailed, Phase: jobs.PhaseLeased, Token: 5, Renderer: "r-2"}, "live lease 5 of r-1"},
		{"A failure under the live token by another renderer is caught",
			jobs.Event{Kind: jobs.EventFailed, Phase: jobs.PhaseFailed, Token: 5, Renderer: "r-2"}, "live lease 5 of r-1"},
		{"A hand-back re-queue by another renderer is caught",
			jobs.Event{Kind: jobs.EventRequeued, Phase: jobs.PhaseQueued, Token: 5, Renderer: "r-2"}, "live lease 5 of r-1"},
		{"An attempt failed under a stale token is caught",
			jobs.Event{Kind: jobs.EventAttemptFailed, Phase: jobs.PhaseLeased, Token: 4, Renderer: "r-1"}, "of token 4"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setupChecker(t)
			if f := b.feed(1, leasedTo(5, "r-1")...); f != nil {
				t.Fatalf("the grant: %v", f)
			}
			f := b.feed(1, tt.end)
			switch {
			case tt.wantFail == "" && f != nil:
				t.Errorf("got %v, want no failure", f)
			case tt.wantFail != "" && (f == nil || !strings.Contains(f.Msg, tt.wantFail)):
				t.Errorf("got %v, want a failure naming %q", f, tt.wantFail)
			}
		})
	}
}

// TestCheckerLeaseStatuses checks that a heartbeat or hand-back answered
// as applied passes only for the renderer the token was granted to.
func TestCheckerLeaseStatuses(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		renderer string
		status   engine.LeaseStatus
		wantFail bool
	}{
		{"The holder's heartbeat answered held is accepted", "r-1", engine.LeaseStatus{Job: 1, Token: 5, Held: true}, false},
		{"Another renderer's heartbeat answered not held is accepted", "r-2", engine.LeaseStatus{Job: 1, Token: 5, Reason: "NOT_LEASE_HOLDER"}, false},
		{"Another renderer's heartbeat answered held is caught", "r-2", engine.LeaseStatus{Job: 1, Token: 5, Held: true}, true},
		{"Another renderer's hand-back applied is caught", "r-2", engine.LeaseStatus{Job: 1, Token: 5, Reason: jobs.ReleaseHandedBack}, true},
		{"A heartbeat held under a token never granted is caught", "r-1", engine.LeaseStatus{Job: 1, Token: 9, Held: true}, true},
		{"A heartbeat held under another job's token is caught", "r-1", engine.LeaseStatus{Job: 2, Token: 5, Held: true}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setupChecker(t)
			if f := b.feed(1, leasedTo(5, "r-1")...); f != nil {
				t.Fatalf("the grant: %v", f)
			}
			f := catches(func() { b.c.leaseStatuses(tt.renderer, "heartbeat", []engine.LeaseStatus{tt.status}) })
			if (f != nil) != tt.wantFail {
				t.Errorf("got %v, want a failure %v", f, tt.wantFail)
			}
		})
	}
}
