package jobs

import (
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// requeuedUncounted returns the record a LEASED job j must become when its
// lease goes back to the queue at now without counting the attempt, with
// reason recorded.
func requeuedUncounted(j Job, now time.Time, reason string) Job {
	token, renderer := j.Lease.Token, j.Lease.Renderer
	j = clone(j)
	for i := range j.Leases {
		if j.Leases[i].Token == token {
			j.Leases[i].Kind = LeaseReleased
		}
	}
	j.Phase, j.Attempt, j.Lease = PhaseQueued, j.Attempt-1, Lease{}
	j.EnqueuedAt, j.UpdatedAt = now, now
	return withEvents(j, Event{Seq: j.EventSeq + 1, At: now, Kind: EventRequeued, Phase: PhaseQueued, Token: token, Renderer: renderer, Attempt: j.Attempt, Reason: reason})
}

func TestRelease(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	policy := RetryPolicy{MaxAttempts: 3, BackoffBase: time.Second, BackoffCap: time.Minute}
	queued := New(1, 1, "alpha", Document{Name: "a.pdf"}, policy, false, t0)
	leased, err := queued.Grant(9, "r-1", t0, 15*time.Second)
	if err != nil {
		t.Fatal(err)
	}

	t.Run("An undelivered lease returns the job to QUEUED without counting the attempt", func(t *testing.T) {
		now := t0.Add(time.Second)
		got, err := leased.Release(9, "r-1", now, ReleaseUndelivered)
		if err != nil {
			t.Fatal(err)
		}
		want := queued
		want.Leases = []LeaseRecord{{Token: 9, Renderer: "r-1", Kind: LeaseReleased}}
		want.EnqueuedAt, want.UpdatedAt = now, now
		want = withEvents(want,
			Event{Seq: 2, At: t0, Kind: EventLeased, Phase: PhaseLeased, Token: 9, Renderer: "r-1", Attempt: 1},
			Event{Seq: 3, At: now, Kind: EventRequeued, Phase: PhaseQueued, Token: 9, Renderer: "r-1", Reason: "LEASE_UNDELIVERED"},
		)
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("released record (-want +got):\n%s", diff)
		}
		if err := got.CheckLease(9, "r-1", now); !errors.Is(err, ErrStaleLease) {
			t.Fatalf("the released token afterwards: %v, want ErrStaleLease", err)
		}
	})
	t.Run("Another token, renderer or phase is refused by the fencing check and changes nothing", func(t *testing.T) {
		for _, tc := range []struct {
			name     string
			job      Job
			token    uint64
			renderer string
			want     error
		}{
			{"wrong token", leased, 8, "r-1", ErrStaleLease},
			{"another renderer", leased, 9, "r-2", ErrNotHolder},
			{"queued job, never leased", queued, 9, "r-1", ErrNotHolder},
		} {
			got, err := tc.job.Release(tc.token, tc.renderer, t0, ReleaseUndelivered)
			if !errors.Is(err, tc.want) {
				t.Errorf("%s: err = %v, want %v", tc.name, err, tc.want)
			}
			if diff := cmp.Diff(tc.job, got); diff != "" {
				t.Errorf("%s: refused release changed the job:\n%s", tc.name, diff)
			}
		}
	})
}

