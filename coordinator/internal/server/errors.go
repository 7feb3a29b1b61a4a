package server

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"

	"github.com/leasehold/leasehold/client/reason"
	"github.com/leasehold/leasehold/coordinator/internal/artifacts"
	"github.com/leasehold/leasehold/coordinator/internal/auth"
	"github.com/leasehold/leasehold/coordinator/internal/engine"
	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	"github.com/leasehold/leasehold/coordinator/internal/reads"
	"github.com/leasehold/leasehold/coordinator/internal/watch"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
)

// ErrorDomain is the google.rpc.ErrorInfo domain of every error the
// coordinator returns.
const ErrorDomain = auth.ErrorDomain

// The reasons handlers choose themselves, by their short names in this
// package; the rest come from the jobs package (jobs.ReasonCode and
// ValidationError.Reason). Every one is a constant of package reason.
const (
	reasonInvalidID             = string(reason.InvalidID)
	reasonInvalidPageToken      = string(reason.InvalidPageToken)
	reasonInvalidPageSize       = string(reason.InvalidPageSize)
	reasonInvalidPhase          = string(reason.InvalidPhase)
	reasonInvalidRendererID     = string(reason.InvalidRendererID)
	reasonInvalidCapacity       = string(reason.InvalidCapacity)
	reasonMissingOutcome        = string(reason.MissingOutcome)
	reasonMissingMetadata       = string(reason.MissingMetadata)
	reasonArtifactTooLarge      = string(reason.ArtifactTooLarge)
	reasonDigestMismatch        = string(reason.DigestMismatch)
	reasonArtifactNotFound      = string(reason.ArtifactNotFound)
	reasonNotSucceeded          = string(reason.NotSucceeded)
	reasonJobNotFound           = string(reason.JobNotFound)
	reasonBatchNotFound         = string(reason.BatchNotFound)
	reasonPermissionDenied      = string(reason.PermissionDenied)
	reasonUnauthenticated       = string(reason.Unauthenticated)
	reasonMissingReason         = string(reason.MissingReason)
	reasonMissingRequestID      = string(reason.MissingRequestID)
	reasonMissingSelection      = string(reason.MissingSelection)
	reasonConflictingSelection  = string(reason.ConflictingSelection)
	reasonInvalidTerminalReason = string(reason.InvalidTerminalReason)
	reasonInvalidContentType    = string(reason.InvalidContentType)
	reasonSlowWatcher           = string(reason.SlowWatcher)
	reasonStorageUnavailable    = string(reason.StorageUnavailable)
	reasonShuttingDown          = string(reason.ShuttingDown)
	reasonTeamQueueFull         = string(reason.TeamQueueFull)
	reasonRequestIDReused       = string(reason.RequestIDReused)
	reasonNotFound              = string(reason.NotFound)
	reasonInternal              = string(reason.Internal)
	reasonStorageFull           = string(reason.StorageFull)
	reasonRendererNotAllowed    = string(reason.RendererIDNotAllowed)
	reasonRendererInUse         = string(reason.RendererIDInUse)
	reasonSessionReplaced       = string(reason.SessionReplaced)
	reasonMissingHello          = string(reason.MissingHello)
	reasonTooManyLeaseRefs      = string(reason.TooManyLeaseRefs)
	reasonMessageLimit          = string(reason.MessageLimitTooSmall)
	reasonEmptyArtifact         = string(reason.EmptyArtifact)
	reasonUploadTimeout         = string(reason.UploadTimeout)
	reasonUploadInProgress      = string(reason.UploadInProgress)
	reasonUploadBudget          = string(reason.UploadBudgetExhausted)
	reasonInvalidReason         = string(reason.InvalidReason)
	reasonInvalidMessage        = string(reason.InvalidMessage)
	reasonTooManyJobIDs         = string(reason.TooManyJobIDs)
	reasonInvalidInstance       = string(reason.InvalidInstanceID)
	reasonInvalidBatchState     = string(reason.InvalidBatchState)
	reasonInvalidInterval       = string(reason.InvalidInterval)
	reasonNotReplicated         = string(reason.NotReplicated)
	reasonInvalidMemberID       = string(reason.InvalidMemberID)
	reasonInvalidRaftAddress    = string(reason.InvalidRaftAddress)
	reasonMemberNotFound        = string(reason.MemberNotFound)
	reasonMemberUnreachable     = string(reason.MemberUnreachable)
	reasonNoTransferTarget      = string(reason.NoTransferTarget)
	reasonTransferFailed        = string(reason.LeadershipTransferFailed)
	reasonRaftAddressInUse      = string(reason.RaftAddressInUse)
	reasonQuorumAtRisk          = string(reason.QuorumAtRisk)
	reasonLastVoter             = string(reason.LastVoter)
	reasonBackupNoSpace         = string(reason.BackupNoSpace)
	reasonNotLeader             = string(reason.NotLeader)
	reasonOutcomeUnknown        = string(reason.OutcomeUnknown)
	reasonInvalidDigest         = string(reason.InvalidDigest)
	reasonInvalidRequestID      = string(reason.InvalidRequestID)
	reasonStoreUnavailable      = string(reason.ArtifactStoreUnavailable)
	reasonStoreRequired         = string(reason.ArtifactStoreRequired)
	reasonPresignUnsupported    = string(reason.PresignUnsupported)
)

