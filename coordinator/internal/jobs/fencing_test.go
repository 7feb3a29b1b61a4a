package jobs

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestCheckLease(t *testing.T) {
	type fence struct {
		token uint64
		phase Phase
	}
	// expiredThenR2 returns a job whose token 1 lease (r1) expired and whose
	// token 2 lease is held by r2 from t0+21s.
	expiredThenR2 := func(t testing.TB) Job {
		j := mustJob(t)(leased(t, 1).Expire(at(20*time.Second), 0, true))
		j = mustJob(t)(j.Requeue(at(20 * time.Second)))
		return mustJob(t)(j.Grant(2, "r2", at(21*time.Second), testTTL))
	}
	tests := []struct {
		name     string
		job      func(t testing.TB) Job
		token    uint64
		renderer string
		now      time.Time
		wantErr  error
		want     fence
	}{
		{
			name:  "The current token from its holder before the deadline holds the lease",
			job:   func(t testing.TB) Job { return leased(t, 5) },
			token: 5, renderer: "r1", now: at(time.Second + testTTL - time.Nanosecond),
		},
		{
			name:  "The current token exactly at the deadline has expired",
			job:   func(t testing.TB) Job { return leased(t, 5) },
			token: 5, renderer: "r1", now: at(time.Second + testTTL),
			wantErr: ErrLeaseExpired, want: fence{5, PhaseLeased},
		},
		{
			name:  "The current token after the deadline has expired",
			job:   func(t testing.TB) Job { return leased(t, 5) },
			token: 5, renderer: "r1", now: at(time.Hour),
			wantErr: ErrLeaseExpired, want: fence{5, PhaseLeased},
		},
		{
			name:  "The current token from a renderer that never held a lease of the job is not the holder's, and names nothing",
			job:   func(t testing.TB) Job { return leased(t, 5) },
			token: 5, renderer: "r2", now: at(2 * time.Second),
			wantErr: ErrNotHolder, want: fence{},
		},
		{
			name:  "The current token from another renderer after the deadline is still not the holder's",
			job:   func(t testing.TB) Job { return leased(t, 5) },
			token: 5, renderer: "r2", now: at(time.Hour),
			wantErr: ErrNotHolder, want: fence{},
		},
		{
			name:  "The current token from no renderer at all is not the holder's",
			job:   func(t testing.TB) Job { return leased(t, 5) },
			token: 5, renderer: "", now: at(2 * time.Second),
			wantErr: ErrNotHolder, want: fence{},
		},
		{
			name:  "An older token is stale",
			job:   func(t testing.TB) Job { return leased(t, 5) },
			token: 4, renderer: "r1", now: at(2 * time.Second),
			wantErr: ErrStaleLease, want: fence{5, PhaseLeased},
		},
		{
			name:  "A token never granted for the job is stale from a renderer that held a lease of it",
			job:   func(t testing.TB) Job { return leased(t, 5) },
			token: 9, renderer: "r1", now: at(2 * time.Second),
			wantErr: ErrStaleLease, want: fence{5, PhaseLeased},
		},
		{
			name:  "A token never granted for the job from a renderer that never held a lease of it is not the holder's, and names nothing",
			job:   func(t testing.TB) Job { return leased(t, 5) },
			token: 9, renderer: "r2", now: at(2 * time.Second),
			wantErr: ErrNotHolder, want: fence{},
		},
		{
			name:  "The zero token is stale",
			job:   func(t testing.TB) Job { return leased(t, 5) },
			token: 0, renderer: "r1", now: at(2 * time.Second),
			wantErr: ErrStaleLease, want: fence{5, PhaseLeased},
		},
		{
			name:  "A token whose lease expired is expired even while a newer lease holds the job",
			job:   expiredThenR2,
			token: 1, renderer: "r1", now: at(22 * time.Second),
			wantErr: ErrLeaseExpired, want: fence{2, PhaseLeased},
		},
		{
			name:  "An expired token sent by the newer holder is not the caller's",
			job:   expiredThenR2,
			token: 1, renderer: "r2", now: at(22 * time.Second),
			wantErr: ErrNotHolder, want: fence{2, PhaseLeased},
		},
		{
			name:  "The newer token sent by the old holder is not the caller's",
			job:   expiredThenR2,
			token: 2, renderer: "r1", now: at(22 * time.Second),
			wantErr: ErrNotHolder, want: fence{2, PhaseLeased},
		},
		{
			name:  "A token whose lease expired is expired while the job waits to retry",
			job:   func(t testing.TB) Job { return mustJob(t)(leased(t, 1).Expire(at(20*time.Second), 0.5, true)) },
			token: 1, renderer: "r1", now: at(20 * time.Second),
			wantErr: ErrLeaseExpired, want: fence{1, PhaseRetryWait},
		},
		{
			name:  "A token re-queued because its holder was never heard from is stale, not expired",
			job:   func(t testing.TB) Job { return mustJob(t)(leased(t, 1).Expire(at(20*time.Second), 0.5, false)) },
			token: 1, renderer: "r1", now: at(20 * time.Second),
			wantErr: ErrStaleLease, want: fence{1, PhaseQueued},
		},
		{
			name:  "A handed-back token is stale",
			job:   func(t testing.TB) Job { return mustJob(t)(leased(t, 1).HandBack(1, "r1", at(2*time.Second), 0)) },
			token: 1, renderer: "r1", now: at(3 * time.Second),
			wantErr: ErrStaleLease, want: fence{1, PhaseQueued},
		},
		{
			name: "A token released as undelivered is stale",
			job: func(t testing.TB) Job {
				return mustJob(t)(leased(t, 1).Release(1, "r1", at(2*time.Second), ReleaseUndelivered))
			},
			token: 1, renderer: "r1", now: at(3 * time.Second),
			wantErr: ErrStaleLease, want: fence{1, PhaseQueued},
		},
		{
			name:  "A token whose attempt failed is stale while the job waits to retry",
			job:   retryWaiting,
			token: 1, renderer: "r1", now: at(2 * time.Second),
			wantErr: ErrStaleLease, want: fence{1, PhaseRetryWait},
		},
		{
			name:  "The revoked token of a job cancelled while leased is cancelled for its holder",
			job:   cancelled,
			token: 1, renderer: "r1", now: at(3 * time.Second),
			wantErr: ErrJobCancelled, want: fence{1, PhaseCancelled},
		},
		{
			name:  "The revoked token from another renderer is not the caller's",
			job:   cancelled,
			token: 1, renderer: "r2", now: at(3 * time.Second),
			wantErr: ErrNotHolder, want: fence{},
		},
		{
			name:  "Another token of a cancelled job is stale",
			job:   cancelled,
			token: 2, renderer: "r1", now: at(3 * time.Second),
			wantErr: ErrStaleLease, want: fence{1, PhaseCancelled},
		},
		{
			name: "The zero token of a job cancelled while queued, never leased, is not the caller's, not cancelled",
			job: func(t testing.TB) Job {
				j, _, err := queued().Cancel("alice", "x", at(time.Second), false)
				return mustJob(t)(j, err)
			},
			token: 0, renderer: "r1", now: at(3 * time.Second),
			wantErr: ErrNotHolder, want: fence{},
		},
		{
			name:  "The token that succeeded is stale afterwards",
			job:   succeeded,
			token: 1, renderer: "r1", now: at(3 * time.Second),
			wantErr: ErrStaleLease, want: fence{1, PhaseSucceeded},
		},
		{
			name:  "Any token of a job never leased is not the caller's, and names nothing",
			job:   func(testing.TB) Job { return queued() },
			token: 1, renderer: "r1", now: at(3 * time.Second),
			wantErr: ErrNotHolder, want: fence{},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.job(t).CheckLease(tt.token, tt.renderer, tt.now)
			if tt.wantErr == nil {
				if err != nil {
					t.Fatalf("CheckLease = %v, want nil", err)
				}
				return
			}
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("CheckLease = %v, want errors.Is %v", err, tt.wantErr)
			}
			for _, other := range []error{ErrStaleLease, ErrLeaseExpired, ErrJobCancelled, ErrNotHolder} {
				if other != tt.wantErr && errors.Is(err, other) {
					t.Errorf("CheckLease = %v also matches %v", err, other)
				}
			}
			var fe *FenceError
			if !errors.As(err, &fe) {
				t.Fatalf("CheckLease error %T is not a *FenceError", err)
			}
			if got := (fence{fe.CurrentToken, fe.CurrentPhase}); got != tt.want {
				t.Errorf("FenceError current = %+v, want %+v", got, tt.want)
			}
			if want := tt.want == (fence{}); fe.NeverHeld != want || NeverHeld(err) != want {
				t.Errorf("FenceError.NeverHeld = %v, NeverHeld = %v; want %v", fe.NeverHeld, NeverHeld(err), want)
			}
			if fe.NeverHeld && strings.Contains(err.Error(), "token") {
				t.Errorf("the refusal of a renderer that never held a lease says %q", err)
			}
			if !IsFence(err) {
				t.Errorf("IsFence(%v) = false, want true", err)
			}
		})
	}
}

