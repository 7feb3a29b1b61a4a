package server

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/engine"
	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	"github.com/leasehold/leasehold/coordinator/internal/store"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"github.com/leasehold/leasehold/internal/testclock"
	"google.golang.org/grpc/codes"
)

// completeWith completes g's lease as r-1, naming digest.
func (b *testBundle) completeWith(t *testing.T, g *leaseholdv1.Grant, token uint64, digest string) error {
	t.Helper()
	_, err := b.rend.Complete(as(t, renderer), &leaseholdv1.CompleteRequest{JobId: g.GetJobId(), Token: token, RendererId: "r-1",
		Outcome: &leaseholdv1.CompleteRequest_Success{Success: &leaseholdv1.CompleteSuccess{ArtifactDigest: digest}}})
	return err
}

// rejections lists every rejected completion.
func (b *testBundle) rejections(t *testing.T) []*leaseholdv1.RejectedCompletion {
	t.Helper()
	resp, err := b.ops.ListRejectedCompletions(as(t, operator), &leaseholdv1.ListRejectedCompletionsRequest{PageSize: 1000})
	if err != nil {
		t.Fatal(err)
	}
	return resp.GetRejections()
}

// TestArtifacts checks that a preview is bound to the lease it was made
// under, never empty, and that uploads are bounded and fenced.
func TestArtifacts(t *testing.T) {
	t.Parallel()

	t.Run("A completion naming another job's upload is FAILED_PRECONDITION ARTIFACT_NOT_FOUND", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.submit(t, alpha, "alpha", "r", doc("a.pdf"), doc("b.pdf"))
		g := b.acquire(t, 2)
		digest := b.upload(t, g[0], []byte("preview of a"))
		wantError(t, b.completeWith(t, g[1], g[1].GetLease().GetToken(), digest), codes.FailedPrecondition, reasonArtifactNotFound)
		if j := b.getJob(t, g[1].GetJobId()); j.GetPhase() != leaseholdv1.Phase_PHASE_LEASED || j.GetArtifact() != nil {
			t.Errorf("job after the refusal = %v with artifact %v, want LEASED without one", j.GetPhase(), j.GetArtifact())
		}
		if err := b.completeWith(t, g[0], g[0].GetLease().GetToken(), digest); err != nil {
			t.Errorf("the uploading lease's own completion: %v", err)
		}
	})

	t.Run("A completion naming an upload of an earlier lease of the job is FAILED_PRECONDITION ARTIFACT_NOT_FOUND", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		first := b.leaseOne(t)
		digest := b.upload(t, first, []byte("preview of attempt 1"))
		if _, err := b.rend.Complete(as(t, renderer), failure(first, leaseholdv1.FailureClass_FAILURE_CLASS_TRANSIENT)); err != nil {
			t.Fatal(err)
		}
		b.clock.Advance(11 * time.Second) // past the longest backoff
		if err := b.eng.Tick(context.Background()); err != nil {
			t.Fatal(err)
		}
		second := b.acquire(t, 1)[0]
		if second.GetJobId() != first.GetJobId() || second.GetLease().GetAttempt() != 2 {
			t.Fatalf("second grant = %v, want %s attempt 2", second, first.GetJobId())
		}
		wantError(t, b.completeWith(t, second, second.GetLease().GetToken(), digest), codes.FailedPrecondition, reasonArtifactNotFound)
	})

	t.Run("A stale completion naming a missing upload is refused as stale, and recorded", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		g := b.leaseOne(t)
		wantError(t, b.completeWith(t, g, g.GetLease().GetToken()+100, sha([]byte("never uploaded"))), codes.Aborted, "STALE_LEASE")
		if got := len(b.rejections(t)); got != 1 {
			t.Errorf("rejections = %d, want 1", got)
		}
		// A missing upload under the live lease is no fencing failure.
		wantError(t, b.completeWith(t, g, g.GetLease().GetToken(), sha([]byte("never uploaded"))), codes.FailedPrecondition, reasonArtifactNotFound)
		if got := len(b.rejections(t)); got != 1 {
			t.Errorf("rejections after ARTIFACT_NOT_FOUND = %d, want still 1", got)
		}
	})

	t.Run("An empty upload is INVALID_ARGUMENT EMPTY_ARTIFACT", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		g := b.leaseOne(t)
		_, err := b.sendUpload(t, renderer, uploadMeta(g, g.GetLease().GetToken(), "r-1"))
		wantError(t, err, codes.InvalidArgument, reasonEmptyArtifact)
		_, err = b.sendUpload(t, renderer, uploadMeta(g, g.GetLease().GetToken(), "r-1"), chunk(nil))
		wantError(t, err, codes.InvalidArgument, reasonEmptyArtifact)
	})

	t.Run("An empty inline preview is INVALID_ARGUMENT EMPTY_ARTIFACT on both paths", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		g := b.leaseOne(t)
		wantError(t, b.completeWith(t, g, g.GetLease().GetToken(), ""), codes.InvalidArgument, reasonEmptyArtifact)
		sc := b.openSession(t, hello("r-1", "i-1", 1), 0)
		r := sc.call(&leaseholdv1.SessionRequest{Completions: []*leaseholdv1.SessionCompletion{inline(g, nil)}}).GetResults()[0]
		if codes.Code(r.GetCode()) != codes.InvalidArgument || r.GetReason() != reasonEmptyArtifact {
			t.Errorf("session result = %v, want INVALID_ARGUMENT EMPTY_ARTIFACT", r)
		}
		if j := b.getJob(t, g.GetJobId()); j.GetPhase() != leaseholdv1.Phase_PHASE_LEASED {
			t.Errorf("job = %v, want LEASED", j.GetPhase())
		}
	})

	t.Run("An upload that sends nothing for the idle timeout ends DEADLINE_EXCEEDED UPLOAD_TIMEOUT", func(t *testing.T) {
		t.Parallel()
		b := setup(t, func(o *options) {
			o.services = func(s *Services) { s.Renderers.uploadIdle = 50 * time.Millisecond }
		})
		g := b.leaseOne(t)
		stream, err := b.rend.UploadArtifact(as(t, renderer))
		if err != nil {
			t.Fatal(err)
		}
		if err := stream.Send(uploadMeta(g, g.GetLease().GetToken(), "r-1")); err != nil {
			t.Fatal(err)
		}
		// Wait for the server's answer without closing: the upload is idle.
		err = stream.RecvMsg(&leaseholdv1.UploadArtifactResponse{})
		wantError(t, err, codes.DeadlineExceeded, reasonUploadTimeout)
	})

	t.Run("An upload that takes longer than the total timeout ends DEADLINE_EXCEEDED UPLOAD_TIMEOUT", func(t *testing.T) {
		t.Parallel()
		b := setup(t, func(o *options) {
			o.services = func(s *Services) { s.Renderers.uploadTotal = 50 * time.Millisecond }
		})
		g := b.leaseOne(t)
		stream, err := b.rend.UploadArtifact(as(t, renderer))
		if err != nil {
			t.Fatal(err)
		}
		if err := stream.Send(uploadMeta(g, g.GetLease().GetToken(), "r-1")); err != nil {
			t.Fatal(err)
		}
		// Keep sending well within the idle timeout until the server ends it.
		for stream.Send(chunk([]byte("x"))) == nil {
		}
		err = stream.RecvMsg(&leaseholdv1.UploadArtifactResponse{})
		wantError(t, err, codes.DeadlineExceeded, reasonUploadTimeout)
	})

	t.Run("An upload whose lease expired before it ended is refused when stored", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		g := b.leaseOne(t)
		stream, err := b.rend.UploadArtifact(as(t, renderer))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range []*leaseholdv1.UploadArtifactRequest{uploadMeta(g, g.GetLease().GetToken(), "r-1"), chunk([]byte("late preview"))} {
			if err := stream.Send(m); err != nil {
				t.Fatal(err)
			}
		}
		// The lease is checked at the start only for who holds it; its
		// deadline passes before the upload ends, and the writer refuses to
		// store the preview.
		b.clock.Advance(16 * time.Second)
		_, err = stream.CloseAndRecv()
		wantError(t, err, codes.Aborted, "LEASE_EXPIRED")
		if j := b.getJob(t, g.GetJobId()); j.GetPhase() != leaseholdv1.Phase_PHASE_RETRY_WAIT {
			t.Errorf("job = %v, want RETRY_WAIT after the expiry", j.GetPhase())
		}
		_, err = b.eng.Artifact(jobs.Job{ID: mustJobID(t, g.GetJobId()), Artifact: jobs.Artifact{Token: g.GetLease().GetToken()}})
		if !errors.Is(err, store.ErrArtifactNotFound) {
			t.Errorf("preview stored under the expired lease: %v, want ErrArtifactNotFound", err)
		}
	})

	t.Run("A step of the wall clock does not refuse an upload under a live lease", func(t *testing.T) {
		t.Parallel()
		// The writer keeps deadlines on its monotonic clock; the wall clock
		// jumps ahead past the lease's recorded deadline.
		origin := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		mono := testclock.New(origin)
		b := setup(t, func(o *options) {
			o.engine = func(c *engine.Config) { c.Mono = mono.Mono }
		})
		g := b.leaseOne(t)
		b.clock.Advance(time.Hour)
		mono.Advance(time.Second)
		resp, err := b.sendUpload(t, renderer, uploadMeta(g, g.GetLease().GetToken(), "r-1"), chunk([]byte("png")))
		if err != nil {
			t.Fatalf("UploadArtifact under a live lease after a wall-clock step: %v", err)
		}
		if err := b.completeWith(t, g, g.GetLease().GetToken(), resp.GetDigest()); err != nil {
			t.Fatalf("Complete: %v", err)
		}
		if j := b.getJob(t, g.GetJobId()); j.GetPhase() != leaseholdv1.Phase_PHASE_SUCCEEDED {
			t.Errorf("job = %v, want SUCCEEDED", j.GetPhase())
		}
	})
}

func mustJobID(t *testing.T, wire string) uint64 {
	t.Helper()
	id, err := parseJobID(wire, "job_id")
	if err != nil {
		t.Fatal(err)
	}
	return id
}