// requestError is a refusal a handler decides itself, before or after
// calling the engine: a malformed argument, a missing permission, a job or
// batch that does not exist. It carries the code and reason it maps to.
type requestError struct {
	code   codes.Code
	reason string
	msg    string
	// field names the offending request field of an INVALID_ARGUMENT.
	field string
	meta  map[string]string
	// err is the cause, if any, for errors.Is.
	err error
}

// Error implements error.
func (e *requestError) Error() string { return e.msg }

// Unwrap returns the cause.
func (e *requestError) Unwrap() error { return e.err }

// invalidArg returns an INVALID_ARGUMENT refusal of field.
func invalidArg(field, reason, format string, args ...any) error {
	return &requestError{code: codes.InvalidArgument, reason: reason, field: field, msg: fmt.Sprintf(format, args...)}
}

// denied returns a PERMISSION_DENIED refusal.
func denied(format string, args ...any) error {
	return &requestError{code: codes.PermissionDenied, reason: reasonPermissionDenied, msg: fmt.Sprintf(format, args...)}
}

// notFound turns jobs.ErrNotFound into NOT_FOUND with the given reason
// (JOB_NOT_FOUND or BATCH_NOT_FOUND) and leaves other errors alone.
func notFound(err error, reason, format string, args ...any) error {
	if errors.Is(err, jobs.ErrNotFound) {
		return &requestError{code: codes.NotFound, reason: reason, msg: fmt.Sprintf(format, args...), err: err}
	}
	return err
}

// errHidden marks a NOT_FOUND given for a job or batch the caller may not
// see, so that the refusal can be audited without telling the caller.
var errHidden = errors.New("not visible to the caller")

// hidden answers a job or batch the caller may not see exactly as one that
// does not exist.
func hidden(reason, format string, args ...any) error {
	return &requestError{code: codes.NotFound, reason: reason, msg: fmt.Sprintf(format, args...), err: errHidden}
}

// Free-text bounds.
const (
	// maxReasonBytes bounds cancel, pause, resume and replay reasons.
	maxReasonBytes = 1024
)

// checkReason refuses a reason over maxReasonBytes or that is not text
// (checkText), and a blank one when it is required.
func checkReason(field, reason string, required bool) error {
	if required && strings.TrimSpace(reason) == "" {
		return invalidArg(field, reasonMissingReason, "%s is required and must not be blank", field)
	}
	return checkText(field, reason, maxReasonBytes, reasonInvalidReason)
}

// checkText is every handler's check of a caller's free text before it is
// stored: at most limit bytes of jobs.ValidText (UTF-8 without control or
// bidirectional formatting characters), or INVALID_ARGUMENT with the
// field's reason and a BadRequest naming it.
func checkText(field, s string, limit int, reason string) error {
	switch {
	case len(s) > limit:
		return invalidArg(field, reason, "%s is at most %d bytes", field, limit)
	case !jobs.ValidText(s):
		return invalidArg(field, reason, "%s must be UTF-8 text without control characters (tabs and line breaks included) "+
			"or bidirectional formatting characters", field)
	}
	return nil
}

// failedPrecondition returns a FAILED_PRECONDITION refusal.
func failedPrecondition(reason, format string, args ...any) error {
	return &requestError{code: codes.FailedPrecondition, reason: reason, msg: fmt.Sprintf(format, args...)}
}