func TestHandBack(t *testing.T) {
	t.Run("The holder hands its lease back: QUEUED at once, the attempt not counted, recorded as REQUEUED HANDED_BACK", func(t *testing.T) {
		in := leased(t, 1)
		now := at(5 * time.Second)
		got, err := in.HandBack(1, "r1", now, 0)
		if err != nil {
			t.Fatalf("HandBack = %v, want nil", err)
		}
		want := requeuedUncounted(in, now, "HANDED_BACK")
		want.HandedBack = 1
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("handed-back record (-want +got):\n%s", diff)
		}
		if got.Attempt != 0 || got.Leases[0].Kind != LeaseReleased {
			t.Errorf("attempt %d lease %+v, want 0 and LeaseReleased", got.Attempt, got.Leases[0])
		}
	})
	t.Run("A hand-back on the last attempt does not exhaust the job", func(t *testing.T) {
		got, err := lastAttemptLeased(t).HandBack(3, "r1", at(101*time.Second), 0)
		if err != nil {
			t.Fatalf("HandBack = %v, want nil", err)
		}
		if got.Phase != PhaseQueued || got.Attempt != testPolicy.MaxAttempts-1 {
			t.Fatalf("after hand-back: %v attempt %d, want QUEUED attempt %d", got.Phase, got.Attempt, testPolicy.MaxAttempts-1)
		}
		next := mustJob(t)(got.Grant(4, "r2", at(102*time.Second), testTTL))
		if next.Attempt != testPolicy.MaxAttempts {
			t.Errorf("attempt of the next grant = %d, want %d", next.Attempt, testPolicy.MaxAttempts)
		}
	})
	t.Run("Uncounted hand-backs are bounded by MaxAttempts per cycle, then a hand-back counts as a failed attempt", func(t *testing.T) {
		j := queued()
		now := t0
		for tok := uint64(1); tok <= uint64(testPolicy.MaxAttempts); tok++ {
			j = mustJob(t)(j.Grant(tok, "r1", now, testTTL))
			now = now.Add(time.Second)
			j = mustJob(t)(j.HandBack(tok, "r1", now, testJitter))
			if j.Phase != PhaseQueued || j.Attempt != 0 || j.HandedBack != uint32(tok) {
				t.Fatalf("hand-back %d: %v attempt %d handed back %d, want QUEUED 0 %d", tok, j.Phase, j.Attempt, j.HandedBack, tok)
			}
		}
		tok := uint64(testPolicy.MaxAttempts) + 1
		in := mustJob(t)(j.Grant(tok, "r1", now, testTTL))
		now = now.Add(time.Second)
		got, err := in.HandBack(tok, "r1", now, testJitter)
		if err != nil {
			t.Fatalf("HandBack = %v, want nil", err)
		}
		next := now.Add(500 * time.Millisecond) // 0.5 * min(1m, 1s)
		want := clone(in)
		want.Leases[len(want.Leases)-1].Kind = LeaseCompleted
		want.Leases[len(want.Leases)-1].Outcome = "failure:HANDED_BACK"
		want.Phase, want.NextAttemptAt, want.Lease = PhaseRetryWait, next, Lease{}
		want.LastCause = "handed back by renderer r1, more than 3 times in this cycle"
		want.UpdatedAt = now
		want = withEvents(want,
			Event{Seq: in.EventSeq + 1, At: now, Kind: EventAttemptFailed, Phase: PhaseLeased, Token: tok, Renderer: "r1", Attempt: 1, Reason: "HANDED_BACK", Message: want.LastCause},
			Event{Seq: in.EventSeq + 2, At: now, Kind: EventRetryScheduled, Phase: PhaseRetryWait, Token: tok, Attempt: 1, Message: next.Format(time.RFC3339Nano)},
		)
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("hand-back past the bound (-want +got):\n%s", diff)
		}
		for a := 1; a < int(testPolicy.MaxAttempts); a++ {
			now = got.NextAttemptAt
			got = mustJob(t)(got.Requeue(now))
			tok++
			got = mustJob(t)(got.Grant(tok, "r1", now, testTTL))
			got = mustJob(t)(got.HandBack(tok, "r1", now, testJitter))
		}
		if got.Phase != PhaseFailed || got.TerminalReason != ReasonAttemptsExhausted {
			t.Errorf("after %d counted hand-backs: %v %v, want FAILED ATTEMPTS_EXHAUSTED", testPolicy.MaxAttempts, got.Phase, got.TerminalReason)
		}
		replayed := mustJob(t)(got.Replay("ops", "fixed the renderer", false, now))
		if replayed.HandedBack != 0 {
			t.Errorf("a replay left HandedBack %d, want 0", replayed.HandedBack)
		}
	})
	t.Run("The handed-back token is stale afterwards for its holder", func(t *testing.T) {
		j := mustJob(t)(leased(t, 1).HandBack(1, "r1", at(5*time.Second), 0))
		j = mustJob(t)(j.Grant(2, "r2", at(6*time.Second), testTTL))
		if _, err := j.Heartbeat(1, "r1", at(7*time.Second), testTTL); !errors.Is(err, ErrStaleLease) {
			t.Errorf("heartbeat of the handed-back token = %v, want ErrStaleLease", err)
		}
		got, _, err := j.Complete(successBy(1, "r1"), at(7*time.Second), 0)
		if !errors.Is(err, ErrStaleLease) {
			t.Errorf("completion of the handed-back token = %v, want ErrStaleLease", err)
		}
		if got.Phase != PhaseLeased || got.Lease != j.Lease || got.Artifact != (Artifact{}) {
			t.Errorf("after the stale completion: %v lease %+v artifact %+v, want r2's lease untouched", got.Phase, got.Lease, got.Artifact)
		}
	})
	t.Run("A hand-back is fenced like a completion and a refused one changes nothing", func(t *testing.T) {
		tests := []struct {
			name     string
			in       func(t testing.TB) Job
			token    uint64
			renderer string
			now      time.Time
			wantErr  error
		}{
			{"Another renderer with the current token is not the holder", func(t testing.TB) Job { return leased(t, 1) }, 1, "r2", at(2 * time.Second), ErrNotHolder},
			{"An older token is stale", func(t testing.TB) Job { return leased(t, 5) }, 4, "r1", at(2 * time.Second), ErrStaleLease},
			{"The current token at the deadline has expired", func(t testing.TB) Job { return leased(t, 1) }, 1, "r1", at(time.Second + testTTL), ErrLeaseExpired},
			{"The revoked token of a cancelled job is cancelled", cancelled, 1, "r1", at(3 * time.Second), ErrJobCancelled},
			{"Any token of a job never leased is not the caller's", func(testing.TB) Job { return queued() }, 1, "r1", at(2 * time.Second), ErrNotHolder},
			{"A token of a queued job from its earlier holder is stale", func(t testing.TB) Job { return retryWaiting(t) }, 1, "r1", at(2 * time.Second), ErrStaleLease},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				in := tt.in(t)
				before := clone(in)
				got, err := in.HandBack(tt.token, tt.renderer, tt.now, 0)
				if !errors.Is(err, tt.wantErr) || !IsFence(err) {
					t.Fatalf("HandBack = %v, want a fencing error matching %v", err, tt.wantErr)
				}
				assertUnchanged(t, got, before)
				assertUnchanged(t, in, before)
			})
		}
	})
}

