package client

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/leasehold/leasehold/client/reason"
)

// ErrorDomain is the google.rpc.ErrorInfo domain of the coordinator's errors.
const ErrorDomain = reason.Domain

// These sentinels classify RPC errors by status code alone. Every *Error
// returned by this package matches the one for its code.
var (
	// ErrNotFound is returned when a job, batch or artifact does not exist (NOT_FOUND).
	ErrNotFound = errors.New("not found")
	// ErrInvalidArgument is returned when the request is malformed or over a limit (INVALID_ARGUMENT).
	ErrInvalidArgument = errors.New("invalid argument")
	// ErrPermissionDenied is returned when the caller's principal may not act on the team (PERMISSION_DENIED).
	ErrPermissionDenied = errors.New("permission denied")
	// ErrUnauthenticated is returned when the bearer token is missing or unknown (UNAUTHENTICATED).
	ErrUnauthenticated = errors.New("unauthenticated")
	// ErrFailedPrecondition is returned when the job's phase forbids the operation (FAILED_PRECONDITION).
	ErrFailedPrecondition = errors.New("failed precondition")
	// ErrFenced is returned when the caller's lease or session is no longer the current one: drop the work (ABORTED).
	ErrFenced = errors.New("fenced: lease no longer current")
	// ErrAlreadyExists is returned when something the call would create is already held by another caller (ALREADY_EXISTS).
	ErrAlreadyExists = errors.New("already exists")
	// ErrResourceExhausted is returned when a quota or buffer is exhausted (RESOURCE_EXHAUSTED).
	ErrResourceExhausted = errors.New("resource exhausted")
	// ErrUnavailable is returned when the coordinator cannot be reached or stopped writing (UNAVAILABLE).
	ErrUnavailable = errors.New("unavailable")
)

