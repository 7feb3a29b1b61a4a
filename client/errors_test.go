package client

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
)

// rpcError builds a status error as the coordinator sends it.
func rpcError(t *testing.T, c codes.Code, reason string, details ...protoadapt.MessageV1) error {
	t.Helper()
	st := status.New(c, "boom")
	if reason != "" {
		details = append([]protoadapt.MessageV1{&errdetails.ErrorInfo{Reason: reason, Domain: ErrorDomain, Metadata: map[string]string{"current_token": "7"}}}, details...)
	}
	if len(details) > 0 {
		var err error
		st, err = st.WithDetails(details...)
		if err != nil {
			t.Fatalf("WithDetails: %v", err)
		}
	}
	return st.Err()
}

func TestErrorMapping(t *testing.T) {
	t.Parallel()

	allSentinels := []error{
		ErrNotFound, ErrInvalidArgument, ErrPermissionDenied, ErrUnauthenticated, ErrFailedPrecondition,
		ErrFenced, ErrResourceExhausted, ErrUnavailable, ErrAlreadyTerminal, ErrRunningCancelDisabled,
		ErrNotSucceeded, ErrStaleLease, ErrLeaseExpired, ErrJobCancelled, ErrOutcomeMismatch, ErrQueueFull,
		ErrSlowWatcher, ErrBatchTooLarge, ErrRequestIDReused, ErrStorageUnavailable,
		ErrAlreadyExists, ErrNotLeaseHolder, ErrSessionReplaced, ErrRendererIDNotAllowed, ErrRendererIDInUse,
		ErrTooManyStreams, ErrStorageFull, ErrMalformedRequest, ErrEmptyArtifact, ErrInvalidReason,
		ErrTooManyJobIDs, ErrUploadTimeout, ErrNotLeader, ErrOutcomeUnknown,
		context.Canceled, context.DeadlineExceeded, ErrDigestMismatch,
	}
	tests := []struct {
		name   string
		code   codes.Code
		reason string
		want   []error // every sentinel the error must match; it must match no other
	}{
		{"not found with a reason is ErrNotFound", codes.NotFound, "JOB_NOT_FOUND", []error{ErrNotFound}},
		{"not found without details is ErrNotFound", codes.NotFound, "", []error{ErrNotFound}},
		{"invalid argument is ErrInvalidArgument", codes.InvalidArgument, "INVALID_NAME", []error{ErrInvalidArgument}},
		{"batch too large is both", codes.InvalidArgument, "BATCH_TOO_LARGE", []error{ErrInvalidArgument, ErrBatchTooLarge}},
		{"request id reused is both", codes.InvalidArgument, "REQUEST_ID_REUSED", []error{ErrInvalidArgument, ErrRequestIDReused}},
		{"permission denied is ErrPermissionDenied", codes.PermissionDenied, "PERMISSION_DENIED", []error{ErrPermissionDenied}},
		{"unauthenticated is ErrUnauthenticated", codes.Unauthenticated, "", []error{ErrUnauthenticated}},
		{"already terminal is a failed precondition", codes.FailedPrecondition, "ALREADY_TERMINAL", []error{ErrFailedPrecondition, ErrAlreadyTerminal}},
		{"running cancel disabled is a failed precondition", codes.FailedPrecondition, "RUNNING_CANCEL_DISABLED", []error{ErrFailedPrecondition, ErrRunningCancelDisabled}},
		{"not succeeded is a failed precondition", codes.FailedPrecondition, "NOT_SUCCEEDED", []error{ErrFailedPrecondition, ErrNotSucceeded}},
		{"stale lease is fenced", codes.Aborted, "STALE_LEASE", []error{ErrFenced, ErrStaleLease}},
		{"lease expired is fenced", codes.Aborted, "LEASE_EXPIRED", []error{ErrFenced, ErrLeaseExpired}},
		{"job cancelled is fenced", codes.Aborted, "JOB_CANCELLED", []error{ErrFenced, ErrJobCancelled}},
		{"outcome mismatch is fenced", codes.Aborted, "OUTCOME_MISMATCH", []error{ErrFenced, ErrOutcomeMismatch}},
		{"aborted without a reason is only fenced", codes.Aborted, "", []error{ErrFenced}},
		{"team queue full is resource exhausted", codes.ResourceExhausted, "TEAM_QUEUE_FULL", []error{ErrResourceExhausted, ErrQueueFull}},
		{"slow watcher is resource exhausted", codes.ResourceExhausted, "SLOW_WATCHER", []error{ErrResourceExhausted, ErrSlowWatcher}},
		{"unavailable is ErrUnavailable", codes.Unavailable, "", []error{ErrUnavailable}},
		{"storage unavailable is both", codes.Unavailable, "STORAGE_UNAVAILABLE", []error{ErrUnavailable, ErrStorageUnavailable}},
		{"a reason under the wrong code is only that code", codes.FailedPrecondition, "STALE_LEASE", []error{ErrFailedPrecondition}},
		{"cancelled is context.Canceled", codes.Canceled, "", []error{context.Canceled}},
		{"deadline exceeded is context.DeadlineExceeded", codes.DeadlineExceeded, "", []error{context.DeadlineExceeded}},
		{"not lease holder is fenced", codes.Aborted, "NOT_LEASE_HOLDER", []error{ErrFenced, ErrNotLeaseHolder}},
		{"session replaced is fenced", codes.Aborted, "SESSION_REPLACED", []error{ErrFenced, ErrSessionReplaced}},
		{"renderer id not allowed is permission denied", codes.PermissionDenied, "RENDERER_ID_NOT_ALLOWED", []error{ErrPermissionDenied, ErrRendererIDNotAllowed}},
		{"renderer id in use is already exists", codes.AlreadyExists, "RENDERER_ID_IN_USE", []error{ErrAlreadyExists, ErrRendererIDInUse}},
		{"already exists without a reason is only ErrAlreadyExists", codes.AlreadyExists, "", []error{ErrAlreadyExists}},
		{"malformed request is invalid argument", codes.InvalidArgument, "MALFORMED_REQUEST", []error{ErrInvalidArgument, ErrMalformedRequest}},
		{"empty artifact is invalid argument", codes.InvalidArgument, "EMPTY_ARTIFACT", []error{ErrInvalidArgument, ErrEmptyArtifact}},
		{"invalid reason is invalid argument", codes.InvalidArgument, "INVALID_REASON", []error{ErrInvalidArgument, ErrInvalidReason}},
		{"too many job ids is invalid argument", codes.InvalidArgument, "TOO_MANY_JOB_IDS", []error{ErrInvalidArgument, ErrTooManyJobIDs}},
		{"too many streams is resource exhausted", codes.ResourceExhausted, "TOO_MANY_STREAMS", []error{ErrResourceExhausted, ErrTooManyStreams}},
		{"storage full is unavailable", codes.Unavailable, "STORAGE_FULL", []error{ErrUnavailable, ErrStorageFull}},
		{"not leader is unavailable", codes.Unavailable, "NOT_LEADER", []error{ErrUnavailable, ErrNotLeader}},
		{"outcome unknown is unavailable", codes.Unavailable, "OUTCOME_UNKNOWN", []error{ErrUnavailable, ErrOutcomeUnknown}},
		{"not leader under another code is only that code", codes.FailedPrecondition, "NOT_LEADER", []error{ErrFailedPrecondition}},
		{"upload timeout is a deadline", codes.DeadlineExceeded, "UPLOAD_TIMEOUT", []error{context.DeadlineExceeded, ErrUploadTimeout}},
		{"internal matches nothing", codes.Internal, "", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := fmt.Errorf("calling: %w", wrapError(rpcError(t, tt.code, tt.reason)))
			for _, s := range allSentinels {
				want := false
				for _, w := range tt.want {
					if w == s {
						want = true
					}
				}
				if got := errors.Is(err, s); got != want {
					t.Errorf("errors.Is(%v, %q) = %v, want %v", err, s, got, want)
				}
			}
			if got := Reason(err); got != tt.reason {
				t.Errorf("Reason = %q, want %q", got, tt.reason)
			}
			if got := status.Code(err); got != tt.code {
				t.Errorf("status.Code = %v, want %v", got, tt.code)
			}
		})
	}
}

