package server

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/leasehold/leasehold/coordinator/internal/auth"
	"github.com/leasehold/leasehold/coordinator/internal/engine"
	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"google.golang.org/grpc/codes"
)

// inProcess returns a context carrying the development principal of
// token, as the console's calls carry the signed-in principal: a handler
// called with it runs in process, past the gRPC codec and its UTF-8 check.
func inProcess(t testing.TB, token string) context.Context {
	t.Helper()
	p, ok := auth.DevPrincipals().Lookup(token)
	if !ok {
		t.Fatalf("no development principal has token %q", token)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	return auth.NewContext(ctx, p)
}

// Strings no caller may store. notUTF8 cannot cross a gRPC connection (the
// client's codec refuses to encode them) but reaches a handler called in
// process; notText can be sent either way.
var (
	notUTF8 = []string{"\xff", "%\xffF", "a\xc0\xafb", "\xe0\x80\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80", "ok\xe2\x82"}
	notText = []string{"\x00", "a\x00b", "reason\njob j-9 SUCCEEDED", "\x1b[2J\x1b[H", "a\u0085b", "\u009b31m", "invoice\u202Efdp.exe"}
)

// textBundle is a coordinator with some work: an alpha batch of two jobs,
// one leased to r-1, and a beta batch; writes counts the store's record
// writes.
type textBundle struct {
	*testBundle
	writes *atomic.Int64
	batch  *leaseholdv1.Batch
	beta   *leaseholdv1.Batch
	lease  *leaseholdv1.Grant
	next   int
	// pool holds leases granted to r-1 while fuzzing.
	pool []*leaseholdv1.Grant
}

func setupText(t testing.TB) *textBundle {
	t.Helper()
	writes := &atomic.Int64{}
	b := &textBundle{writes: writes, testBundle: setup(t, func(o *options) {
		o.fault = func(string) error {
			writes.Add(1)
			return nil
		}
	})}
	ctx := inProcess(t, alpha)
	resp, err := b.services.Jobs.SubmitBatch(ctx, &leaseholdv1.SubmitBatchRequest{Team: "alpha", RequestId: "alpha-1", Documents: []*leaseholdv1.Document{doc("a.pdf"), doc("b.pdf")}})
	if err != nil {
		t.Fatal(err)
	}
	b.batch = resp.GetBatch()
	ar, err := b.services.Renderers.Acquire(inProcess(t, renderer), &leaseholdv1.AcquireRequest{RendererId: "r-1", MaxLeases: 1, Capacity: 1})
	if err != nil || len(ar.GetLeases()) != 1 {
		t.Fatalf("Acquire = %v, %v; want one lease", ar, err)
	}
	b.lease = ar.GetLeases()[0]
	resp, err = b.services.Jobs.SubmitBatch(inProcess(t, beta), &leaseholdv1.SubmitBatchRequest{Team: "beta", RequestId: "beta-1", Documents: []*leaseholdv1.Document{doc("c.pdf")}})
	if err != nil {
		t.Fatal(err)
	}
	b.beta = resp.GetBatch()
	return b
}

// refusedAndUnchanged runs call, which must be refused INVALID_ARGUMENT
// with reason and a BadRequest naming field (field "" for a per-item
// answer that carries no details), and checks that nothing was written and
// that the writer still serves another team: team beta submits over gRPC.
func (b *textBundle) refusedAndUnchanged(t *testing.T, what, field, reason string, call func() error) {
	t.Helper()
	before, writes := b.snapshot(t), b.writes.Load()
	err := call()
	if err == nil {
		t.Fatalf("%s: accepted, want INVALID_ARGUMENT %s", what, reason)
	}
	if code, info := errorInfo(err); code != codes.InvalidArgument || info.GetReason() != reason {
		t.Errorf("%s: %v %s (%v), want INVALID_ARGUMENT %s", what, code, info.GetReason(), err, reason)
	}
	if field != "" && !slices.Contains(badRequestFields(err), field) {
		t.Errorf("%s: BadRequest names %v, want %s", what, badRequestFields(err), field)
	}
	if n := b.writes.Load() - writes; n != 0 {
		t.Errorf("%s: the refused call wrote %d records", what, n)
	}
	if diff := cmpDiff(before, b.snapshot(t)); diff != "" {
		t.Errorf("%s: the refused call changed the state (-before +after):\n%s", what, diff)
	}
	if !b.eng.Serving() {
		t.Fatalf("%s: the writer stopped", what)
	}
	b.next++
	b.submit(t, beta, "beta", fmt.Sprintf("after-%d", b.next), doc("after.pdf"))
}

// jobsAudit is an audit record with reason.
func jobsAudit(reason string) jobs.AuditRecord {
	return jobs.AuditRecord{Principal: "dev-operator", Action: jobs.AuditDenied, Reason: reason, Teams: []string{"beta"}}
}

// engineFailure is a transient failure of the lease (job, token) by r-1.
func engineFailure(job, token uint64, message string) engine.CompleteRequest {
	return engine.CompleteRequest{Job: job, Completion: jobs.Completion{Token: token, Renderer: "r-1", Class: jobs.ClassTransient, Message: message}}
}

// textUpload is the metadata of an upload under g's lease.
func textUpload(g *leaseholdv1.Grant, contentType, expected string) *leaseholdv1.UploadArtifactRequest {
	return &leaseholdv1.UploadArtifactRequest{Part: &leaseholdv1.UploadArtifactRequest_Metadata{Metadata: &leaseholdv1.ArtifactMetadata{
		JobId: g.GetJobId(), Token: g.GetLease().GetToken(), RendererId: "r-1", ContentType: contentType, ExpectedSha256: expected}}}
}

// textCall is one handler field that takes caller text.
type textCall struct {
	name, field, reason string
	// grpc sends the call over the bundle's connection, so that only text
	// that is UTF-8 can be tried.
	grpc bool
	call func(t *testing.T, b *textBundle, s string) error
}

// textCalls are the fields of every handler that stores caller text.
var textCalls = []textCall{
	{name: "SubmitBatch team", field: "team", reason: "INVALID_TEAM", call: func(t *testing.T, b *textBundle, s string) error {
		_, err := b.services.Jobs.SubmitBatch(inProcess(t, alpha), &leaseholdv1.SubmitBatchRequest{Team: s, RequestId: "r", Documents: []*leaseholdv1.Document{doc("a.pdf")}})
		return err
	}},
	{name: "SubmitBatch request_id", field: "request_id", reason: "INVALID_REQUEST_ID", call: func(t *testing.T, b *textBundle, s string) error {
		_, err := b.services.Jobs.SubmitBatch(inProcess(t, alpha), &leaseholdv1.SubmitBatchRequest{Team: "alpha", RequestId: s, Documents: []*leaseholdv1.Document{doc("a.pdf")}})
		return err
	}},
	{name: "SubmitBatch document name", field: "documents[1].name", reason: "INVALID_NAME", call: func(t *testing.T, b *textBundle, s string) error {
		_, err := b.services.Jobs.SubmitBatch(inProcess(t, alpha), &leaseholdv1.SubmitBatchRequest{Team: "alpha", RequestId: "r", Documents: []*leaseholdv1.Document{doc("a.pdf"), doc(s)}})
		return err
	}},
	{name: "SubmitBatch document content_type", field: "documents[0].content_type", reason: "INVALID_CONTENT_TYPE", call: func(t *testing.T, b *textBundle, s string) error {
		d := doc("a.pdf")
		d.ContentType = s
		_, err := b.services.Jobs.SubmitBatch(inProcess(t, alpha), &leaseholdv1.SubmitBatchRequest{Team: "alpha", RequestId: "r", Documents: []*leaseholdv1.Document{d}})
		return err
	}},
	{name: "SubmitBatch document source_uri", field: "documents[0].source_uri", reason: "INVALID_SOURCE_URI", call: func(t *testing.T, b *textBundle, s string) error {
		d := doc("a.pdf")
		d.SourceUri = "s3://bucket/" + s
		_, err := b.services.Jobs.SubmitBatch(inProcess(t, alpha), &leaseholdv1.SubmitBatchRequest{Team: "alpha", RequestId: "r", Documents: []*leaseholdv1.Document{d}})
		return err
	}},
	{name: "CancelJob reason", field: "reason", reason: reasonInvalidReason, call: func(t *testing.T, b *textBundle, s string) error {
		_, err := b.services.Jobs.CancelJob(inProcess(t, alpha), &leaseholdv1.CancelJobRequest{JobId: b.batch.GetJobIds()[1], Reason: s})
		return err
	}},
	{name: "CancelJob reason of a leased job", field: "reason", reason: reasonInvalidReason, call: func(t *testing.T, b *textBundle, s string) error {
		_, err := b.services.Jobs.CancelJob(inProcess(t, alpha), &leaseholdv1.CancelJobRequest{JobId: b.lease.GetJobId(), Reason: s})
		return err
	}},
	{name: "CancelJob reason by an operator out of scope (audited)", field: "reason", reason: reasonInvalidReason, call: func(t *testing.T, b *textBundle, s string) error {
		_, err := b.services.Jobs.CancelJob(inProcess(t, opAlpha), &leaseholdv1.CancelJobRequest{JobId: b.beta.GetJobIds()[0], Reason: s})
		return err
	}},
	{name: "CancelBatch reason", field: "reason", reason: reasonInvalidReason, call: func(t *testing.T, b *textBundle, s string) error {
		_, err := b.services.Jobs.CancelBatch(inProcess(t, alpha), &leaseholdv1.CancelBatchRequest{BatchId: b.batch.GetId(), Reason: s})
		return err
	}},
	{name: "CancelBatch reason by an operator", field: "reason", reason: reasonInvalidReason, call: func(t *testing.T, b *textBundle, s string) error {
		_, err := b.services.Jobs.CancelBatch(inProcess(t, operator), &leaseholdv1.CancelBatchRequest{BatchId: b.beta.GetId(), Reason: s})
		return err
	}},
	{name: "ReplayJobs reason", field: "reason", reason: reasonInvalidReason, call: func(t *testing.T, b *textBundle, s string) error {
		_, err := b.services.Operators.ReplayJobs(inProcess(t, operator), &leaseholdv1.ReplayJobsRequest{BatchId: b.batch.GetId(), Reason: s, RequestId: "rp-1"})
		return err
	}},
	{name: "ReplayJobs reason of a dry run", field: "reason", reason: reasonInvalidReason, call: func(t *testing.T, b *textBundle, s string) error {
		_, err := b.services.Operators.ReplayJobs(inProcess(t, operator), &leaseholdv1.ReplayJobsRequest{BatchId: b.batch.GetId(), Reason: s, DryRun: true})
		return err
	}},
	{name: "ReplayJobs request_id", field: "request_id", reason: reasonInvalidRequestID, call: func(t *testing.T, b *textBundle, s string) error {
		_, err := b.services.Operators.ReplayJobs(inProcess(t, operator), &leaseholdv1.ReplayJobsRequest{BatchId: b.batch.GetId(), Reason: "rerun", RequestId: s})
		return err
	}},
	{name: "PauseDispatch reason", field: "reason", reason: reasonInvalidReason, call: func(t *testing.T, b *textBundle, s string) error {
		_, err := b.services.Operators.PauseDispatch(inProcess(t, operator), &leaseholdv1.PauseDispatchRequest{Reason: s})
		return err
	}},
	{name: "ResumeDispatch reason", field: "reason", reason: reasonInvalidReason, call: func(t *testing.T, b *textBundle, s string) error {
		_, err := b.services.Operators.ResumeDispatch(inProcess(t, operator), &leaseholdv1.ResumeDispatchRequest{Reason: s})
		return err
	}},
	{name: "Complete failure.message", field: "failure.message", reason: reasonInvalidMessage, call: func(t *testing.T, b *textBundle, s string) error {
		req := failure(b.lease, leaseholdv1.FailureClass_FAILURE_CLASS_TRANSIENT)
		req.GetFailure().Message = s
		_, err := b.services.Renderers.Complete(inProcess(t, renderer), req)
		return err
	}},
	{name: "Complete success.artifact_digest", field: "success.artifact_digest", reason: reasonInvalidDigest, call: func(t *testing.T, b *textBundle, s string) error {
		_, err := b.services.Renderers.Complete(inProcess(t, renderer), &leaseholdv1.CompleteRequest{JobId: b.lease.GetJobId(), Token: b.lease.GetLease().GetToken(), RendererId: "r-1",
			Outcome: &leaseholdv1.CompleteRequest_Success{Success: &leaseholdv1.CompleteSuccess{ArtifactDigest: strings.Repeat("a", 63) + s}}})
		return err
	}},
	{name: "Complete success.content_type", field: "success.content_type", reason: reasonInvalidContentType, call: func(t *testing.T, b *textBundle, s string) error {
		_, err := b.services.Renderers.Complete(inProcess(t, renderer), &leaseholdv1.CompleteRequest{JobId: b.lease.GetJobId(), Token: b.lease.GetLease().GetToken(), RendererId: "r-1",
			Outcome: &leaseholdv1.CompleteRequest_Success{Success: &leaseholdv1.CompleteSuccess{Content: []byte("\x89PNG"), ContentType: "image/png" + s}}})
		return err
	}},
	{name: "Complete renderer_id", field: "renderer_id", reason: reasonInvalidRendererID, call: func(t *testing.T, b *textBundle, s string) error {
		req := failure(b.lease, leaseholdv1.FailureClass_FAILURE_CLASS_TRANSIENT)
		req.RendererId = "r-1" + s
		_, err := b.services.Renderers.Complete(inProcess(t, renderer), req)
		return err
	}},
	{name: "Acquire renderer_id", field: "renderer_id", reason: reasonInvalidRendererID, call: func(t *testing.T, b *textBundle, s string) error {
		_, err := b.services.Renderers.Acquire(inProcess(t, renderer), &leaseholdv1.AcquireRequest{RendererId: s, MaxLeases: 1, Capacity: 1})
		return err
	}},
	{name: "UploadArtifact metadata.content_type", field: "metadata.content_type", reason: reasonInvalidContentType, grpc: true, call: func(t *testing.T, b *textBundle, s string) error {
		_, err := b.sendUpload(t, renderer, textUpload(b.lease, "image/png"+s, ""), chunk([]byte("\x89PNG")))
		return err
	}},
	{name: "UploadArtifact metadata.expected_sha256", field: "metadata.expected_sha256", reason: reasonInvalidDigest, grpc: true, call: func(t *testing.T, b *textBundle, s string) error {
		_, err := b.sendUpload(t, renderer, textUpload(b.lease, "image/png", sha([]byte("\x89PNG"))[:63]+s), chunk([]byte("\x89PNG")))
		return err
	}},
	{name: "Session completion failure.message", reason: reasonInvalidMessage, grpc: true, call: func(t *testing.T, b *textBundle, s string) error {
		sc := b.openSession(t, hello("r-1", "i-text", 1), 0)
		resp := sc.call(&leaseholdv1.SessionRequest{Completions: []*leaseholdv1.SessionCompletion{{JobId: b.lease.GetJobId(), Token: b.lease.GetLease().GetToken(),
			Outcome: &leaseholdv1.SessionCompletion_Failure{Failure: &leaseholdv1.CompleteFailure{Class: leaseholdv1.FailureClass_FAILURE_CLASS_TRANSIENT, Message: s}}}}})
		if err := sc.stream.CloseSend(); err != nil {
			t.Fatal(err)
		}
		if err := sc.end(); err != nil {
			t.Fatalf("the session ended with %v, want OK after a refused completion", err)
		}
		res := resp.GetResults()
		if len(res) != 1 {
			t.Fatalf("answer %v, want one completion result", resp)
		}
		return newStatus(codes.Code(res[0].GetCode()), res[0].GetReason(), res[0].GetMessage(), nil)
	}},
}

// TestCallerTextNeverStopsTheWriter calls every handler that stores caller
// text with strings no caller may store, in process as the console calls
// them (past the codec) and, for streams, over gRPC: each is refused
// INVALID_ARGUMENT with the field's reason and a BadRequest naming it,
// writes nothing, and leaves the writer serving the next team's submit.
func TestCallerTextNeverStopsTheWriter(t *testing.T) {
	t.Parallel()
	for _, tc := range textCalls {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setupText(t)
			bad := notText
			if !tc.grpc {
				bad = append(slices.Clone(notUTF8), notText...)
			}
			for _, s := range bad {
				b.refusedAndUnchanged(t, fmt.Sprintf("%s %q", tc.name, s), tc.field, tc.reason, func() error { return tc.call(t, b, s) })
			}
		})
	}
}

