package server

import (
	"bytes"
	"context"
	"testing"

	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/proto"
)

// TestAuthorization checks who may call what.
func TestAuthorization(t *testing.T) {
	t.Parallel()
	b := setup(t)
	alphaBatch := b.submit(t, alpha, "alpha", "a1", doc("a.pdf"), doc("b.pdf"))
	betaBatch := b.submit(t, beta, "beta", "b1", doc("c.pdf"))
	alphaJob, betaJob := alphaBatch.GetJobIds()[0], betaBatch.GetJobIds()[0]

	calls := []struct {
		name string
		call func(ctx context.Context) error
		// want maps a token ("" for none) to the expected code.
		want map[string]codes.Code
		// notFound is the reason of a NOT_FOUND answer: what the caller may
		// not see is answered as an id that does not exist.
		notFound string
	}{
		{
			name: "GetJob of an alpha job",
			call: func(ctx context.Context) error {
				_, err := b.jobs.GetJob(ctx, &leaseholdv1.GetJobRequest{JobId: alphaJob})
				return err
			},
			want: map[string]codes.Code{"": codes.Unauthenticated, "bogus-token": codes.Unauthenticated, alpha: codes.OK, beta: codes.NotFound,
				renderer: codes.NotFound, operator: codes.OK, opAlpha: codes.OK},
			notFound: reasonJobNotFound,
		},
		{
			name: "GetBatch of a beta batch",
			call: func(ctx context.Context) error {
				_, err := b.jobs.GetBatch(ctx, &leaseholdv1.GetBatchRequest{BatchId: betaBatch.GetId()})
				return err
			},
			want:     map[string]codes.Code{"": codes.Unauthenticated, alpha: codes.NotFound, beta: codes.OK, operator: codes.OK, opAlpha: codes.NotFound},
			notFound: reasonBatchNotFound,
		},
		{
			name: "ListJobs of team beta",
			call: func(ctx context.Context) error {
				_, err := b.jobs.ListJobs(ctx, &leaseholdv1.ListJobsRequest{Team: "beta"})
				return err
			},
			want: map[string]codes.Code{alpha: codes.PermissionDenied, beta: codes.OK, renderer: codes.PermissionDenied, operator: codes.OK, opAlpha: codes.PermissionDenied},
		},
		{
			name: "SubmitBatch for team alpha",
			call: func(ctx context.Context) error {
				_, err := b.jobs.SubmitBatch(ctx, &leaseholdv1.SubmitBatchRequest{Team: "alpha", RequestId: "auth-" + t.Name(), Documents: []*leaseholdv1.Document{doc("x.pdf")}})
				return err
			},
			want: map[string]codes.Code{"": codes.Unauthenticated, beta: codes.PermissionDenied, renderer: codes.PermissionDenied, operator: codes.PermissionDenied, alpha: codes.OK},
		},
		{
			name: "Acquire",
			call: func(ctx context.Context) error {
				_, err := b.rend.Acquire(ctx, &leaseholdv1.AcquireRequest{RendererId: "r-auth", MaxLeases: 1, Capacity: 1})
				return err
			},
			// The renderer's call succeeds; the grant it may receive is
			// completed below so that later rows see a stable state.
			want: map[string]codes.Code{"": codes.Unauthenticated, alpha: codes.PermissionDenied, operator: codes.PermissionDenied},
		},
		{
			name: "GetArtifact",
			call: func(ctx context.Context) error {
				stream, err := b.jobs.GetArtifact(ctx, &leaseholdv1.GetArtifactRequest{JobId: alphaJob})
				if err != nil {
					return err
				}
				_, err = stream.Recv()
				return err
			},
			// alpha gets past authorization and is refused because the job
			// has not succeeded; beta may not see the job; operators never
			// read previews.
			want:     map[string]codes.Code{alpha: codes.FailedPrecondition, beta: codes.NotFound, operator: codes.PermissionDenied, opAlpha: codes.PermissionDenied},
			notFound: reasonJobNotFound,
		},
		{
			name: "PauseDispatch and ResumeDispatch",
			call: func(ctx context.Context) error {
				if _, err := b.ops.PauseDispatch(ctx, &leaseholdv1.PauseDispatchRequest{Reason: "auth test"}); err != nil {
					return err
				}
				_, err := b.ops.ResumeDispatch(ctx, &leaseholdv1.ResumeDispatchRequest{Reason: "auth test"})
				return err
			},
			want: map[string]codes.Code{"": codes.Unauthenticated, alpha: codes.PermissionDenied, renderer: codes.PermissionDenied, opAlpha: codes.PermissionDenied, operator: codes.OK},
		},
		{
			name: "GetAudit",
			call: func(ctx context.Context) error {
				_, err := b.ops.GetAudit(ctx, &leaseholdv1.GetAuditRequest{})
				return err
			},
			want: map[string]codes.Code{alpha: codes.PermissionDenied, renderer: codes.PermissionDenied, opAlpha: codes.OK, operator: codes.OK},
		},
	}
	for _, c := range calls {
		for token, want := range c.want {
			name := token
			if name == "" {
				name = "no token"
			}
			err := c.call(as(t, token))
			if got := codeOf(err); got != want {
				t.Errorf("%s as %s: code %v (%v), want %v", c.name, name, got, err, want)
			}
			if want == codes.PermissionDenied {
				wantError(t, err, codes.PermissionDenied, reasonPermissionDenied)
			}
			if want == codes.Unauthenticated {
				wantError(t, err, codes.Unauthenticated, reasonUnauthenticated)
			}
			if want == codes.NotFound {
				wantError(t, err, codes.NotFound, c.notFound)
			}
		}
	}

	t.Run("The health service answers without a token", func(t *testing.T) {
		if _, err := b.health.Check(as(t, ""), &healthpb.HealthCheckRequest{}); err != nil {
			t.Errorf("health Check without a token: %v", err)
		}
	})
	t.Run("A submitter's cancel of another team's job is NOT_FOUND and changes nothing", func(t *testing.T) {
		_, err := b.jobs.CancelJob(as(t, alpha), &leaseholdv1.CancelJobRequest{JobId: betaJob})
		wantError(t, err, codes.NotFound, reasonJobNotFound)
		j, err := b.jobs.GetJob(as(t, beta), &leaseholdv1.GetJobRequest{JobId: betaJob})
		if err != nil {
			t.Fatal(err)
		}
		if got := j.GetJob().GetPhase(); got == leaseholdv1.Phase_PHASE_CANCELLED {
			t.Errorf("a refused cancel changed the job to %v", got)
		}
	})
	t.Run("An operator out of scope is answered NOT_FOUND and the refusal is audited", func(t *testing.T) {
		_, err := b.jobs.CancelJob(as(t, opAlpha), &leaseholdv1.CancelJobRequest{JobId: betaJob, Reason: "cleanup"})
		wantError(t, err, codes.NotFound, reasonJobNotFound)
		audit, err := b.ops.GetAudit(as(t, operator), &leaseholdv1.GetAuditRequest{})
		if err != nil {
			t.Fatal(err)
		}
		var found bool
		for _, r := range audit.GetRecords() {
			if r.GetAction() == jobs.AuditDenied && r.GetPrincipal() == "dev-operator-alpha" && len(r.GetJobIds()) == 1 && r.GetJobIds()[0] == betaJob {
				found = true
			}
		}
		if !found {
			t.Errorf("no DENIED audit record for dev-operator-alpha on %s in %v", betaJob, audit.GetRecords())
		}
	})
	t.Run("An operator in scope may cancel and the cancel is audited", func(t *testing.T) {
		target := alphaBatch.GetJobIds()[1]
		resp, err := b.jobs.CancelJob(as(t, opAlpha), &leaseholdv1.CancelJobRequest{JobId: target, Reason: "cleanup"})
		if err != nil {
			t.Fatalf("CancelJob: %v", err)
		}
		if got := resp.GetJob().GetPhase(); got != leaseholdv1.Phase_PHASE_CANCELLED {
			t.Errorf("phase = %v, want CANCELLED", got)
		}
		audit, err := b.ops.GetAudit(as(t, operator), &leaseholdv1.GetAuditRequest{PageSize: 1})
		if err != nil {
			t.Fatal(err)
		}
		if len(audit.GetRecords()) != 1 || audit.GetRecords()[0].GetAction() != jobs.AuditCancelJob {
			t.Errorf("newest audit record = %v, want one CANCEL_JOB", audit.GetRecords())
		}
		if audit.GetNextPageToken() == "" {
			t.Errorf("a one-record page of a longer trail has no next_page_token")
		}
	})
	t.Run("A submitter's listing covers only its own team", func(t *testing.T) {
		list, err := b.jobs.ListJobs(as(t, beta), &leaseholdv1.ListJobsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		for _, j := range list.GetJobs() {
			if j.GetTeam() != "beta" {
				t.Errorf("beta's listing shows job %s of team %s", j.GetId(), j.GetTeam())
			}
		}
		if len(list.GetJobs()) == 0 {
			t.Errorf("beta's listing is empty, want its own job")
		}
	})
}

func codeOf(err error) codes.Code {
	c, _ := errorInfo(err)
	return c
}

// TestOperatorResponsesCarryNoDocumentData marshals every response an
// operator can get about a job and checks that neither the source location
// nor the inline content is in it, while the submitter's view has the
// source location (so the check can fail).
func TestOperatorResponsesCarryNoDocumentData(t *testing.T) {
	t.Parallel()
	b := setup(t, func(o *options) {})
	batch := b.submit(t, alpha, "alpha", "r", doc("a.pdf"), doc("b.pdf"))
	g := b.acquire(t, 1)[0]
	failed := b.acquire(t, 1)[0]
	if _, err := b.rend.Complete(as(t, renderer), failure(failed, leaseholdv1.FailureClass_FAILURE_CLASS_INVALID_DOCUMENT)); err != nil {
		t.Fatal(err)
	}

	submitterView, err := b.jobs.GetJob(as(t, alpha), &leaseholdv1.GetJobRequest{JobId: g.GetJobId()})
	if err != nil {
		t.Fatal(err)
	}
	if !contains(t, submitterView, secretURI) {
		t.Fatalf("the submitter's view lacks the source location; the check below would prove nothing")
	}

	var responses []proto.Message
	add := func(m proto.Message, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("operator call: %v", err)
		}
		responses = append(responses, m)
	}
	for _, token := range []string{operator, opAlpha} {
		ctx := as(t, token)
		add(b.jobs.GetJob(ctx, &leaseholdv1.GetJobRequest{JobId: g.GetJobId()}))
		add(b.jobs.ListJobs(ctx, &leaseholdv1.ListJobsRequest{}))
		add(b.jobs.ListJobs(ctx, &leaseholdv1.ListJobsRequest{BatchId: batch.GetId(), Team: "alpha"}))
		add(b.jobs.GetBatch(ctx, &leaseholdv1.GetBatchRequest{BatchId: batch.GetId()}))
		add(b.ops.ReplayJobs(ctx, &leaseholdv1.ReplayJobsRequest{BatchId: batch.GetId(), DryRun: true, IncludePermanent: true}))
		stream, err := b.jobs.WatchBatch(ctx, &leaseholdv1.WatchBatchRequest{BatchId: batch.GetId()})
		if err != nil {
			t.Fatal(err)
		}
		for range 2 {
			add(stream.Recv())
		}
	}
	add(b.jobs.CancelJob(as(t, opAlpha), &leaseholdv1.CancelJobRequest{JobId: g.GetJobId(), Reason: "x"}))
	add(b.jobs.CancelBatch(as(t, operator), &leaseholdv1.CancelBatchRequest{BatchId: batch.GetId(), Reason: "x"}))
	add(b.ops.GetAudit(as(t, operator), &leaseholdv1.GetAuditRequest{}))
	add(b.ops.ListRejectedCompletions(as(t, operator), &leaseholdv1.ListRejectedCompletionsRequest{}))

	for i, m := range responses {
		if contains(t, m, secretURI) || contains(t, m, secretContent) {
			t.Errorf("operator response %d (%T) carries document data: %v", i, m, m)
		}
	}
}

func contains(t *testing.T, m proto.Message, s string) bool {
	t.Helper()
	data, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Contains(data, []byte(s))
}