func TestWrapError(t *testing.T) {
	t.Parallel()

	t.Run("details are decoded", func(t *testing.T) {
		t.Parallel()
		err := wrapError(rpcError(t, codes.InvalidArgument, "DUPLICATE_NAME",
			&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: "documents[1].name", Description: "duplicate"}}},
			&errdetails.QuotaFailure{Violations: []*errdetails.QuotaFailure_Violation{{Subject: "team:a", Description: "full"}}},
		))
		var e *Error
		if !errors.As(err, &e) {
			t.Fatalf("wrapError returned %T, want *Error", err)
		}
		want := &Error{
			Code:       codes.InvalidArgument,
			Message:    "boom",
			Reason:     "DUPLICATE_NAME",
			Metadata:   map[string]string{"current_token": "7"},
			Violations: []FieldViolation{{"documents[1].name", "duplicate"}, {"team:a", "full"}},
		}
		if diff := cmp.Diff(want, e, cmp.FilterPath(func(p cmp.Path) bool { return p.Last().String() == ".Err" }, cmp.Ignore())); diff != "" {
			t.Errorf("decoded error mismatch (-want +got):\n%s", diff)
		}
		if got, want := e.Error(), "boom (INVALID_ARGUMENT DUPLICATE_NAME)"; got != want {
			t.Errorf("Error() = %q, want %q", got, want)
		}
	})

	t.Run("the ErrorInfo of the leasehold.v1 domain wins over another", func(t *testing.T) {
		t.Parallel()
		st, err := status.New(codes.Aborted, "fenced").WithDetails(
			&errdetails.ErrorInfo{Reason: "PROXY_THING", Domain: "proxy.example"},
			&errdetails.ErrorInfo{Reason: "STALE_LEASE", Domain: ErrorDomain},
		)
		if err != nil {
			t.Fatal(err)
		}
		got := wrapError(st.Err())
		if Reason(got) != "STALE_LEASE" || !errors.Is(got, ErrStaleLease) {
			t.Errorf("reason = %q, ErrStaleLease = %v; want STALE_LEASE and true", Reason(got), errors.Is(got, ErrStaleLease))
		}
	})

	t.Run("errors without a status are returned unchanged", func(t *testing.T) {
		t.Parallel()
		plain := errors.New("plain")
		if got := wrapError(plain); got != plain {
			t.Errorf("wrapError(plain) = %v, want the same error", got)
		}
		if got := wrapError(nil); got != nil {
			t.Errorf("wrapError(nil) = %v, want nil", got)
		}
	})
}
