package server

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/leasehold/leasehold/coordinator/internal/engine"
	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	"github.com/leasehold/leasehold/coordinator/internal/reads"
	"github.com/leasehold/leasehold/coordinator/internal/store"
	"github.com/leasehold/leasehold/coordinator/internal/watch"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestToStatus checks every row of the error table directly, including
// those no RPC can reach on demand.
func TestToStatus(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		err        error
		wantCode   codes.Code
		wantReason string
		wantMeta   map[string]string
		wantLogged bool
	}{
		{"A handler refusal keeps its code and reason", invalidArg("job_id", reasonInvalidID, "bad"), codes.InvalidArgument, reasonInvalidID, nil, false},
		{"A validation error is INVALID_ARGUMENT with its reason",
			&jobs.ValidationError{Err: jobs.ErrInvalidBatch, Reason: "EMPTY_BATCH", Violations: []jobs.Violation{{Field: "documents", Reason: "EMPTY_BATCH"}}},
			codes.InvalidArgument, "EMPTY_BATCH", nil, false},
		{"A full team queue is RESOURCE_EXHAUSTED",
			&jobs.ValidationError{Err: jobs.ErrTeamQueueFull, Reason: "TEAM_QUEUE_FULL", Limit: 3, Used: 3},
			codes.ResourceExhausted, reasonTeamQueueFull, map[string]string{"limit": "3", "used": "3"}, false},
		{"A reused request id is INVALID_ARGUMENT REQUEST_ID_REUSED", fmt.Errorf("submit: %w", jobs.ErrRequestIDReused), codes.InvalidArgument, reasonRequestIDReused, nil, false},
		{"A stale lease is ABORTED with the current token and phase",
			&jobs.FenceError{Err: jobs.ErrStaleLease, CurrentToken: 9, CurrentPhase: jobs.PhaseLeased},
			codes.Aborted, "STALE_LEASE", map[string]string{"current_token": "9", "current_phase": "PHASE_LEASED"}, false},
		{"An expired lease is ABORTED LEASE_EXPIRED",
			&jobs.FenceError{Err: jobs.ErrLeaseExpired, CurrentToken: 0, CurrentPhase: jobs.PhaseRetryWait},
			codes.Aborted, "LEASE_EXPIRED", map[string]string{"current_token": "0", "current_phase": "PHASE_RETRY_WAIT"}, false},
		{"A cancelled job is ABORTED JOB_CANCELLED",
			&jobs.FenceError{Err: jobs.ErrJobCancelled, CurrentPhase: jobs.PhaseCancelled},
			codes.Aborted, "JOB_CANCELLED", map[string]string{"current_token": "0", "current_phase": "PHASE_CANCELLED"}, false},
		{"Cancelling a finished job is FAILED_PRECONDITION ALREADY_TERMINAL naming the phase",
			&jobs.PhaseError{Err: jobs.ErrAlreadyTerminal, Phase: jobs.PhaseSucceeded, Op: "cancel"},
			codes.FailedPrecondition, "ALREADY_TERMINAL", map[string]string{"phase": "PHASE_SUCCEEDED"}, false},
		{"Cancelling a running job while that is off is FAILED_PRECONDITION RUNNING_CANCEL_DISABLED",
			&jobs.PhaseError{Err: jobs.ErrRunningCancelDisabled, Phase: jobs.PhaseLeased, Op: "cancel"},
			codes.FailedPrecondition, "RUNNING_CANCEL_DISABLED", map[string]string{"phase": "PHASE_LEASED"}, false},
		{"Another phase refusal is FAILED_PRECONDITION with its reason",
			&jobs.PhaseError{Err: jobs.ErrIllegalTransition, Phase: jobs.PhaseQueued, Op: "grant"},
			codes.FailedPrecondition, "ILLEGAL_TRANSITION", map[string]string{"phase": "PHASE_QUEUED"}, false},
		{"A bare not-found is NOT_FOUND", jobs.ErrNotFound, codes.NotFound, reasonNotFound, nil, false},
		{"A job not found chosen by the handler is JOB_NOT_FOUND", notFound(jobs.ErrNotFound, reasonJobNotFound, "job j-1 not found"), codes.NotFound, reasonJobNotFound, nil, false},
		{"A stopped writer is UNAVAILABLE", fmt.Errorf("submit: %w", engine.ErrStopped), codes.Unavailable, reasonStorageUnavailable, nil, false},
		{"A failed commit is UNAVAILABLE", engine.ErrStorageFailed, codes.Unavailable, reasonStorageUnavailable, nil, false},
		{"Another renderer's lease is ABORTED NOT_LEASE_HOLDER",
			&jobs.FenceError{Err: jobs.ErrNotHolder, CurrentToken: 4, CurrentPhase: jobs.PhaseLeased},
			codes.Aborted, "NOT_LEASE_HOLDER", map[string]string{"current_token": "4", "current_phase": "PHASE_LEASED"}, false},
		{"The same token with another outcome is ABORTED OUTCOME_MISMATCH",
			&jobs.FenceError{Err: jobs.ErrOutcomeMismatch, CurrentToken: 4, CurrentPhase: jobs.PhaseSucceeded},
			codes.Aborted, "OUTCOME_MISMATCH", map[string]string{"current_token": "4", "current_phase": "PHASE_SUCCEEDED"}, false},
		{"A success naming no upload of its lease is FAILED_PRECONDITION ARTIFACT_NOT_FOUND",
			&jobs.PhaseError{Err: jobs.ErrArtifactMissing, Phase: jobs.PhaseLeased, Op: "complete"},
			codes.FailedPrecondition, reasonArtifactNotFound, map[string]string{"phase": "PHASE_LEASED"}, false},
		{"A job the caller may not see is NOT_FOUND JOB_NOT_FOUND", hidden(reasonJobNotFound, "job j-1 not found"), codes.NotFound, reasonJobNotFound, nil, false},
		{"A renderer id live in another process is ALREADY_EXISTS RENDERER_ID_IN_USE", engine.ErrRendererInUse, codes.AlreadyExists, reasonRendererInUse, nil, false},
		{"A replaced session is ABORTED SESSION_REPLACED", engine.ErrReplaced, codes.Aborted, reasonSessionReplaced, nil, false},
		{"A watcher too far behind is RESOURCE_EXHAUSTED SLOW_WATCHER", watch.ErrSlowWatcher, codes.ResourceExhausted, reasonSlowWatcher, nil, false},
		{"No room for a backup's copy is RESOURCE_EXHAUSTED BACKUP_NO_SPACE", fmt.Errorf("copying: %w", reads.ErrBackupSpace), codes.ResourceExhausted, reasonBackupNoSpace, nil, false},
		{"A full disk is UNAVAILABLE STORAGE_FULL", fmt.Errorf("%w: %w", engine.ErrStorageFull, engine.ErrStorageFailed), codes.Unavailable, reasonStorageFull, nil, false},
		{"Shutting down is UNAVAILABLE SHUTTING_DOWN", errShuttingDown, codes.Unavailable, reasonShuttingDown, nil, false},
		{"A transfer no voter took is UNAVAILABLE LEADERSHIP_TRANSFER_FAILED", fmt.Errorf("%w: leadership transfer timeout", ErrTransferFailed),
			codes.Unavailable, reasonTransferFailed, nil, false},
		{"Anything else is INTERNAL and logged", errors.New("disk on fire"), codes.Internal, reasonInternal, nil, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var logs bytes.Buffer
			err := toStatus(slog.New(slog.NewTextHandler(&logs, nil)), tc.err)
			code, info := errorInfo(err)
			if code != tc.wantCode || info.GetReason() != tc.wantReason {
				t.Fatalf("got %v %q, want %v %q", code, info.GetReason(), tc.wantCode, tc.wantReason)
			}
			if info.GetDomain() != ErrorDomain {
				t.Errorf("domain = %q, want %q", info.GetDomain(), ErrorDomain)
			}
			if diff := cmp.Diff(tc.wantMeta, info.GetMetadata()); tc.wantMeta != nil && diff != "" {
				t.Errorf("metadata (-want +got):\n%s", diff)
			}
			if got := logs.Len() > 0; got != tc.wantLogged {
				t.Errorf("logged = %v, want %v (%s)", got, tc.wantLogged, logs.String())
			}
			if tc.wantCode == codes.Internal && strings.Contains(status.Convert(err).Message(), "disk on fire") {
				t.Errorf("INTERNAL message leaks the cause: %q", status.Convert(err).Message())
			}
		})
	}

	t.Run("Context errors pass through as their own codes", func(t *testing.T) {
		t.Parallel()
		log := slog.New(slog.DiscardHandler)
		if got := status.Code(toStatus(log, context.Canceled)); got != codes.Canceled {
			t.Errorf("context.Canceled -> %v, want Canceled", got)
		}
		if got := status.Code(toStatus(log, fmt.Errorf("x: %w", context.DeadlineExceeded))); got != codes.DeadlineExceeded {
			t.Errorf("context.DeadlineExceeded -> %v, want DeadlineExceeded", got)
		}
	})
	t.Run("A validation error carries one field violation per violation", func(t *testing.T) {
		t.Parallel()
		err := toStatus(slog.New(slog.DiscardHandler), &jobs.ValidationError{Err: jobs.ErrInvalidBatch, Reason: "INVALID_NAME", Violations: []jobs.Violation{
			{Field: "documents[0].name", Reason: "INVALID_NAME"}, {Field: "documents[1].size_bytes", Reason: "DOCUMENT_TOO_LARGE"},
		}})
		if diff := cmp.Diff([]string{"documents[0].name", "documents[1].size_bytes"}, badRequestFields(err)); diff != "" {
			t.Errorf("BadRequest fields (-want +got):\n%s", diff)
		}
	})
}

