package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/leasehold/leasehold/client"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"github.com/leasehold/leasehold/internal/proctest"
)

// TestCancelQueuedWorkNeverReachesARenderer cancels a deep batch while two
// renderers keep working, and checks from the renderers' record files that
// no job cancelled while QUEUED was ever handed to one.
func TestCancelQueuedWorkNeverReachesARenderer(t *testing.T) {
	t.Parallel()
	coord := startCoordinator(t, "--lease-ttl", "10s")
	renderers := []*renderer{
		startRenderer(t, coord.Addr, "r1", "--capacity", "2", "--latency", "150ms"),
		startRenderer(t, coord.Addr, "r2", "--capacity", "2", "--latency", "150ms"),
	}
	alpha := dial(t, coord.Addr, tokenAlpha)
	ctx := testContext(t)

	const n = 80
	docs := make([]*leaseholdv1.Document, n)
	for i := range docs {
		docs[i] = doc(fmt.Sprintf("deep-%03d.txt", i), fmt.Sprintf("document %d", i))
	}
	sub, err := alpha.SubmitBatch(ctx, "alpha", "deep", docs, nil)
	if err != nil {
		t.Fatalf("SubmitBatch: %v", err)
	}
	batchID := sub.GetBatch().GetId()
	// Let the renderers start on the batch before cancelling it.
	for _, r := range renderers {
		r.WaitFor("lease acquired")
	}
	cancelled, err := alpha.CancelBatch(ctx, batchID, "not needed any more")
	if err != nil {
		t.Fatalf("CancelBatch: %v", err)
	}
	// Renderers keep polling: a later batch must be served while the
	// cancelled jobs stay out of their hands.
	later, err := alpha.SubmitBatch(ctx, "alpha", "later", []*leaseholdv1.Document{doc("later-1.txt", "1"), doc("later-2.txt", "2"), doc("later-3.txt", "3"), doc("later-4.txt", "4")}, nil)
	if err != nil {
		t.Fatalf("SubmitBatch: %v", err)
	}
	waitBatchDone(t, alpha, batchID)
	if got := phaseCounts(waitBatchDone(t, alpha, later.GetBatch().GetId())); got[leaseholdv1.Phase_PHASE_SUCCEEDED] != 4 {
		t.Errorf("later batch counts = %v, want 4 SUCCEEDED", got)
	}

	t.Logf("CancelBatch: %d cancelled queued, %d cancelled running, %d already succeeded",
		cancelled.GetCancelledQueued(), cancelled.GetCancelledRunning(), cancelled.GetAlreadySucceeded())
	if cancelled.GetCancelledQueued() == 0 {
		t.Fatalf("CancelBatch cancelled no queued job; the queue was not deep enough to test anything")
	}
	if got := cancelled.GetCancelledQueued() + cancelled.GetCancelledRunning() + cancelled.GetAlreadySucceeded() + cancelled.GetAlreadyFailed() + cancelled.GetAlreadyCancelled(); got != n {
		t.Errorf("CancelBatch counts add up to %d, want %d", got, n)
	}

	seen := map[string]bool{}
	for _, r := range renderers {
		for id := range r.recordedJobs(t) {
			seen[id] = true
		}
	}
	var fromQueued, fromLeased uint32
	for _, j := range batchJobs(t, alpha, batchID) {
		switch j.GetCancellation().GetFromPhase() {
		case leaseholdv1.Phase_PHASE_QUEUED, leaseholdv1.Phase_PHASE_RETRY_WAIT:
			fromQueued++
			if seen[j.GetId()] {
				t.Errorf("job %s was cancelled while %v but a renderer recorded it", j.GetId(), j.GetCancellation().GetFromPhase())
			}
		case leaseholdv1.Phase_PHASE_LEASED:
			fromLeased++
			if !seen[j.GetId()] {
				t.Errorf("job %s was cancelled while LEASED but no renderer recorded it", j.GetId())
			}
		}
	}
	if fromQueued != cancelled.GetCancelledQueued() || fromLeased != cancelled.GetCancelledRunning() {
		t.Errorf("jobs cancelled from QUEUED/RETRY_WAIT, LEASED = %d, %d; CancelBatch said %d, %d",
			fromQueued, fromLeased, cancelled.GetCancelledQueued(), cancelled.GetCancelledRunning())
	}
}

