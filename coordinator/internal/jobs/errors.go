package jobs

import (
	"errors"
	"fmt"

	"github.com/leasehold/leasehold/client/reason"
)

// Fencing failures: a completion or heartbeat whose token is not the job's
// current, live lease. The gRPC edge maps them to ABORTED.
var (
	// ErrStaleLease is returned when the token is not the job's current
	// lease: a newer lease exists or the job has moved on.
	ErrStaleLease = errors.New("stale lease")
	// ErrLeaseExpired is returned when the token's lease deadline passed
	// before the command reached the writer.
	ErrLeaseExpired = errors.New("lease expired")
	// ErrJobCancelled is returned when the token's lease was revoked by a
	// cancellation.
	ErrJobCancelled = errors.New("job cancelled")
	// ErrNotHolder is returned when the token names a lease granted to
	// another renderer than the caller, or the caller never held a lease of
	// the job.
	ErrNotHolder = errors.New("lease is held by another renderer")
	// ErrOutcomeMismatch is returned when a completion repeats an applied
	// token with a different outcome.
	ErrOutcomeMismatch = errors.New("completion outcome differs from the applied one")
)

// Refusals of a transition that the job's phase forbids. The gRPC edge maps
// them to FAILED_PRECONDITION.
var (
	// ErrIllegalTransition is returned when a command does not apply to the
	// job's phase; it is wrapped with the phase and the command.
	ErrIllegalTransition = errors.New("illegal transition")
	// ErrAlreadyTerminal is returned when cancelling a SUCCEEDED or FAILED job.
	ErrAlreadyTerminal = errors.New("job already terminal")
	// ErrRunningCancelDisabled is returned when cancelling a LEASED job while
	// running-job cancellation is switched off.
	ErrRunningCancelDisabled = errors.New("cancelling running jobs is disabled")
	// ErrNotFailed is returned when replaying a job that is not FAILED.
	ErrNotFailed = errors.New("job is not failed")
	// ErrPermanentFailure is returned when replaying a permanent failure
	// without the explicit override.
	ErrPermanentFailure = errors.New("job failed permanently")
	// ErrLeaseStillValid is returned when expiring a lease before its deadline.
	ErrLeaseStillValid = errors.New("lease deadline has not passed")
	// ErrBackoffPending is returned when re-queueing before the retry time.
	ErrBackoffPending = errors.New("retry backoff has not elapsed")
	// ErrArtifactMissing is returned when the current lease holder reports
	// success with a digest that was never uploaded.
	ErrArtifactMissing = errors.New("artifact was never uploaded")
)

// FenceError is a fencing failure with the job's state at the time, for the
// caller's metadata. It unwraps to one of the fencing sentinels.
type FenceError struct {
	Err          error
	CurrentToken uint64
	CurrentPhase Phase
	// NeverHeld says the caller never held a lease of the job: the job's
	// state is none of its business, so CurrentToken and CurrentPhase are
	// zero and the error says nothing of them.
	NeverHeld bool
}

// Error implements error.
func (e *FenceError) Error() string {
	if e.NeverHeld {
		return fmt.Sprintf("%v: the caller never held a lease of this job", e.Err)
	}
	return fmt.Sprintf("%v (current token %d, phase %s)", e.Err, e.CurrentToken, e.CurrentPhase)
}

// NeverHeld reports whether err is a fencing failure of a caller that never
// held a lease of the job (FenceError.NeverHeld).
func NeverHeld(err error) bool {
	var fe *FenceError
	return errors.As(err, &fe) && fe.NeverHeld
}

// Unwrap returns the sentinel.
func (e *FenceError) Unwrap() error { return e.Err }

// PhaseError is a refusal because of the job's phase; it unwraps to a
// sentinel such as ErrAlreadyTerminal or ErrIllegalTransition.
type PhaseError struct {
	Err   error
	Phase Phase
	Op    string
}

// Error implements error.
func (e *PhaseError) Error() string {
	return fmt.Sprintf("%s: %v (phase %s)", e.Op, e.Err, e.Phase)
}

// Unwrap returns the sentinel.
func (e *PhaseError) Unwrap() error { return e.Err }

// ReasonCode returns the stable reason for a fencing or phase error, as the
// API reports it (for example STALE_LEASE), or "" for other errors.
func ReasonCode(err error) string {
	switch {
	case errors.Is(err, ErrStaleLease):
		return string(reason.StaleLease)
	case errors.Is(err, ErrLeaseExpired):
		return string(reason.LeaseExpired)
	case errors.Is(err, ErrJobCancelled):
		return string(reason.JobCancelled)
	case errors.Is(err, ErrNotHolder):
		return string(reason.NotLeaseHolder)
	case errors.Is(err, ErrOutcomeMismatch):
		return string(reason.OutcomeMismatch)
	case errors.Is(err, ErrAlreadyTerminal):
		return string(reason.AlreadyTerminal)
	case errors.Is(err, ErrRunningCancelDisabled):
		return string(reason.RunningCancelDisabled)
	case errors.Is(err, ErrNotFailed):
		return string(reason.NotFailed)
	case errors.Is(err, ErrPermanentFailure):
		return string(reason.PermanentFailure)
	case errors.Is(err, ErrArtifactMissing):
		return string(reason.ArtifactNotFound)
	case errors.Is(err, ErrIllegalTransition):
		return string(reason.IllegalTransition)
	}
	return ""
}

// Errors of reading what is stored.
var (
	// ErrNotFound is returned when a job or batch does not exist.
	ErrNotFound = errors.New("not found")
	// ErrArtifactNotFound is returned when a succeeded job's preview is
	// missing from the store.
	ErrArtifactNotFound = errors.New("preview not found")
)
