package server

import (
	"bytes"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/testing/protocmp"
)

// TestRenderLifecycle follows one job from submission to its preview.
func TestRenderLifecycle(t *testing.T) {
	t.Parallel()
	b := setup(t)
	batch := b.submit(t, alpha, "alpha", "r1", doc("a.pdf"), &leaseholdv1.Document{Name: "m.docm", Content: []byte("x")})

	t.Run("Submission returns the batch with its ids and counts", func(t *testing.T) {
		if got := len(batch.GetJobIds()); got != 2 {
			t.Fatalf("job ids = %d, want 2", got)
		}
		want := []*leaseholdv1.PhaseCount{{Phase: leaseholdv1.Phase_PHASE_QUEUED, Count: 1}, {Phase: leaseholdv1.Phase_PHASE_FAILED, Count: 1}}
		if diff := cmp.Diff(want, batch.GetCounts(), cmpProto()); diff != "" {
			t.Errorf("counts (-want +got):\n%s", diff)
		}
	})
	t.Run("Submitting again with the same request id replays the batch", func(t *testing.T) {
		resp, err := b.jobs.SubmitBatch(as(t, alpha), &leaseholdv1.SubmitBatchRequest{Team: "alpha", RequestId: "r1",
			Documents: []*leaseholdv1.Document{doc("a.pdf"), {Name: "m.docm", Content: []byte("x")}}})
		if err != nil {
			t.Fatal(err)
		}
		if !resp.GetReplayed() || resp.GetBatch().GetId() != batch.GetId() {
			t.Errorf("replayed = %v, batch %s; want true, %s", resp.GetReplayed(), resp.GetBatch().GetId(), batch.GetId())
		}
	})

	g := b.acquire(t, 4)
	if len(g) != 1 {
		t.Fatalf("Acquire granted %d leases, want 1 (the unsupported one is never dispatched)", len(g))
	}
	t.Run("A grant carries the document with its inline content", func(t *testing.T) {
		if got, want := string(g[0].GetDocument().GetContent()), secretContent+" a.pdf"; got != want {
			t.Errorf("content = %q, want %q", got, want)
		}
		if g[0].GetLease().GetToken() == 0 || g[0].GetLease().GetAttempt() != 1 {
			t.Errorf("lease = %v, want a token and attempt 1", g[0].GetLease())
		}
	})

	preview := bytes.Repeat([]byte("\x89PNG\r\n\x1a\npreview"), 20000) // > one chunk
	resp := b.succeed(t, g[0], preview)
	t.Run("Completion moves the job to SUCCEEDED with the artifact", func(t *testing.T) {
		j := resp.GetJob()
		if j.GetPhase() != leaseholdv1.Phase_PHASE_SUCCEEDED || j.GetArtifact().GetDigest() != sha(preview) {
			t.Errorf("job = %v %v, want SUCCEEDED with digest %s", j.GetPhase(), j.GetArtifact(), sha(preview))
		}
		if got := j.GetArtifact().GetContentType(); got != "image/png" {
			t.Errorf("artifact content type = %q, want image/png", got)
		}
	})
	t.Run("Repeating the completion answers replayed", func(t *testing.T) {
		again, err := b.rend.Complete(as(t, renderer), &leaseholdv1.CompleteRequest{JobId: g[0].GetJobId(), Token: g[0].GetLease().GetToken(), RendererId: "r-1",
			Outcome: &leaseholdv1.CompleteRequest_Success{Success: &leaseholdv1.CompleteSuccess{ArtifactDigest: sha(preview)}}})
		if err != nil {
			t.Fatal(err)
		}
		if !again.GetReplayed() {
			t.Errorf("replayed = false, want true")
		}
	})
	t.Run("The submitter downloads the preview in chunks", func(t *testing.T) {
		stream, err := b.jobs.GetArtifact(as(t, alpha), &leaseholdv1.GetArtifactRequest{JobId: g[0].GetJobId()})
		if err != nil {
			t.Fatal(err)
		}
		var got []byte
		var msgs int
		var meta *leaseholdv1.Artifact
		for {
			m, err := stream.Recv()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			if msgs == 0 {
				meta = m.GetArtifact()
			} else if m.GetArtifact() != nil {
				t.Errorf("message %d repeats the metadata", msgs)
			}
			msgs++
			got = append(got, m.GetChunk()...)
		}
		if !bytes.Equal(got, preview) {
			t.Errorf("downloaded %d bytes, want the %d uploaded", len(got), len(preview))
		}
		if msgs < 2 || meta.GetSizeBytes() != int64(len(preview)) {
			t.Errorf("messages = %d, size = %d; want several, %d", msgs, meta.GetSizeBytes(), len(preview))
		}
	})
	t.Run("The finished batch is done", func(t *testing.T) {
		resp, err := b.jobs.GetBatch(as(t, alpha), &leaseholdv1.GetBatchRequest{BatchId: batch.GetId()})
		if err != nil {
			t.Fatal(err)
		}
		if !resp.GetBatch().GetDone() {
			t.Errorf("done = false, want true: %v", resp.GetBatch().GetCounts())
		}
	})
}