func TestReasonCode(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want string
	}{
		{"A stale lease", &FenceError{Err: ErrStaleLease}, "STALE_LEASE"},
		{"An expired lease", &FenceError{Err: ErrLeaseExpired}, "LEASE_EXPIRED"},
		{"A cancelled job", &FenceError{Err: ErrJobCancelled}, "JOB_CANCELLED"},
		{"Another renderer's lease", &FenceError{Err: ErrNotHolder}, "NOT_LEASE_HOLDER"},
		{"An outcome mismatch", &FenceError{Err: ErrOutcomeMismatch}, "OUTCOME_MISMATCH"},
		{"An already terminal job", &PhaseError{Err: ErrAlreadyTerminal}, "ALREADY_TERMINAL"},
		{"A disabled running cancel", &PhaseError{Err: ErrRunningCancelDisabled}, "RUNNING_CANCEL_DISABLED"},
		{"A replay of a job that is not failed", &PhaseError{Err: ErrNotFailed}, "NOT_FAILED"},
		{"A replay of a permanent failure", &PhaseError{Err: ErrPermanentFailure}, "PERMANENT_FAILURE"},
		{"An illegal transition", &PhaseError{Err: ErrIllegalTransition}, "ILLEGAL_TRANSITION"},
		{"An unrelated error has no reason", errors.New("disk on fire"), ""},
		{"A nil error has no reason", nil, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := ReasonCode(tt.err); got != tt.want {
				t.Errorf("ReasonCode(%v) = %q, want %q", tt.err, got, tt.want)
			}
		})
	}
}