// These sentinels classify RPC errors by status code and google.rpc.ErrorInfo
// reason. An *Error matches both the reason's sentinel and its code's sentinel:
// ABORTED STALE_LEASE is ErrStaleLease and ErrFenced.
var (
	// ErrAlreadyTerminal is returned when cancelling a job that already SUCCEEDED or FAILED (FAILED_PRECONDITION ALREADY_TERMINAL).
	ErrAlreadyTerminal = errors.New("job already terminal")
	// ErrRunningCancelDisabled is returned when cancelling a LEASED job while running-cancel is off (FAILED_PRECONDITION RUNNING_CANCEL_DISABLED).
	ErrRunningCancelDisabled = errors.New("cancelling running jobs is disabled")
	// ErrNotSucceeded is returned when asking for the artifact of a job that has not SUCCEEDED (FAILED_PRECONDITION NOT_SUCCEEDED).
	ErrNotSucceeded = errors.New("job has not succeeded")
	// ErrStaleLease is returned when a newer lease exists or the job moved on (ABORTED STALE_LEASE).
	ErrStaleLease = errors.New("stale lease")
	// ErrLeaseExpired is returned when the lease deadline passed (ABORTED LEASE_EXPIRED).
	ErrLeaseExpired = errors.New("lease expired")
	// ErrJobCancelled is returned when the leased job was cancelled (ABORTED JOB_CANCELLED).
	ErrJobCancelled = errors.New("job cancelled")
	// ErrNotLeaseHolder is returned when the token is current but was granted to another renderer (ABORTED NOT_LEASE_HOLDER).
	ErrNotLeaseHolder = errors.New("not the lease holder")
	// ErrSessionReplaced is returned when a newer session of the same renderer instance took over this one (ABORTED SESSION_REPLACED).
	ErrSessionReplaced = errors.New("renderer session replaced")
	// ErrOutcomeMismatch is returned when a repeated completion claims a different outcome (ABORTED OUTCOME_MISMATCH).
	ErrOutcomeMismatch = errors.New("completion outcome mismatch")
	// ErrRendererIDNotAllowed is returned when the credential may not use the renderer id (PERMISSION_DENIED RENDERER_ID_NOT_ALLOWED).
	ErrRendererIDNotAllowed = errors.New("renderer id not allowed for this credential")
	// ErrRendererIDInUse is returned when another renderer instance holds a live session under the id (ALREADY_EXISTS RENDERER_ID_IN_USE).
	ErrRendererIDInUse = errors.New("renderer id in use")
	// ErrQueueFull is returned when the team's queue is at its quota (RESOURCE_EXHAUSTED TEAM_QUEUE_FULL).
	ErrQueueFull = errors.New("team queue full")
	// ErrSlowWatcher is returned when a watch stream fell too far behind; watching again is safe (RESOURCE_EXHAUSTED SLOW_WATCHER).
	ErrSlowWatcher = errors.New("watcher fell behind")
	// ErrTooManyStreams is returned when the caller holds as many streams as it may (RESOURCE_EXHAUSTED TOO_MANY_STREAMS).
	ErrTooManyStreams = errors.New("too many streams")
	// ErrStorageFull is returned when the coordinator's disk has no room for the write (UNAVAILABLE STORAGE_FULL: it stopped taking writes).
	ErrStorageFull = errors.New("coordinator storage full")
	// ErrBatchTooLarge is returned when a batch has too many documents, declared bytes or inline bytes (INVALID_ARGUMENT BATCH_TOO_LARGE).
	ErrBatchTooLarge = errors.New("batch too large")
	// ErrMalformedRequest is returned when the request could not be decoded (INVALID_ARGUMENT MALFORMED_REQUEST).
	ErrMalformedRequest = errors.New("malformed request")
	// ErrEmptyArtifact is returned when an upload or inline preview has no bytes (INVALID_ARGUMENT EMPTY_ARTIFACT).
	ErrEmptyArtifact = errors.New("empty artifact")
	// ErrInvalidReason is returned when a free-text reason is over its limit or is not text: a control or bidirectional formatting character, or not UTF-8 (INVALID_ARGUMENT INVALID_REASON).
	ErrInvalidReason = errors.New("invalid reason")
	// ErrTooManyJobIDs is returned when a request names more jobs than one call may (INVALID_ARGUMENT TOO_MANY_JOB_IDS).
	ErrTooManyJobIDs = errors.New("too many job ids")
	// ErrRequestIDReused is returned when a request id was used before with different documents (INVALID_ARGUMENT REQUEST_ID_REUSED).
	ErrRequestIDReused = errors.New("request id reused")
	// ErrStorageUnavailable is returned when the coordinator stopped taking writes (UNAVAILABLE STORAGE_UNAVAILABLE).
	ErrStorageUnavailable = errors.New("coordinator storage unavailable")
	// ErrUploadTimeout is returned when an artifact upload stalled or ran too long (DEADLINE_EXCEEDED UPLOAD_TIMEOUT).
	ErrUploadTimeout = errors.New("artifact upload timed out")
	// ErrNotLeader is returned when the replica that took the call does not lead its cluster; the metadata may name the leader as leader_id and leader_addr (UNAVAILABLE NOT_LEADER).
	ErrNotLeader = errors.New("coordinator is not the leader")
	// ErrOutcomeUnknown is returned when leadership was lost with the write proposed, so that it may or may not have been applied; sending it again is safe (UNAVAILABLE OUTCOME_UNKNOWN).
	ErrOutcomeUnknown = errors.New("write outcome unknown")
)

// ErrDigestMismatch is returned by DownloadArtifact when the SHA-256 of the
// received bytes differs from the artifact's digest. It is decided by the
// client, not by a status code.
var ErrDigestMismatch = errors.New("artifact digest mismatch")

// errorClass maps a status code, and optionally an ErrorInfo reason, to a
// sentinel. An empty reason matches any reason.
type errorClass struct {
	code     codes.Code
	reason   reason.Reason
	sentinel error
}