func cmpProto() cmp.Option {
	return cmp.Comparer(func(a, b *leaseholdv1.PhaseCount) bool {
		return a.GetPhase() == b.GetPhase() && a.GetCount() == b.GetCount()
	})
}

// TestHeartbeat checks the heartbeat stream: answers in order and
// revocations pushed at once.
func TestHeartbeat(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.submit(t, alpha, "alpha", "r", doc("a.pdf"), doc("b.pdf"))
	grants := b.acquire(t, 2)
	if len(grants) != 2 {
		t.Fatalf("granted %d, want 2", len(grants))
	}
	stream, err := b.rend.Heartbeat(as(t, renderer))
	if err != nil {
		t.Fatal(err)
	}
	refs := []*leaseholdv1.LeaseRef{
		{JobId: grants[0].GetJobId(), Token: grants[0].GetLease().GetToken()},
		{JobId: grants[1].GetJobId(), Token: grants[1].GetLease().GetToken() + 1000},
	}
	if err := stream.Send(&leaseholdv1.HeartbeatRequest{RendererId: "r-1", Capacity: 4, Leases: refs}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	t.Run("Each lease is answered in order", func(t *testing.T) {
		got := resp.GetLeases()
		if len(got) != 2 {
			t.Fatalf("answers = %d, want 2", len(got))
		}
		if got[0].GetState() != leaseholdv1.LeaseState_LEASE_STATE_HELD || got[0].GetDeadline() == nil {
			t.Errorf("first = %v, want HELD with a deadline", got[0])
		}
		if got[1].GetState() != leaseholdv1.LeaseState_LEASE_STATE_LOST || got[1].GetReason() != "STALE_LEASE" {
			t.Errorf("second = %v, want LOST STALE_LEASE", got[1])
		}
	})
	t.Run("A cancellation is pushed on the stream without a heartbeat", func(t *testing.T) {
		cancel, err := b.jobs.CancelJob(as(t, alpha), &leaseholdv1.CancelJobRequest{JobId: grants[0].GetJobId(), Reason: "not needed"})
		if err != nil {
			t.Fatal(err)
		}
		if cancel.GetRunningRendererId() != "r-1" || cancel.GetAcknowledged() {
			t.Errorf("cancel response renderer %q acknowledged %v, want r-1 and false", cancel.GetRunningRendererId(), cancel.GetAcknowledged())
		}
		pushed, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if len(pushed.GetRevoked()) != 1 || pushed.GetRevoked()[0].GetJobId() != grants[0].GetJobId() || pushed.GetRevoked()[0].GetReason() != "JOB_CANCELLED" {
			t.Fatalf("pushed = %v, want the revocation of %s", pushed, grants[0].GetJobId())
		}
		// Acknowledge it; the answer to this heartbeat comes after the ack
		// is committed.
		if err := stream.Send(&leaseholdv1.HeartbeatRequest{CancelAcks: []*leaseholdv1.LeaseRef{refs[0]}}); err != nil {
			t.Fatal(err)
		}
		if _, err := stream.Recv(); err != nil {
			t.Fatal(err)
		}
		again, err := b.jobs.CancelJob(as(t, alpha), &leaseholdv1.CancelJobRequest{JobId: grants[0].GetJobId()})
		if err != nil {
			t.Fatal(err)
		}
		if !again.GetAlreadyCancelled() || !again.GetAcknowledged() {
			t.Errorf("second cancel: already %v acknowledged %v, want both true", again.GetAlreadyCancelled(), again.GetAcknowledged())
		}
	})
	t.Run("A changed renderer id ends the stream with INVALID_RENDERER_ID", func(t *testing.T) {
		if err := stream.Send(&leaseholdv1.HeartbeatRequest{RendererId: "r-2"}); err != nil {
			t.Fatal(err)
		}
		_, err := stream.Recv()
		wantError(t, err, codes.InvalidArgument, reasonInvalidRendererID)
	})
}

// TestAcquire checks the long poll.
func TestAcquire(t *testing.T) {
	t.Parallel()

	t.Run("Without work and without wait it answers at once with nothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		resp, err := b.rend.Acquire(as(t, renderer), &leaseholdv1.AcquireRequest{RendererId: "r-1", MaxLeases: 1})
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.GetLeases()) != 0 || resp.GetHeartbeatInterval().AsDuration() != 5*time.Second {
			t.Errorf("leases %d, heartbeat %v; want 0, 5s", len(resp.GetLeases()), resp.GetHeartbeatInterval().AsDuration())
		}
	})
	t.Run("A waiting poll returns the lease of a batch submitted meanwhile", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		type result struct {
			resp *leaseholdv1.AcquireResponse
			err  error
		}
		done := make(chan result, 1)
		ctx := as(t, renderer)
		go func() {
			resp, err := b.rend.Acquire(ctx, &leaseholdv1.AcquireRequest{RendererId: "r-1", MaxLeases: 1, Wait: wait(50 * time.Second)})
			done <- result{resp, err}
		}()
		batch := b.submit(t, alpha, "alpha", "r", doc("a.pdf"))
		r := <-done
		if r.err != nil {
			t.Fatal(r.err)
		}
		if len(r.resp.GetLeases()) != 1 || r.resp.GetLeases()[0].GetJobId() != batch.GetJobIds()[0] {
			t.Errorf("leases = %v, want the new job", r.resp.GetLeases())
		}
	})
	t.Run("While dispatch is paused nothing is granted and the answer says so", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		if _, err := b.ops.PauseDispatch(as(t, operator), &leaseholdv1.PauseDispatchRequest{Reason: "rollout"}); err != nil {
			t.Fatal(err)
		}
		b.submit(t, alpha, "alpha", "r", doc("a.pdf"))
		resp, err := b.rend.Acquire(as(t, renderer), &leaseholdv1.AcquireRequest{RendererId: "r-1", MaxLeases: 1})
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.GetLeases()) != 0 || !resp.GetDispatchPaused() {
			t.Errorf("leases %d paused %v, want 0 and true", len(resp.GetLeases()), resp.GetDispatchPaused())
		}
		if _, err := b.ops.ResumeDispatch(as(t, operator), &leaseholdv1.ResumeDispatchRequest{Reason: "done"}); err != nil {
			t.Fatal(err)
		}
		if got := b.acquire(t, 1); len(got) != 1 {
			t.Errorf("after resume granted %d, want 1", len(got))
		}
	})
	t.Run("Shutdown answers a waiting poll at once", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		done := make(chan error, 1)
		ctx := as(t, renderer)
		go func() {
			_, err := b.rend.Acquire(ctx, &leaseholdv1.AcquireRequest{RendererId: "r-1", MaxLeases: 1, Wait: wait(50 * time.Second)})
			done <- err
		}()
		b.services.Shutdown()
		if err := <-done; err != nil {
			t.Errorf("Acquire after Shutdown: %v, want an empty answer", err)
		}
	})
}