// lateCompletionScenario plays the lost-update scenario with explicit times:
// renderer A is granted token 1, stalls past its TTL, the lease expires, the
// job is re-queued after its backoff, renderer B is granted token 2 and
// completes. It returns the job after B's success.
func lateCompletionScenario(t *testing.T) Job {
	t.Helper()
	j := mustJob(t)(queued().Grant(1, "rA", t0, testTTL))
	j = mustJob(t)(j.Expire(t0.Add(testTTL), 0.5, true))
	if j.Phase != PhaseRetryWait {
		t.Fatalf("after expiry: phase %v, want RETRY_WAIT", j.Phase)
	}
	j = mustJob(t)(j.Requeue(j.NextAttemptAt))
	j = mustJob(t)(j.Grant(2, "rB", at(20*time.Second), testTTL))
	j, replayed, err := j.Complete(Completion{Token: 2, Renderer: "rB", Success: true, Digest: "sha256:bb", Size: 7, ContentType: "image/png"}, at(25*time.Second), 0)
	if err != nil || replayed {
		t.Fatalf("B's completion = (replayed %v, %v), want applied", replayed, err)
	}
	return j
}

func TestLateCompletionAfterExpiryIsFenced(t *testing.T) {
	bSucceeded := lateCompletionScenario(t)
	aLate := Completion{Token: 1, Renderer: "rA", Success: true, Digest: "sha256:aa", Size: 9, ContentType: "image/png"}

	// The facts that must survive every later command byte for byte.
	type facts struct {
		Phase          Phase
		Attempt        uint32
		Artifact       Artifact
		TerminalReason TerminalReason
		FinishedAt     time.Time
	}
	factsOf := func(j Job) facts {
		return facts{j.Phase, j.Attempt, j.Artifact, j.TerminalReason, j.FinishedAt}
	}
	wantFacts := facts{
		Phase: PhaseSucceeded, Attempt: 2,
		Artifact:       Artifact{Digest: "sha256:bb", Size: 7, ContentType: "image/png", Token: 2, Renderer: "rB"},
		TerminalReason: ReasonSucceeded, FinishedAt: at(25 * time.Second),
	}
	if got := factsOf(bSucceeded); got != wantFacts {
		t.Fatalf("after B's completion: %+v, want %+v", got, wantFacts)
	}

	afterA, replayed, err := bSucceeded.Complete(aLate, at(30*time.Second), 0)
	t.Run("A's late completion is rejected as LEASE_EXPIRED", func(t *testing.T) {
		if !errors.Is(err, ErrLeaseExpired) || replayed {
			t.Fatalf("A's completion = (replayed %v, %v), want ErrLeaseExpired", replayed, err)
		}
		var fe *FenceError
		if !errors.As(err, &fe) || fe.CurrentPhase != PhaseSucceeded {
			t.Errorf("A's rejection = %#v, want a *FenceError naming SUCCEEDED", err)
		}
	})
	t.Run("A's rejection adds one COMPLETION_REJECTED event and counts it, nothing else", func(t *testing.T) {
		want := withEvents(bSucceeded, Event{
			Seq: uint32(len(bSucceeded.Events)) + 1, At: at(30 * time.Second),
			Kind: EventCompletionRejected, Phase: PhaseSucceeded, Token: 1, Renderer: "rA", Attempt: 2,
			Reason: "LEASE_EXPIRED", Message: "success:sha256:aa",
		})
		want.RejectedCompletions = 1
		want.Rejected = []RejectionKey{{Token: 1, Reason: "LEASE_EXPIRED", Renderer: "rA"}}
		want.UpdatedAt = at(30 * time.Second)
		if diff := cmp.Diff(want, afterA); diff != "" {
			t.Errorf("record after A's rejection (-want +got):\n%s", diff)
		}
		if got := factsOf(afterA); got != wantFacts {
			t.Errorf("facts after A's rejection: %+v, want %+v", got, wantFacts)
		}
		if !RejectionRecorded(bSucceeded, afterA) {
			t.Error("RejectionRecorded = false for the first rejection, want true")
		}
	})
	t.Run("A's second identical completion adds nothing", func(t *testing.T) {
		again, replayed, err := afterA.Complete(aLate, at(31*time.Second), 0)
		if !errors.Is(err, ErrLeaseExpired) || replayed {
			t.Fatalf("A's second completion = (replayed %v, %v), want ErrLeaseExpired", replayed, err)
		}
		assertUnchanged(t, again, afterA)
		if RejectionRecorded(afterA, again) {
			t.Error("RejectionRecorded = true for a repeated rejection, want false")
		}
	})
	t.Run("Replaying B's completion answers replayed and changes nothing", func(t *testing.T) {
		bAgain := Completion{Token: 2, Renderer: "rB", Success: true, Digest: "sha256:bb", Size: 7, ContentType: "image/png"}
		got, replayed, err := afterA.Complete(bAgain, at(40*time.Second), 0)
		if err != nil || !replayed {
			t.Fatalf("B's replay = (replayed %v, %v), want replayed and nil", replayed, err)
		}
		assertUnchanged(t, got, afterA)
	})
	t.Run("B's token with a different outcome is OUTCOME_MISMATCH and keeps the artifact", func(t *testing.T) {
		for _, c := range []Completion{
			{Token: 2, Renderer: "rB", Success: true, Digest: "sha256:cc", Size: 7, ContentType: "image/png"},
			{Token: 2, Renderer: "rB", Class: ClassTransient, Message: "oops"},
		} {
			got, replayed, err := afterA.Complete(c, at(41*time.Second), 0)
			if !errors.Is(err, ErrOutcomeMismatch) || replayed {
				t.Fatalf("B's %s = (replayed %v, %v), want ErrOutcomeMismatch", c.Outcome(), replayed, err)
			}
			if g := factsOf(got); g != wantFacts {
				t.Errorf("facts after mismatch: %+v, want %+v", g, wantFacts)
			}
			if ev := lastEvent(t, got); ev.Kind != EventCompletionRejected || ev.Reason != "OUTCOME_MISMATCH" || ev.Token != 2 {
				t.Errorf("last event = %+v, want COMPLETION_REJECTED OUTCOME_MISMATCH for token 2", ev)
			}
		}
	})
}