// errorTable is the one place where status codes and reasons become sentinels.
var errorTable = []errorClass{
	{codes.NotFound, "", ErrNotFound},
	{codes.InvalidArgument, "", ErrInvalidArgument},
	{codes.InvalidArgument, reason.BatchTooLarge, ErrBatchTooLarge},
	{codes.InvalidArgument, reason.RequestIDReused, ErrRequestIDReused},
	{codes.InvalidArgument, reason.MalformedRequest, ErrMalformedRequest},
	{codes.InvalidArgument, reason.EmptyArtifact, ErrEmptyArtifact},
	{codes.InvalidArgument, reason.InvalidReason, ErrInvalidReason},
	{codes.InvalidArgument, reason.TooManyJobIDs, ErrTooManyJobIDs},
	{codes.PermissionDenied, "", ErrPermissionDenied},
	{codes.PermissionDenied, reason.RendererIDNotAllowed, ErrRendererIDNotAllowed},
	{codes.AlreadyExists, "", ErrAlreadyExists},
	{codes.AlreadyExists, reason.RendererIDInUse, ErrRendererIDInUse},
	{codes.Unauthenticated, "", ErrUnauthenticated},
	{codes.FailedPrecondition, "", ErrFailedPrecondition},
	{codes.FailedPrecondition, reason.AlreadyTerminal, ErrAlreadyTerminal},
	{codes.FailedPrecondition, reason.RunningCancelDisabled, ErrRunningCancelDisabled},
	{codes.FailedPrecondition, reason.NotSucceeded, ErrNotSucceeded},
	{codes.Aborted, "", ErrFenced},
	{codes.Aborted, reason.StaleLease, ErrStaleLease},
	{codes.Aborted, reason.LeaseExpired, ErrLeaseExpired},
	{codes.Aborted, reason.JobCancelled, ErrJobCancelled},
	{codes.Aborted, reason.NotLeaseHolder, ErrNotLeaseHolder},
	{codes.Aborted, reason.SessionReplaced, ErrSessionReplaced},
	{codes.Aborted, reason.OutcomeMismatch, ErrOutcomeMismatch},
	{codes.ResourceExhausted, "", ErrResourceExhausted},
	{codes.ResourceExhausted, reason.TeamQueueFull, ErrQueueFull},
	{codes.ResourceExhausted, reason.SlowWatcher, ErrSlowWatcher},
	{codes.ResourceExhausted, reason.TooManyStreams, ErrTooManyStreams},
	{codes.Unavailable, reason.StorageFull, ErrStorageFull},
	{codes.Unavailable, "", ErrUnavailable},
	{codes.Unavailable, reason.StorageUnavailable, ErrStorageUnavailable},
	{codes.Unavailable, reason.NotLeader, ErrNotLeader},
	{codes.Unavailable, reason.OutcomeUnknown, ErrOutcomeUnknown},
	{codes.Canceled, "", context.Canceled},
	{codes.DeadlineExceeded, "", context.DeadlineExceeded},
	{codes.DeadlineExceeded, reason.UploadTimeout, ErrUploadTimeout},
}

// FieldViolation names one offending field of a request, from
// google.rpc.BadRequest, or one exhausted quota, from google.rpc.QuotaFailure
// (Field is then the quota's subject).
type FieldViolation struct {
	Field       string
	Description string
}

// Error is an RPC error from the coordinator with its details decoded.
//
// Every error returned by a Client method that came from an RPC is an *Error.
// Use errors.Is with the sentinels of this package to classify it, and
// errors.As to read the reason and metadata.
type Error struct {
	// Code is the gRPC status code.
	Code codes.Code
	// Message is the status message.
	Message string
	// Reason is the ErrorInfo reason, one of package reason's (such as
	// STALE_LEASE); empty without ErrorInfo.
	Reason string
	// Metadata is the ErrorInfo metadata, such as current_token and current_phase.
	Metadata map[string]string
	// Violations lists the BadRequest field violations and QuotaFailure violations.
	Violations []FieldViolation
	// Err is the underlying status error.
	Err error
}