// TestWatchBatch checks the snapshot, the events and the clean end.
func TestWatchBatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	batch := b.submit(t, alpha, "alpha", "r", doc("a.pdf"), doc("b.pdf"))
	stream, err := b.jobs.WatchBatch(as(t, alpha), &leaseholdv1.WatchBatchRequest{BatchId: batch.GetId()})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		m, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if m.GetEvent() != nil || m.GetPhase() != leaseholdv1.Phase_PHASE_QUEUED || m.GetJobId() != batch.GetJobIds()[i] {
			t.Errorf("snapshot %d = %v, want %s QUEUED without event", i, m, batch.GetJobIds()[i])
		}
	}
	// Finish both jobs: one cancelled, one failed permanently.
	if _, err := b.jobs.CancelJob(as(t, alpha), &leaseholdv1.CancelJobRequest{JobId: batch.GetJobIds()[0]}); err != nil {
		t.Fatal(err)
	}
	g := b.acquire(t, 1)[0]
	if _, err := b.rend.Complete(as(t, renderer), failure(g, leaseholdv1.FailureClass_FAILURE_CLASS_INVALID_DOCUMENT)); err != nil {
		t.Fatal(err)
	}
	var kinds []leaseholdv1.EventKind
	var last *leaseholdv1.WatchBatchResponse
	for {
		m, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("watch ended with %v, want OK", err)
		}
		kinds = append(kinds, m.GetEvent().GetKind())
		last = m
	}
	want := []leaseholdv1.EventKind{leaseholdv1.EventKind_EVENT_KIND_CANCELLED, leaseholdv1.EventKind_EVENT_KIND_LEASED, leaseholdv1.EventKind_EVENT_KIND_FAILED}
	if diff := cmp.Diff(want, kinds); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
	if !last.GetBatch().GetDone() {
		t.Errorf("last message's batch is not done: %v", last.GetBatch())
	}
}