func TestCompletionAtTheDeadlineIsRejectedAndLeavesTheLease(t *testing.T) {
	in := leased(t, 1)
	got, _, err := in.Complete(successBy(1, "r1"), in.Lease.Deadline, 0)
	if !errors.Is(err, ErrLeaseExpired) {
		t.Fatalf("Complete at the deadline = %v, want ErrLeaseExpired", err)
	}
	if got.Phase != PhaseLeased || got.Lease != in.Lease || got.Artifact != (Artifact{}) {
		t.Errorf("after rejection: phase %v lease %+v artifact %+v; want the lease untouched", got.Phase, got.Lease, got.Artifact)
	}
	if diff := cmp.Diff(in.Leases, got.Leases); diff != "" {
		t.Errorf("the rejected completion ended the lease (-want +got):\n%s", diff)
	}
	if _, err := got.Expire(in.Lease.Deadline, 0, true); err != nil {
		t.Errorf("Expire after the rejected completion = %v, want nil", err)
	}
}

// rejectStale sends a stale success completion for each token to j, which
// must be leased to r1 under a larger token, from r1, and returns the
// record.
func rejectStale(t *testing.T, j Job, now time.Time, tokens ...uint64) Job {
	t.Helper()
	for _, tok := range tokens {
		next, _, err := j.Complete(successBy(tok, "r1"), now, 0)
		if !errors.Is(err, ErrStaleLease) {
			t.Fatalf("completion with token %d = %v, want ErrStaleLease", tok, err)
		}
		j = next
	}
	return j
}

