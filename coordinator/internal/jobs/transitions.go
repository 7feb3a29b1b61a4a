package jobs

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/mutation"

	"github.com/leasehold/leasehold/client/reason"
)

// New returns a freshly accepted job: QUEUED, or FAILED (UNSUPPORTED_FORMAT)
// when the coordinator already knows its format is unsupported.
func New(id, batch uint64, team string, doc Document, policy RetryPolicy, unsupported bool, now time.Time) Job {
	j := Job{
		ID:         id,
		BatchID:    batch,
		Team:       team,
		Doc:        doc,
		Policy:     policy,
		Phase:      PhaseQueued,
		Cycle:      1,
		CreatedAt:  now,
		EnqueuedAt: now,
	}
	j = j.withEvent(Event{Kind: EventSubmitted}, now)
	if unsupported {
		j.EnqueuedAt = time.Time{}
		j = j.finish(PhaseFailed, ReasonUnsupportedFormat, "format is not supported: "+doc.ContentType, now)
		j = j.withEvent(Event{Kind: EventFailed, Reason: ReasonUnsupportedFormat.String(), Message: j.TerminalMessage}, now)
	}
	return j
}

// CheckLease is the one fencing predicate. It returns nil only when j is
// LEASED under exactly token, to renderer, and the lease deadline is after
// now; otherwise a *FenceError wrapping ErrNotHolder (the token's lease was
// granted to another renderer, or renderer never held a lease of this job
// in any cycle), ErrJobCancelled (the lease was revoked by a cancellation),
// ErrLeaseExpired (its deadline passed) or ErrStaleLease (anything else: a
// newer lease exists, the job moved on, or the token was never granted for
// this job). Completion, heartbeat, hand-back, cancel acknowledgement and
// artifact upload all decide through it, inside the writer.
//
// A renderer that never held a lease of the job gets ErrNotHolder whatever
// the token and the job's state, with NeverHeld set and no current token or
// phase, so that probing another team's job ids tells a renderer nothing of
// them.
func (j Job) CheckLease(token uint64, renderer string, now time.Time) error {
	if j.Phase == PhaseLeased && j.Lease.Token == token && j.Lease.Renderer == renderer && now.Before(j.Lease.Deadline) {
		return nil
	}
	if mutation.On(mutation.Fencing) && j.Phase == PhaseLeased {
		return nil
	}
	if !j.heldBy(renderer) {
		return &FenceError{Err: ErrNotHolder, NeverHeld: true}
	}
	fe := &FenceError{Err: ErrStaleLease, CurrentToken: j.LastToken(), CurrentPhase: j.Phase}
	rec, known := j.lease(token)
	switch {
	case known && rec.Renderer != renderer:
		fe.Err = ErrNotHolder
	case j.Phase == PhaseCancelled && j.Cancellation.Token == token && token != 0:
		fe.Err = ErrJobCancelled
	case j.Phase == PhaseLeased && j.Lease.Token == token:
		fe.Err = ErrLeaseExpired
	case known && rec.Kind == LeaseExpired:
		fe.Err = ErrLeaseExpired
	}
	return fe
}

// LastToken returns the token of the job's most recent lease: the current
// one while LEASED, else the last one granted (0 if none ever was).
func (j Job) LastToken() uint64 {
	if j.Phase == PhaseLeased {
		return j.Lease.Token
	}
	if n := len(j.Leases); n > 0 {
		return j.Leases[n-1].Token
	}
	return 0
}

// Grant leases a QUEUED job to renderer under token until now+ttl, starting
// the next attempt. The caller guarantees token is larger than every token
// granted before.
func (j Job) Grant(token uint64, renderer string, now time.Time, ttl time.Duration) (Job, error) {
	if j.Phase != PhaseQueued {
		return j, &PhaseError{Err: ErrIllegalTransition, Phase: j.Phase, Op: "grant"}
	}
	j.Phase = PhaseLeased
	j.Attempt++
	j.Lease = Lease{Token: token, Renderer: renderer, GrantedAt: now, Deadline: now.Add(ttl)}
	j.Leases = append(slices.Clip(j.Leases), LeaseRecord{Token: token, Renderer: renderer})
	j.EnqueuedAt = time.Time{}
	return j.withEvent(Event{Kind: EventLeased, Token: token, Renderer: renderer}, now), nil
}

