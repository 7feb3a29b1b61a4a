package jobs

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// apply runs one command on a record and returns the next record and the
// error; wrappers check any extra result (replayed, CancelResult, bool).
type apply func(t *testing.T, j Job) (Job, error)

func grant(token uint64, renderer string, now time.Time) apply {
	return func(t *testing.T, j Job) (Job, error) { return j.Grant(token, renderer, now, testTTL) }
}

func heartbeat(token uint64, renderer string, now time.Time, ttl time.Duration) apply {
	return func(t *testing.T, j Job) (Job, error) { return j.Heartbeat(token, renderer, now, ttl) }
}

func handBack(token uint64, renderer string, now time.Time) apply {
	return func(t *testing.T, j Job) (Job, error) { return j.HandBack(token, renderer, now, 0) }
}

func release(token uint64, now time.Time) apply {
	return func(t *testing.T, j Job) (Job, error) { return j.Release(token, "r1", now, ReleaseUndelivered) }
}

func complete(c Completion, now time.Time, wantReplayed bool) apply {
	return func(t *testing.T, j Job) (Job, error) {
		t.Helper()
		next, replayed, err := j.Complete(c, now, testJitter)
		if replayed != wantReplayed {
			t.Errorf("Complete replayed = %v, want %v", replayed, wantReplayed)
		}
		return next, err
	}
}

func expire(now time.Time, heard bool) apply {
	return func(t *testing.T, j Job) (Job, error) { return j.Expire(now, testJitter, heard) }
}

func requeue(now time.Time) apply {
	return func(t *testing.T, j Job) (Job, error) { return j.Requeue(now) }
}

func cancel(now time.Time, allowRunning bool, want CancelResult) apply {
	return func(t *testing.T, j Job) (Job, error) {
		t.Helper()
		next, res, err := j.Cancel("alice", "not needed", now, allowRunning)
		if res != want {
			t.Errorf("Cancel result = %v, want %v", res, want)
		}
		return next, err
	}
}

func ackCancel(token uint64, renderer string, now time.Time, want bool) apply {
	return func(t *testing.T, j Job) (Job, error) {
		t.Helper()
		next, ok := j.AckCancel(token, renderer, now)
		if ok != want {
			t.Errorf("AckCancel = %v, want %v", ok, want)
		}
		return next, nil
	}
}

func replay(includePermanent bool, now time.Time) apply {
	return func(t *testing.T, j Job) (Job, error) {
		return j.Replay("oscar", "renderer fixed", includePermanent, now)
	}
}