// badRequestFields lists the fields of err's BadRequest detail.
func badRequestFields(err error) []string {
	var out []string
	for _, d := range status.Convert(err).Details() {
		if br, ok := d.(*errdetails.BadRequest); ok {
			for _, v := range br.GetFieldViolations() {
				out = append(out, v.GetField())
			}
		}
	}
	return out
}

// quotaViolations counts err's QuotaFailure violations.
func quotaViolations(err error) int {
	n := 0
	for _, d := range status.Convert(err).Details() {
		if qf, ok := d.(*errdetails.QuotaFailure); ok {
			n += len(qf.GetViolations())
		}
	}
	return n
}

// TestErrorTableOverRPC drives each row of the error table through a real
// RPC and checks the code, the reason and the details a client sees.
func TestErrorTableOverRPC(t *testing.T) {
	t.Parallel()

	t.Run("A malformed job id is INVALID_ARGUMENT INVALID_ID", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		_, err := b.jobs.GetJob(as(t, alpha), &leaseholdv1.GetJobRequest{JobId: "job-1"})
		wantError(t, err, codes.InvalidArgument, reasonInvalidID)
		if diff := cmp.Diff([]string{"job_id"}, badRequestFields(err)); diff != "" {
			t.Errorf("BadRequest fields (-want +got):\n%s", diff)
		}
	})
	t.Run("A malformed page token is INVALID_ARGUMENT INVALID_PAGE_TOKEN", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		_, err := b.jobs.ListJobs(as(t, alpha), &leaseholdv1.ListJobsRequest{PageToken: "not a token"})
		wantError(t, err, codes.InvalidArgument, reasonInvalidPageToken)
	})
	t.Run("An empty batch is INVALID_ARGUMENT EMPTY_BATCH with a BadRequest", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		_, err := b.jobs.SubmitBatch(as(t, alpha), &leaseholdv1.SubmitBatchRequest{Team: "alpha", RequestId: "r"})
		wantError(t, err, codes.InvalidArgument, "EMPTY_BATCH")
		if diff := cmp.Diff([]string{"documents"}, badRequestFields(err)); diff != "" {
			t.Errorf("BadRequest fields (-want +got):\n%s", diff)
		}
	})
	t.Run("Too many documents is INVALID_ARGUMENT BATCH_TOO_LARGE and stores nothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t, func(o *options) { o.engine = func(c *engine.Config) { c.Limits.MaxDocuments = 2 } })
		_, err := b.jobs.SubmitBatch(as(t, alpha), &leaseholdv1.SubmitBatchRequest{Team: "alpha", RequestId: "r",
			Documents: []*leaseholdv1.Document{doc("a"), doc("b"), doc("c")}})
		wantError(t, err, codes.InvalidArgument, "BATCH_TOO_LARGE")
		list, err := b.jobs.ListJobs(as(t, alpha), &leaseholdv1.ListJobsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if got := len(list.GetJobs()); got != 0 {
			t.Errorf("jobs stored after a refused batch = %d, want 0", got)
		}
	})
	t.Run("A full team queue is RESOURCE_EXHAUSTED TEAM_QUEUE_FULL with a QuotaFailure", func(t *testing.T) {
		t.Parallel()
		b := setup(t, func(o *options) { o.engine = func(c *engine.Config) { c.Limits.MaxTeamQueue = 1 } })
		b.submit(t, alpha, "alpha", "r1", doc("a"))
		_, err := b.jobs.SubmitBatch(as(t, alpha), &leaseholdv1.SubmitBatchRequest{Team: "alpha", RequestId: "r2", Documents: []*leaseholdv1.Document{doc("b")}})
		wantError(t, err, codes.ResourceExhausted, reasonTeamQueueFull)
		if got := quotaViolations(err); got != 1 {
			t.Errorf("QuotaFailure violations = %d, want 1", got)
		}
	})
	t.Run("A request id reused for other documents is INVALID_ARGUMENT REQUEST_ID_REUSED", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.submit(t, alpha, "alpha", "same", doc("a"))
		_, err := b.jobs.SubmitBatch(as(t, alpha), &leaseholdv1.SubmitBatchRequest{Team: "alpha", RequestId: "same", Documents: []*leaseholdv1.Document{doc("other")}})
		wantError(t, err, codes.InvalidArgument, reasonRequestIDReused)
	})
	t.Run("A completion under a wrong token is ABORTED STALE_LEASE with the current token", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		g := b.leaseOne(t)
		req := failure(g, leaseholdv1.FailureClass_FAILURE_CLASS_TRANSIENT)
		req.Token = g.GetLease().GetToken() + 100
		_, err := b.rend.Complete(as(t, renderer), req)
		meta := wantError(t, err, codes.Aborted, "STALE_LEASE")
		want := map[string]string{"current_token": fmt.Sprint(g.GetLease().GetToken()), "current_phase": "PHASE_LEASED"}
		if diff := cmp.Diff(want, meta); diff != "" {
			t.Errorf("metadata (-want +got):\n%s", diff)
		}
	})
	t.Run("A completion after the deadline is ABORTED LEASE_EXPIRED", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		g := b.leaseOne(t)
		b.clock.Advance(16 * time.Second)
		_, err := b.rend.Complete(as(t, renderer), failure(g, leaseholdv1.FailureClass_FAILURE_CLASS_TRANSIENT))
		wantError(t, err, codes.Aborted, "LEASE_EXPIRED")
	})
	t.Run("A completion of a cancelled job is ABORTED JOB_CANCELLED", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		g := b.leaseOne(t)
		if _, err := b.jobs.CancelJob(as(t, alpha), &leaseholdv1.CancelJobRequest{JobId: g.GetJobId()}); err != nil {
			t.Fatal(err)
		}
		_, err := b.rend.Complete(as(t, renderer), failure(g, leaseholdv1.FailureClass_FAILURE_CLASS_TRANSIENT))
		meta := wantError(t, err, codes.Aborted, "JOB_CANCELLED")
		if got, want := meta["current_phase"], "PHASE_CANCELLED"; got != want {
			t.Errorf("current_phase = %q, want %q", got, want)
		}
	})
	t.Run("The same token with another outcome is ABORTED OUTCOME_MISMATCH", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		g := b.leaseOne(t)
		if _, err := b.rend.Complete(as(t, renderer), failure(g, leaseholdv1.FailureClass_FAILURE_CLASS_INVALID_DOCUMENT)); err != nil {
			t.Fatal(err)
		}
		_, err := b.rend.Complete(as(t, renderer), failure(g, leaseholdv1.FailureClass_FAILURE_CLASS_UNSUPPORTED_FORMAT))
		wantError(t, err, codes.Aborted, "OUTCOME_MISMATCH")
	})
	t.Run("Cancelling a succeeded job is FAILED_PRECONDITION ALREADY_TERMINAL naming the phase", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		g := b.leaseOne(t)
		b.succeed(t, g, []byte("png"))
		_, err := b.jobs.CancelJob(as(t, alpha), &leaseholdv1.CancelJobRequest{JobId: g.GetJobId()})
		meta := wantError(t, err, codes.FailedPrecondition, "ALREADY_TERMINAL")
		if got, want := meta["phase"], "PHASE_SUCCEEDED"; got != want {
			t.Errorf("phase = %q, want %q", got, want)
		}
	})
	t.Run("Cancelling a leased job with running-cancel off is FAILED_PRECONDITION RUNNING_CANCEL_DISABLED", func(t *testing.T) {
		t.Parallel()
		b := setup(t, func(o *options) { o.engine = func(c *engine.Config) { c.RunningCancel = false } })
		g := b.leaseOne(t)
		_, err := b.jobs.CancelJob(as(t, alpha), &leaseholdv1.CancelJobRequest{JobId: g.GetJobId()})
		wantError(t, err, codes.FailedPrecondition, "RUNNING_CANCEL_DISABLED")
	})
	t.Run("Completing with a digest never uploaded is FAILED_PRECONDITION ARTIFACT_NOT_FOUND", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		g := b.leaseOne(t)
		_, err := b.rend.Complete(as(t, renderer), &leaseholdv1.CompleteRequest{JobId: g.GetJobId(), Token: g.GetLease().GetToken(), RendererId: "r-1",
			Outcome: &leaseholdv1.CompleteRequest_Success{Success: &leaseholdv1.CompleteSuccess{ArtifactDigest: sha([]byte("never"))}}})
		wantError(t, err, codes.FailedPrecondition, reasonArtifactNotFound)
	})
	t.Run("A completion without an outcome is INVALID_ARGUMENT MISSING_OUTCOME", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		_, err := b.rend.Complete(as(t, renderer), &leaseholdv1.CompleteRequest{JobId: "j-1", Token: 1, RendererId: "r-1"})
		wantError(t, err, codes.InvalidArgument, reasonMissingOutcome)
	})
	t.Run("Asking for the preview of an unfinished job is FAILED_PRECONDITION NOT_SUCCEEDED", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		batch := b.submit(t, alpha, "alpha", "r", doc("a"))
		stream, err := b.jobs.GetArtifact(as(t, alpha), &leaseholdv1.GetArtifactRequest{JobId: batch.GetJobIds()[0]})
		if err == nil {
			_, err = stream.Recv()
		}
		wantError(t, err, codes.FailedPrecondition, reasonNotSucceeded)
	})
	t.Run("An unknown job is NOT_FOUND JOB_NOT_FOUND", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		_, err := b.jobs.GetJob(as(t, alpha), &leaseholdv1.GetJobRequest{JobId: "j-999"})
		wantError(t, err, codes.NotFound, reasonJobNotFound)
		_, err = b.rend.Complete(as(t, renderer), failure(&leaseholdv1.Grant{JobId: "j-999", Lease: &leaseholdv1.Lease{Token: 1}}, leaseholdv1.FailureClass_FAILURE_CLASS_TRANSIENT))
		wantError(t, err, codes.NotFound, reasonJobNotFound)
	})
	t.Run("An unknown batch is NOT_FOUND BATCH_NOT_FOUND", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		_, err := b.jobs.GetBatch(as(t, alpha), &leaseholdv1.GetBatchRequest{BatchId: "b-999"})
		wantError(t, err, codes.NotFound, reasonBatchNotFound)
		_, err = b.jobs.CancelBatch(as(t, alpha), &leaseholdv1.CancelBatchRequest{BatchId: "b-999"})
		wantError(t, err, codes.NotFound, reasonBatchNotFound)
	})
	t.Run("A stopped writer is UNAVAILABLE STORAGE_UNAVAILABLE", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.eng.Stop()
		for range 5 { // the writer's queue must not swallow a late command
			_, err := b.jobs.SubmitBatch(as(t, alpha), &leaseholdv1.SubmitBatchRequest{Team: "alpha", RequestId: "r", Documents: []*leaseholdv1.Document{doc("a")}})
			wantError(t, err, codes.Unavailable, reasonStorageUnavailable)
		}
	})
	t.Run("A failed commit is UNAVAILABLE STORAGE_UNAVAILABLE", func(t *testing.T) {
		t.Parallel()
		var broken atomic.Bool
		b := setup(t, func(o *options) {
			o.fault = func(string) error {
				if broken.Load() {
					return store.ErrInjected
				}
				return nil
			}
		})
		broken.Store(true)
		_, err := b.jobs.SubmitBatch(as(t, alpha), &leaseholdv1.SubmitBatchRequest{Team: "alpha", RequestId: "r", Documents: []*leaseholdv1.Document{doc("a")}})
		wantError(t, err, codes.Unavailable, reasonStorageUnavailable)
		if b.eng.Serving() {
			t.Errorf("the engine still serves after a failed commit")
		}
	})
	t.Run("An unknown engine error is INTERNAL without its cause", func(t *testing.T) {
		t.Parallel()
		b := setup(t, func(o *options) { o.wrap = func(e Engine) Engine { return brokenReads{e} } })
		_, err := b.jobs.GetJob(as(t, alpha), &leaseholdv1.GetJobRequest{JobId: "j-1"})
		wantError(t, err, codes.Internal, reasonInternal)
		if msg := status.Convert(err).Message(); strings.Contains(msg, "disk on fire") {
			t.Errorf("INTERNAL message leaks the cause: %q", msg)
		}
	})
	t.Run("A renderer id with spaces is INVALID_ARGUMENT INVALID_RENDERER_ID", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		_, err := b.rend.Acquire(as(t, renderer), &leaseholdv1.AcquireRequest{RendererId: "r 1", MaxLeases: 1})
		wantError(t, err, codes.InvalidArgument, reasonInvalidRendererID)
	})
	t.Run("Asking for no leases is INVALID_ARGUMENT INVALID_CAPACITY", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		_, err := b.rend.Acquire(as(t, renderer), &leaseholdv1.AcquireRequest{RendererId: "r-1", MaxLeases: 0})
		wantError(t, err, codes.InvalidArgument, reasonInvalidCapacity)
	})
}