// TestCancelIsPushedToTheRunningRenderer cancels a job a renderer is
// rendering, with heartbeats an hour apart so that only the push on the
// heartbeat stream can tell the renderer, and checks that it stops and
// acknowledges.
func TestCancelIsPushedToTheRunningRenderer(t *testing.T) {
	t.Parallel()
	coord := startCoordinator(t, "--lease-ttl", "60s")
	r := startRenderer(t, coord.Addr, "r1", "--capacity", "1", "--latency", "60s", "--heartbeat-interval", "1h")
	alpha := dial(t, coord.Addr, tokenAlpha)
	ctx := testContext(t)

	sub, err := alpha.SubmitBatch(ctx, "alpha", "long", []*leaseholdv1.Document{doc("long.txt", "takes a minute")}, nil)
	if err != nil {
		t.Fatalf("SubmitBatch: %v", err)
	}
	jobID := sub.GetBatch().GetJobIds()[0]
	acquired := r.WaitFor("lease acquired", "job="+jobID+" ")
	token := proctest.LogAttr(acquired, "token")

	resp, err := alpha.CancelJob(ctx, jobID, "changed my mind")
	if err != nil {
		t.Fatalf("CancelJob: %v", err)
	}
	if got := resp.GetJob().GetPhase(); got != leaseholdv1.Phase_PHASE_CANCELLED {
		t.Errorf("CancelJob phase = %v, want PHASE_CANCELLED", got)
	}
	if got := resp.GetRunningRendererId(); got != "r1" {
		t.Errorf("CancelJob running renderer = %q, want r1", got)
	}

	lost := r.WaitFor("lease lost", "job="+jobID+" ")
	if got := proctest.LogAttr(lost, "reason"); got != "JOB_CANCELLED" {
		t.Errorf("lease lost reason = %q, want JOB_CANCELLED (line %q)", got, lost)
	}
	r.WaitFor("cancel acknowledged", "job="+jobID+" ", "token="+token)

	// The acknowledgement is committed after the renderer sends it; wait
	// for the record to show it.
	j := eventually(t, func() (*leaseholdv1.Job, bool) {
		j, err := alpha.GetJob(ctx, jobID)
		if err != nil {
			t.Fatalf("GetJob: %v", err)
		}
		return j, j.GetCancellation().GetAcknowledged()
	})
	c := j.GetCancellation()
	if c.GetFromPhase() != leaseholdv1.Phase_PHASE_LEASED || c.GetRendererId() != "r1" || fmt.Sprint(c.GetRevokedToken()) != token {
		t.Errorf("cancellation = %v, want from LEASED, renderer r1, revoked token %s", c, token)
	}
	if c.GetAcknowledgedAt().AsTime().Before(c.GetAt().AsTime()) {
		t.Errorf("acknowledged at %v, before the cancel at %v", c.GetAcknowledgedAt().AsTime(), c.GetAt().AsTime())
	}
	var kinds []leaseholdv1.EventKind
	for _, ev := range j.GetEvents() {
		kinds = append(kinds, ev.GetKind())
	}
	want := []leaseholdv1.EventKind{
		leaseholdv1.EventKind_EVENT_KIND_SUBMITTED,
		leaseholdv1.EventKind_EVENT_KIND_LEASED,
		leaseholdv1.EventKind_EVENT_KIND_CANCELLED,
		leaseholdv1.EventKind_EVENT_KIND_CANCEL_ACKNOWLEDGED,
	}
	if diff := cmp.Diff(want, kinds); diff != "" {
		t.Errorf("history (-want +got):\n%s", diff)
	}
	if lines := r.LinesWith("render done"); len(lines) != 0 {
		t.Errorf("renderer finished a cancelled render: %q", lines)
	}
}