// Reasons recorded with a lease that went back to its queue uncounted.
const (
	// ReleaseUndelivered: the grant never reached its renderer (the call or
	// stream that was to carry it ended first).
	ReleaseUndelivered = string(reason.LeaseUndelivered)
	// ReleaseNeverHeard: the lease expired without the coordinator ever
	// hearing from its holder, so the grant was most likely never delivered.
	ReleaseNeverHeard = string(reason.LeaseNeverHeard)
	// ReleaseHandedBack: the holder gave the lease back unfinished.
	ReleaseHandedBack = string(reason.HandedBack)
)

// handedBackOutcome is the recorded outcome of a hand-back that counted as
// a failed attempt.
const handedBackOutcome = "failure:" + ReleaseHandedBack

// Release returns a lease granted to renderer that never reached it to the
// queue: the job returns to QUEUED and the attempt is not counted. The
// token is spent and never reused, so should the grant have escaped after
// all, its completion is stale. It decides through CheckLease, so a lease
// that has meanwhile moved on is left alone (the fencing error says why).
// reason is recorded in the history (ReleaseUndelivered).
func (j Job) Release(token uint64, renderer string, now time.Time, reason string) (Job, error) {
	if err := j.CheckLease(token, renderer, now); err != nil {
		return j, err
	}
	return j.release(reason, now), nil
}

// HandBack returns a lease its holder gives back unfinished (a draining
// renderer): QUEUED again at once, the attempt not counted, recorded as
// REQUEUED HANDED_BACK. It is fenced like a completion. A cycle's first
// MaxAttempts hand-backs are free; past them a hand-back counts as a failed
// attempt (ATTEMPT_FAILED HANDED_BACK), and the job waits to retry or is
// FAILED (ATTEMPTS_EXHAUSTED), so that renderers that take a document and
// always give it back cannot keep it in circulation forever. jitter in
// [0, 1) draws the backoff.
func (j Job) HandBack(token uint64, renderer string, now time.Time, jitter float64) (Job, error) {
	if err := j.CheckLease(token, renderer, now); err != nil {
		return j, err
	}
	if j.HandedBack < j.Policy.MaxAttempts {
		j.HandedBack++
		return j.release(ReleaseHandedBack, now), nil
	}
	// Counted, the hand-back is the lease's outcome, as a failure report
	// would be: a completion sent for it later is refused OUTCOME_MISMATCH.
	j = j.endLease(token, LeaseCompleted, handedBackOutcome)
	j.LastCause = fmt.Sprintf("handed back by renderer %s, more than %d times in this cycle", renderer, j.Policy.MaxAttempts)
	j = j.withEvent(Event{Kind: EventAttemptFailed, Token: token, Renderer: renderer, Reason: ReleaseHandedBack, Message: j.LastCause}, now)
	return j.retryOrExhaust(token, renderer, now, jitter), nil
}

// release ends the live lease uncounted and re-queues the job.
func (j Job) release(reason string, now time.Time) Job {
	token, renderer := j.Lease.Token, j.Lease.Renderer
	j = j.endLease(token, LeaseReleased, "")
	j.Phase = PhaseQueued
	j.Attempt--
	j.Lease = Lease{}
	j.EnqueuedAt = now
	return j.withEvent(Event{Kind: EventRequeued, Token: token, Renderer: renderer, Reason: reason}, now)
}

// Heartbeat extends the lease held by renderer under token to now+ttl. It
// adds no history event.
func (j Job) Heartbeat(token uint64, renderer string, now time.Time, ttl time.Duration) (Job, error) {
	if err := j.CheckLease(token, renderer, now); err != nil {
		return j, err
	}
	if d := now.Add(ttl); d.After(j.Lease.Deadline) {
		j.Lease.Deadline = d
	}
	j.UpdatedAt = now
	return j, nil
}

// Completion is a renderer's report of the attempt made under Token.
type Completion struct {
	Token    uint64
	Renderer string
	Success  bool
	// Digest, Size and ContentType describe the preview on success.
	Digest      string
	Size        int64
	ContentType string
	// Class and Message describe a failure.
	Class   FailureClass
	Message string
	// ArtifactMissing reports that no preview with the success Digest was
	// uploaded under this lease. It is judged after the fencing check, so a
	// stale completion is refused as stale whatever it names.
	ArtifactMissing bool
	// Stored says the success names an object of the artifact store, which
	// was found with Digest and Size off the writer, rather than an inline
	// preview or an upload kept in the coordinator's records.
	Stored bool
}