// TestWriterRefusesTextBelowTheHandlers calls the engine directly with text
// the handlers would have refused, as a caller that skipped them would:
// the writer refuses each command itself, and the error table answers
// INVALID_ARGUMENT INVALID_TEXT with a BadRequest naming the field.
func TestWriterRefusesTextBelowTheHandlers(t *testing.T) {
	t.Parallel()
	b := setupText(t)
	ctx := context.Background()
	jobID, err := parseJobID(b.batch.GetJobIds()[1], "job_id")
	if err != nil {
		t.Fatal(err)
	}
	leased, err := parseJobID(b.lease.GetJobId(), "job_id")
	if err != nil {
		t.Fatal(err)
	}
	calls := []struct {
		name, field string
		call        func(s string) error
	}{
		{"Cancel", "reason", func(s string) error {
			_, err := b.eng.Cancel(ctx, engine.CancelRequest{Job: jobID, Principal: "dev-alpha", Reason: s})
			return err
		}},
		{"SetPaused", "reason", func(s string) error {
			_, err := b.eng.SetPaused(ctx, true, "dev-operator", s)
			return err
		}},
		{"Replay", "request_id", func(s string) error {
			_, err := b.eng.Replay(ctx, engine.ReplayRequest{Principal: "dev-operator", RequestID: s, Reason: "rerun", JobIDs: []uint64{jobID}})
			return err
		}},
		{"RecordAudit", "reason", func(s string) error {
			return b.eng.RecordAudit(ctx, jobsAudit(s))
		}},
		{"Complete", "failure.message", func(s string) error {
			req := engineFailure(leased, b.lease.GetLease().GetToken(), s)
			res, err := b.eng.Receive(ctx, nil, engine.SessionInput{Renderer: engine.Renderer{ID: req.Renderer}, Completions: []engine.CompleteRequest{req}})
			if err != nil {
				return err
			}
			return res.Completions[0].Err
		}},
	}
	for _, c := range calls {
		for _, s := range append(slices.Clone(notUTF8), notText...) {
			b.refusedAndUnchanged(t, fmt.Sprintf("%s %q", c.name, s), c.field, "INVALID_TEXT", func() error {
				return toStatus(b.services.Jobs.log, c.call(s))
			})
		}
	}
}