// rejectionEvents counts COMPLETION_REJECTED events in evs.
func rejectionEvents(evs []Event) int {
	n := 0
	for _, ev := range evs {
		if ev.Kind == EventCompletionRejected {
			n++
		}
	}
	return n
}

func tokens(from, to uint64) []uint64 {
	var ts []uint64
	for tok := from; tok <= to; tok++ {
		ts = append(ts, tok)
	}
	return ts
}

// staleKeys returns the rejection keys of rejectStale's STALE_LEASE
// refusals of tokens.
func staleKeys(tokens ...uint64) []RejectionKey {
	keys := make([]RejectionKey, len(tokens))
	for i, tok := range tokens {
		keys[i] = RejectionKey{Token: tok, Reason: "STALE_LEASE", Renderer: "r1"}
	}
	return keys
}

func TestRejectionEventsAreCapped(t *testing.T) {
	t.Run("Rejections past the cap are not recorded", func(t *testing.T) {
		j := rejectStale(t, leased(t, 1000), at(2*time.Second), tokens(1, MaxRejectionEvents+8)...)
		if got := rejectionEvents(j.Events); got != MaxRejectionEvents {
			t.Errorf("COMPLETION_REJECTED events = %d, want %d", got, MaxRejectionEvents)
		}
		if j.RejectedCompletions != MaxRejectionEvents {
			t.Errorf("RejectedCompletions = %d, want %d", j.RejectedCompletions, MaxRejectionEvents)
		}
		if diff := cmp.Diff(staleKeys(tokens(1, MaxRejectionEvents)...), j.Rejected); diff != "" {
			t.Errorf("Rejected keeps the first %d of the cycle (-want +got):\n%s", MaxRejectionEvents, diff)
		}
		if j.Phase != PhaseLeased || j.Lease.Token != 1000 {
			t.Errorf("phase %v token %d after rejections, want LEASED 1000", j.Phase, j.Lease.Token)
		}
	})
	t.Run("A refusal past the cap, new or repeated, changes nothing and is not recorded", func(t *testing.T) {
		// Repeats are recognised through Rejected, which keeps the first
		// MaxRejectionEvents of a cycle; past them nothing is recorded, so
		// that no number of refused calls grows the record or the
		// rejections listing (the writer counts them in a metric).
		j := rejectStale(t, leased(t, 1000), at(2*time.Second), tokens(1, MaxRejectionEvents)...)
		for _, tok := range []uint64{MaxRejectionEvents + 1, MaxRejectionEvents + 1, MaxRejectionEvents + 2} {
			again := rejectStale(t, j, at(3*time.Second), tok)
			assertUnchanged(t, again, j)
			if RejectionRecorded(j, again) {
				t.Errorf("RejectionRecorded = true past the cap (token %d), want false", tok)
			}
		}
	})
	t.Run("A repeat of a rejection kept within the cap is not counted again past it", func(t *testing.T) {
		j := rejectStale(t, leased(t, 1000), at(2*time.Second), tokens(1, MaxRejectionEvents+1)...)
		again := rejectStale(t, j, at(3*time.Second), 1, MaxRejectionEvents)
		assertUnchanged(t, again, j)
	})
	t.Run("Each cycle keeps its own first rejections", func(t *testing.T) {
		// job.proto: rejected completions beyond the first 32 of a cycle are
		// counted but not kept; a replayed job starts a new cycle.
		j := rejectStale(t, leased(t, 1000), at(2*time.Second), tokens(1, MaxRejectionEvents)...)
		j, _, err := j.Complete(Completion{Token: 1000, Renderer: "r1", Class: ClassInvalidDocument, Message: "bad"}, at(3*time.Second), 0)
		j = mustJob(t)(j, err)
		j = mustJob(t)(j.Replay("oscar", "fixed", true, at(4*time.Second)))
		if j.Rejected != nil {
			t.Errorf("Rejected after replay = %v, want none", j.Rejected)
		}
		j = mustJob(t)(j.Grant(2000, "r1", at(5*time.Second), testTTL))
		j = rejectStale(t, j, at(6*time.Second), 1500, 1)
		if ev := lastEvent(t, j); ev.Kind != EventCompletionRejected || ev.Token != 1 {
			t.Errorf("last event after the rejections of cycle 2 = %v token %d, want COMPLETION_REJECTED token 1", ev.Kind, ev.Token)
		}
		if diff := cmp.Diff(staleKeys(1500, 1), j.Rejected); diff != "" {
			t.Errorf("Rejected in cycle 2 (-want +got):\n%s", diff)
		}
		if j.RejectedCompletions != MaxRejectionEvents+2 {
			t.Errorf("RejectedCompletions = %d, want %d across cycles", j.RejectedCompletions, MaxRejectionEvents+2)
		}
	})
}

