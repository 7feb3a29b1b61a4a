package jobs

import (
	"fmt"
	"slices"
	"time"
)

// Phase is where a job is in its lifecycle. The numbers match the wire and
// storage enums.
type Phase int32

// The phases of a job.
const (
	PhaseUnspecified Phase = iota
	PhaseQueued
	PhaseLeased
	PhaseRetryWait
	PhaseSucceeded
	PhaseFailed
	PhaseCancelled
)

var phaseNames = [...]string{"UNSPECIFIED", "QUEUED", "LEASED", "RETRY_WAIT", "SUCCEEDED", "FAILED", "CANCELLED"}

// String returns the phase's short upper-case name.
func (p Phase) String() string {
	if p < 0 || int(p) >= len(phaseNames) {
		return fmt.Sprintf("Phase(%d)", int32(p))
	}
	return phaseNames[p]
}

// Terminal reports whether the phase never changes again (except by replay).
func (p Phase) Terminal() bool {
	return p == PhaseSucceeded || p == PhaseFailed || p == PhaseCancelled
}

// TerminalReason says how a job ended.
type TerminalReason int32

// The terminal reasons.
const (
	ReasonUnspecified TerminalReason = iota
	ReasonSucceeded
	ReasonUnsupportedFormat
	ReasonInvalidDocument
	ReasonAttemptsExhausted
	ReasonCancelled
)

var reasonNames = [...]string{"UNSPECIFIED", "SUCCEEDED", "UNSUPPORTED_FORMAT", "INVALID_DOCUMENT", "ATTEMPTS_EXHAUSTED", "CANCELLED"}

// String returns the reason's upper-case name.
func (r TerminalReason) String() string {
	if r < 0 || int(r) >= len(reasonNames) {
		return fmt.Sprintf("TerminalReason(%d)", int32(r))
	}
	return reasonNames[r]
}

// Permanent reports whether the reason is a permanent failure that replay
// skips unless told otherwise.
func (r TerminalReason) Permanent() bool {
	return r == ReasonUnsupportedFormat || r == ReasonInvalidDocument
}

// FailureClass is how a renderer classifies a failed attempt.
type FailureClass int32

// The failure classes.
const (
	ClassUnspecified FailureClass = iota
	ClassUnsupportedFormat
	ClassInvalidDocument
	ClassTransient
)

var classNames = [...]string{"UNSPECIFIED", "UNSUPPORTED_FORMAT", "INVALID_DOCUMENT", "TRANSIENT"}

// String returns the class's upper-case name.
func (c FailureClass) String() string {
	if c < 0 || int(c) >= len(classNames) {
		return fmt.Sprintf("FailureClass(%d)", int32(c))
	}
	return classNames[c]
}

// EventKind names an entry in a job's history.
type EventKind int32

// The event kinds; numbers match the wire enum.
const (
	EventUnspecified EventKind = iota
	EventSubmitted
	EventLeased
	EventLeaseExpired
	EventAttemptFailed
	EventRetryScheduled
	EventRequeued
	EventSucceeded
	EventFailed
	EventCancelled
	EventCancelAcknowledged
	EventCompletionRejected
	EventCancelRejected
	EventReplayed
)

var eventNames = [...]string{"UNSPECIFIED", "SUBMITTED", "LEASED", "LEASE_EXPIRED", "ATTEMPT_FAILED", "RETRY_SCHEDULED", "REQUEUED", "SUCCEEDED", "FAILED", "CANCELLED", "CANCEL_ACKNOWLEDGED", "COMPLETION_REJECTED", "CANCEL_REJECTED", "REPLAYED"}

// String returns the kind's upper-case name.
func (k EventKind) String() string {
	if k < 0 || int(k) >= len(eventNames) {
		return fmt.Sprintf("EventKind(%d)", int32(k))
	}
	return eventNames[k]
}

// MaxRejectionEvents bounds how many rejected completions one job keeps in
// its history; later ones are only counted (the rejections listing has all).
const MaxRejectionEvents = 32

// Document is a job's document metadata. The content itself is stored
// apart and never part of the record.
type Document struct {
	Name          string
	ContentType   string
	SizeBytes     int64
	SourceURI     string
	ContentSHA256 string
}