func TestNew(t *testing.T) {
	tests := []struct {
		name        string
		doc         Document
		unsupported bool
		want        Job
	}{
		{
			name: "An accepted document is queued with one SUBMITTED event",
			doc:  testDoc,
			want: Job{
				ID: 7, BatchID: 3, Team: "team-a", Doc: testDoc, Policy: testPolicy,
				Phase: PhaseQueued, Cycle: 1,
				CreatedAt: t0, UpdatedAt: t0, EnqueuedAt: t0,
				EventSeq: 1,
				Events:   []Event{{Seq: 1, At: t0, Kind: EventSubmitted, Phase: PhaseQueued}},
			},
		},
		{
			name:        "A document of a known unsupported format fails at once with UNSUPPORTED_FORMAT",
			doc:         Document{Name: "setup.exe", ContentType: "application/x-msdownload", SizeBytes: 10},
			unsupported: true,
			want: Job{
				ID: 7, BatchID: 3, Team: "team-a",
				Doc:    Document{Name: "setup.exe", ContentType: "application/x-msdownload", SizeBytes: 10},
				Policy: testPolicy,
				Phase:  PhaseFailed, Cycle: 1,
				TerminalReason:  ReasonUnsupportedFormat,
				TerminalMessage: "format is not supported: application/x-msdownload",
				FinishedAt:      t0,
				CreatedAt:       t0, UpdatedAt: t0,
				EventSeq: 2,
				Events: []Event{
					{Seq: 1, At: t0, Kind: EventSubmitted, Phase: PhaseQueued},
					{Seq: 2, At: t0, Kind: EventFailed, Phase: PhaseFailed, Reason: "UNSUPPORTED_FORMAT", Message: "format is not supported: application/x-msdownload"},
				},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := New(7, 3, "team-a", tt.doc, testPolicy, tt.unsupported, t0)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("New() mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

// legalTransitions lists every transition of the lifecycle table (and the
// cancel, acknowledgement and replay rules) with the exact record each one
// must produce from its input.
func legalTransitions() []struct {
	name    string
	in      func(t testing.TB) Job
	do      apply
	wantErr error
	want    func(in Job) Job
} {
	transientFailure := Completion{Token: 1, Renderer: "r1", Class: ClassTransient, Message: "timeout"}
	return []struct {
		name    string
		in      func(t testing.TB) Job
		do      apply
		wantErr error
		want    func(in Job) Job
	}{
		{
			name: "Grant leases a queued job with a new token, attempt plus one and deadline now plus TTL",
			in:   func(testing.TB) Job { return queued() },
			do:   grant(41, "r9", at(time.Second)),
			want: func(j Job) Job {
				j.Phase, j.Attempt = PhaseLeased, 1
				j.Lease = Lease{Token: 41, Renderer: "r9", GrantedAt: at(time.Second), Deadline: at(time.Second + testTTL)}
				j.Leases = []LeaseRecord{{Token: 41, Renderer: "r9"}}
				j.EnqueuedAt, j.UpdatedAt = time.Time{}, at(time.Second)
				return withEvents(j, Event{Seq: 2, At: at(time.Second), Kind: EventLeased, Phase: PhaseLeased, Token: 41, Renderer: "r9", Attempt: 1})
			},
		},
		{
			name: "A heartbeat with the current token extends the deadline without a history event",
			in:   func(t testing.TB) Job { return leased(t, 1) },
			do:   heartbeat(1, "r1", at(10*time.Second), testTTL),
			want: func(j Job) Job {
				j.Lease.Deadline = at(10*time.Second + testTTL)
				j.UpdatedAt = at(10 * time.Second)
				return j
			},
		},
		{
			name: "A heartbeat never shortens the deadline",
			in:   func(t testing.TB) Job { return leased(t, 1) },
			do:   heartbeat(1, "r1", at(2*time.Second), time.Second),
			want: func(j Job) Job {
				j.UpdatedAt = at(2 * time.Second)
				return j
			},
		},
		{
			name: "A successful completion with the current token before the deadline succeeds and sets the artifact",
			in:   func(t testing.TB) Job { return leased(t, 1) },
			do:   complete(successBy(1, "r1"), at(2*time.Second), false),
			want: func(j Job) Job {
				j.Phase, j.TerminalReason, j.FinishedAt = PhaseSucceeded, ReasonSucceeded, at(2*time.Second)
				j.Lease = Lease{}
				j.Artifact = Artifact{Digest: "sha256:aa", Size: 99, ContentType: "image/png", Token: 1, Renderer: "r1"}
				j.Leases = []LeaseRecord{{Token: 1, Renderer: "r1", Kind: LeaseCompleted, Outcome: "success:sha256:aa"}}
				j.UpdatedAt = at(2 * time.Second)
				return withEvents(j, Event{Seq: 3, At: at(2 * time.Second), Kind: EventSucceeded, Phase: PhaseSucceeded, Token: 1, Renderer: "r1", Attempt: 1, Message: "sha256:aa"})
			},
		},
		{
			name: "An UNSUPPORTED_FORMAT failure ends the job without retry",
			in:   func(t testing.TB) Job { return leased(t, 1) },
			do:   complete(Completion{Token: 1, Renderer: "r1", Class: ClassUnsupportedFormat, Message: "macro"}, at(2*time.Second), false),
			want: func(j Job) Job {
				j.Phase, j.TerminalReason, j.TerminalMessage, j.FinishedAt = PhaseFailed, ReasonUnsupportedFormat, "macro", at(2*time.Second)
				j.Lease = Lease{}
				j.LastCause = "macro"
				j.Leases = []LeaseRecord{{Token: 1, Renderer: "r1", Kind: LeaseCompleted, Outcome: "failure:UNSUPPORTED_FORMAT"}}
				j.UpdatedAt = at(2 * time.Second)
				return withEvents(j, Event{Seq: 3, At: at(2 * time.Second), Kind: EventFailed, Phase: PhaseFailed, Token: 1, Renderer: "r1", Attempt: 1, Reason: "UNSUPPORTED_FORMAT", Message: "macro"})
			},
		},
		{
			name: "An INVALID_DOCUMENT failure ends the job without retry",
			in:   func(t testing.TB) Job { return leased(t, 1) },
			do:   complete(Completion{Token: 1, Renderer: "r1", Class: ClassInvalidDocument, Message: "truncated"}, at(2*time.Second), false),
			want: func(j Job) Job {
				j.Phase, j.TerminalReason, j.TerminalMessage, j.FinishedAt = PhaseFailed, ReasonInvalidDocument, "truncated", at(2*time.Second)
				j.Lease = Lease{}
				j.LastCause = "truncated"
				j.Leases = []LeaseRecord{{Token: 1, Renderer: "r1", Kind: LeaseCompleted, Outcome: "failure:INVALID_DOCUMENT"}}
				j.UpdatedAt = at(2 * time.Second)
				return withEvents(j, Event{Seq: 3, At: at(2 * time.Second), Kind: EventFailed, Phase: PhaseFailed, Token: 1, Renderer: "r1", Attempt: 1, Reason: "INVALID_DOCUMENT", Message: "truncated"})
			},
		},
		{
			name: "A transient failure before the last attempt waits to retry after the jittered backoff",
			in:   func(t testing.TB) Job { return leased(t, 1) },
			do:   complete(transientFailure, at(2*time.Second), false),
			want: func(j Job) Job {
				next := at(2*time.Second + 500*time.Millisecond) // 0.5 * min(1m, 1s)
				j.Phase, j.NextAttemptAt, j.Lease = PhaseRetryWait, next, Lease{}
				j.LastCause = "timeout"
				j.Leases = []LeaseRecord{{Token: 1, Renderer: "r1", Kind: LeaseCompleted, Outcome: "failure:TRANSIENT"}}
				j.UpdatedAt = at(2 * time.Second)
				return withEvents(j,
					Event{Seq: 3, At: at(2 * time.Second), Kind: EventAttemptFailed, Phase: PhaseLeased, Token: 1, Renderer: "r1", Attempt: 1, Reason: "TRANSIENT", Message: "timeout"},
					Event{Seq: 4, At: at(2 * time.Second), Kind: EventRetryScheduled, Phase: PhaseRetryWait, Token: 1, Attempt: 1, Message: next.Format(time.RFC3339Nano)},
				)
			},
		},
		{
			name: "A transient failure on the last attempt fails the job ATTEMPTS_EXHAUSTED with the last cause",
			in:   lastAttemptLeased,
			do:   complete(Completion{Token: 3, Renderer: "r1", Class: ClassTransient, Message: "disk full"}, at(101*time.Second), false),
			want: func(j Job) Job {
				msg := "attempts exhausted; last cause: disk full"
				j.Phase, j.TerminalReason, j.TerminalMessage, j.FinishedAt = PhaseFailed, ReasonAttemptsExhausted, msg, at(101*time.Second)
				j.Lease = Lease{}
				j.LastCause = "disk full"
				j.Leases[2] = LeaseRecord{Token: 3, Renderer: "r1", Kind: LeaseCompleted, Outcome: "failure:TRANSIENT"}
				j.UpdatedAt = at(101 * time.Second)
				n := uint32(len(j.Events))
				return withEvents(j,
					Event{Seq: n + 1, At: at(101 * time.Second), Kind: EventAttemptFailed, Phase: PhaseLeased, Token: 3, Renderer: "r1", Attempt: 3, Reason: "TRANSIENT", Message: "disk full"},
					Event{Seq: n + 2, At: at(101 * time.Second), Kind: EventFailed, Phase: PhaseFailed, Token: 3, Renderer: "r1", Attempt: 3, Reason: "ATTEMPTS_EXHAUSTED", Message: msg},
				)
			},
		},
		{
			name: "An expired lease heard from before the last attempt counts as a failed attempt and waits to retry",
			in:   func(t testing.TB) Job { return leased(t, 1) },
			do:   expire(at(time.Second+testTTL), true),
			want: func(j Job) Job {
				now := at(time.Second + testTTL)
				next := now.Add(500 * time.Millisecond)
				j.Phase, j.NextAttemptAt, j.Lease = PhaseRetryWait, next, Lease{}
				j.Leases = []LeaseRecord{{Token: 1, Renderer: "r1", Kind: LeaseExpired}}
				j.LastCause = "lease expired on renderer r1"
				j.UpdatedAt = now
				return withEvents(j,
					Event{Seq: 3, At: now, Kind: EventLeaseExpired, Phase: PhaseLeased, Token: 1, Renderer: "r1", Attempt: 1, Reason: "LEASE_EXPIRED"},
					Event{Seq: 4, At: now, Kind: EventRetryScheduled, Phase: PhaseRetryWait, Token: 1, Attempt: 1, Message: next.Format(time.RFC3339Nano)},
				)
			},
		},
		{
			name: "An expired lease heard from on the last attempt fails the job ATTEMPTS_EXHAUSTED with the expiry as last cause",
			in:   lastAttemptLeased,
			do:   expire(at(200*time.Second), true),
			want: func(j Job) Job {
				now := at(200 * time.Second)
				msg := "attempts exhausted; last cause: lease expired on renderer r1"
				j.Phase, j.TerminalReason, j.TerminalMessage, j.FinishedAt = PhaseFailed, ReasonAttemptsExhausted, msg, now
				j.Lease = Lease{}
				j.Leases[2].Kind = LeaseExpired
				j.LastCause = "lease expired on renderer r1"
				j.UpdatedAt = now
				n := uint32(len(j.Events))
				return withEvents(j,
					Event{Seq: n + 1, At: now, Kind: EventLeaseExpired, Phase: PhaseLeased, Token: 3, Renderer: "r1", Attempt: 3, Reason: "LEASE_EXPIRED"},
					Event{Seq: n + 2, At: now, Kind: EventFailed, Phase: PhaseFailed, Token: 3, Renderer: "r1", Attempt: 3, Reason: "ATTEMPTS_EXHAUSTED", Message: msg},
				)
			},
		},
		{
			name: "Requeue returns a waiting job to the queue once the backoff has elapsed",
			in:   retryWaiting,
			do:   requeue(at(2*time.Second + 500*time.Millisecond)),
			want: func(j Job) Job {
				now := at(2*time.Second + 500*time.Millisecond)
				j.Phase, j.NextAttemptAt, j.EnqueuedAt, j.UpdatedAt = PhaseQueued, time.Time{}, now, now
				return withEvents(j, Event{Seq: 5, At: now, Kind: EventRequeued, Phase: PhaseQueued, Attempt: 1})
			},
		},
		{
			name: "Cancel of a queued job ends it at once",
			in:   func(testing.TB) Job { return queued() },
			do:   cancel(at(5*time.Second), false, CancelledQueued),
			want: func(j Job) Job {
				now := at(5 * time.Second)
				j.Cancellation = Cancellation{Principal: "alice", At: now, Reason: "not needed", FromPhase: PhaseQueued}
				j.Phase, j.TerminalReason, j.TerminalMessage, j.FinishedAt = PhaseCancelled, ReasonCancelled, "not needed", now
				j.EnqueuedAt, j.UpdatedAt = time.Time{}, now
				return withEvents(j, Event{Seq: 2, At: now, Kind: EventCancelled, Phase: PhaseCancelled, Principal: "alice", Reason: "FROM_QUEUED", Message: "not needed"})
			},
		},
		{
			name: "Cancel of a job waiting to retry ends it at once and clears the retry time",
			in:   retryWaiting,
			do:   cancel(at(5*time.Second), false, CancelledQueued),
			want: func(j Job) Job {
				now := at(5 * time.Second)
				j.Cancellation = Cancellation{Principal: "alice", At: now, Reason: "not needed", FromPhase: PhaseRetryWait}
				j.Phase, j.TerminalReason, j.TerminalMessage, j.FinishedAt = PhaseCancelled, ReasonCancelled, "not needed", now
				j.NextAttemptAt, j.UpdatedAt = time.Time{}, now
				return withEvents(j, Event{Seq: 5, At: now, Kind: EventCancelled, Phase: PhaseCancelled, Attempt: 1, Principal: "alice", Reason: "FROM_RETRY_WAIT", Message: "not needed"})
			},
		},
		{
			name: "Cancel of a leased job revokes the lease and records the renderer and token",
			in:   func(t testing.TB) Job { return leased(t, 1) },
			do:   cancel(at(5*time.Second), true, CancelledRunning),
			want: func(j Job) Job {
				now := at(5 * time.Second)
				j.Cancellation = Cancellation{Principal: "alice", At: now, Reason: "not needed", FromPhase: PhaseLeased, Renderer: "r1", Token: 1}
				j.Leases = []LeaseRecord{{Token: 1, Renderer: "r1", Kind: LeaseRevoked}}
				j.Phase, j.TerminalReason, j.TerminalMessage, j.FinishedAt = PhaseCancelled, ReasonCancelled, "not needed", now
				j.Lease, j.UpdatedAt = Lease{}, now
				return withEvents(j, Event{Seq: 3, At: now, Kind: EventCancelled, Phase: PhaseCancelled, Token: 1, Renderer: "r1", Attempt: 1, Principal: "alice", Reason: "FROM_LEASED", Message: "not needed"})
			},
		},
		{
			name: "Cancel of a cancelled job answers AlreadyCancelled and changes nothing",
			in:   cancelled,
			do:   cancel(at(9*time.Second), true, AlreadyCancelled),
			want: func(j Job) Job { return j },
		},
		{
			name:    "Cancel of a succeeded job is ALREADY_TERMINAL and records one CANCEL_REJECTED event",
			in:      succeeded,
			do:      cancel(at(9*time.Second), true, 0),
			wantErr: ErrAlreadyTerminal,
			want: func(j Job) Job {
				j.CancelRejected = true
				j.UpdatedAt = at(9 * time.Second)
				return withEvents(j, Event{Seq: 4, At: at(9 * time.Second), Kind: EventCancelRejected, Phase: PhaseSucceeded, Attempt: 1, Principal: "alice", Reason: "ALREADY_TERMINAL", Message: "not needed"})
			},
		},
		{
			name:    "Cancel of a failed job is ALREADY_TERMINAL and records one CANCEL_REJECTED event",
			in:      func(t testing.TB) Job { return failedWith(t, ClassInvalidDocument) },
			do:      cancel(at(9*time.Second), false, 0),
			wantErr: ErrAlreadyTerminal,
			want: func(j Job) Job {
				j.CancelRejected = true
				j.UpdatedAt = at(9 * time.Second)
				return withEvents(j, Event{Seq: 4, At: at(9 * time.Second), Kind: EventCancelRejected, Phase: PhaseFailed, Attempt: 1, Principal: "alice", Reason: "ALREADY_TERMINAL", Message: "not needed"})
			},
		},
		{
			name: "The revoked lease's holder acknowledges the cancellation once",
			in:   cancelled,
			do:   ackCancel(1, "r1", at(3*time.Second), true),
			want: func(j Job) Job {
				j.Cancellation.AckedAt, j.UpdatedAt = at(3*time.Second), at(3*time.Second)
				return withEvents(j, Event{Seq: 4, At: at(3 * time.Second), Kind: EventCancelAcknowledged, Phase: PhaseCancelled, Token: 1, Renderer: "r1", Attempt: 1})
			},
		},
		{
			name: "Replay of an exhausted job starts a new cycle with attempts reset and its leases kept",
			in: func(t testing.TB) Job {
				j, _, err := lastAttemptLeased(t).Complete(Completion{Token: 3, Renderer: "r1", Class: ClassTransient, Message: "disk full"}, at(101*time.Second), testJitter)
				return mustJob(t)(j, err)
			},
			do: replay(false, at(300*time.Second)),
			want: func(j Job) Job {
				now := at(300 * time.Second)
				j.Phase, j.Attempt, j.Cycle = PhaseQueued, 0, 2
				j.TerminalReason, j.TerminalMessage, j.FinishedAt = ReasonUnspecified, "", time.Time{}
				j.EnqueuedAt, j.UpdatedAt = now, now
				return withEvents(j, Event{Seq: uint32(len(j.Events)) + 1, At: now, Kind: EventReplayed, Phase: PhaseQueued, Principal: "oscar", Reason: "ATTEMPTS_EXHAUSTED", Message: "renderer fixed"})
			},
		},
		{
			name: "Replay of a permanent failure with the override starts a new cycle",
			in:   func(t testing.TB) Job { return failedWith(t, ClassUnsupportedFormat) },
			do:   replay(true, at(300*time.Second)),
			want: func(j Job) Job {
				now := at(300 * time.Second)
				j.Phase, j.Attempt, j.Cycle = PhaseQueued, 0, 2
				j.TerminalReason, j.TerminalMessage, j.FinishedAt = ReasonUnspecified, "", time.Time{}
				j.EnqueuedAt, j.UpdatedAt = now, now
				return withEvents(j, Event{Seq: 4, At: now, Kind: EventReplayed, Phase: PhaseQueued, Principal: "oscar", Reason: "UNSUPPORTED_FORMAT", Message: "renderer fixed"})
			},
		},
		{
			name: "Replay of a job failed at submission as unsupported with the override queues it",
			in: func(testing.TB) Job {
				return New(7, 3, "team-a", testDoc, testPolicy, true, t0)
			},
			do: replay(true, at(300*time.Second)),
			want: func(j Job) Job {
				now := at(300 * time.Second)
				j.Phase, j.Cycle = PhaseQueued, 2
				j.TerminalReason, j.TerminalMessage, j.FinishedAt = ReasonUnspecified, "", time.Time{}
				j.EnqueuedAt, j.UpdatedAt = now, now
				return withEvents(j, Event{Seq: 3, At: now, Kind: EventReplayed, Phase: PhaseQueued, Principal: "oscar", Reason: "UNSUPPORTED_FORMAT", Message: "renderer fixed"})
			},
		},
		{
			name: "A hand-back by the holder re-queues the job at once without counting the attempt",
			in:   func(t testing.TB) Job { return leased(t, 1) },
			do:   handBack(1, "r1", at(5*time.Second)),
			want: func(j Job) Job {
				now := at(5 * time.Second)
				j.Phase, j.Attempt, j.Lease, j.HandedBack = PhaseQueued, 0, Lease{}, 1
				j.Leases = []LeaseRecord{{Token: 1, Renderer: "r1", Kind: LeaseReleased}}
				j.EnqueuedAt, j.UpdatedAt = now, now
				return withEvents(j, Event{Seq: 3, At: now, Kind: EventRequeued, Phase: PhaseQueued, Token: 1, Renderer: "r1", Reason: "HANDED_BACK"})
			},
		},
		{
			name: "The engine's release of an undelivered lease re-queues the job without counting the attempt",
			in:   lastAttemptLeased,
			do:   release(3, at(101*time.Second)),
			want: func(j Job) Job {
				now := at(101 * time.Second)
				j.Phase, j.Attempt, j.Lease = PhaseQueued, 2, Lease{}
				j.Leases[2].Kind = LeaseReleased
				j.EnqueuedAt, j.UpdatedAt = now, now
				return withEvents(j, Event{Seq: j.EventSeq + 1, At: now, Kind: EventRequeued, Phase: PhaseQueued, Token: 3, Renderer: "r1", Attempt: 2, Reason: "LEASE_UNDELIVERED"})
			},
		},
		{
			name: "An expired lease never heard from re-queues the job at once without counting the attempt",
			in:   func(t testing.TB) Job { return leased(t, 1) },
			do:   expire(at(time.Second+testTTL), false),
			want: func(j Job) Job {
				now := at(time.Second + testTTL)
				j.Phase, j.Attempt, j.Lease = PhaseQueued, 0, Lease{}
				j.Leases = []LeaseRecord{{Token: 1, Renderer: "r1", Kind: LeaseReleased}}
				j.Undelivered = 1
				j.EnqueuedAt, j.UpdatedAt = now, now
				return withEvents(j, Event{Seq: 3, At: now, Kind: EventRequeued, Phase: PhaseQueued, Token: 1, Renderer: "r1", Reason: "LEASE_NEVER_HEARD"})
			},
		},
		{
			name: "An expired lease never heard from counts once the cycle's MaxAttempts uncounted re-queues are spent",
			in:   neverHeardSpent,
			do:   expire(at(100*time.Second+testTTL), false),
			want: func(j Job) Job {
				now := at(100*time.Second + testTTL)
				next := now.Add(500 * time.Millisecond)
				j.Phase, j.NextAttemptAt, j.Lease = PhaseRetryWait, next, Lease{}
				j.Leases[3].Kind = LeaseExpired
				j.LastCause = "lease expired on renderer r1"
				j.UpdatedAt = now
				return withEvents(j,
					Event{Seq: j.EventSeq + 1, At: now, Kind: EventLeaseExpired, Phase: PhaseLeased, Token: 4, Renderer: "r1", Attempt: 1, Reason: "LEASE_EXPIRED"},
					Event{Seq: j.EventSeq + 2, At: now, Kind: EventRetryScheduled, Phase: PhaseRetryWait, Token: 4, Attempt: 1, Message: next.Format(time.RFC3339Nano)},
				)
			},
		},
		{
			name:    "A completion from another renderer with the current token is refused NOT_LEASE_HOLDER and only recorded",
			in:      func(t testing.TB) Job { return leased(t, 1) },
			do:      complete(successBy(1, "r2"), at(2*time.Second), false),
			wantErr: ErrNotHolder,
			want: func(j Job) Job {
				j.RejectedCompletions = 1
				j.Rejected = []RejectionKey{{Token: 1, Reason: "NOT_LEASE_HOLDER", Renderer: "r2"}}
				j.UpdatedAt = at(2 * time.Second)
				return withEvents(j, Event{Seq: 3, At: at(2 * time.Second), Kind: EventCompletionRejected, Phase: PhaseLeased, Token: 1, Renderer: "r2", Attempt: 1, Reason: "NOT_LEASE_HOLDER", Message: "success:sha256:aa"})
			},
		},
		{
			name: "Attempt 1's transient failure resent after attempt 2 succeeded is a replay that changes nothing",
			in: func(t testing.TB) Job {
				j := mustJob(t)(retryWaiting(t).Requeue(at(3 * time.Second)))
				j = mustJob(t)(j.Grant(2, "r2", at(4*time.Second), testTTL))
				j, _, err := j.Complete(successBy(2, "r2"), at(5*time.Second), 0)
				return mustJob(t)(j, err)
			},
			do:   complete(Completion{Token: 1, Renderer: "r1", Class: ClassTransient, Message: "timeout"}, at(6*time.Second), true),
			want: func(j Job) Job { return j },
		},
		{
			name: "Replay keeps the leases and the rejection count and starts the cycle's rejections, cancel refusal and uncounted re-queues afresh",
			in: func(t testing.TB) Job {
				j := mustJob(t)(leased(t, 1).Expire(at(time.Second+testTTL), 0, false))
				j = mustJob(t)(j.Grant(2, "r1", at(20*time.Second), testTTL))
				j, _, err := j.Complete(successBy(1, "r1"), at(21*time.Second), 0)
				if !errors.Is(err, ErrStaleLease) {
					t.Fatalf("setup: stale completion = %v", err)
				}
				j, _, err = j.Complete(Completion{Token: 2, Renderer: "r1", Class: ClassInvalidDocument, Message: "bad"}, at(22*time.Second), 0)
				j = mustJob(t)(j, err)
				j, _, err = j.Cancel("alice", "late", at(23*time.Second), true)
				if !errors.Is(err, ErrAlreadyTerminal) {
					t.Fatalf("setup: cancel = %v", err)
				}
				if j.Undelivered != 1 || len(j.Rejected) != 1 || !j.CancelRejected {
					t.Fatalf("setup: undelivered %d rejected %v cancel rejected %v", j.Undelivered, j.Rejected, j.CancelRejected)
				}
				return j
			},
			do: replay(true, at(300*time.Second)),
			want: func(j Job) Job {
				now := at(300 * time.Second)
				j.Phase, j.Attempt, j.Cycle = PhaseQueued, 0, 2
				j.TerminalReason, j.TerminalMessage, j.FinishedAt = ReasonUnspecified, "", time.Time{}
				j.Rejected, j.CancelRejected, j.Undelivered = nil, false, 0
				j.EnqueuedAt, j.UpdatedAt = now, now
				return withEvents(j, Event{Seq: j.EventSeq + 1, At: now, Kind: EventReplayed, Phase: PhaseQueued, Principal: "oscar", Reason: "INVALID_DOCUMENT", Message: "renderer fixed"})
			},
		},
	}
}

func TestLegalTransitions(t *testing.T) {
	for _, tt := range legalTransitions() {
		t.Run(tt.name, func(t *testing.T) {
			in := tt.in(t)
			before := clone(in)
			got, err := tt.do(t, in)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("error = %v, want %v", err, tt.wantErr)
			}
			if diff := cmp.Diff(tt.want(clone(before)), got); diff != "" {
				t.Errorf("next record mismatch (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(before, in); diff != "" {
				t.Errorf("transition mutated its receiver (-before +after):\n%s", diff)
			}
		})
	}
}

// refusals lists commands the job's phase or time forbids; each must return
// the input record unchanged with an error matching the sentinel.
func refusals() []struct {
	name    string
	in      func(t testing.TB) Job
	do      apply
	wantErr error
} {
	noOutcome := Completion{Token: 1, Renderer: "r1"}
	return []struct {
		name    string
		in      func(t testing.TB) Job
		do      apply
		wantErr error
	}{
		{"Grant on a leased job is illegal", func(t testing.TB) Job { return leased(t, 1) }, grant(2, "r2", at(2*time.Second)), ErrIllegalTransition},
		{"Grant on a job waiting to retry is illegal", retryWaiting, grant(2, "r2", at(60*time.Second)), ErrIllegalTransition},
		{"Grant on a succeeded job is illegal", succeeded, grant(2, "r2", at(3*time.Second)), ErrIllegalTransition},
		{"Grant on a failed job is illegal", exhausted, grant(9, "r2", at(300*time.Second)), ErrIllegalTransition},
		{"Grant on a cancelled job is illegal", cancelled, grant(2, "r2", at(3*time.Second)), ErrIllegalTransition},
		{"Grant on a zero record is illegal", func(testing.TB) Job { return Job{} }, grant(2, "r2", at(3*time.Second)), ErrIllegalTransition},
		{"A heartbeat with an older token is stale", func(t testing.TB) Job { return leased(t, 5) }, heartbeat(4, "r1", at(2*time.Second), testTTL), ErrStaleLease},
		{"A heartbeat with a newer token is stale", func(t testing.TB) Job { return leased(t, 5) }, heartbeat(6, "r1", at(2*time.Second), testTTL), ErrStaleLease},
		{"A heartbeat with the current token from another renderer is not the holder's", func(t testing.TB) Job { return leased(t, 5) }, heartbeat(5, "r2", at(2*time.Second), testTTL), ErrNotHolder},
		{"A heartbeat at the deadline is too late", func(t testing.TB) Job { return leased(t, 1) }, heartbeat(1, "r1", at(time.Second+testTTL), testTTL), ErrLeaseExpired},
		{"A heartbeat on a job never leased is not the caller's", func(testing.TB) Job { return queued() }, heartbeat(1, "r1", at(time.Second), testTTL), ErrNotHolder},
		{"A heartbeat with the revoked token of a cancelled job is cancelled", cancelled, heartbeat(1, "r1", at(3*time.Second), testTTL), ErrJobCancelled},
		{"A heartbeat of an expired lease after requeue is expired", func(t testing.TB) Job {
			return mustJob(t)(mustJob(t)(leased(t, 1).Expire(at(20*time.Second), 0, true)).Requeue(at(20 * time.Second)))
		}, heartbeat(1, "r1", at(21*time.Second), testTTL), ErrLeaseExpired},
		{"A hand-back with the current token from another renderer is not the holder's", func(t testing.TB) Job { return leased(t, 1) }, handBack(1, "r2", at(2*time.Second)), ErrNotHolder},
		{"A hand-back with an older token is stale", func(t testing.TB) Job { return leased(t, 5) }, handBack(4, "r1", at(2*time.Second)), ErrStaleLease},
		{"A hand-back at the deadline is too late", func(t testing.TB) Job { return leased(t, 1) }, handBack(1, "r1", at(time.Second+testTTL)), ErrLeaseExpired},
		{"A hand-back of a revoked lease is cancelled", cancelled, handBack(1, "r1", at(3*time.Second)), ErrJobCancelled},
		{"A release of another token is fenced off", func(t testing.TB) Job { return leased(t, 5) }, release(4, at(2*time.Second)), ErrStaleLease},
		{"A release of a job waiting to retry is fenced off", retryWaiting, release(1, at(3*time.Second)), ErrStaleLease},
		{"Expire before the deadline is refused", func(t testing.TB) Job { return leased(t, 1) }, expire(at(time.Second+testTTL-time.Nanosecond), true), ErrLeaseStillValid},
		{"Expire of a lease never heard from before the deadline is refused", func(t testing.TB) Job { return leased(t, 1) }, expire(at(time.Second+testTTL-time.Nanosecond), false), ErrLeaseStillValid},
		{"Expire on a queued job is illegal", func(testing.TB) Job { return queued() }, expire(at(time.Hour), true), ErrIllegalTransition},
		{"Expire on a job waiting to retry is illegal", retryWaiting, expire(at(time.Hour), false), ErrIllegalTransition},
		{"Expire on a succeeded job is illegal", succeeded, expire(at(time.Hour), true), ErrIllegalTransition},
		{"Expire on a cancelled job is illegal", cancelled, expire(at(time.Hour), false), ErrIllegalTransition},
		{"Requeue before the retry time is refused", retryWaiting, requeue(at(2*time.Second + 500*time.Millisecond - time.Nanosecond)), ErrBackoffPending},
		{"Requeue on a queued job is illegal", func(testing.TB) Job { return queued() }, requeue(at(time.Hour)), ErrIllegalTransition},
		{"Requeue on a leased job is illegal", func(t testing.TB) Job { return leased(t, 1) }, requeue(at(time.Hour)), ErrIllegalTransition},
		{"Requeue on a failed job is illegal", exhausted, requeue(at(time.Hour)), ErrIllegalTransition},
		{"Requeue on a cancelled job is illegal", cancelled, requeue(at(time.Hour)), ErrIllegalTransition},
		{"A completion with neither success nor a failure class is illegal", func(t testing.TB) Job { return leased(t, 1) }, complete(noOutcome, at(2*time.Second), false), ErrIllegalTransition},
		{"Cancel of a leased job while running cancellation is disabled is refused", func(t testing.TB) Job { return leased(t, 1) }, cancel(at(2*time.Second), false, 0), ErrRunningCancelDisabled},
		{"Cancel of a zero record is illegal", func(testing.TB) Job { return Job{} }, cancel(at(2*time.Second), true, 0), ErrIllegalTransition},
		{"A second cancel of a succeeded job records nothing more", func(t testing.TB) Job {
			j, _, err := succeeded(t).Cancel("alice", "x", at(3*time.Second), true)
			if !errors.Is(err, ErrAlreadyTerminal) {
				t.Fatalf("setup: first cancel = %v", err)
			}
			return j
		}, cancel(at(4*time.Second), true, 0), ErrAlreadyTerminal},
		{"Acknowledging a cancellation with another token changes nothing", cancelled, ackCancel(2, "r1", at(3*time.Second), false), nil},
		{"Acknowledging a cancellation from a renderer other than the revoked holder changes nothing", cancelled, ackCancel(1, "r2", at(3*time.Second), false), nil},
		{"Acknowledging a cancellation twice changes nothing the second time", func(t testing.TB) Job {
			j, ok := cancelled(t).AckCancel(1, "r1", at(3*time.Second))
			if !ok {
				t.Fatal("setup: first acknowledgement refused")
			}
			return j
		}, ackCancel(1, "r1", at(4*time.Second), false), nil},
		{"Acknowledging a job cancelled while queued changes nothing", func(t testing.TB) Job {
			j, _, err := queued().Cancel("alice", "x", at(time.Second), false)
			return mustJob(t)(j, err)
		}, ackCancel(0, "r1", at(4*time.Second), false), nil},
		{"Acknowledging a job cancelled while waiting to retry with its last token changes nothing", func(t testing.TB) Job {
			j, _, err := retryWaiting(t).Cancel("alice", "x", at(3*time.Second), false)
			return mustJob(t)(j, err)
		}, ackCancel(1, "r1", at(4*time.Second), false), nil},
		{"Acknowledging a leased job changes nothing", func(t testing.TB) Job { return leased(t, 1) }, ackCancel(1, "r1", at(2*time.Second), false), nil},
		{"Replay of a permanent UNSUPPORTED_FORMAT failure needs the override", func(t testing.TB) Job { return failedWith(t, ClassUnsupportedFormat) }, replay(false, at(time.Hour)), ErrPermanentFailure},
		{"Replay of a permanent INVALID_DOCUMENT failure needs the override", func(t testing.TB) Job { return failedWith(t, ClassInvalidDocument) }, replay(false, at(time.Hour)), ErrPermanentFailure},
		{"Replay of a queued job is NOT_FAILED", func(testing.TB) Job { return queued() }, replay(true, at(time.Hour)), ErrNotFailed},
		{"Replay of a leased job is NOT_FAILED", func(t testing.TB) Job { return leased(t, 1) }, replay(true, at(time.Hour)), ErrNotFailed},
		{"Replay of a job waiting to retry is NOT_FAILED", retryWaiting, replay(true, at(time.Hour)), ErrNotFailed},
		{"Replay of a succeeded job is NOT_FAILED", succeeded, replay(true, at(time.Hour)), ErrNotFailed},
		{"Replay of a cancelled job is NOT_FAILED", cancelled, replay(true, at(time.Hour)), ErrNotFailed},
	}
}

func TestRefusedTransitionsChangeNothing(t *testing.T) {
	for _, tt := range refusals() {
		t.Run(tt.name, func(t *testing.T) {
			in := tt.in(t)
			before := clone(in)
			got, err := tt.do(t, in)
			if tt.wantErr == nil {
				if err != nil {
					t.Fatalf("error = %v, want nil", err)
				}
			} else if !errors.Is(err, tt.wantErr) {
				t.Fatalf("error = %v, want errors.Is %v", err, tt.wantErr)
			}
			assertUnchanged(t, got, before)
			assertUnchanged(t, in, before)
		})
	}
}

func TestRefusalErrorsCarryPhaseAndReason(t *testing.T) {
	tests := []struct {
		name       string
		err        func(t *testing.T) error
		wantPhase  Phase
		wantReason string
	}{
		{"Grant on a leased job names LEASED", func(t *testing.T) error {
			_, err := leased(t, 1).Grant(2, "r", at(2*time.Second), testTTL)
			return err
		}, PhaseLeased, "ILLEGAL_TRANSITION"},
		{"Cancel of a succeeded job names SUCCEEDED", func(t *testing.T) error {
			_, _, err := succeeded(t).Cancel("a", "b", at(3*time.Second), true)
			return err
		}, PhaseSucceeded, "ALREADY_TERMINAL"},
		{"Cancel of a running job while disabled names LEASED", func(t *testing.T) error {
			_, _, err := leased(t, 1).Cancel("a", "b", at(3*time.Second), false)
			return err
		}, PhaseLeased, "RUNNING_CANCEL_DISABLED"},
		{"Replay of a queued job names QUEUED", func(t *testing.T) error {
			_, err := queued().Replay("a", "b", true, at(3*time.Second))
			return err
		}, PhaseQueued, "NOT_FAILED"},
		{"Replay of a permanent failure names FAILED", func(t *testing.T) error {
			_, err := failedWith(t, ClassInvalidDocument).Replay("a", "b", false, at(3*time.Second))
			return err
		}, PhaseFailed, "PERMANENT_FAILURE"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.err(t)
			var pe *PhaseError
			if !errors.As(err, &pe) {
				t.Fatalf("error %v (%T) is not a *PhaseError", err, err)
			}
			if pe.Phase != tt.wantPhase {
				t.Errorf("PhaseError.Phase = %v, want %v", pe.Phase, tt.wantPhase)
			}
			if got := ReasonCode(err); got != tt.wantReason {
				t.Errorf("ReasonCode = %q, want %q", got, tt.wantReason)
			}
			if IsFence(err) {
				t.Errorf("IsFence(%v) = true, want false", err)
			}
		})
	}
}

func TestCancelOfTerminalJobRecordsOneRejectionPerCycle(t *testing.T) {
	t.Run("A second cancel of a succeeded job adds no event", func(t *testing.T) {
		first, _, err := succeeded(t).Cancel("alice", "x", at(5*time.Second), true)
		if !errors.Is(err, ErrAlreadyTerminal) {
			t.Fatalf("first cancel error = %v, want ErrAlreadyTerminal", err)
		}
		if !first.CancelRejected {
			t.Error("CancelRejected = false after the first refused cancel, want true")
		}
		second, res, err := first.Cancel("bob", "y", at(6*time.Second), true)
		if !errors.Is(err, ErrAlreadyTerminal) {
			t.Fatalf("second cancel error = %v, want ErrAlreadyTerminal", err)
		}
		if res != 0 {
			t.Errorf("second cancel result = %v, want 0", res)
		}
		assertUnchanged(t, second, first)
	})
	t.Run("A failed job replayed and failed again records a new CANCEL_REJECTED", func(t *testing.T) {
		j := failedWith(t, ClassInvalidDocument)
		j, _, _ = j.Cancel("alice", "x", at(5*time.Second), true)
		j = mustJob(t)(j.Replay("oscar", "retry", true, at(6*time.Second)))
		if j.CancelRejected {
			t.Error("CancelRejected = true after replay, want the new cycle to start without it")
		}
		j = mustJob(t)(j.Grant(2, "r1", at(7*time.Second), testTTL))
		j, _, err := j.Complete(Completion{Token: 2, Renderer: "r1", Class: ClassInvalidDocument, Message: "still bad"}, at(8*time.Second), 0)
		j = mustJob(t)(j, err)
		j, _, err = j.Cancel("alice", "again", at(9*time.Second), true)
		if !errors.Is(err, ErrAlreadyTerminal) {
			t.Fatalf("cancel error = %v, want ErrAlreadyTerminal", err)
		}
		var n int
		for _, ev := range j.Events {
			if ev.Kind == EventCancelRejected {
				n++
			}
		}
		if n != 2 {
			t.Errorf("CANCEL_REJECTED events = %d, want 2 (one per cycle); history %v", n, kinds(j))
		}
	})
}

func TestCompletionAfterCancelLosesAndCancelAfterCompletionLoses(t *testing.T) {
	t.Run("A completion after a running cancel is rejected as JOB_CANCELLED and the job stays cancelled", func(t *testing.T) {
		in := cancelled(t)
		got, replayed, err := in.Complete(successBy(1, "r1"), at(3*time.Second), 0)
		if !errors.Is(err, ErrJobCancelled) || replayed {
			t.Fatalf("Complete = (replayed %v, %v), want ErrJobCancelled", replayed, err)
		}
		if got.Phase != PhaseCancelled || got.Artifact != (Artifact{}) || got.TerminalReason != ReasonCancelled {
			t.Errorf("after rejected completion: phase %v, artifact %+v, reason %v; want CANCELLED, none, CANCELLED", got.Phase, got.Artifact, got.TerminalReason)
		}
	})
	t.Run("A replayed success after a cancel that lost is still answered as replayed", func(t *testing.T) {
		in := succeeded(t)
		in, _, _ = in.Cancel("alice", "late", at(3*time.Second), true)
		got, replayed, err := in.Complete(successBy(1, "r1"), at(4*time.Second), 0)
		if err != nil || !replayed {
			t.Fatalf("Complete = (replayed %v, %v), want replayed and nil", replayed, err)
		}
		assertUnchanged(t, got, in)
	})
}

// spare returns a copy of xs with spare capacity filled with marker, so
// that a write past its length is visible.
func spare[T any](xs []T, marker T) []T {
	out := make([]T, len(xs), len(xs)+8)
	copy(out, xs)
	full := out[:cap(out)]
	for i := len(xs); i < len(full); i++ {
		full[i] = marker
	}
	return out
}

// withSpareCapacity returns j whose history, leases and rejections have
// spare capacity filled with markers.
func withSpareCapacity(j Job) Job {
	j.Events = spare(j.Events, Event{Kind: EventUnspecified, Message: "marker"})
	j.Leases = spare(j.Leases, LeaseRecord{Token: 999999, Renderer: "marker"})
	j.Rejected = spare(j.Rejected, RejectionKey{Token: 999999, Reason: "marker"})
	return j
}

// backing returns xs extended to its capacity.
func backing[T any](xs []T) []T { return slices.Clone(xs[:cap(xs)]) }

func TestTransitionsNeverShareHistoryWithTheirReceiver(t *testing.T) {
	type named struct {
		name string
		in   func(t testing.TB) Job
		do   apply
	}
	var all []named
	for _, tt := range legalTransitions() {
		all = append(all, named{tt.name, tt.in, tt.do})
	}
	for _, tt := range refusals() {
		all = append(all, named{tt.name, tt.in, tt.do})
	}
	for _, tt := range all {
		t.Run(tt.name, func(t *testing.T) {
			in := withSpareCapacity(tt.in(t))
			events, leases, rejected := backing(in.Events), backing(in.Leases), backing(in.Rejected)
			got, _ := tt.do(t, in)
			if diff := cmp.Diff(events, backing(in.Events)); diff != "" {
				t.Fatalf("transition wrote into its receiver's history array (-before +after):\n%s", diff)
			}
			if diff := cmp.Diff(leases, backing(in.Leases)); diff != "" {
				t.Fatalf("transition wrote into its receiver's lease array (-before +after):\n%s", diff)
			}
			if diff := cmp.Diff(rejected, backing(in.Rejected)); diff != "" {
				t.Fatalf("transition wrote into its receiver's rejection array (-before +after):\n%s", diff)
			}
			before := clone(in)
			got.Events = append(got.Events, Event{Kind: EventReplayed, Message: "appended by the caller"})
			got.Leases = append(got.Leases, LeaseRecord{Token: 888888, Renderer: "appended by the caller"})
			got.Rejected = append(got.Rejected, RejectionKey{Token: 888888, Reason: "appended by the caller"})
			if diff := cmp.Diff(before, in); diff != "" {
				t.Errorf("appending to the result changed the receiver (-before +after):\n%s", diff)
			}
		})
	}
}

func TestEventSequenceNumbersIncreaseByOne(t *testing.T) {
	j, _, err := lastAttemptLeased(t).Complete(Completion{Token: 3, Renderer: "r1", Class: ClassTransient, Message: "x"}, at(101*time.Second), 0)
	j = mustJob(t)(j, err)
	j = mustJob(t)(j.Replay("oscar", "r", false, at(102*time.Second)))
	for i, ev := range j.Events {
		if ev.Seq != uint32(i)+1 {
			t.Errorf("Events[%d].Seq = %d, want %d", i, ev.Seq, i+1)
		}
	}
	if want := uint32(len(j.Events)); j.EventSeq != want {
		t.Errorf("EventSeq = %d, want %d (the last event's)", j.EventSeq, want)
	}
}

// TestTransitionsDecideTheSameWithoutTheHistory runs every table case on
// its input loaded without history, as the writer loads a record: the
// result must be the same record, with only the new events in memory,
// numbered on from EventSeq.
func TestTransitionsDecideTheSameWithoutTheHistory(t *testing.T) {
	type named struct {
		name string
		in   func(t testing.TB) Job
		do   apply
	}
	var all []named
	for _, tt := range legalTransitions() {
		all = append(all, named{tt.name, tt.in, tt.do})
	}
	for _, tt := range refusals() {
		all = append(all, named{tt.name, tt.in, tt.do})
	}
	all = append(all,
		named{"A repeated stale rejection", func(t testing.TB) Job {
			j, _, _ := leased(t, 5).Complete(successBy(4, "r1"), at(2*time.Second), 0)
			return j
		}, complete(successBy(4, "r1"), at(3*time.Second), false)},
		named{"A late completion of an expired lease after a newer grant", func(t testing.TB) Job {
			j := mustJob(t)(leased(t, 1).Expire(at(20*time.Second), 0, true))
			j = mustJob(t)(j.Requeue(at(20 * time.Second)))
			return mustJob(t)(j.Grant(2, "r2", at(21*time.Second), testTTL))
		}, complete(successBy(1, "r1"), at(22*time.Second), false)},
		named{"A completion of a released lease names the released token as the last", func(t testing.TB) Job {
			return mustJob(t)(leased(t, 1).Release(1, "r1", at(2*time.Second), ReleaseUndelivered))
		}, complete(successBy(1, "r1"), at(3*time.Second), false)},
	)
	for _, tt := range all {
		t.Run(tt.name, func(t *testing.T) {
			in := tt.in(t)
			full, fullErr := tt.do(t, clone(in))
			loaded := clone(in)
			loaded.Events = nil
			got, err := tt.do(t, loaded)
			if ReasonCode(err) != ReasonCode(fullErr) || (err == nil) != (fullErr == nil) {
				t.Fatalf("without history: error %v, with it %v", err, fullErr)
			}
			var fe, fullFE *FenceError
			if errors.As(err, &fe) && errors.As(fullErr, &fullFE) && *fe != *fullFE {
				t.Errorf("without history: %+v, with it %+v", *fe, *fullFE)
			}
			want := full
			want.Events = full.Events[len(in.Events):]
			if len(want.Events) == 0 {
				want.Events = nil
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("record decided without history (-with +without):\n%s", diff)
			}
		})
	}
}

func TestStringers(t *testing.T) {
	tests := []struct {
		name string
		got  string
		want string
	}{
		{"A known phase prints its name", PhaseRetryWait.String(), "RETRY_WAIT"},
		{"An unknown phase prints its number", Phase(42).String(), "Phase(42)"},
		{"A negative phase prints its number", Phase(-1).String(), "Phase(-1)"},
		{"A known reason prints its name", ReasonAttemptsExhausted.String(), "ATTEMPTS_EXHAUSTED"},
		{"An unknown reason prints its number", TerminalReason(9).String(), "TerminalReason(9)"},
		{"A known class prints its name", ClassTransient.String(), "TRANSIENT"},
		{"An unknown class prints its number", FailureClass(9).String(), "FailureClass(9)"},
		{"A known event kind prints its name", EventCompletionRejected.String(), "COMPLETION_REJECTED"},
		{"The last event kind prints its name", EventReplayed.String(), "REPLAYED"},
		{"An unknown event kind prints its number", EventKind(99).String(), "EventKind(99)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.got != tt.want {
				t.Errorf("got %q, want %q", tt.got, tt.want)
			}
		})
	}
}

func TestTerminalAndPermanent(t *testing.T) {
	for p := PhaseUnspecified; p <= PhaseCancelled; p++ {
		want := p == PhaseSucceeded || p == PhaseFailed || p == PhaseCancelled
		if got := p.Terminal(); got != want {
			t.Errorf("%v.Terminal() = %v, want %v", p, got, want)
		}
	}
	for r := ReasonUnspecified; r <= ReasonCancelled; r++ {
		want := r == ReasonUnsupportedFormat || r == ReasonInvalidDocument
		if got := r.Permanent(); got != want {
			t.Errorf("%v.Permanent() = %v, want %v", r, got, want)
		}
	}
}

func TestBatchJobIDs(t *testing.T) {
	b := Batch{FirstJob: 10, Count: 3}
	if diff := cmp.Diff([]uint64{10, 11, 12}, b.JobIDs()); diff != "" {
		t.Errorf("JobIDs mismatch (-want +got):\n%s", diff)
	}
}