// TestReplayRequestIDIsBounded sends, over gRPC, a replay whose request id
// is longer than a bbolt key may be: it is refused with the field's reason
// and the writer keeps serving.
func TestReplayRequestIDIsBounded(t *testing.T) {
	t.Parallel()
	b := setupText(t)
	for _, n := range []int{129, 40 << 10} {
		b.refusedAndUnchanged(t, fmt.Sprintf("a request id of %d bytes", n), "request_id", reasonInvalidRequestID, func() error {
			_, err := b.ops.ReplayJobs(as(t, operator), &leaseholdv1.ReplayJobsRequest{JobIds: b.batch.GetJobIds(), Reason: "rerun", RequestId: strings.Repeat("r", n)})
			return err
		})
	}
}

// fuzzFields are the caller fields FuzzCallerText fills: each call sends s
// in one field of a request that is otherwise valid, in process as the
// console calls the handlers.
var fuzzFields = []struct {
	name string
	call func(t *testing.T, b *textBundle, s string) error
}{
	{"SubmitBatch team", func(t *testing.T, b *textBundle, s string) error {
		_, err := b.services.Jobs.SubmitBatch(inProcess(t, alpha), &leaseholdv1.SubmitBatchRequest{Team: s, RequestId: b.fresh("t"), Documents: []*leaseholdv1.Document{doc("a.pdf")}})
		return err
	}},
	{"SubmitBatch request_id", func(t *testing.T, b *textBundle, s string) error {
		_, err := b.services.Jobs.SubmitBatch(inProcess(t, alpha), &leaseholdv1.SubmitBatchRequest{Team: "alpha", RequestId: s, Documents: []*leaseholdv1.Document{doc("a.pdf")}})
		return err
	}},
	{"SubmitBatch document name", func(t *testing.T, b *textBundle, s string) error {
		_, err := b.services.Jobs.SubmitBatch(inProcess(t, alpha), &leaseholdv1.SubmitBatchRequest{Team: "alpha", RequestId: b.fresh("n"), Documents: []*leaseholdv1.Document{doc(s)}})
		return err
	}},
	{"SubmitBatch document content_type and source_uri", func(t *testing.T, b *textBundle, s string) error {
		d := doc("a.pdf")
		d.ContentType, d.SourceUri = s, s
		_, err := b.services.Jobs.SubmitBatch(inProcess(t, alpha), &leaseholdv1.SubmitBatchRequest{Team: "alpha", RequestId: b.fresh("c"), Documents: []*leaseholdv1.Document{d}})
		return err
	}},
	{"CancelJob reason", func(t *testing.T, b *textBundle, s string) error {
		_, err := b.services.Jobs.CancelJob(inProcess(t, alpha), &leaseholdv1.CancelJobRequest{JobId: b.queued(t), Reason: s})
		return err
	}},
	{"CancelBatch reason by an operator out of scope", func(t *testing.T, b *textBundle, s string) error {
		_, err := b.services.Jobs.CancelBatch(inProcess(t, opAlpha), &leaseholdv1.CancelBatchRequest{BatchId: b.beta.GetId(), Reason: s})
		return err
	}},
	{"ReplayJobs reason and request_id", func(t *testing.T, b *textBundle, s string) error {
		_, err := b.services.Operators.ReplayJobs(inProcess(t, operator), &leaseholdv1.ReplayJobsRequest{BatchId: b.batch.GetId(), Reason: s, RequestId: s})
		return err
	}},
	{"ReplayJobs reason of a dry run", func(t *testing.T, b *textBundle, s string) error {
		_, err := b.services.Operators.ReplayJobs(inProcess(t, operator), &leaseholdv1.ReplayJobsRequest{JobIds: b.batch.GetJobIds(), Reason: s, DryRun: true})
		return err
	}},
	{"PauseDispatch and ResumeDispatch reason", func(t *testing.T, b *textBundle, s string) error {
		if _, err := b.services.Operators.PauseDispatch(inProcess(t, operator), &leaseholdv1.PauseDispatchRequest{Reason: s}); err != nil {
			return err
		}
		_, err := b.services.Operators.ResumeDispatch(inProcess(t, operator), &leaseholdv1.ResumeDispatchRequest{Reason: s})
		return err
	}},
	{"Complete failure.message", func(t *testing.T, b *textBundle, s string) error {
		req := failure(b.leased(t), leaseholdv1.FailureClass_FAILURE_CLASS_INVALID_DOCUMENT)
		req.GetFailure().Message = s
		_, err := b.services.Renderers.Complete(inProcess(t, renderer), req)
		return err
	}},
	{"Complete success.artifact_digest of a stale lease", func(t *testing.T, b *textBundle, s string) error {
		g := b.leased(t)
		_, err := b.services.Renderers.Complete(inProcess(t, renderer), &leaseholdv1.CompleteRequest{JobId: g.GetJobId(), Token: g.GetLease().GetToken() + 1000, RendererId: "r-1",
			Outcome: &leaseholdv1.CompleteRequest_Success{Success: &leaseholdv1.CompleteSuccess{ArtifactDigest: s}}})
		return err
	}},
	{"Complete success.content_type", func(t *testing.T, b *textBundle, s string) error {
		g := b.leased(t)
		_, err := b.services.Renderers.Complete(inProcess(t, renderer), &leaseholdv1.CompleteRequest{JobId: g.GetJobId(), Token: g.GetLease().GetToken(), RendererId: "r-1",
			Outcome: &leaseholdv1.CompleteRequest_Success{Success: &leaseholdv1.CompleteSuccess{Content: []byte("\x89PNG"), ContentType: s}}})
		return err
	}},
	{"Acquire renderer_id", func(t *testing.T, b *textBundle, s string) error {
		res, err := b.services.Renderers.Acquire(inProcess(t, renderer), &leaseholdv1.AcquireRequest{RendererId: s, MaxLeases: 1, Capacity: 1})
		for _, g := range res.GetLeases() {
			b.pool = append(b.pool, g)
		}
		return err
	}},
}