func TestExpireOfALeaseNeverHeardFrom(t *testing.T) {
	t.Run("A lease never heard from re-queues at once without counting the attempt", func(t *testing.T) {
		in := leased(t, 1)
		now := in.Lease.Deadline
		got, err := in.Expire(now, testJitter, false)
		if err != nil {
			t.Fatalf("Expire = %v, want nil", err)
		}
		want := requeuedUncounted(in, now, "LEASE_NEVER_HEARD")
		want.Undelivered = 1
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("record after the never-heard expiry (-want +got):\n%s", diff)
		}
	})
	t.Run("A lease heard from counts its expiry as a failed attempt", func(t *testing.T) {
		in := leased(t, 1)
		got, err := in.Expire(in.Lease.Deadline, testJitter, true)
		if err != nil {
			t.Fatalf("Expire = %v, want nil", err)
		}
		if got.Phase != PhaseRetryWait || got.Attempt != 1 || got.Undelivered != 0 {
			t.Errorf("after a heard expiry: %v attempt %d undelivered %d, want RETRY_WAIT 1 0", got.Phase, got.Attempt, got.Undelivered)
		}
		if diff := cmp.Diff([]LeaseRecord{{Token: 1, Renderer: "r1", Kind: LeaseExpired}}, got.Leases); diff != "" {
			t.Errorf("leases (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff([]EventKind{EventSubmitted, EventLeased, EventLeaseExpired, EventRetryScheduled}, kinds(got)); diff != "" {
			t.Errorf("history (-want +got):\n%s", diff)
		}
	})
	t.Run("A never-heard expiry on the last attempt re-queues instead of exhausting", func(t *testing.T) {
		got, err := lastAttemptLeased(t).Expire(at(200*time.Second), testJitter, false)
		if err != nil {
			t.Fatalf("Expire = %v, want nil", err)
		}
		if got.Phase != PhaseQueued || got.Attempt != testPolicy.MaxAttempts-1 || got.Undelivered != 1 {
			t.Errorf("after the expiry: %v attempt %d undelivered %d, want QUEUED %d 1", got.Phase, got.Attempt, got.Undelivered, testPolicy.MaxAttempts-1)
		}
	})
	t.Run("Uncounted re-queues are bounded by MaxAttempts per cycle, then an expiry counts", func(t *testing.T) {
		j := queued()
		now := t0
		for tok := uint64(1); tok <= uint64(testPolicy.MaxAttempts); tok++ {
			j = mustJob(t)(j.Grant(tok, "r1", now, testTTL))
			now = j.Lease.Deadline
			j = mustJob(t)(j.Expire(now, testJitter, false))
			if j.Phase != PhaseQueued || j.Attempt != 0 || j.Undelivered != uint32(tok) {
				t.Fatalf("never-heard expiry %d: %v attempt %d undelivered %d, want QUEUED 0 %d", tok, j.Phase, j.Attempt, j.Undelivered, tok)
			}
			if ev := lastEvent(t, j); ev.Kind != EventRequeued || ev.Reason != "LEASE_NEVER_HEARD" || ev.Token != tok {
				t.Fatalf("never-heard expiry %d recorded %+v, want REQUEUED LEASE_NEVER_HEARD", tok, ev)
			}
		}
		in := neverHeardSpent(t)
		now = in.Lease.Deadline
		got, err := in.Expire(now, testJitter, false)
		if err != nil {
			t.Fatalf("Expire = %v, want nil", err)
		}
		next := now.Add(500 * time.Millisecond) // 0.5 * min(1m, 1s)
		want := clone(in)
		want.Leases[len(want.Leases)-1].Kind = LeaseExpired
		want.Phase, want.NextAttemptAt, want.Lease = PhaseRetryWait, next, Lease{}
		want.LastCause = "lease expired on renderer r1"
		want.UpdatedAt = now
		tok := in.Lease.Token
		want = withEvents(want,
			Event{Seq: in.EventSeq + 1, At: now, Kind: EventLeaseExpired, Phase: PhaseLeased, Token: tok, Renderer: "r1", Attempt: 1, Reason: "LEASE_EXPIRED"},
			Event{Seq: in.EventSeq + 2, At: now, Kind: EventRetryScheduled, Phase: PhaseRetryWait, Token: tok, Attempt: 1, Message: next.Format(time.RFC3339Nano)},
		)
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("expiry past the bound (-want +got):\n%s", diff)
		}
	})
	t.Run("A never-heard expiry before the deadline is refused and changes nothing", func(t *testing.T) {
		in := leased(t, 1)
		got, err := in.Expire(in.Lease.Deadline.Add(-time.Nanosecond), testJitter, false)
		if !errors.Is(err, ErrLeaseStillValid) {
			t.Fatalf("Expire = %v, want ErrLeaseStillValid", err)
		}
		assertUnchanged(t, got, in)
	})
}