// Outcome returns the completion's idempotency outcome.
func (c Completion) Outcome() string { return Outcome(c.Success, c.Digest, c.Class) }

// Complete applies a completion. It returns the next record, whether the
// completion was a replay of one already applied (then the record is
// unchanged), and an error when it is refused.
//
// A replay is any completion of a lease of this job whose completion was
// applied, with the same outcome, even after later attempts; the same token
// with another outcome is refused ErrOutcomeMismatch.
//
// A refused completion (a *FenceError) returns the record with one
// COMPLETION_REJECTED event appended and nothing else changed, the first
// time the same token from the same renderer is refused for the same reason
// in this cycle, for at most MaxRejectionEvents such keys in a cycle; a
// repeat, and any refusal past those, returns the record unchanged
// (RejectionRecorded reports which), so that no number of refused calls
// grows the record, its history or the caller's rejections listing past
// the cap.
// jitter in [0, 1) draws the backoff of a retryable failure.
func (j Job) Complete(c Completion, now time.Time, jitter float64) (next Job, replayed bool, err error) {
	if rec, ok := j.lease(c.Token); ok && rec.Kind == LeaseCompleted && rec.Renderer == c.Renderer {
		if c.Outcome() == rec.Outcome {
			return j, true, nil
		}
		return j.reject(c, &FenceError{Err: ErrOutcomeMismatch, CurrentToken: j.LastToken(), CurrentPhase: j.Phase}, now)
	}
	if err := j.CheckLease(c.Token, c.Renderer, now); err != nil {
		return j.reject(c, err, now)
	}
	if c.Success && c.ArtifactMissing {
		return j, false, &PhaseError{Err: ErrArtifactMissing, Phase: j.Phase, Op: "complete"}
	}
	if !c.Success && c.Class == ClassUnspecified {
		return j, false, &PhaseError{Err: ErrIllegalTransition, Phase: j.Phase, Op: "complete without outcome"}
	}
	j = j.endLease(c.Token, LeaseCompleted, c.Outcome())
	attempt := j.Attempt
	switch {
	case c.Success:
		j.Artifact = Artifact{Digest: c.Digest, Size: c.Size, ContentType: c.ContentType, Token: c.Token, Renderer: c.Renderer, Stored: c.Stored}
		j = j.finish(PhaseSucceeded, ReasonSucceeded, "", now)
		return j.withEvent(Event{Kind: EventSucceeded, Token: c.Token, Renderer: c.Renderer, Attempt: attempt, Message: c.Digest}, now), false, nil
	case c.Class == ClassUnsupportedFormat || c.Class == ClassInvalidDocument:
		reason := ReasonUnsupportedFormat
		if c.Class == ClassInvalidDocument {
			reason = ReasonInvalidDocument
		}
		j.LastCause = c.Message
		j = j.finish(PhaseFailed, reason, c.Message, now)
		return j.withEvent(Event{Kind: EventFailed, Token: c.Token, Renderer: c.Renderer, Attempt: attempt, Reason: reason.String(), Message: c.Message}, now), false, nil
	default:
		j.LastCause = c.Message
		j = j.withEvent(Event{Kind: EventAttemptFailed, Token: c.Token, Renderer: c.Renderer, Reason: c.Class.String(), Message: c.Message}, now)
		return j.retryOrExhaust(c.Token, c.Renderer, now, jitter), false, nil
	}
}

// reject returns j with a COMPLETION_REJECTED event for c, once per token,
// renderer and reason in a cycle and for at most MaxRejectionEvents of them,
// and the refusal.
func (j Job) reject(c Completion, err error, now time.Time) (Job, bool, error) {
	key := RejectionKey{Token: c.Token, Reason: ReasonCode(err), Renderer: c.Renderer}
	if len(j.Rejected) >= MaxRejectionEvents || slices.Contains(j.Rejected, key) {
		return j, false, err
	}
	j.RejectedCompletions++
	j.Rejected = append(slices.Clip(j.Rejected), key)
	j = j.withEvent(Event{Kind: EventCompletionRejected, Token: c.Token, Renderer: c.Renderer, Reason: key.Reason, Message: c.Outcome()}, now)
	return j, false, err
}

// RejectionRecorded reports whether Complete recorded c's refusal for the
// first time, by comparing the record before and after: false for a repeat
// and for a refusal past the cycle's MaxRejectionEvents.
func RejectionRecorded(before, after Job) bool {
	return after.RejectedCompletions != before.RejectedCompletions
}