// fresh returns a request id not used before.
func (b *textBundle) fresh(prefix string) string {
	b.next++
	return fmt.Sprintf("%s-fresh-%d", prefix, b.next)
}

// queued submits one alpha document and returns its job id.
func (b *textBundle) queued(t *testing.T) string {
	t.Helper()
	resp, err := b.services.Jobs.SubmitBatch(inProcess(t, alpha), &leaseholdv1.SubmitBatchRequest{Team: "alpha", RequestId: b.fresh("q"), Documents: []*leaseholdv1.Document{doc("q.pdf")}})
	if err != nil {
		t.Fatal(err)
	}
	return resp.GetBatch().GetJobIds()[0]
}

// leased returns a lease of r-1 that is live: one granted earlier and not
// yet completed, or a new one.
func (b *textBundle) leased(t *testing.T) *leaseholdv1.Grant {
	t.Helper()
	for len(b.pool) > 0 {
		g := b.pool[len(b.pool)-1]
		j, err := b.services.Jobs.GetJob(inProcess(t, alpha), &leaseholdv1.GetJobRequest{JobId: g.GetJobId()})
		if err == nil && j.GetJob().GetPhase() == leaseholdv1.Phase_PHASE_LEASED && j.GetJob().GetLease().GetToken() == g.GetLease().GetToken() {
			return g
		}
		b.pool = b.pool[:len(b.pool)-1]
	}
	b.queued(t)
	if b.eng.DispatchState().Paused {
		if _, err := b.services.Operators.ResumeDispatch(inProcess(t, operator), &leaseholdv1.ResumeDispatchRequest{Reason: "fuzzing"}); err != nil {
			t.Fatal(err)
		}
	}
	res, err := b.services.Renderers.Acquire(inProcess(t, renderer), &leaseholdv1.AcquireRequest{RendererId: "r-1", MaxLeases: 1, Capacity: 1})
	if err != nil || len(res.GetLeases()) != 1 {
		t.Fatalf("Acquire = %v, %v; want a lease", res, err)
	}
	b.pool = append(b.pool, res.GetLeases()[0])
	return res.GetLeases()[0]
}