// TestMissingArtifactIsJudgedAfterTheFence checks that a success naming a
// digest never uploaded is refused as stale when the token is stale, and as
// a missing artifact, changing nothing, only for the current holder.
func TestMissingArtifactIsJudgedAfterTheFence(t *testing.T) {
	j := leased(t, 5)
	now := at(2 * time.Second)
	missing := Completion{Token: 5, Renderer: "r1", Success: true, Digest: "never", ArtifactMissing: true}
	got, _, err := j.Complete(missing, now, 0)
	if !errors.Is(err, ErrArtifactMissing) || ReasonCode(err) != "ARTIFACT_NOT_FOUND" {
		t.Fatalf("holder's completion with no upload: %v (%s), want ErrArtifactMissing", err, ReasonCode(err))
	}
	assertUnchanged(t, got, j)
	missing.Token = 4
	if _, _, err := j.Complete(missing, now, 0); !errors.Is(err, ErrStaleLease) {
		t.Fatalf("stale completion with no upload: %v, want ErrStaleLease", err)
	}
}

func TestCompletionFromAnotherRendererWithTheCurrentTokenIsRefused(t *testing.T) {
	in := leased(t, 1)
	now := at(2 * time.Second)
	impostor := successBy(1, "r2")
	got, replayed, err := in.Complete(impostor, now, 0)

	t.Run("It is refused NOT_LEASE_HOLDER naming nothing of the job, which the impostor never held", func(t *testing.T) {
		if !errors.Is(err, ErrNotHolder) || replayed {
			t.Fatalf("Complete = (replayed %v, %v), want ErrNotHolder", replayed, err)
		}
		if got := ReasonCode(err); got != "NOT_LEASE_HOLDER" {
			t.Errorf("ReasonCode = %q, want NOT_LEASE_HOLDER", got)
		}
		var fe *FenceError
		if !errors.As(err, &fe) || !fe.NeverHeld || fe.CurrentToken != 0 || fe.CurrentPhase != PhaseUnspecified {
			t.Errorf("refusal = %#v, want a *FenceError that never held, naming no token or phase", err)
		}
	})
	t.Run("It changes nothing but one recorded rejection", func(t *testing.T) {
		want := clone(in)
		want.RejectedCompletions = 1
		want.Rejected = []RejectionKey{{Token: 1, Reason: "NOT_LEASE_HOLDER", Renderer: "r2"}}
		want.UpdatedAt = now
		want = withEvents(want, Event{
			Seq: 3, At: now, Kind: EventCompletionRejected, Phase: PhaseLeased, Token: 1, Renderer: "r2", Attempt: 1,
			Reason: "NOT_LEASE_HOLDER", Message: "success:sha256:aa",
		})
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("record after the impostor's completion (-want +got):\n%s", diff)
		}
	})
	t.Run("A failure from another renderer is refused the same way", func(t *testing.T) {
		failure := Completion{Token: 1, Renderer: "r3", Class: ClassInvalidDocument, Message: "bad"}
		next, _, err := in.Complete(failure, now, 0)
		if !errors.Is(err, ErrNotHolder) {
			t.Fatalf("Complete = %v, want ErrNotHolder", err)
		}
		if next.Phase != PhaseLeased || next.Lease != in.Lease || next.TerminalReason != ReasonUnspecified {
			t.Errorf("after the refusal: %v lease %+v reason %v, want the lease untouched", next.Phase, next.Lease, next.TerminalReason)
		}
	})
	t.Run("The holder still completes under its lease afterwards", func(t *testing.T) {
		done, replayed, err := got.Complete(successBy(1, "r1"), at(3*time.Second), 0)
		if err != nil || replayed {
			t.Fatalf("holder's completion = (replayed %v, %v), want applied", replayed, err)
		}
		if want := (Artifact{Digest: "sha256:aa", Size: 99, ContentType: "image/png", Token: 1, Renderer: "r1"}); done.Phase != PhaseSucceeded || done.Artifact != want {
			t.Errorf("after the holder's completion: %v artifact %+v, want SUCCEEDED %+v", done.Phase, done.Artifact, want)
		}
		again, replayed, err := done.Complete(impostor, at(4*time.Second), 0)
		if !errors.Is(err, ErrNotHolder) || replayed {
			t.Fatalf("impostor's identical outcome after the success = (replayed %v, %v), want ErrNotHolder, not a replay", replayed, err)
		}
		assertUnchanged(t, again, done)
	})
}