// TestUploadArtifact checks the upload stream's refusals and its answer.
func TestUploadArtifact(t *testing.T) {
	t.Parallel()
	send := func(t *testing.T, b *testBundle, msgs ...*leaseholdv1.UploadArtifactRequest) (*leaseholdv1.UploadArtifactResponse, error) {
		t.Helper()
		stream, err := b.rend.UploadArtifact(as(t, renderer))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range msgs {
			if err := stream.Send(m); err != nil {
				break // the server ended the stream; CloseAndRecv has its status
			}
		}
		return stream.CloseAndRecv()
	}
	meta := func(g *leaseholdv1.Grant, token uint64, expected string) *leaseholdv1.UploadArtifactRequest {
		return &leaseholdv1.UploadArtifactRequest{Part: &leaseholdv1.UploadArtifactRequest_Metadata{Metadata: &leaseholdv1.ArtifactMetadata{
			JobId: g.GetJobId(), Token: token, RendererId: "r-1", ContentType: "image/png", ExpectedSha256: expected}}}
	}
	chunk := func(data []byte) *leaseholdv1.UploadArtifactRequest {
		return &leaseholdv1.UploadArtifactRequest{Part: &leaseholdv1.UploadArtifactRequest_Chunk{Chunk: data}}
	}

	t.Run("Chunks are stored under their SHA-256", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		g := b.leaseOne(t)
		resp, err := send(t, b, meta(g, g.GetLease().GetToken(), sha([]byte("abcdef"))), chunk([]byte("abc")), chunk([]byte("def")))
		if err != nil {
			t.Fatalf("UploadArtifact: %v", err)
		}
		if got, want := resp.GetDigest(), sha([]byte("abcdef")); got != want {
			t.Errorf("digest = %s, want %s", got, want)
		}
		if got := resp.GetSizeBytes(); got != 6 {
			t.Errorf("size = %d, want 6", got)
		}
	})
	t.Run("A first message without metadata is INVALID_ARGUMENT MISSING_METADATA", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		_, err := send(t, b, chunk([]byte("abc")))
		wantError(t, err, codes.InvalidArgument, reasonMissingMetadata)
	})
	t.Run("A stale token is refused early with ABORTED STALE_LEASE", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		g := b.leaseOne(t)
		_, err := send(t, b, meta(g, g.GetLease().GetToken()+1, ""), chunk([]byte("abc")))
		wantError(t, err, codes.Aborted, "STALE_LEASE")
	})
	t.Run("Bytes that hash to another digest are INVALID_ARGUMENT DIGEST_MISMATCH", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		g := b.leaseOne(t)
		_, err := send(t, b, meta(g, g.GetLease().GetToken(), sha([]byte("other"))), chunk([]byte("abc")))
		wantError(t, err, codes.InvalidArgument, reasonDigestMismatch)
	})
	t.Run("An upload over the limit is INVALID_ARGUMENT ARTIFACT_TOO_LARGE", func(t *testing.T) {
		t.Parallel()
		b := setup(t, func(o *options) { o.maxArtifactBytes = 4 })
		g := b.leaseOne(t)
		_, err := send(t, b, meta(g, g.GetLease().GetToken(), ""), chunk([]byte("abc")), chunk([]byte("def")))
		wantError(t, err, codes.InvalidArgument, reasonArtifactTooLarge)
	})
}

// brokenReads is an engine whose job reads fail with an error the table
// does not know.
type brokenReads struct{ Engine }

func (brokenReads) Job(uint64) (jobs.Job, error) { return jobs.Job{}, errors.New("disk on fire") }