// retryOrExhaust ends the current attempt: RETRY_WAIT with backoff, or
// FAILED (ATTEMPTS_EXHAUSTED) with the last cause after the last attempt.
func (j Job) retryOrExhaust(token uint64, renderer string, now time.Time, jitter float64) Job {
	j.Lease = Lease{}
	if j.Attempt >= j.Policy.MaxAttempts {
		msg := "attempts exhausted"
		if j.LastCause != "" {
			msg += "; last cause: " + j.LastCause
		}
		j = j.finish(PhaseFailed, ReasonAttemptsExhausted, msg, now)
		return j.withEvent(Event{Kind: EventFailed, Token: token, Renderer: renderer, Reason: ReasonAttemptsExhausted.String(), Message: msg}, now)
	}
	j.Phase = PhaseRetryWait
	j.NextAttemptAt = now.Add(j.Policy.Backoff(j.Attempt, jitter))
	return j.withEvent(Event{Kind: EventRetryScheduled, Token: token, Message: j.NextAttemptAt.UTC().Format(time.RFC3339Nano)}, now)
}

// Expire ends a LEASED job's attempt whose deadline has passed at now: the
// attempt counts as failed, and the job waits to retry or is FAILED
// (ATTEMPTS_EXHAUSTED).
//
// heard says whether the lease is known to have reached its holder: the
// coordinator handed it to a live reply or stream, or heard from the holder
// about it since (a receipt, heartbeat or completion). A lease not known to
// have arrived (the coordinator went down between its commit and its reply,
// and the holder has not spoken since) goes back to the queue at once
// without counting the attempt, recorded as REQUEUED LEASE_NEVER_HEARD; at
// most MaxAttempts times per cycle, after which it counts like any expiry,
// so that a renderer that dies on receipt cannot loop a document forever.
func (j Job) Expire(now time.Time, jitter float64, heard bool) (Job, error) {
	if j.Phase != PhaseLeased {
		return j, &PhaseError{Err: ErrIllegalTransition, Phase: j.Phase, Op: "expire"}
	}
	if now.Before(j.Lease.Deadline) {
		return j, &PhaseError{Err: ErrLeaseStillValid, Phase: j.Phase, Op: "expire"}
	}
	token, renderer := j.Lease.Token, j.Lease.Renderer
	if !heard && j.Undelivered < j.Policy.MaxAttempts {
		j.Undelivered++
		return j.release(ReleaseNeverHeard, now), nil
	}
	j = j.endLease(token, LeaseExpired, "")
	j.LastCause = "lease expired on renderer " + renderer
	j = j.withEvent(Event{Kind: EventLeaseExpired, Token: token, Renderer: renderer, Reason: string(reason.LeaseExpired)}, now)
	return j.retryOrExhaust(token, renderer, now, jitter), nil
}

// Requeue returns a RETRY_WAIT job to QUEUED once its backoff has elapsed.
func (j Job) Requeue(now time.Time) (Job, error) {
	if j.Phase != PhaseRetryWait {
		return j, &PhaseError{Err: ErrIllegalTransition, Phase: j.Phase, Op: "requeue"}
	}
	if now.Before(j.NextAttemptAt) {
		return j, &PhaseError{Err: ErrBackoffPending, Phase: j.Phase, Op: "requeue"}
	}
	j.Phase = PhaseQueued
	j.NextAttemptAt = time.Time{}
	j.EnqueuedAt = now
	return j.withEvent(Event{Kind: EventRequeued}, now), nil
}

// CancelResult says what a cancel did.
type CancelResult int

// The cancel results.
const (
	// CancelledQueued: the job was QUEUED or RETRY_WAIT and is now CANCELLED.
	CancelledQueued CancelResult = iota + 1
	// CancelledRunning: the job was LEASED; its lease is revoked.
	CancelledRunning
	// AlreadyCancelled: the job was CANCELLED before; nothing changed.
	AlreadyCancelled
)