func TestAnEarlierAttemptsCompletionResentAfterLaterAttemptsIsAReplay(t *testing.T) {
	transient := Completion{Token: 1, Renderer: "r1", Class: ClassTransient, Message: "timeout"}
	j, _, err := leased(t, 1).Complete(transient, at(2*time.Second), testJitter)
	j = mustJob(t)(j, err)
	j = mustJob(t)(j.Requeue(j.NextAttemptAt))
	attempt2 := mustJob(t)(j.Grant(2, "r2", at(10*time.Second), testTTL))
	succeededBy2, _, err := attempt2.Complete(successBy(2, "r2"), at(11*time.Second), 0)
	succeededBy2 = mustJob(t)(succeededBy2, err)

	t.Run("Attempt 1's transient failure resent after attempt 2 succeeded answers replayed with no rejection", func(t *testing.T) {
		got, replayed, err := succeededBy2.Complete(transient, at(12*time.Second), testJitter)
		if err != nil || !replayed {
			t.Fatalf("resent failure = (replayed %v, %v), want replayed and nil", replayed, err)
		}
		assertUnchanged(t, got, succeededBy2)
		if RejectionRecorded(succeededBy2, got) {
			t.Error("RejectionRecorded = true for a replay, want false")
		}
	})
	t.Run("Attempt 1's failure resent while attempt 2 holds the lease answers replayed and leaves the lease", func(t *testing.T) {
		got, replayed, err := attempt2.Complete(transient, at(10*time.Second), testJitter)
		if err != nil || !replayed {
			t.Fatalf("resent failure = (replayed %v, %v), want replayed and nil", replayed, err)
		}
		assertUnchanged(t, got, attempt2)
	})
	t.Run("Attempt 1's token with another outcome is OUTCOME_MISMATCH and keeps the artifact", func(t *testing.T) {
		got, replayed, err := succeededBy2.Complete(successBy(1, "r1"), at(12*time.Second), 0)
		if !errors.Is(err, ErrOutcomeMismatch) || replayed {
			t.Fatalf("other outcome = (replayed %v, %v), want ErrOutcomeMismatch", replayed, err)
		}
		if got.Phase != PhaseSucceeded || got.Artifact != succeededBy2.Artifact {
			t.Errorf("after the mismatch: %v artifact %+v, want SUCCEEDED %+v", got.Phase, got.Artifact, succeededBy2.Artifact)
		}
		if diff := cmp.Diff([]RejectionKey{{Token: 1, Reason: "OUTCOME_MISMATCH", Renderer: "r1"}}, got.Rejected); diff != "" {
			t.Errorf("Rejected (-want +got):\n%s", diff)
		}
	})
	t.Run("Attempt 1's failure resent by another renderer is NOT_LEASE_HOLDER, not a replay", func(t *testing.T) {
		other := transient
		other.Renderer = "r2"
		_, replayed, err := succeededBy2.Complete(other, at(12*time.Second), testJitter)
		if !errors.Is(err, ErrNotHolder) || replayed {
			t.Fatalf("other renderer's resend = (replayed %v, %v), want ErrNotHolder", replayed, err)
		}
	})
}