// TestReplayJobs checks dry run, a real run and its idempotency.
func TestReplayJobs(t *testing.T) {
	t.Parallel()
	b := setup(t)
	batch := b.submit(t, alpha, "alpha", "r", doc("a.pdf"))
	g := b.acquire(t, 1)[0]
	if _, err := b.rend.Complete(as(t, renderer), failure(g, leaseholdv1.FailureClass_FAILURE_CLASS_INVALID_DOCUMENT)); err != nil {
		t.Fatal(err)
	}
	req := &leaseholdv1.ReplayJobsRequest{JobIds: batch.GetJobIds(), IncludePermanent: true, DryRun: true}

	t.Run("A real run without a reason is INVALID_ARGUMENT MISSING_REASON", func(t *testing.T) {
		_, err := b.ops.ReplayJobs(as(t, operator), &leaseholdv1.ReplayJobsRequest{JobIds: batch.GetJobIds(), RequestId: "x"})
		wantError(t, err, codes.InvalidArgument, reasonMissingReason)
	})
	t.Run("A replay without a selection is INVALID_ARGUMENT MISSING_SELECTION", func(t *testing.T) {
		_, err := b.ops.ReplayJobs(as(t, operator), &leaseholdv1.ReplayJobsRequest{DryRun: true})
		wantError(t, err, codes.InvalidArgument, reasonMissingSelection)
	})
	t.Run("A dry run says what would happen and changes nothing", func(t *testing.T) {
		resp, err := b.ops.ReplayJobs(as(t, operator), req)
		if err != nil {
			t.Fatal(err)
		}
		if !resp.GetDryRun() || resp.GetRequeued() != 1 || len(resp.GetItems()) != 1 || resp.GetItems()[0].GetAction() != leaseholdv1.ReplayAction_REPLAY_ACTION_REQUEUE {
			t.Errorf("dry run = %v, want one REQUEUE", resp)
		}
		j, err := b.jobs.GetJob(as(t, alpha), &leaseholdv1.GetJobRequest{JobId: batch.GetJobIds()[0]})
		if err != nil {
			t.Fatal(err)
		}
		if j.GetJob().GetPhase() != leaseholdv1.Phase_PHASE_FAILED {
			t.Errorf("after a dry run the job is %v, want FAILED", j.GetJob().GetPhase())
		}
	})
	t.Run("An operator out of scope sees the job exactly as one that does not exist", func(t *testing.T) {
		b.submit(t, beta, "beta", "rb", doc("z.pdf"))
		hidden, err := b.ops.ReplayJobs(as(t, opAlpha), &leaseholdv1.ReplayJobsRequest{JobIds: []string{"j-2"}, DryRun: true})
		if err != nil {
			t.Fatal(err)
		}
		absent, err := b.ops.ReplayJobs(as(t, opAlpha), &leaseholdv1.ReplayJobsRequest{JobIds: []string{"j-999"}, DryRun: true})
		if err != nil {
			t.Fatal(err)
		}
		want := []*leaseholdv1.ReplayItem{{JobId: "j-2", Action: leaseholdv1.ReplayAction_REPLAY_ACTION_SKIP, SkipReason: "JOB_NOT_FOUND"}}
		if diff := cmp.Diff(want, hidden.GetItems(), protocmp.Transform()); diff != "" || hidden.GetOutOfScope() != 0 {
			t.Errorf("out of scope %d, items (-want +got):\n%s", hidden.GetOutOfScope(), diff)
		}
		absent.Items[0].JobId = "j-2"
		if diff := cmp.Diff(absent, hidden, protocmp.Transform()); diff != "" {
			t.Errorf("a hidden job answered unlike a missing one (-missing +hidden):\n%s", diff)
		}
	})
	t.Run("A real run re-queues and a repeat returns the first answer", func(t *testing.T) {
		real := &leaseholdv1.ReplayJobsRequest{JobIds: batch.GetJobIds(), IncludePermanent: true, RequestId: "replay-1", Reason: "fixed the parser"}
		first, err := b.ops.ReplayJobs(as(t, operator), real)
		if err != nil {
			t.Fatal(err)
		}
		if first.GetRequeued() != 1 || first.GetAuditId() == 0 || first.GetReplayed() {
			t.Errorf("first = %v, want one re-queued, audited, not replayed", first)
		}
		second, err := b.ops.ReplayJobs(as(t, operator), real)
		if err != nil {
			t.Fatal(err)
		}
		if !second.GetReplayed() || second.GetAuditId() != first.GetAuditId() || second.GetRequeued() != 1 {
			t.Errorf("second = %v, want the first answer with replayed set", second)
		}
		j, err := b.jobs.GetJob(as(t, alpha), &leaseholdv1.GetJobRequest{JobId: batch.GetJobIds()[0]})
		if err != nil {
			t.Fatal(err)
		}
		if j.GetJob().GetPhase() != leaseholdv1.Phase_PHASE_QUEUED || j.GetJob().GetCycle() != 2 {
			t.Errorf("job after replay = %v cycle %d, want QUEUED cycle 2", j.GetJob().GetPhase(), j.GetJob().GetCycle())
		}
	})
}

