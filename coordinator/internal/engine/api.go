package engine

import (
	"errors"
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	"github.com/leasehold/leasehold/coordinator/internal/reads"
)

// Errors that say a command was not applied for reasons outside the state
// machine, or refusals the engine decides itself. Domain refusals of a
// transition are the jobs package's sentinels.
var (
	// ErrStopped is returned when the writer has stopped (shutdown).
	ErrStopped = errors.New("writer stopped")
	// ErrStorageFailed is returned after a commit failed: the writer is
	// fail-stopped and acknowledges nothing more.
	ErrStorageFailed = errors.New("storage failed; writer stopped")
	// ErrStorageFull is returned after a commit failed because the disk is
	// full; it wraps ErrStorageFailed.
	ErrStorageFull = errors.New("storage full; writer stopped")
	// ErrRendererInUse is returned when a renderer id already has a live
	// session or stream of another process.
	ErrRendererInUse = errors.New("renderer id is in use by another connection")
	// ErrReplaced is the end of a session that a newer session of the same
	// renderer process replaced.
	ErrReplaced = errors.New("session replaced by a newer one of the same renderer")
	// ErrTooManyLeaseRefs refuses a session's opening or message with a
	// list of lease references (or completions) longer than MaxLeaseRefs
	// allows it; nothing of it is applied.
	ErrTooManyLeaseRefs = errors.New("a renderer message names more leases than its capacity")
)

// MaxLeaseRefs is the most leases one list of a session's opening or
// message may name (SessionOpen.Holding; SessionInput's Received,
// Heartbeats, Completions, HandBacks and Acks, each): the capacity the
// renderer declared, the most leases it works on at once, or, for a
// stream that declared none, the capacity its credential may declare;
// never more than maxCredit nor less than 1. It bounds what one writer
// command of a session costs, whatever the message's bytes would allow.
func MaxLeaseRefs(capacity int, r Renderer) int {
	n := capacity
	if n <= 0 {
		n = r.MaxCapacity
	}
	return min(max(n, 1), maxCredit)
}

// Within reports whether every list of in names at most n leases (its
// Undelivered excepted: those are grants the server itself hands back).
func (in SessionInput) Within(n int) bool {
	return len(in.Received) <= n && len(in.Heartbeats) <= n && len(in.Completions) <= n &&
		len(in.HandBacks) <= n && len(in.Acks) <= n
}

// SubmitRequest is one SubmitBatch.
type SubmitRequest struct {
	Team      string
	RequestID string
	Docs      []jobs.DocInput
	Policy    jobs.PolicyInput
	// TraceParent is the W3C traceparent of the submitting call, stored
	// with each job (jobs.Job.TraceParent); it is not part of the request's
	// identity for idempotency.
	TraceParent string
}

// SubmitResult is the stored batch with its counts; Replayed is set when
// the request id had been seen and nothing new was stored.
type SubmitResult struct {
	Batch    reads.BatchView
	Replayed bool
}

// Renderer identifies the renderer behind a command: its id, the
// credential (principal) it authenticated with, and that credential's
// bound on live capacity.
type Renderer struct {
	ID        string
	Principal string
	// MaxCapacity bounds the live capacity all renderers of the principal
	// may declare together; 0 means no bound.
	MaxCapacity int
}

// Grant is a granted lease: the job as leased. Its inline content is read
// after the commit (ReadContent).
type Grant struct {
	Job     jobs.Job
	Content []byte
}

// LeaseRef names a lease.
type LeaseRef struct {
	Job   uint64
	Token uint64
}

// LeaseStatus answers a heartbeat or hand-back for one lease, or announces
// a revocation.
type LeaseStatus struct {
	Job   uint64
	Token uint64
	Held  bool
	// Reason is STALE_LEASE, LEASE_EXPIRED, JOB_CANCELLED, NOT_LEASE_HOLDER
	// or JOB_NOT_FOUND when not held; HANDED_BACK for an applied hand-back.
	Reason       string
	Deadline     time.Time
	CurrentToken uint64
	CurrentPhase jobs.Phase
}

// CompleteRequest is one completion. A success either carries Preview
// (stored in the commit that records it) or names, in Completion.Digest,
// a preview uploaded under the same lease.
//
// A success with Completion.Stored names an object of the artifact store
// that the caller found, off the writer, with the digest and size named,
// after reading the object clock at Seen (Engine.ObjectClock); the writer
// sets the pointer unless the sweep may have deleted the object since
// (store.Tx.ObjectMissing).
type CompleteRequest struct {
	Job uint64
	jobs.Completion
	Preview *jobs.Preview
	Seen    uint64
}

