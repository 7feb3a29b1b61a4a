package sim

import (
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/engine"
	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	"github.com/leasehold/leasehold/coordinator/internal/reads"
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

// TestCheckerGrantSeen checks that a grant reaching a renderer passes only
// when a committed entry granted that job to that renderer under that
// token.
func TestCheckerGrantSeen(t *testing.T) {
	t.Parallel()
	grant := func(job, token uint64) engine.Grant {
		return engine.Grant{Job: jobs.Job{ID: job, Lease: jobs.Lease{Token: token, Renderer: "r-1"}}}
	}
	tests := []struct {
		name     string
		renderer string
		grant    engine.Grant
		wantFail bool
	}{
		{"A committed grant reaching its renderer is accepted", "r-1", grant(1, 5), false},
		{"A grant no committed entry made is caught", "r-1", grant(1, 6), true},
		{"A committed token reaching another renderer is caught", "r-2", grant(1, 5), true},
		{"A committed token for another job is caught", "r-1", grant(2, 5), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setupChecker(t)
			if f := b.feed(1, leasedTo(5, "r-1")...); f != nil {
				t.Fatalf("the grant: %v", f)
			}
			f := catches(func() { b.c.grantSeen(tt.renderer, tt.grant) })
			if (f != nil) != tt.wantFail {
				t.Errorf("got %v, want a failure %v", f, tt.wantFail)
			}
		})
	}
}

// TestCheckerLeaseAfterFailover checks the promise a promotion makes the
// leases live at it: none expires before a TTL and the extension from the
// promotion, counted or never heard from; a lease granted after it, or an
// expiry after the promise, is accepted.
func TestCheckerLeaseAfterFailover(t *testing.T) {
	t.Parallel()
	const promotedAt = 10 * time.Second
	const extend = 300 * time.Millisecond
	expired := func(at time.Duration, token uint64, never bool) jobs.Event {
		ev := jobs.Event{Kind: jobs.EventLeaseExpired, Phase: jobs.PhaseLeased, Token: token, Renderer: "r-1", At: epoch.Add(at)}
		if never {
			ev.Kind, ev.Phase, ev.Reason = jobs.EventRequeued, jobs.PhaseQueued, jobs.ReleaseNeverHeard
		}
		return ev
	}
	tests := []struct {
		name string
		// grantAfter grants the lease after the promotion instead of before.
		grantAfter bool
		end        jobs.Event
		wantFail   bool
	}{
		{"An expiry after the TTL and the extension is accepted", false, expired(promotedAt+leaseTTL+extend, 5, false), false},
		{"An expiry within the extension is caught", false, expired(promotedAt+leaseTTL, 5, false), true},
		{"A never-heard re-queue within the extension is caught", false, expired(promotedAt+leaseTTL+extend/2, 5, true), true},
		{"A lease granted after the promotion may expire after its TTL", true, expired(promotedAt+leaseTTL, 5, false), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setupChecker(t)
			b.c.w.now = promotedAt
			if !tt.grantAfter {
				if f := b.feed(1, leasedTo(5, "r-1")...); f != nil {
					t.Fatalf("the grant: %v", f)
				}
			}
			b.c.promoted(extend)
			if tt.grantAfter {
				if f := b.feed(1, leasedTo(5, "r-1")...); f != nil {
					t.Fatalf("the grant: %v", f)
				}
			}
			b.c.w.now = tt.end.At.Sub(epoch)
			f := b.feed(1, tt.end)
			switch {
			case tt.wantFail && (f == nil || !strings.Contains(f.Msg, "before the TTL and the extension")):
				t.Errorf("got %v, want a failure for an expiry before the promise ran out", f)
			case !tt.wantFail && f != nil:
				t.Errorf("got %v, want no failure", f)
			}
		})
	}
}

// TestCheckerRead checks that a read answered after a submission was
// acknowledged must find its batch.
func TestCheckerRead(t *testing.T) {
	t.Parallel()
	key := [2]string{"team-a", "req-1"}
	tests := []struct {
		name     string
		view     reads.BatchView
		err      error
		wantFail bool
	}{
		{"A read that finds the batch is accepted", reads.BatchView{Batch: jobs.Batch{ID: 3, Count: 2}}, nil, false},
		{"A read that does not find it is stale", reads.BatchView{}, jobs.ErrNotFound, true},
		{"A read that finds another batch is caught", reads.BatchView{Batch: jobs.Batch{ID: 4, Count: 2}}, nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setupChecker(t)
			b.c.acked[key] = ackedBatch{id: 3, count: 2}
			b.c.ackedKeys = append(b.c.ackedKeys, key)
			f := catches(func() { b.c.read(&coordinator{name: "n1"}, key, tt.view, tt.err) })
			if (f != nil) != tt.wantFail {
				t.Errorf("got %v, want a failure %v", f, tt.wantFail)
			}
		})
	}
}