// TestListings checks pagination and the rejections listing.
func TestListings(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var docs []*leaseholdv1.Document
	for _, n := range []string{"1", "2", "3", "4", "5"} {
		docs = append(docs, doc(n+".pdf"))
	}
	batch := b.submit(t, alpha, "alpha", "r", docs...)

	t.Run("Pages of two walk all five jobs in id order", func(t *testing.T) {
		var ids []string
		token := ""
		for range 10 {
			resp, err := b.jobs.ListJobs(as(t, alpha), &leaseholdv1.ListJobsRequest{PageSize: 2, PageToken: token, OmitEvents: true})
			if err != nil {
				t.Fatal(err)
			}
			for _, j := range resp.GetJobs() {
				ids = append(ids, j.GetId())
				if len(j.GetEvents()) != 0 {
					t.Errorf("omit_events listing has %d events", len(j.GetEvents()))
				}
			}
			if token = resp.GetNextPageToken(); token == "" {
				break
			}
		}
		if diff := cmp.Diff(batch.GetJobIds(), ids); diff != "" {
			t.Errorf("ids (-want +got):\n%s", diff)
		}
	})
	t.Run("A phase filter lists only that phase", func(t *testing.T) {
		if _, err := b.jobs.CancelJob(as(t, alpha), &leaseholdv1.CancelJobRequest{JobId: batch.GetJobIds()[4]}); err != nil {
			t.Fatal(err)
		}
		resp, err := b.jobs.ListJobs(as(t, alpha), &leaseholdv1.ListJobsRequest{BatchId: batch.GetId(), Phase: leaseholdv1.Phase_PHASE_CANCELLED})
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.GetJobs()) != 1 || resp.GetJobs()[0].GetId() != batch.GetJobIds()[4] {
			t.Errorf("cancelled jobs = %v, want only %s", resp.GetJobs(), batch.GetJobIds()[4])
		}
	})
	t.Run("A fenced-off completion is listed for operators", func(t *testing.T) {
		g := b.acquire(t, 1)[0]
		req := failure(g, leaseholdv1.FailureClass_FAILURE_CLASS_TRANSIENT)
		req.Token += 50
		_, err := b.rend.Complete(as(t, renderer), req)
		wantError(t, err, codes.Aborted, "STALE_LEASE")
		resp, err := b.ops.ListRejectedCompletions(as(t, operator), &leaseholdv1.ListRejectedCompletionsRequest{JobId: g.GetJobId()})
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.GetRejections()) != 1 || resp.GetRejections()[0].GetReason() != "STALE_LEASE" || resp.GetRejections()[0].GetToken() != req.GetToken() {
			t.Errorf("rejections = %v, want one STALE_LEASE with token %d", resp.GetRejections(), req.GetToken())
		}
		// A beta-only view would hide it; alpha's operator sees it.
		scoped, err := b.ops.ListRejectedCompletions(as(t, opAlpha), &leaseholdv1.ListRejectedCompletionsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if len(scoped.GetRejections()) != 1 {
			t.Errorf("alpha operator sees %d rejections, want 1", len(scoped.GetRejections()))
		}
	})
}

// TestShutdownEndsStreams checks that Shutdown ends long-lived streams
// with UNAVAILABLE so that a graceful stop is not held up by them.
func TestShutdownEndsStreams(t *testing.T) {
	t.Parallel()
	b := setup(t)
	batch := b.submit(t, alpha, "alpha", "r", doc("a.pdf"))
	watch, err := b.jobs.WatchBatch(as(t, alpha), &leaseholdv1.WatchBatchRequest{BatchId: batch.GetId()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := watch.Recv(); err != nil { // the snapshot
		t.Fatal(err)
	}
	hb, err := b.rend.Heartbeat(as(t, renderer))
	if err != nil {
		t.Fatal(err)
	}
	if err := hb.Send(&leaseholdv1.HeartbeatRequest{RendererId: "r-1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := hb.Recv(); err != nil {
		t.Fatal(err)
	}
	b.services.Shutdown()
	_, err = watch.Recv()
	wantError(t, err, codes.Unavailable, reasonShuttingDown)
	_, err = hb.Recv()
	wantError(t, err, codes.Unavailable, reasonShuttingDown)
}