// documentedCodes are the codes a handler may refuse these calls with: a
// refusal of the request, a job or batch the caller may not act on, a
// fencing refusal; never UNAVAILABLE or INTERNAL.
var documentedCodes = []codes.Code{codes.InvalidArgument, codes.PermissionDenied, codes.NotFound, codes.FailedPrecondition, codes.Aborted}

// FuzzCallerText sends arbitrary strings in each caller field of the
// handlers, called in process as the console calls them, to a real engine
// on a bbolt file: every call succeeds or is refused with a documented
// code and a stable reason; text it accepts is text the store keeps
// (jobs.ValidText); and afterwards the writer serves and a fresh submit of
// another team succeeds.
func FuzzCallerText(f *testing.F) {
	seeds := []string{"", "ok", "renderer 1.5 rollout", strings.Repeat("a", 64), sha([]byte("x")), "image/png",
		"\xff", "\xfe\xff", "\x00", "a\x00b", "\xc0\x80", "\xc0\xaf", "\xe0\x80\xaf", "\xf0\x80\x80\xaf", "\xed\xa0\x80", "\xed\xbf\xbf",
		"\xed\xa0\xbd\xed\xb8\x80", "\xf4\x90\x80\x80", "\xf8\x88\x80\x80\x80", "ok\xe2\x82", "\n", "\x1b[2J", "\u0085", "\u202e", "\u2066x\u2069",
		"résumé", "報告", strings.Repeat("r", 1025), strings.Repeat("k", 40<<10)}
	// Every field with the bytes that stopped the writer, and every seed in
	// some field: the fuzzer moves them between fields.
	for i := range fuzzFields {
		f.Add(uint8(i), "\xff")
		f.Add(uint8(i), "\x00")
	}
	for i, s := range seeds {
		f.Add(uint8(i), s)
	}
	b := setupText(f)
	f.Fuzz(func(t *testing.T, which uint8, s string) {
		field := fuzzFields[int(which)%len(fuzzFields)]
		err := field.call(t, b, s)
		if err == nil && !jobs.ValidText(s) {
			t.Errorf("%s accepted %q, which is not text the store keeps", field.name, s)
		}
		if err != nil {
			code, info := errorInfo(err)
			if !slices.Contains(documentedCodes, code) || info.GetReason() == "" || info.GetDomain() != ErrorDomain {
				t.Errorf("%s %q: %v %q (%v), want a documented refusal", field.name, s, code, info.GetReason(), err)
			}
			if code == codes.InvalidArgument && len(badRequestFields(err)) == 0 {
				t.Errorf("%s %q: INVALID_ARGUMENT %s without a BadRequest naming the field", field.name, s, info.GetReason())
			}
		}
		if !b.eng.Serving() {
			t.Fatalf("%s %q: the writer stopped", field.name, s)
		}
		if _, err := b.services.Jobs.SubmitBatch(inProcess(t, beta), &leaseholdv1.SubmitBatchRequest{Team: "beta", RequestId: b.fresh("beta"),
			Documents: []*leaseholdv1.Document{doc("b.pdf")}}); err != nil {
			t.Fatalf("team beta's submit after %s %q: %v", field.name, s, err)
		}
	})
}
