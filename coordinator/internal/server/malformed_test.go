package server

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"testing"

	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"google.golang.org/grpc/codes"
)

// TestMalformedRequests drives every malformed-request refusal a handler
// makes itself and checks the code, the reason and the field named.
func TestMalformedRequests(t *testing.T) {
	t.Parallel()
	b := setup(t)
	batch := b.submit(t, alpha, "alpha", "r", doc("a.pdf"))
	other := b.submit(t, alpha, "alpha", "r2", doc("b.pdf"))
	g := b.acquire(t, 1)[0]
	long := strings.Repeat("x", 1025)

	jobsCall := func(f func() error) func() error { return f }
	heartbeat := func(req *leaseholdv1.HeartbeatRequest) func() error {
		return func() error {
			stream, err := b.rend.Heartbeat(as(t, renderer))
			if err != nil {
				return err
			}
			if err := stream.Send(req); err != nil {
				return err
			}
			_, err = stream.Recv()
			return err
		}
	}
	complete := func(req *leaseholdv1.CompleteRequest) func() error {
		return func() error {
			_, err := b.rend.Complete(as(t, renderer), req)
			return err
		}
	}
	success := func(s *leaseholdv1.CompleteSuccess) *leaseholdv1.CompleteRequest {
		return &leaseholdv1.CompleteRequest{JobId: g.GetJobId(), Token: g.GetLease().GetToken(), RendererId: "r-1",
			Outcome: &leaseholdv1.CompleteRequest_Success{Success: s}}
	}
	failing := func(class leaseholdv1.FailureClass, msg string) *leaseholdv1.CompleteRequest {
		return &leaseholdv1.CompleteRequest{JobId: g.GetJobId(), Token: g.GetLease().GetToken(), RendererId: "r-1",
			Outcome: &leaseholdv1.CompleteRequest_Failure{Failure: &leaseholdv1.CompleteFailure{Class: class, Message: msg}}}
	}
	session := func(msgs ...*leaseholdv1.SessionRequest) func() error {
		return func() error {
			sc := b.startSession(t, renderer, msgs[0])
			for _, m := range msgs[1:] {
				sc.send(m)
			}
			return sc.end()
		}
	}
	hi := func(id string) *leaseholdv1.SessionRequest {
		return &leaseholdv1.SessionRequest{Hello: hello(id, "i-1", 1)}
	}
	upload := func(msgs ...*leaseholdv1.UploadArtifactRequest) func() error {
		return func() error {
			_, err := b.sendUpload(t, renderer, msgs...)
			return err
		}
	}
	replay := func(req *leaseholdv1.ReplayJobsRequest) func() error {
		return func() error {
			_, err := b.ops.ReplayJobs(as(t, operator), req)
			return err
		}
	}
	uploadType := func(m *leaseholdv1.UploadArtifactRequest, ct string) *leaseholdv1.UploadArtifactRequest {
		m.GetMetadata().ContentType = ct
		return m
	}
	manyIDs := make([]string, 1001)
	for i := range manyIDs {
		manyIDs[i] = fmt.Sprintf("j-%d", i+1)
	}

	tests := []struct {
		name   string
		call   func() error
		code   codes.Code
		reason string
		field  string
	}{
		{"GetJob with a leading zero", jobsCall(func() error {
			_, err := b.jobs.GetJob(as(t, alpha), &leaseholdv1.GetJobRequest{JobId: "j-01"})
			return err
		}), codes.InvalidArgument, reasonInvalidID, "job_id"},
		{"GetJob of job zero", jobsCall(func() error {
			_, err := b.jobs.GetJob(as(t, alpha), &leaseholdv1.GetJobRequest{JobId: "j-0"})
			return err
		}), codes.InvalidArgument, reasonInvalidID, "job_id"},
		{"GetJob with a batch id", jobsCall(func() error {
			_, err := b.jobs.GetJob(as(t, alpha), &leaseholdv1.GetJobRequest{JobId: batch.GetId()})
			return err
		}), codes.InvalidArgument, reasonInvalidID, "job_id"},
		{"GetJob without an id", jobsCall(func() error {
			_, err := b.jobs.GetJob(as(t, alpha), &leaseholdv1.GetJobRequest{})
			return err
		}), codes.InvalidArgument, reasonInvalidID, "job_id"},
		{"GetBatch with a job id", jobsCall(func() error {
			_, err := b.jobs.GetBatch(as(t, alpha), &leaseholdv1.GetBatchRequest{BatchId: g.GetJobId()})
			return err
		}), codes.InvalidArgument, reasonInvalidID, "batch_id"},
		{"GetArtifact with a malformed id", jobsCall(func() error {
			stream, err := b.jobs.GetArtifact(as(t, alpha), &leaseholdv1.GetArtifactRequest{JobId: "nope"})
			if err == nil {
				_, err = stream.Recv()
			}
			return err
		}), codes.InvalidArgument, reasonInvalidID, "job_id"},
		{"ListJobs with page_size 5000", jobsCall(func() error {
			_, err := b.jobs.ListJobs(as(t, alpha), &leaseholdv1.ListJobsRequest{PageSize: 5000})
			return err
		}), codes.InvalidArgument, reasonInvalidPageSize, "page_size"},
		{"ListJobs with a negative page_size", jobsCall(func() error {
			_, err := b.jobs.ListJobs(as(t, alpha), &leaseholdv1.ListJobsRequest{PageSize: -1})
			return err
		}), codes.InvalidArgument, reasonInvalidPageSize, "page_size"},
		{"ListJobs with an unknown phase", jobsCall(func() error {
			_, err := b.jobs.ListJobs(as(t, alpha), &leaseholdv1.ListJobsRequest{Phase: 99})
			return err
		}), codes.InvalidArgument, reasonInvalidPhase, "phase"},
		{"ListJobs with a malformed batch id", jobsCall(func() error {
			_, err := b.jobs.ListJobs(as(t, alpha), &leaseholdv1.ListJobsRequest{BatchId: "batch-1"})
			return err
		}), codes.InvalidArgument, reasonInvalidID, "batch_id"},
		{"CancelJob with a reason over 1024 bytes", jobsCall(func() error {
			_, err := b.jobs.CancelJob(as(t, alpha), &leaseholdv1.CancelJobRequest{JobId: g.GetJobId(), Reason: long})
			return err
		}), codes.InvalidArgument, reasonInvalidReason, "reason"},
		{"CancelJob with a signed id", jobsCall(func() error {
			_, err := b.jobs.CancelJob(as(t, alpha), &leaseholdv1.CancelJobRequest{JobId: "j-+1"})
			return err
		}), codes.InvalidArgument, reasonInvalidID, "job_id"},
		{"CancelBatch with a reason over 1024 bytes", jobsCall(func() error {
			_, err := b.jobs.CancelBatch(as(t, alpha), &leaseholdv1.CancelBatchRequest{BatchId: batch.GetId(), Reason: long})
			return err
		}), codes.InvalidArgument, reasonInvalidReason, "reason"},
		{"WatchBatch resuming a job of another batch", jobsCall(func() error {
			stream, err := b.jobs.WatchBatch(as(t, alpha), &leaseholdv1.WatchBatchRequest{BatchId: batch.GetId(),
				Resume: []*leaseholdv1.JobCursor{{JobId: other.GetJobIds()[0], Seq: 1}}})
			if err == nil {
				_, err = stream.Recv()
			}
			return err
		}), codes.InvalidArgument, reasonInvalidID, "resume"},
		{"WatchBatch resuming a malformed job id", jobsCall(func() error {
			stream, err := b.jobs.WatchBatch(as(t, alpha), &leaseholdv1.WatchBatchRequest{BatchId: batch.GetId(),
				Resume: []*leaseholdv1.JobCursor{{JobId: "x", Seq: 1}}})
			if err == nil {
				_, err = stream.Recv()
			}
			return err
		}), codes.InvalidArgument, reasonInvalidID, "resume.job_id"},

		{"Heartbeat with capacity 4e9", heartbeat(&leaseholdv1.HeartbeatRequest{RendererId: "r-1", Capacity: 4_000_000_000}),
			codes.InvalidArgument, reasonInvalidCapacity, "capacity"},
		{"Heartbeat without a renderer id", heartbeat(&leaseholdv1.HeartbeatRequest{}),
			codes.InvalidArgument, reasonInvalidRendererID, "renderer_id"},
		{"Acquire of 65 leases", jobsCall(func() error {
			_, err := b.rend.Acquire(as(t, renderer), &leaseholdv1.AcquireRequest{RendererId: "r-1", MaxLeases: 65})
			return err
		}), codes.InvalidArgument, reasonInvalidCapacity, "max_leases"},
		{"Acquire with capacity 4e9", jobsCall(func() error {
			_, err := b.rend.Acquire(as(t, renderer), &leaseholdv1.AcquireRequest{RendererId: "r-1", MaxLeases: 1, Capacity: 4_000_000_000})
			return err
		}), codes.InvalidArgument, reasonInvalidCapacity, "capacity"},
		{"Acquire with capacity below max_leases", jobsCall(func() error {
			_, err := b.rend.Acquire(as(t, renderer), &leaseholdv1.AcquireRequest{RendererId: "r-1", MaxLeases: 4, Capacity: 2})
			return err
		}), codes.InvalidArgument, reasonInvalidCapacity, "capacity"},
		{"Complete with a failure message over 4096 bytes", complete(failing(leaseholdv1.FailureClass_FAILURE_CLASS_TRANSIENT, strings.Repeat("m", 4097))),
			codes.InvalidArgument, reasonInvalidMessage, "failure.message"},
		{"Complete with an unspecified failure class", complete(failing(leaseholdv1.FailureClass_FAILURE_CLASS_UNSPECIFIED, "x")),
			codes.InvalidArgument, reasonMissingOutcome, "failure.class"},
		{"Complete with an inline preview over 1 MiB", complete(success(&leaseholdv1.CompleteSuccess{Content: bytes.Repeat([]byte{1}, 1<<20+1)})),
			codes.InvalidArgument, reasonArtifactTooLarge, "success.content"},
		{"Complete with an inline preview that hashes to another digest", complete(success(&leaseholdv1.CompleteSuccess{Content: []byte("png"), ContentType: "image/png", ArtifactDigest: sha([]byte("other"))})),
			codes.InvalidArgument, reasonDigestMismatch, "success.artifact_digest"},
		{"Complete with a preview media type over 255 bytes", complete(success(&leaseholdv1.CompleteSuccess{Content: []byte("png"), ContentType: "image/" + strings.Repeat("p", 250)})),
			codes.InvalidArgument, reasonInvalidContentType, "success.content_type"},
		{"Complete with a preview media type with a control character", complete(success(&leaseholdv1.CompleteSuccess{Content: []byte("png"), ContentType: "image/png\x00"})),
			codes.InvalidArgument, reasonInvalidContentType, "success.content_type"},
		{"Complete with a malformed job id", complete(&leaseholdv1.CompleteRequest{JobId: "j-x", Token: 1, RendererId: "r-1",
			Outcome: &leaseholdv1.CompleteRequest_Failure{Failure: &leaseholdv1.CompleteFailure{Class: leaseholdv1.FailureClass_FAILURE_CLASS_TRANSIENT}}}),
			codes.InvalidArgument, reasonInvalidID, "job_id"},
		{"Session without hello", session(&leaseholdv1.SessionRequest{Credits: 1}),
			codes.InvalidArgument, reasonMissingHello, "hello"},
		{"Session with hello twice", session(hi("r-m1"), hi("r-m1")),
			codes.InvalidArgument, reasonMissingHello, "hello"},
		{"Session without an instance id", session(&leaseholdv1.SessionRequest{Hello: hello("r-m2", "", 1)}),
			codes.InvalidArgument, reasonInvalidInstance, "hello.instance_id"},
		{"Session with capacity 0", session(&leaseholdv1.SessionRequest{Hello: hello("r-m3", "i-1", 0)}),
			codes.InvalidArgument, reasonInvalidCapacity, "hello.capacity"},
		{"Session with capacity 4e9", session(&leaseholdv1.SessionRequest{Hello: hello("r-m3", "i-1", 4_000_000_000)}),
			codes.InvalidArgument, reasonInvalidCapacity, "hello.capacity"},
		{"Session with a renderer id with spaces", session(hi("r m")),
			codes.InvalidArgument, reasonInvalidRendererID, "renderer_id"},
		// A malformed reference in a later message is answered on its own
		// (TestMalformedLeaseReferences); in hello it refuses the session.
		{"Session with a malformed held lease id in hello", session(&leaseholdv1.SessionRequest{Hello: &leaseholdv1.SessionHello{
			RendererId: "r-m4", InstanceId: "i-1", Capacity: 1, Holding: []*leaseholdv1.LeaseRef{{JobId: "7"}}}}),
			codes.InvalidArgument, reasonInvalidID, "hello.holding.job_id"},
		{"UploadArtifact with a malformed job id", upload(uploadMeta(&leaseholdv1.Grant{JobId: "j-"}, 1, "r-1"), chunk([]byte("x"))),
			codes.InvalidArgument, reasonInvalidID, "metadata.job_id"},
		{"UploadArtifact with metadata twice", upload(uploadMeta(g, g.GetLease().GetToken(), "r-1"), uploadMeta(g, g.GetLease().GetToken(), "r-1")),
			codes.InvalidArgument, reasonMissingMetadata, "metadata"},
		{"UploadArtifact with a preview media type with a line break", upload(uploadType(uploadMeta(g, g.GetLease().GetToken(), "r-1"), "image/png\r\nX-Frame-Options: allow"), chunk([]byte("x"))),
			codes.InvalidArgument, reasonInvalidContentType, "metadata.content_type"},
		{"UploadArtifact with a malformed renderer id", upload(uploadMeta(g, g.GetLease().GetToken(), "r/1"), chunk([]byte("x"))),
			codes.InvalidArgument, reasonInvalidRendererID, "renderer_id"},

		{"ReplayJobs with a blank reason", replay(&leaseholdv1.ReplayJobsRequest{JobIds: []string{g.GetJobId()}, RequestId: "r", Reason: " \t "}),
			codes.InvalidArgument, reasonMissingReason, "reason"},
		{"ReplayJobs with a reason over 1024 bytes", replay(&leaseholdv1.ReplayJobsRequest{JobIds: []string{g.GetJobId()}, RequestId: "r", Reason: long}),
			codes.InvalidArgument, reasonInvalidReason, "reason"},
		{"ReplayJobs with 1001 job ids", replay(&leaseholdv1.ReplayJobsRequest{JobIds: manyIDs, DryRun: true}),
			codes.InvalidArgument, reasonTooManyJobIDs, "job_ids"},
		{"ReplayJobs without a request id", replay(&leaseholdv1.ReplayJobsRequest{JobIds: []string{g.GetJobId()}, Reason: "why"}),
			codes.InvalidArgument, reasonMissingRequestID, "request_id"},
		{"ReplayJobs with a malformed job id", replay(&leaseholdv1.ReplayJobsRequest{JobIds: []string{g.GetJobId(), "j-1.5"}, DryRun: true}),
			codes.InvalidArgument, reasonInvalidID, "job_ids[1]"},
		{"ReplayJobs with a malformed batch id", replay(&leaseholdv1.ReplayJobsRequest{BatchId: "b-", DryRun: true}),
			codes.InvalidArgument, reasonInvalidID, "batch_id"},
		{"ReplayJobs with an unknown terminal reason", replay(&leaseholdv1.ReplayJobsRequest{BatchId: batch.GetId(), TerminalReason: 99, DryRun: true}),
			codes.InvalidArgument, reasonInvalidTerminalReason, "terminal_reason"},
		{"ReplayJobs by job_ids and batch_id at once", replay(&leaseholdv1.ReplayJobsRequest{JobIds: []string{g.GetJobId()}, BatchId: other.GetId(),
			RequestId: "both", Reason: "why", IncludePermanent: true}),
			codes.InvalidArgument, reasonConflictingSelection, "batch_id"},
		{"ReplayJobs by job_ids narrowed to a terminal reason", replay(&leaseholdv1.ReplayJobsRequest{JobIds: []string{g.GetJobId()},
			TerminalReason: leaseholdv1.TerminalReason_TERMINAL_REASON_ATTEMPTS_EXHAUSTED, RequestId: "narrowed", Reason: "why"}),
			codes.InvalidArgument, reasonConflictingSelection, "terminal_reason"},
		{"PauseDispatch without a reason", jobsCall(func() error {
			_, err := b.ops.PauseDispatch(as(t, operator), &leaseholdv1.PauseDispatchRequest{})
			return err
		}), codes.InvalidArgument, reasonMissingReason, "reason"},
		{"PauseDispatch with a blank reason", jobsCall(func() error {
			_, err := b.ops.PauseDispatch(as(t, operator), &leaseholdv1.PauseDispatchRequest{Reason: "   "})
			return err
		}), codes.InvalidArgument, reasonMissingReason, "reason"},
		{"PauseDispatch with a reason over 1024 bytes", jobsCall(func() error {
			_, err := b.ops.PauseDispatch(as(t, operator), &leaseholdv1.PauseDispatchRequest{Reason: long})
			return err
		}), codes.InvalidArgument, reasonInvalidReason, "reason"},
		{"ResumeDispatch without a reason", jobsCall(func() error {
			_, err := b.ops.ResumeDispatch(as(t, operator), &leaseholdv1.ResumeDispatchRequest{})
			return err
		}), codes.InvalidArgument, reasonMissingReason, "reason"},
		{"ListRejectedCompletions with page_size 5000", jobsCall(func() error {
			_, err := b.ops.ListRejectedCompletions(as(t, operator), &leaseholdv1.ListRejectedCompletionsRequest{PageSize: 5000})
			return err
		}), codes.InvalidArgument, reasonInvalidPageSize, "page_size"},
		{"ListRejectedCompletions with a malformed job id", jobsCall(func() error {
			_, err := b.ops.ListRejectedCompletions(as(t, operator), &leaseholdv1.ListRejectedCompletionsRequest{JobId: "1"})
			return err
		}), codes.InvalidArgument, reasonInvalidID, "job_id"},
		{"GetAudit with page_size 5000", jobsCall(func() error {
			_, err := b.ops.GetAudit(as(t, operator), &leaseholdv1.GetAuditRequest{PageSize: 5000})
			return err
		}), codes.InvalidArgument, reasonInvalidPageSize, "page_size"},
		{"GetAudit with a malformed page token", jobsCall(func() error {
			_, err := b.ops.GetAudit(as(t, operator), &leaseholdv1.GetAuditRequest{PageToken: "!!"})
			return err
		}), codes.InvalidArgument, reasonInvalidPageToken, "page_token"},
	}
	before := b.snapshot(t)
	for _, tc := range tests {
		t.Run(tc.name+" is "+tc.code.String()+" "+tc.reason, func(t *testing.T) {
			err := tc.call()
			wantError(t, err, tc.code, tc.reason)
			if fields := badRequestFields(err); !slices.Contains(fields, tc.field) {
				t.Errorf("BadRequest fields = %v, want %q", fields, tc.field)
			}
		})
	}
	if diff := cmpDiff(before, b.snapshot(t)); diff != "" {
		t.Errorf("malformed requests changed the state (-before +after):\n%s", diff)
	}

	t.Run("A session completion with a malformed id is answered INVALID_ID on its own", func(t *testing.T) {
		sc := b.openSession(t, hello("r-m5", "i-1", 1), 0)
		r := sc.call(&leaseholdv1.SessionRequest{Completions: []*leaseholdv1.SessionCompletion{{JobId: "j-?", Token: 1,
			Outcome: &leaseholdv1.SessionCompletion_Failure{Failure: &leaseholdv1.CompleteFailure{Class: leaseholdv1.FailureClass_FAILURE_CLASS_TRANSIENT}}}}}).GetResults()[0]
		if codes.Code(r.GetCode()) != codes.InvalidArgument || r.GetReason() != reasonInvalidID || r.GetJobId() != "j-?" {
			t.Errorf("result = %v, want INVALID_ARGUMENT INVALID_ID for j-?", r)
		}
		sc.call(&leaseholdv1.SessionRequest{}) // the stream is still open
	})
}
