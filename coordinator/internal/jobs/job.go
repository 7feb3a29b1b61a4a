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

// MaxRejectionEvents bounds how many distinct rejected completions (token,
// renderer, reason) one job records per cycle, in its history and in the
// rejections listing; later ones change no record (the writer counts them
// in a metric).
const MaxRejectionEvents = 32

// LeaseEndKind says how a lease ended.
type LeaseEndKind int32

// The ways a lease ends; numbers are stored.
const (
	// LeaseLive: the lease has not ended.
	LeaseLive LeaseEndKind = iota
	// LeaseCompleted: its completion was applied (Outcome says which), or
	// its holder handed it back once the cycle's free hand-backs were used
	// up (Outcome "failure:HANDED_BACK").
	LeaseCompleted
	// LeaseExpired: its deadline passed.
	LeaseExpired
	// LeaseReleased: it went back to the queue uncounted: never delivered,
	// never heard from, or handed back within the cycle's free hand-backs.
	LeaseReleased
	// LeaseRevoked: the job was cancelled while it was held.
	LeaseRevoked
)

// LeaseRecord is one lease ever granted for a job and how it ended. The
// job keeps them all, oldest first, so that the fencing check can answer a
// late or repeated call without reading the history.
type LeaseRecord struct {
	Token    uint64
	Renderer string
	Kind     LeaseEndKind
	// Outcome is the applied completion's outcome, for LeaseCompleted.
	Outcome string
}

// RejectionKey names a rejected completion recorded in the history: the
// same token refused for the same reason to the same renderer is one
// rejection however often it is sent.
type RejectionKey struct {
	Token    uint64
	Reason   string
	Renderer string
}

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
	// Stored says the preview is an object of the artifact store, under
	// the job's team and Digest; otherwise it is inline in the coordinator's
	// records, under (job, Token).
	Stored bool
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
//
// Events holds the history known in memory: all of it when read for
// display, and only the events a transition appended when the writer loaded
// the record without its history. Transitions never read Events; what they
// need of the past is in Leases, Rejected and the counters.
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

	// Leases lists every lease granted, oldest first, with how it ended.
	Leases []LeaseRecord
	// LastCause is the message of the last failed attempt.
	LastCause string

	CreatedAt  time.Time
	UpdatedAt  time.Time
	EnqueuedAt time.Time

	// ContentBytes is the size of the inline document content.
	ContentBytes int64

	// EventSeq is the seq of the job's last event.
	EventSeq uint32
	// Events are the events the transitions applied to this value
	// appended, oldest first: for a record loaded by the writer, the ones
	// its command produced, which the writer stores and publishes; for a
	// new job, all of them. The stored history is History.
	Events []Event
	// History is the job's stored history up to EventSeq, oldest first, as
	// a read with history returns it (store's JobWithHistory). Transitions
	// neither read nor change it.
	History []Event
	// RejectedCompletions counts every rejected completion recorded, at
	// most MaxRejectionEvents per cycle.
	RejectedCompletions uint32
	// Rejected lists the (token, reason) rejections recorded in this
	// cycle's history, at most MaxRejectionEvents.
	Rejected []RejectionKey
	// CancelRejected is set once a cancel after the end of this cycle was
	// recorded in the history.
	CancelRejected bool
	// Undelivered counts this cycle's uncharged expiries of leases never
	// heard from.
	Undelivered uint32
	// HandedBack counts this cycle's uncharged hand-backs.
	HandedBack uint32
	// TraceParent is the W3C traceparent of the submission, set once when
	// the job is stored and sent with every grant; empty when the
	// submission was not traced. Transitions never read or change it.
	TraceParent string
}

// withEvent returns j with ev appended to a fresh copy of its history, so
// that the caller's record never shares a backing array with the result.
func (j Job) withEvent(ev Event, now time.Time) Job {
	j.EventSeq++
	ev.Seq = j.EventSeq
	ev.At = now
	ev.Phase = j.Phase
	if ev.Attempt == 0 {
		ev.Attempt = j.Attempt
	}
	j.Events = append(slices.Clip(j.Events), ev)
	j.UpdatedAt = now
	return j
}

// heldBy reports whether any lease of the job, in any cycle, was granted to
// renderer.
func (j Job) heldBy(renderer string) bool {
	return slices.ContainsFunc(j.Leases, func(r LeaseRecord) bool { return r.Renderer == renderer })
}

// lease returns the record of the lease granted under token.
func (j Job) lease(token uint64) (LeaseRecord, bool) {
	for i := len(j.Leases) - 1; i >= 0; i-- {
		if j.Leases[i].Token == token {
			return j.Leases[i], true
		}
	}
	return LeaseRecord{}, false
}

// endLease returns j with the live lease under token marked as ended, on a
// fresh copy of the list.
func (j Job) endLease(token uint64, kind LeaseEndKind, outcome string) Job {
	j.Leases = slices.Clone(j.Leases)
	for i := len(j.Leases) - 1; i >= 0; i-- {
		if j.Leases[i].Token == token {
			j.Leases[i].Kind = kind
			j.Leases[i].Outcome = outcome
			break
		}
	}
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