func TestARepeatedRejectionIsRecordedOnce(t *testing.T) {
	j := leased(t, 5)
	deadline := j.Lease.Deadline
	steps := []struct {
		name         string
		c            Completion
		now          time.Time
		wantErr      error
		wantRecorded bool
	}{
		{"A stale token is recorded", successBy(4, "r1"), at(2 * time.Second), ErrStaleLease, true},
		{"The same stale token again is not", successBy(4, "r1"), at(3 * time.Second), ErrStaleLease, false},
		{"The same stale token with another outcome is not", Completion{Token: 4, Renderer: "r1", Class: ClassTransient, Message: "x"}, at(4 * time.Second), ErrStaleLease, false},
		{"An impostor with the current token is recorded", successBy(5, "r2"), at(5 * time.Second), ErrNotHolder, true},
		{"Another impostor with the current token is recorded apart", successBy(5, "r3"), at(6 * time.Second), ErrNotHolder, true},
		{"The impostor after the deadline is still not", successBy(5, "r2"), deadline, ErrNotHolder, false},
		{"The holder after the deadline is recorded under its own reason", successBy(5, "r1"), deadline, ErrLeaseExpired, true},
		{"The holder after the deadline again is not", successBy(5, "r1"), deadline.Add(time.Second), ErrLeaseExpired, false},
	}
	for _, st := range steps {
		next, replayed, err := j.Complete(st.c, st.now, 0)
		if !errors.Is(err, st.wantErr) || replayed {
			t.Fatalf("%s: Complete = (replayed %v, %v), want %v", st.name, replayed, err, st.wantErr)
		}
		if got := RejectionRecorded(j, next); got != st.wantRecorded {
			t.Errorf("%s: RejectionRecorded = %v, want %v", st.name, got, st.wantRecorded)
		}
		if !st.wantRecorded {
			assertUnchanged(t, next, j)
		}
		j = next
	}
	want := []RejectionKey{{Token: 4, Reason: "STALE_LEASE", Renderer: "r1"}, {Token: 5, Reason: "NOT_LEASE_HOLDER", Renderer: "r2"},
		{Token: 5, Reason: "NOT_LEASE_HOLDER", Renderer: "r3"}, {Token: 5, Reason: "LEASE_EXPIRED", Renderer: "r1"}}
	if diff := cmp.Diff(want, j.Rejected); diff != "" {
		t.Errorf("Rejected (-want +got):\n%s", diff)
	}
	if n := rejectionEvents(j.Events); j.RejectedCompletions != uint32(len(want)) || n != len(want) {
		t.Errorf("RejectedCompletions %d and %d COMPLETION_REJECTED events, want both %d", j.RejectedCompletions, n, len(want))
	}
	if j.Phase != PhaseLeased || j.Lease.Token != 5 || j.Attempt != 1 {
		t.Errorf("after the rejections: %v token %d attempt %d, want LEASED 5 1", j.Phase, j.Lease.Token, j.Attempt)
	}
}