// TestCancelRacesCompletion fires Complete and CancelJob at the same time,
// over and over, and checks that each job ends exactly once: either
// CANCELLED with no artifact and the completion rejected and recorded, or
// SUCCEEDED with the cancel refused as ALREADY_TERMINAL; and that replaying
// both calls changes nothing.
func TestCancelRacesCompletion(t *testing.T) {
	t.Parallel()
	coord := startCoordinator(t, "--lease-ttl", "30s")
	alpha := dial(t, coord.Addr, tokenAlpha)
	operator := dial(t, coord.Addr, tokenOperator)
	rs := dialRenderer(t, coord.Addr)
	ctx := testContext(t)
	png := []byte("\x89PNG\r\n\x1a\n race preview")

	const iterations = 100
	var succeeded, cancelled int
	for i := range iterations {
		sub, err := alpha.SubmitBatch(ctx, "alpha", fmt.Sprintf("race-%d", i), []*leaseholdv1.Document{doc(fmt.Sprintf("race-%d.txt", i), "race")}, nil)
		if err != nil {
			t.Fatalf("iteration %d: SubmitBatch: %v", i, err)
		}
		jobID := sub.GetBatch().GetJobIds()[0]
		acq, err := rs.Acquire(ctx, &leaseholdv1.AcquireRequest{RendererId: "racer", MaxLeases: 1, Wait: durationpb.New(5 * time.Second)})
		if err != nil {
			t.Fatalf("iteration %d: Acquire: %v", i, err)
		}
		if len(acq.GetLeases()) != 1 || acq.GetLeases()[0].GetJobId() != jobID {
			t.Fatalf("iteration %d: Acquire = %v, want one lease on %s", i, acq.GetLeases(), jobID)
		}
		token := acq.GetLeases()[0].GetLease().GetToken()
		digest := upload(t, rs, jobID, token, png)

		complete := &leaseholdv1.CompleteRequest{JobId: jobID, Token: token, RendererId: "racer",
			Outcome: &leaseholdv1.CompleteRequest_Success{Success: &leaseholdv1.CompleteSuccess{ArtifactDigest: digest}}}
		var (
			start             = make(chan struct{})
			wg                sync.WaitGroup
			completeErr       error
			cancelErr         error
			cancelResp        *leaseholdv1.CancelJobResponse
			completeGoroutine = func() { <-start; _, completeErr = rs.Complete(ctx, complete) }
			cancelGoroutine   = func() { <-start; cancelResp, cancelErr = alpha.CancelJob(ctx, jobID, "race") }
			first, second     = completeGoroutine, cancelGoroutine
		)
		if i%2 == 1 {
			first, second = second, first
		}
		wg.Go(first)
		wg.Go(second)
		close(start)
		wg.Wait()

		before, err := alpha.GetJob(ctx, jobID)
		if err != nil {
			t.Fatalf("iteration %d: GetJob: %v", i, err)
		}
		rejections := func() []*leaseholdv1.RejectedCompletion {
			resp, err := operator.ListRejectedCompletions(ctx, &leaseholdv1.ListRejectedCompletionsRequest{JobId: jobID})
			if err != nil {
				t.Fatalf("iteration %d: ListRejectedCompletions: %v", i, err)
			}
			return resp.GetRejections()
		}

		switch before.GetPhase() {
		case leaseholdv1.Phase_PHASE_CANCELLED:
			cancelled++
			if cancelErr != nil || cancelResp.GetAlreadyCancelled() {
				t.Errorf("iteration %d: job CANCELLED but CancelJob = %v, already cancelled %v; want the cancel that won", i, cancelErr, cancelResp.GetAlreadyCancelled())
			}
			if got := reasonOf(completeErr); status.Code(completeErr) != codes.Aborted || got != "JOB_CANCELLED" {
				t.Errorf("iteration %d: job CANCELLED but Complete = %v, want ABORTED JOB_CANCELLED", i, completeErr)
			}
			if before.GetArtifact() != nil {
				t.Errorf("iteration %d: CANCELLED job has artifact %v, want none", i, before.GetArtifact())
			}
			if rej := rejections(); len(rej) != 1 || rej[0].GetToken() != token || rej[0].GetReason() != "JOB_CANCELLED" {
				t.Errorf("iteration %d: rejected completions = %v, want exactly one for token %d with reason JOB_CANCELLED", i, rej, token)
			}
		case leaseholdv1.Phase_PHASE_SUCCEEDED:
			succeeded++
			if completeErr != nil {
				t.Errorf("iteration %d: job SUCCEEDED but Complete = %v", i, completeErr)
			}
			if !errors.Is(cancelErr, client.ErrAlreadyTerminal) {
				t.Errorf("iteration %d: job SUCCEEDED but CancelJob = %v, want FAILED_PRECONDITION ALREADY_TERMINAL", i, cancelErr)
			}
			if a := before.GetArtifact(); a.GetToken() != token || a.GetDigest() != digest {
				t.Errorf("iteration %d: artifact = %v, want digest %s under token %d", i, a, digest, token)
			}
			if rej := rejections(); len(rej) != 0 {
				t.Errorf("iteration %d: rejected completions = %v, want none", i, rej)
			}
		default:
			t.Fatalf("iteration %d: job phase = %v after Complete and CancelJob, want SUCCEEDED or CANCELLED", i, before.GetPhase())
		}

		// Replay both calls: each answers as the outcome that stands and
		// nothing changes.
		replayResp, replayCompleteErr := rs.Complete(ctx, complete)
		_, replayCancelErr := alpha.CancelJob(ctx, jobID, "race")
		if before.GetPhase() == leaseholdv1.Phase_PHASE_SUCCEEDED {
			if replayCompleteErr != nil || !replayResp.GetReplayed() {
				t.Errorf("iteration %d: replayed Complete = replayed %v, %v; want a replayed success", i, replayResp.GetReplayed(), replayCompleteErr)
			}
			if !errors.Is(replayCancelErr, client.ErrAlreadyTerminal) {
				t.Errorf("iteration %d: replayed CancelJob = %v, want ALREADY_TERMINAL", i, replayCancelErr)
			}
		} else {
			if reasonOf(replayCompleteErr) != "JOB_CANCELLED" {
				t.Errorf("iteration %d: replayed Complete = %v, want ABORTED JOB_CANCELLED", i, replayCompleteErr)
			}
			if replayCancelErr != nil {
				t.Errorf("iteration %d: replayed CancelJob = %v, want OK", i, replayCancelErr)
			}
		}
		after, err := alpha.GetJob(ctx, jobID)
		if err != nil {
			t.Fatalf("iteration %d: GetJob: %v", i, err)
		}
		if !proto.Equal(before, after) {
			t.Errorf("iteration %d: replays changed the job (-before +after):\n%s", i, cmp.Diff(before, after, protocmp.Transform()))
		}
		if before.GetPhase() == leaseholdv1.Phase_PHASE_CANCELLED {
			if rej := rejections(); len(rej) != 1 {
				t.Errorf("iteration %d: after replays, rejected completions = %d, want still 1", i, len(rej))
			}
		}
		if t.Failed() {
			break
		}
	}
	t.Logf("%d iterations: %d SUCCEEDED (completion won), %d CANCELLED (cancel won)", iterations, succeeded, cancelled)
	if succeeded == 0 || cancelled == 0 {
		t.Errorf("outcomes: %d SUCCEEDED, %d CANCELLED; want both to occur", succeeded, cancelled)
	}
}