// Cancel cancels j on behalf of principal. QUEUED and RETRY_WAIT jobs end at
// once; a LEASED job ends at once with its lease revoked (when
// allowRunning), so the holder's later completion is refused. Cancelling a
// CANCELLED job changes nothing. Cancelling a SUCCEEDED or FAILED job is
// ErrAlreadyTerminal, and the record gains one CANCEL_REJECTED event the
// first time in the cycle, so the history shows the cancel that lost.
func (j Job) Cancel(principal, reason string, now time.Time, allowRunning bool) (Job, CancelResult, error) {
	c := Cancellation{Principal: principal, At: now, Reason: reason, FromPhase: j.Phase}
	res := CancelledQueued
	switch j.Phase {
	case PhaseQueued, PhaseRetryWait:
	case PhaseLeased:
		if !allowRunning {
			return j, 0, &PhaseError{Err: ErrRunningCancelDisabled, Phase: j.Phase, Op: "cancel"}
		}
		if mutation.On(mutation.CancelKeepsLease) {
			return j.withEvent(Event{Kind: EventCancelled, Token: j.Lease.Token, Renderer: j.Lease.Renderer, Principal: principal, Reason: "FROM_LEASED", Message: reason}, now), CancelledRunning, nil
		}
		c.Renderer, c.Token = j.Lease.Renderer, j.Lease.Token
		j = j.endLease(c.Token, LeaseRevoked, "")
		res = CancelledRunning
	case PhaseCancelled:
		return j, AlreadyCancelled, nil
	case PhaseSucceeded, PhaseFailed:
		err := &PhaseError{Err: ErrAlreadyTerminal, Phase: j.Phase, Op: "cancel"}
		if j.CancelRejected {
			return j, 0, err
		}
		j.CancelRejected = true
		return j.withEvent(Event{Kind: EventCancelRejected, Principal: principal, Reason: ReasonCode(err), Message: reason}, now), 0, err
	default:
		return j, 0, &PhaseError{Err: ErrIllegalTransition, Phase: j.Phase, Op: "cancel"}
	}
	j.Cancellation = c
	j.EnqueuedAt = time.Time{}
	j = j.finish(PhaseCancelled, ReasonCancelled, reason, now)
	return j.withEvent(Event{Kind: EventCancelled, Token: c.Token, Renderer: c.Renderer, Principal: principal, Reason: "FROM_" + c.FromPhase.String(), Message: reason}, now), res, nil
}

// AckCancel records that renderer, the holder of the lease revoked under
// token, has stopped. It decides through CheckLease: only a refusal of
// exactly ErrJobCancelled (the caller held the revoked lease) is
// acknowledged. It reports false (and returns j unchanged) when there is
// nothing to acknowledge: another token or renderer, or an acknowledgement
// already recorded.
func (j Job) AckCancel(token uint64, renderer string, now time.Time) (Job, bool) {
	if err := j.CheckLease(token, renderer, now); !errors.Is(err, ErrJobCancelled) || !j.Cancellation.AckedAt.IsZero() {
		return j, false
	}
	j.Cancellation.AckedAt = now
	return j.withEvent(Event{Kind: EventCancelAcknowledged, Token: token, Renderer: j.Cancellation.Renderer}, now), true
}

// Replay starts a new cycle of a FAILED job on behalf of an operator:
// QUEUED, attempts reset, terminal record cleared. Permanent failures need
// includePermanent. The leases of earlier cycles stay recorded, so their
// late completions are still told apart.
func (j Job) Replay(principal, reason string, includePermanent bool, now time.Time) (Job, error) {
	if err := j.CanReplay(includePermanent); err != nil {
		return j, err
	}
	prev := j.TerminalReason
	j.Phase = PhaseQueued
	j.Attempt = 0
	j.Cycle++
	j.TerminalReason = ReasonUnspecified
	j.TerminalMessage = ""
	j.FinishedAt = time.Time{}
	j.Rejected = nil
	j.CancelRejected = false
	j.Undelivered = 0
	j.HandedBack = 0
	j.EnqueuedAt = now
	return j.withEvent(Event{Kind: EventReplayed, Principal: principal, Reason: prev.String(), Message: reason}, now), nil
}

// CanReplay reports why j cannot be replayed, or nil.
func (j Job) CanReplay(includePermanent bool) error {
	if j.Phase != PhaseFailed {
		return &PhaseError{Err: ErrNotFailed, Phase: j.Phase, Op: "replay"}
	}
	if j.TerminalReason.Permanent() && !includePermanent {
		return &PhaseError{Err: ErrPermanentFailure, Phase: j.Phase, Op: "replay"}
	}
	return nil
}

// IsFence reports whether err is a fencing failure.
func IsFence(err error) bool {
	var fe *FenceError
	return errors.As(err, &fe)
}