// Error returns the status message followed by the code and reason, as in
// "job j-1 not found (NOT_FOUND JOB_NOT_FOUND)".
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.Message)
	b.WriteString(" (")
	b.WriteString(CodeName(e.Code))
	if e.Reason != "" {
		b.WriteByte(' ')
		b.WriteString(e.Reason)
	}
	b.WriteByte(')')
	return b.String()
}

// Unwrap returns the underlying status error.
func (e *Error) Unwrap() error { return e.Err }

// GRPCStatus returns the underlying status, so that status.FromError and
// status.Code see through the wrapper.
func (e *Error) GRPCStatus() *status.Status {
	st, _ := status.FromError(e.Err)
	return st
}

// Is reports whether the sentinel target classifies e: target matches when
// the error table maps e's code (and, for reason sentinels, e's reason) to it.
func (e *Error) Is(target error) bool {
	for _, c := range errorTable {
		if c.sentinel == target && c.code == e.Code && (c.reason == "" || string(c.reason) == e.Reason) {
			return true
		}
	}
	return false
}

// Reason returns the ErrorInfo reason of err if it is or wraps an *Error,
// and "" otherwise: one of package reason's, as in
// client.Reason(err) == string(reason.TeamQueueFull).
func Reason(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Reason
	}
	return ""
}

// CodeName returns the canonical UPPER_SNAKE name of a status code, as in
// "FAILED_PRECONDITION".
func CodeName(c codes.Code) string {
	if n, ok := codeNames[c]; ok {
		return n
	}
	return fmt.Sprintf("CODE_%d", uint32(c))
}

var codeNames = map[codes.Code]string{
	codes.OK:                 "OK",
	codes.Canceled:           "CANCELLED",
	codes.Unknown:            "UNKNOWN",
	codes.InvalidArgument:    "INVALID_ARGUMENT",
	codes.DeadlineExceeded:   "DEADLINE_EXCEEDED",
	codes.NotFound:           "NOT_FOUND",
	codes.AlreadyExists:      "ALREADY_EXISTS",
	codes.PermissionDenied:   "PERMISSION_DENIED",
	codes.ResourceExhausted:  "RESOURCE_EXHAUSTED",
	codes.FailedPrecondition: "FAILED_PRECONDITION",
	codes.Aborted:            "ABORTED",
	codes.OutOfRange:         "OUT_OF_RANGE",
	codes.Unimplemented:      "UNIMPLEMENTED",
	codes.Internal:           "INTERNAL",
	codes.Unavailable:        "UNAVAILABLE",
	codes.DataLoss:           "DATA_LOSS",
	codes.Unauthenticated:    "UNAUTHENTICATED",
}

// wrapError converts an RPC error into an *Error carrying its decoded
// details. nil stays nil; errors that carry no status (io.EOF, a client-side
// failure) are returned unchanged.
func wrapError(err error) error {
	if err == nil {
		return nil
	}
	var already *Error
	if errors.As(err, &already) {
		return err
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	e := &Error{Code: st.Code(), Message: st.Message(), Err: err}
	haveOurs := false
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			// The first ErrorInfo counts unless a later one is in our domain
			// (a proxy may add its own).
			if !haveOurs && (e.Reason == "" || d.GetDomain() == ErrorDomain) {
				e.Reason = d.GetReason()
				e.Metadata = d.GetMetadata()
				haveOurs = d.GetDomain() == ErrorDomain
			}
		case *errdetails.BadRequest:
			for _, v := range d.GetFieldViolations() {
				e.Violations = append(e.Violations, FieldViolation{Field: v.GetField(), Description: v.GetDescription()})
			}
		case *errdetails.QuotaFailure:
			for _, v := range d.GetViolations() {
				e.Violations = append(e.Violations, FieldViolation{Field: v.GetSubject(), Description: v.GetDescription()})
			}
		}
	}
	return e
}