// upload stores content as the preview of (jobID, token) and returns its digest.
func upload(t *testing.T, rs leaseholdv1.RendererServiceClient, jobID string, token uint64, content []byte) string {
	t.Helper()
	stream, err := rs.UploadArtifact(testContext(t))
	if err != nil {
		t.Fatalf("UploadArtifact: %v", err)
	}
	msgs := []*leaseholdv1.UploadArtifactRequest{
		{Part: &leaseholdv1.UploadArtifactRequest_Metadata{Metadata: &leaseholdv1.ArtifactMetadata{JobId: jobID, Token: token, RendererId: "racer", ContentType: "image/png"}}},
		{Part: &leaseholdv1.UploadArtifactRequest_Chunk{Chunk: bytes.Clone(content)}},
	}
	for _, m := range msgs {
		if err := stream.Send(m); err != nil {
			t.Fatalf("UploadArtifact send: %v", err)
		}
	}
	resp, err := stream.CloseAndRecv()
	if err != nil {
		t.Fatalf("UploadArtifact: %v", err)
	}
	return resp.GetDigest()
}

// reasonOf returns the ErrorInfo reason of a status error, or "".
func reasonOf(err error) string {
	for _, d := range status.Convert(err).Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info.GetReason()
		}
	}
	return ""
}

// eventually calls check until it reports true, at most for the failsafe
// timeout, pausing briefly between calls, and returns its last value. It
// is for state that a process commits after the event the test saw.
func eventually[T any](t *testing.T, check func() (T, bool)) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		v, ok := check()
		if ok {
			return v
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			t.Fatalf("condition not met within %v; last value %v", waitTimeout, v)
		}
	}
}
