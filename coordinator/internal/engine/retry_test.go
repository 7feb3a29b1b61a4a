package engine

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/leasehold/leasehold/coordinator/internal/jobs"
)

func TestRetries(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("TransientFailuresRetryUpToMaxAttemptsThenEndExhaustedWithTheLastCause", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		pol := b.cfg.Retry
		id := b.submit(t, "alpha", "r1", "a.pdf").FirstJob
		grants, checkedEarly := 0, 0
		for n := uint32(1); ; n++ {
			gs := b.acquire(t, "r-1", 1)
			if len(gs) != 1 || gs[0].Job.ID != id {
				t.Fatalf("attempt %d: grants = %+v, want job %d", n, gs, id)
			}
			grants++
			if gs[0].Job.Attempt != n {
				t.Errorf("attempt %d: granted with Attempt %d", n, gs[0].Job.Attempt)
			}
			b.clock.Advance(time.Second)
			failedAt := b.clock.Now()
			res, err := complete(ctx, b.e, failure(id, gs[0].Job.Lease.Token, "r-1", jobs.ClassTransient, fmt.Sprintf("cause %d", n)))
			if err != nil {
				t.Fatalf("attempt %d: %v", n, err)
			}
			if n == pol.MaxAttempts {
				j := res.Job
				if j.Phase != jobs.PhaseFailed || j.TerminalReason != jobs.ReasonAttemptsExhausted {
					t.Fatalf("after attempt %d: %v %v, want FAILED ATTEMPTS_EXHAUSTED", n, j.Phase, j.TerminalReason)
				}
				if want := fmt.Sprintf("cause %d", n); !strings.Contains(j.TerminalMessage, want) {
					t.Errorf("terminal message = %q, want it to carry the last cause %q", j.TerminalMessage, want)
				}
				break
			}
			j := res.Job
			if j.Phase != jobs.PhaseRetryWait {
				t.Fatalf("after attempt %d: phase %v, want RETRY_WAIT", n, j.Phase)
			}
			wait := j.NextAttemptAt.Sub(failedAt)
			ceiling := min(pol.BackoffCap, pol.BackoffBase<<(n-1))
			if wait < 0 || wait > ceiling {
				t.Errorf("after attempt %d: backoff %v, want within [0, %v]", n, wait, ceiling)
			}
			if wait > 0 {
				b.tick(t, wait-time.Nanosecond)
				if got := b.acquireAll(t, "r-1"); len(got) != 0 {
					t.Fatalf("after attempt %d: granted %v a nanosecond before NextAttemptAt", n, got)
				}
				if p := b.job(t, id).Phase; p != jobs.PhaseRetryWait {
					t.Fatalf("after attempt %d: phase %v a nanosecond before NextAttemptAt, want RETRY_WAIT", n, p)
				}
				checkedEarly++
				wait = time.Nanosecond
			}
			b.tick(t, wait)
		}
		if grants != int(pol.MaxAttempts) {
			t.Errorf("granted %d times, want MaxAttempts = %d", grants, pol.MaxAttempts)
		}
		if checkedEarly == 0 {
			t.Error("every backoff was zero: nothing checked that a waiting job is not granted early")
		}
		b.tick(t, time.Hour)
		if got := b.acquireAll(t, "r-1"); len(got) != 0 {
			t.Errorf("an exhausted job was granted again: %v", got)
		}
		j := b.job(t, id)
		if j.Attempt != pol.MaxAttempts || countEvents(j, jobs.EventAttemptFailed) != int(pol.MaxAttempts) || terminalEvents(j) != 1 {
			t.Errorf("history: attempt %d, %d ATTEMPT_FAILED, %d terminal; want %d, %d, 1",
				j.Attempt, countEvents(j, jobs.EventAttemptFailed), terminalEvents(j), pol.MaxAttempts, pol.MaxAttempts)
		}
	})

	t.Run("BackoffNeverExceedsItsCeilingOverManyJobs", func(t *testing.T) {
		t.Parallel()
		b := setup(t, func(c *Config) {
			c.Retry = jobs.RetryPolicy{MaxAttempts: 6, BackoffBase: time.Second, BackoffCap: 5 * time.Second}
		})
		names := make([]string, 20)
		for i := range names {
			names[i] = fmt.Sprintf("doc-%d.pdf", i)
		}
		b.submit(t, "alpha", "r1", names...)
		pol := b.cfg.Retry
		seen := 0
		for round := 0; round < int(pol.MaxAttempts); round++ {
			gs := b.acquire(t, "r-1", len(names))
			for _, g := range gs {
				n := g.Job.Attempt
				res, err := complete(ctx, b.e, failure(g.Job.ID, g.Job.Lease.Token, "r-1", jobs.ClassTransient, "flaky"))
				if err != nil {
					t.Fatal(err)
				}
				if res.Job.Phase != jobs.PhaseRetryWait {
					continue
				}
				seen++
				wait := res.Job.NextAttemptAt.Sub(b.clock.Now())
				if ceiling := min(pol.BackoffCap, pol.BackoffBase<<(n-1)); wait < 0 || wait > ceiling {
					t.Errorf("job %d attempt %d: backoff %v, want within [0, %v]", g.Job.ID, n, wait, ceiling)
				}
			}
			b.tick(t, pol.BackoffCap)
		}
		if want := len(names) * int(pol.MaxAttempts-1); seen != want {
			t.Errorf("checked %d backoffs, want %d", seen, want)
		}
	})

	t.Run("ExpiredLeasesCountAsAttemptsAndEndExhausted", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		id := b.submit(t, "alpha", "r1", "a.pdf").FirstJob
		grants := 0
		for range 10 {
			gs := b.acquireAll(t, "r-1")
			if len(gs) == 0 {
				break
			}
			grants++
			if grants == 1 {
				b.tick(t, b.cfg.LeaseTTL-time.Nanosecond)
				if p := b.job(t, id).Phase; p != jobs.PhaseLeased {
					t.Fatalf("a nanosecond before the deadline phase = %v, want LEASED", p)
				}
				b.tick(t, time.Nanosecond)
			} else {
				b.tick(t, b.cfg.LeaseTTL)
			}
			j := b.job(t, id)
			if j.Phase == jobs.PhaseFailed {
				break
			}
			if j.Phase != jobs.PhaseRetryWait {
				t.Fatalf("after the deadline of grant %d: phase %v, want RETRY_WAIT", grants, j.Phase)
			}
			// Just past the retry's due time: this test counts attempts;
			// the boundary of a lease's deadline is judged above.
			b.tick(t, j.NextAttemptAt.Sub(b.clock.Now())+time.Millisecond)
		}
		if grants != int(b.cfg.Retry.MaxAttempts) {
			t.Errorf("granted %d times, want MaxAttempts = %d", grants, b.cfg.Retry.MaxAttempts)
		}
		j := b.job(t, id)
		if j.Phase != jobs.PhaseFailed || j.TerminalReason != jobs.ReasonAttemptsExhausted {
			t.Fatalf("job = %v %v, want FAILED ATTEMPTS_EXHAUSTED", j.Phase, j.TerminalReason)
		}
		if !strings.Contains(j.TerminalMessage, "lease expired on renderer r-1") {
			t.Errorf("terminal message = %q, want the expiry as last cause", j.TerminalMessage)
		}
		if n := countEvents(j, jobs.EventLeaseExpired); n != int(b.cfg.Retry.MaxAttempts) {
			t.Errorf("LEASE_EXPIRED events = %d, want %d", n, b.cfg.Retry.MaxAttempts)
		}
		b.tick(t, time.Hour)
		if got := b.acquireAll(t, "r-1"); len(got) != 0 {
			t.Errorf("an exhausted job was granted again: %v", got)
		}
	})

	t.Run("RetryTimersAndLeaseDeadlinesSurviveARestart", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ids := b.submit(t, "alpha", "r1", "retry.pdf", "leased.pdf").JobIDs()
		gs := b.acquire(t, "r-1", 2)
		if len(gs) != 2 {
			t.Fatalf("grants = %d, want 2", len(gs))
		}
		b.clock.Advance(time.Second)
		res, err := complete(ctx, b.e, failure(ids[0], gs[0].Job.Lease.Token, "r-1", jobs.ClassTransient, "flaky"))
		if err != nil {
			t.Fatal(err)
		}
		waiting := res.Job
		wait := waiting.NextAttemptAt.Sub(b.clock.Now())
		if waiting.Phase != jobs.PhaseRetryWait || wait <= 0 {
			t.Fatalf("job = %v waiting %v, want RETRY_WAIT with a positive backoff", waiting.Phase, wait)
		}
		before := b.job(t, ids[0])

		b.restart(t)
		// Every live lease gets a full TTL from the restart.
		deadline := b.clock.Now().Add(b.cfg.LeaseTTL)
		if diff := cmp.Diff(before, b.job(t, ids[0])); diff != "" {
			t.Fatalf("the waiting job changed across the restart:\n%s", diff)
		}
		b.tick(t, wait-time.Nanosecond)
		if got := b.acquireAll(t, "r-2"); len(got) != 0 {
			t.Fatalf("granted %v before NextAttemptAt after a restart", got)
		}
		b.tick(t, time.Nanosecond)
		got := b.acquire(t, "r-2", 10)
		if len(got) != 1 || got[0].Job.ID != ids[0] || got[0].Job.Attempt != 2 {
			t.Fatalf("grants at NextAttemptAt = %+v, want job %d attempt 2", got, ids[0])
		}

		b.tick(t, deadline.Sub(b.clock.Now())-time.Nanosecond)
		if p := b.job(t, ids[1]).Phase; p != jobs.PhaseLeased {
			t.Fatalf("lease before its deadline after a restart: phase %v, want LEASED", p)
		}
		b.tick(t, time.Nanosecond)
		// Its holder was never heard from since the restart: the attempt is
		// not counted.
		if j := b.job(t, ids[1]); j.Phase != jobs.PhaseQueued || j.Attempt != 0 {
			t.Fatalf("lease at its deadline after a restart: phase %v attempt %d, want QUEUED attempt 0", j.Phase, j.Attempt)
		}
	})

	t.Run("PermanentFailuresEndAtOnceAndAreNeverGrantedAgain", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct {
			class  jobs.FailureClass
			reason jobs.TerminalReason
		}{
			{jobs.ClassInvalidDocument, jobs.ReasonInvalidDocument},
			{jobs.ClassUnsupportedFormat, jobs.ReasonUnsupportedFormat},
		} {
			t.Run(tc.class.String(), func(t *testing.T) {
				t.Parallel()
				b := setup(t)
				id := b.submit(t, "alpha", "r1", "a.pdf").FirstJob
				g := b.acquire(t, "r-1", 1)[0]
				res, err := complete(ctx, b.e, failure(id, g.Job.Lease.Token, "r-1", tc.class, "broken xref table"))
				if err != nil {
					t.Fatal(err)
				}
				j := res.Job
				if j.Phase != jobs.PhaseFailed || j.TerminalReason != tc.reason || j.TerminalMessage != "broken xref table" || j.Attempt != 1 {
					t.Fatalf("job = %v %v %q attempt %d; want FAILED %v after one attempt", j.Phase, j.TerminalReason, j.TerminalMessage, j.Attempt, tc.reason)
				}
				if diff := cmp.Diff(j, b.job(t, id), ignoreHistory); diff != "" {
					t.Errorf("stored job differs from the answer:\n%s", diff)
				}
				b.tick(t, 24*time.Hour)
				if got := b.acquireAll(t, "r-1"); len(got) != 0 {
					t.Errorf("a permanently failed job was granted again: %v", got)
				}
			})
		}
	})
}
