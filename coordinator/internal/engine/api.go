package engine

import (
	"errors"
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/jobs"
)

// Errors that say a command was not applied for reasons outside the state
// machine. Domain refusals are the jobs package's sentinels.
var (
	// ErrStopped is returned when the writer has stopped (shutdown).
	ErrStopped = errors.New("writer stopped")
	// ErrStorageFailed is returned after a commit failed: the writer is
	// fail-stopped and acknowledges nothing more.
	ErrStorageFailed = errors.New("storage failed; writer stopped")
	// ErrNotFound is returned when a job or batch does not exist.
	ErrNotFound = errors.New("not found")
)

// SubmitRequest is one SubmitBatch.
type SubmitRequest struct {
	Team      string
	RequestID string
	Docs      []jobs.DocInput
	Policy    jobs.PolicyInput
}

// SubmitResult is the stored batch; Replayed is set when the request id had
// been seen and nothing new was stored.
type SubmitResult struct {
	Batch    jobs.Batch
	Replayed bool
}

// AcquireRequest asks for up to Max leases for Renderer, whose total
// capacity is Capacity.
type AcquireRequest struct {
	Renderer string
	Max      int
	Capacity int
}

// Grant is a granted lease: the job as leased and its inline content.
type Grant struct {
	Job     jobs.Job
	Content []byte
}

// AcquireResult is the leases granted by one Acquire; Paused reports that
// dispatch is paused by an operator.
type AcquireResult struct {
	Grants []Grant
	Paused bool
}

// LeaseRef names a lease.
type LeaseRef struct {
	Job   uint64
	Token uint64
}

// LeaseStatus answers a heartbeat for one lease, or announces a revocation.
type LeaseStatus struct {
	Job   uint64
	Token uint64
	Held  bool
	// Reason is STALE_LEASE, LEASE_EXPIRED, JOB_CANCELLED or JOB_NOT_FOUND
	// when not held.
	Reason       string
	Deadline     time.Time
	CurrentToken uint64
	CurrentPhase jobs.Phase
}

// HeartbeatRequest is one message of a renderer's heartbeat stream.
type HeartbeatRequest struct {
	Renderer string
	Capacity int
	Leases   []LeaseRef
	Acks     []LeaseRef
}

// CompleteRequest is one Complete.
type CompleteRequest struct {
	Job uint64
	jobs.Completion
}

// CompleteResult is the job after a completion; Replayed is set when the
// completion had already been applied.
type CompleteResult struct {
	Job      jobs.Job
	Replayed bool
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
	// SkipReason says why not: NOT_FAILED, PERMANENT_FAILURE or JOB_NOT_FOUND.
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

// JobFilter selects jobs for ListJobs.
type JobFilter struct {
	Batch uint64
	// Teams limits the listing to these teams; nil means every team.
	Teams []string
	Phase jobs.Phase
	// After is the last id of the previous page.
	After uint64
	Limit int
}

// RejectionFilter selects rejected completions, newest first.
type RejectionFilter struct {
	Job      uint64
	Renderer string
	Since    time.Time
	Until    time.Time
	// Before is the last id of the previous page (0 for the first).
	Before uint64
	Limit  int
	// Teams limits the listing to these teams; nil means every team.
	Teams []string
}

// BatchView is a batch with its job counts per phase.
type BatchView struct {
	Batch  jobs.Batch
	Counts map[jobs.Phase]int
	Done   bool
}

// JobEvent is a committed change to a job, as watchers see it.
type JobEvent struct {
	Job   jobs.Job
	Event jobs.Event
}