// Lease is the current holder of a LEASED job.
type Lease struct {
	Token     uint64
	Renderer  string
	GrantedAt time.Time
	Deadline  time.Time
}

// Artifact is the reference to a succeeded job's preview.
type Artifact struct {
	Digest      string
	Size        int64
	ContentType string
	Token       uint64
	Renderer    string
}

// Cancellation records who cancelled a job and what it interrupted.
type Cancellation struct {
	Principal string
	At        time.Time
	Reason    string
	FromPhase Phase
	// Renderer and Token name the revoked lease of a job cancelled while LEASED.
	Renderer string
	Token    uint64
	// AckedAt is when that renderer acknowledged the revocation.
	AckedAt time.Time
}

// RetryPolicy bounds retries: MaxAttempts per cycle, with exponential
// backoff from BackoffBase doubling up to BackoffCap, with full jitter.
type RetryPolicy struct {
	MaxAttempts uint32
	BackoffBase time.Duration
	BackoffCap  time.Duration
}

// Backoff returns the wait before the attempt after attempt number n (from
// 1): jitter * min(cap, base * 2^(n-1)), where jitter is uniform in [0, 1).
func (p RetryPolicy) Backoff(n uint32, jitter float64) time.Duration {
	ceiling := p.BackoffCap
	if n >= 1 && n <= 62 {
		d := p.BackoffBase << (n - 1)
		if d > 0 && d < ceiling && d>>(n-1) == p.BackoffBase {
			ceiling = d
		}
	}
	jitter = min(max(jitter, 0), 1)
	return time.Duration(jitter * float64(ceiling))
}

// Event is one entry in a job's history.
type Event struct {
	Seq       uint32
	At        time.Time
	Kind      EventKind
	Phase     Phase
	Token     uint64
	Renderer  string
	Attempt   uint32
	Reason    string
	Message   string
	Principal string
}

// Job is one document's preview job: the record the writer persists.
type Job struct {
	ID      uint64
	BatchID uint64
	Team    string
	Doc     Document
	Policy  RetryPolicy

	Phase   Phase
	Attempt uint32
	Cycle   uint32

	// Lease is set only while Phase is LEASED.
	Lease Lease
	// NextAttemptAt is set only while Phase is RETRY_WAIT.
	NextAttemptAt time.Time

	TerminalReason  TerminalReason
	TerminalMessage string
	FinishedAt      time.Time
	Artifact        Artifact
	Cancellation    Cancellation

	// CompletedToken and CompletedOutcome name the last applied completion,
	// so that a replay of it is recognised and answered without change.
	CompletedToken   uint64
	CompletedOutcome string
	// LastCause is the message of the last failed attempt.
	LastCause string

	CreatedAt  time.Time
	UpdatedAt  time.Time
	EnqueuedAt time.Time

	Events              []Event
	RejectedCompletions uint32
}

// withEvent returns j with ev appended to a fresh copy of its history, so
// that the caller's record never shares a backing array with the result.
func (j Job) withEvent(ev Event, now time.Time) Job {
	ev.Seq = uint32(len(j.Events)) + 1
	if len(j.Events) > 0 {
		ev.Seq = j.Events[len(j.Events)-1].Seq + 1
	}
	ev.At = now
	ev.Phase = j.Phase
	if ev.Attempt == 0 {
		ev.Attempt = j.Attempt
	}
	j.Events = append(slices.Clip(j.Events), ev)
	j.UpdatedAt = now
	return j
}

// finish moves j to a terminal phase.
func (j Job) finish(phase Phase, reason TerminalReason, msg string, now time.Time) Job {
	j.Phase = phase
	j.TerminalReason = reason
	j.TerminalMessage = msg
	j.FinishedAt = now
	j.Lease = Lease{}
	j.NextAttemptAt = time.Time{}
	return j
}

// Outcome names a completion's result for idempotency checks: "success:<digest>"
// or "failure:<class>".
func Outcome(success bool, digest string, class FailureClass) string {
	if success {
		return "success:" + digest
	}
	return "failure:" + class.String()
}