// toStatus is the one table from errors to gRPC status codes; every handler
// returns toStatus(err). Context errors pass through as CANCELLED or
// DEADLINE_EXCEEDED; an error no row knows becomes INTERNAL and is logged
// here, once, without its text reaching the caller.
//
//	*requestError                     its own code and reason
//	context.Canceled / DeadlineExceeded  CANCELLED / DEADLINE_EXCEEDED
//	status errors                     unchanged
//	jobs.ErrTeamQueueFull             RESOURCE_EXHAUSTED TEAM_QUEUE_FULL + QuotaFailure
//	jobs.ErrRequestIDReused           INVALID_ARGUMENT REQUEST_ID_REUSED + BadRequest
//	*jobs.ValidationError             INVALID_ARGUMENT <Reason> + BadRequest
//	*jobs.FenceError                  ABORTED <ReasonCode> current_token, current_phase
//	                                  (no metadata when the caller never held a lease of the job)
//	jobs.ErrAlreadyTerminal           FAILED_PRECONDITION ALREADY_TERMINAL phase
//	other *jobs.PhaseError            FAILED_PRECONDITION <ReasonCode> phase
//	jobs.ErrNotFound                NOT_FOUND NOT_FOUND (handlers choose JOB_/BATCH_NOT_FOUND)
//	engine.ErrRendererInUse           ALREADY_EXISTS RENDERER_ID_IN_USE
//	engine.ErrReplaced                ABORTED SESSION_REPLACED
//	engine.ErrTooManyLeaseRefs        INVALID_ARGUMENT TOO_MANY_LEASE_REFS
//	watch.ErrSlowWatcher             RESOURCE_EXHAUSTED SLOW_WATCHER
//	reads.ErrBackupSpace             RESOURCE_EXHAUSTED BACKUP_NO_SPACE
//	engine.ErrNotLeader               UNAVAILABLE NOT_LEADER leader_id, leader_addr
//	engine.ErrOutcomeUnknown          UNAVAILABLE OUTCOME_UNKNOWN
//	ErrTransferFailed                 UNAVAILABLE LEADERSHIP_TRANSFER_FAILED
//	engine.ErrStorageFull             UNAVAILABLE STORAGE_FULL
//	engine.ErrStopped, ErrStorageFailed UNAVAILABLE STORAGE_UNAVAILABLE
//	artifacts.ErrUnavailable          UNAVAILABLE ARTIFACT_STORE_UNAVAILABLE
//	anything else                     INTERNAL, logged
func toStatus(log *slog.Logger, err error) error {
	if err == nil {
		return nil
	}
	var (
		re *requestError
		ve *jobs.ValidationError
		fe *jobs.FenceError
		pe *jobs.PhaseError
	)
	switch {
	case errors.As(err, &re):
		var details []protoadapt.MessageV1
		if re.code == codes.InvalidArgument && re.field != "" {
			details = append(details, &errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{
				{Field: re.field, Description: re.msg, Reason: re.reason},
			}})
		}
		return newStatus(re.code, re.reason, re.msg, re.meta, details...)
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return status.FromContextError(err).Err()
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	switch {
	case errors.Is(err, jobs.ErrTeamQueueFull):
		qf := &errdetails.QuotaFailure{}
		desc := err.Error()
		if errors.As(err, &ve) && ve.Limit > 0 {
			desc = fmt.Sprintf("the team has %d non-terminal jobs, at most %d", ve.Used, ve.Limit)
		}
		qf.Violations = append(qf.Violations, &errdetails.QuotaFailure_Violation{Subject: "team", Description: desc})
		meta := map[string]string{}
		if ve != nil {
			meta["limit"] = strconv.Itoa(ve.Limit)
			meta["used"] = strconv.Itoa(ve.Used)
		}
		return newStatus(codes.ResourceExhausted, reasonTeamQueueFull, err.Error(), meta, qf)
	case errors.Is(err, jobs.ErrRequestIDReused):
		br := &errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{
			{Field: "request_id", Description: "the request id was used before with different documents", Reason: reasonRequestIDReused},
		}}
		return newStatus(codes.InvalidArgument, reasonRequestIDReused, err.Error(), nil, br)
	case errors.As(err, &ve):
		br := &errdetails.BadRequest{}
		for _, v := range ve.Violations {
			br.FieldViolations = append(br.FieldViolations, &errdetails.BadRequest_FieldViolation{Field: v.Field, Description: v.Description, Reason: string(v.Reason)})
		}
		return newStatus(codes.InvalidArgument, string(ve.Reason), err.Error(), nil, br)
	case errors.As(err, &fe):
		var meta map[string]string
		if !fe.NeverHeld {
			meta = map[string]string{
				"current_token": strconv.FormatUint(fe.CurrentToken, 10),
				"current_phase": phaseName(fe.CurrentPhase),
			}
		}
		return newStatus(codes.Aborted, jobs.ReasonCode(err), err.Error(), meta)
	case errors.As(err, &pe):
		r := cmp.Or(jobs.ReasonCode(err), string(reason.FailedPrecondition))
		return newStatus(codes.FailedPrecondition, r, err.Error(), map[string]string{"phase": phaseName(pe.Phase)})
	case errors.Is(err, jobs.ErrNotFound):
		return newStatus(codes.NotFound, reasonNotFound, err.Error(), nil)
	case errors.Is(err, engine.ErrRendererInUse):
		return newStatus(codes.AlreadyExists, reasonRendererInUse, "the renderer id has a live session of another process; "+
			"give each renderer process its own id", nil)
	case errors.Is(err, engine.ErrReplaced):
		return newStatus(codes.Aborted, reasonSessionReplaced, "a newer session of this renderer process replaced this one", nil)
	case errors.Is(err, engine.ErrTooManyLeaseRefs):
		return newStatus(codes.InvalidArgument, reasonTooManyLeaseRefs, "a list of the message names more leases than the renderer's capacity; "+
			"nothing of it was applied", nil)
	case errors.Is(err, watch.ErrSlowWatcher):
		return newStatus(codes.ResourceExhausted, reasonSlowWatcher, "the watcher fell too far behind; watch again (resume from the last event seen)", nil)
	case errors.Is(err, reads.ErrBackupSpace):
		return newStatus(codes.ResourceExhausted, reasonBackupNoSpace, err.Error(), nil)
	case errors.Is(err, engine.ErrOutcomeUnknown):
		return newStatus(codes.Unavailable, reasonOutcomeUnknown, "leadership changed with this write proposed: it may or may not have been applied; "+
			"every write is idempotent, so send it again (to the leader)", nil)
	case errors.Is(err, engine.ErrNotLeader):
		meta := map[string]string{}
		var nl *engine.NotLeaderError
		if errors.As(err, &nl) {
			if nl.LeaderID != "" {
				meta["leader_id"] = nl.LeaderID
			}
			if nl.LeaderAddr != "" {
				meta["leader_addr"] = nl.LeaderAddr
			}
		}
		return newStatus(codes.Unavailable, reasonNotLeader, "this coordinator is not the leader; send writes and streams to the leader"+leaderText(nl), meta)
	case errors.Is(err, ErrTransferFailed):
		return newStatus(codes.Unavailable, reasonTransferFailed, "no other voter took over leadership in time; this node may lead again: "+
			"look at the cluster and retry", nil)
	case errors.Is(err, engine.ErrStorageFull):
		return newStatus(codes.Unavailable, reasonStorageFull, "the coordinator's disk is full; it stopped taking writes and acknowledged nothing unsaved", nil)
	case errors.Is(err, engine.ErrStopped), errors.Is(err, engine.ErrStorageFailed):
		return newStatus(codes.Unavailable, reasonStorageUnavailable, "the coordinator is not taking writes: "+err.Error(), nil)
	case errors.Is(err, artifacts.ErrUnavailable):
		return newStatus(codes.Unavailable, reasonStoreUnavailable, "the artifact store did not answer; nothing changed: "+
			"keep the lease and retry", nil)
	}
	log.Error("internal error", "err", err)
	return newStatus(codes.Internal, reasonInternal, "internal error", nil)
}

// leaderText names the leader in a NOT_LEADER message, when known.
func leaderText(nl *engine.NotLeaderError) string {
	switch {
	case nl == nil || nl.LeaderID == "":
		return " (no leader is known now; retry shortly)"
	case nl.LeaderAddr == "":
		return fmt.Sprintf(" (%s)", nl.LeaderID)
	}
	return fmt.Sprintf(" (%s at %s)", nl.LeaderID, nl.LeaderAddr)
}

// newStatus builds a status error with ErrorInfo and further details.
func newStatus(code codes.Code, reason, msg string, meta map[string]string, details ...protoadapt.MessageV1) error {
	if len(meta) == 0 {
		meta = nil
	}
	st := status.New(code, msg)
	all := append([]protoadapt.MessageV1{&errdetails.ErrorInfo{Reason: reason, Domain: ErrorDomain, Metadata: meta}}, details...)
	if d, err := st.WithDetails(all...); err == nil {
		st = d
	}
	return st.Err()
}

// phaseName is a phase as the API names it in error metadata: the
// leasehold.v1.Phase enum name, such as PHASE_SUCCEEDED.
func phaseName(p jobs.Phase) string {
	return leaseholdv1.Phase(p).String()
}