// CompleteResult is the job after a completion; Replayed is set when the
// completion had already been applied. Err is the completion's own refusal
// when it is one item of a session command.
type CompleteResult struct {
	Job      jobs.Job
	Replayed bool
	Err      error
}

// StageRequest stores a preview uploaded under a lease, fenced like a
// completion.
//
// With Stored, the caller put the preview in the artifact store after
// reading the object clock at Seen (Preview.Content is then not kept) and
// Size is its length: the writer records the upload without its bytes.
type StageRequest struct {
	Job      uint64
	Token    uint64
	Renderer string
	Preview  jobs.Preview
	Stored   bool
	Size     int64
	Seen     uint64
}

// SessionOpen opens a renderer session (Engine.Open).
type SessionOpen struct {
	Renderer Renderer
	// Instance identifies the renderer process; a session of the same
	// instance replaces a live one, another instance is refused. A unary
	// client names none.
	Instance string
	// Capacity is how many leases the renderer holds at most, for live
	// capacity; 0 leaves what it said before.
	Capacity int
	// Credits is how many grants the session may take at once (a unary
	// Acquire's max_leases); a Session stream sends its credits later.
	Credits int
	// MaxBytes bounds the bytes all the grants the session takes may carry
	// (a unary Acquire's reply); 0 is no bound.
	MaxBytes int
	// Holding are leases the renderer still holds from an earlier session.
	Holding []LeaseRef
}

// SessionInput is one message of a renderer session: everything it carries
// is applied by one writer command, in this order: receipts, heartbeats,
// completions, hand-backs, cancel acknowledgements, undelivered grants,
// credits.
type SessionInput struct {
	// Renderer is who sends a message outside any session (Receive with a
	// nil Conn); a session's messages are its renderer's.
	Renderer Renderer
	// Capacity, when set, is the renderer's new capacity.
	Capacity    int
	Received    []LeaseRef
	Heartbeats  []LeaseRef
	Completions []CompleteRequest
	HandBacks   []LeaseRef
	Acks        []LeaseRef
	// Undelivered are grants that never reached the renderer (the reply or
	// message to carry them failed): they are re-queued uncounted.
	Undelivered []LeaseRef
	Credits     int
	Draining    bool
}

// SessionResult answers a SessionInput.
type SessionResult struct {
	Completions []CompleteResult
	Heartbeats  []LeaseStatus
	HandBacks   []LeaseStatus
}

// CancelRequest cancels one job or every job of a batch.
type CancelRequest struct {
	Job       uint64
	Batch     uint64
	Principal string
	Reason    string
	// Operator marks a cancel by an operator, which is audited.
	Operator bool
}

// CancelResult is what a cancel did.
type CancelResult struct {
	// Job is the job after a CancelJob.
	Job    jobs.Job
	Result jobs.CancelResult
	// Batch counts for a CancelBatch.
	CancelledQueued  int
	CancelledRunning int
	AlreadyCancelled int
	AlreadySucceeded int
	AlreadyFailed    int
	SkippedRunning   int
	// Running lists jobs cancelled while LEASED (their renderer may still run).
	Running []jobs.Job
}

// ReplayRequest is one operator replay.
type ReplayRequest struct {
	Principal        string
	RequestID        string
	Reason           string
	JobIDs           []uint64
	Batch            uint64
	TerminalReason   jobs.TerminalReason
	DryRun           bool
	IncludePermanent bool
	// InScope reports whether the operator may act on team.
	InScope func(team string) bool
	// Encode serializes the answer for the audit record so a repeated
	// request id returns it again.
	Encode func(ReplayResult) []byte
}

// ReplayItem is one selected, in-scope job.
type ReplayItem struct {
	Job jobs.Job
	// Requeue is true when the job is (or would be) re-queued; otherwise
	// SkipReason says why not: NOT_FAILED, PERMANENT_FAILURE,
	// UNSUPPORTED_FORMAT or JOB_NOT_FOUND.
	Requeue    bool
	SkipReason string
	// ID is set for JOB_NOT_FOUND items, whose Job is empty.
	ID uint64
}

// ReplayResult is what a replay did or would do.
type ReplayResult struct {
	DryRun     bool
	Items      []ReplayItem
	Requeued   int
	Skipped    int
	OutOfScope int
	Selected   int
	Limit      int
	Truncated  bool
	AuditID    uint64
	// Previous is the serialized answer of an earlier call with the same
	// request id; when set nothing was done now.
	Previous []byte
}
