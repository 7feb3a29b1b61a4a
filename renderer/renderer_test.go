package renderer_test

import (
	"bytes"
	"context"
	"errors"
	"image/png"
	"log/slog"
	"net/http"
	"regexp"
	"slices"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/durationpb"

	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"github.com/leasehold/leasehold/renderer"
	"github.com/leasehold/leasehold/renderer/mock"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// onlyKeys compares maps on the given keys only.
func onlyKeys(keys ...string) cmp.Option {
	keep := map[string]bool{}
	for _, k := range keys {
		keep[k] = true
	}
	return cmp.FilterPath(func(p cmp.Path) bool {
		if mi, ok := p.Last().(cmp.MapIndex); ok {
			return !keep[mi.Key().String()]
		}
		return false
	}, cmp.Ignore())
}

// TestWorkerCompletesInline ensures the session opens with the renderer's
// hello, and a granted lease is acknowledged, rendered and completed with
// the preview inline, together with the credit that refills its slot.
func TestWorkerCompletesInline(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := setup(t, renderer.Config{Provider: newMock(t, mock.Config{}), Capacity: 2}, nil)

		s := b.session(t)
		wantHello := &leaseholdv1.SessionRequest{
			Hello: &leaseholdv1.SessionHello{
				RendererId:      testRendererID,
				Capacity:        2,
				MaxMessageBytes: renderer.DefaultMaxReceiveBytes,
			},
			Credits: 2,
		}
		if diff := cmp.Diff(wantHello, s.hello, protocmp.Transform(),
			protocmp.IgnoreFields(&leaseholdv1.SessionHello{}, "instance_id")); diff != "" {
			t.Errorf("hello (-want +got):\n%s", diff)
		}
		if id := s.hello.GetHello().GetInstanceId(); !regexp.MustCompile(`^[0-9a-f]{16}$`).MatchString(id) {
			t.Errorf("instance id = %q, want 16 hex digits", id)
		}

		s.grantNow(grant("job-1", 42, pdf("%PDF-1.7 hello")))
		got := s.waitReq(t, "the completion", func(r *leaseholdv1.SessionRequest) bool { return len(r.GetCompletions()) > 0 })
		c := got.GetCompletions()[0]
		if c.GetJobId() != "job-1" || c.GetToken() != 42 {
			t.Errorf("completion names %s/%d, want job-1/42", c.GetJobId(), c.GetToken())
		}
		if got.GetCredits() != 1 {
			t.Errorf("the completion's request carries %d credits, want 1 (the slot it freed)", got.GetCredits())
		}
		succ := c.GetSuccess()
		if succ.GetContentType() != mock.ContentType || succ.GetArtifactDigest() != "" {
			t.Errorf("success = content type %q, digest %q; want %q inline without a digest", succ.GetContentType(), succ.GetArtifactDigest(), mock.ContentType)
		}
		if _, err := png.Decode(bytes.NewReader(succ.GetContent())); err != nil {
			t.Errorf("inline preview does not decode: %v", err)
		}
		chunks, err := mock.TextChunks(succ.GetContent())
		if err != nil {
			t.Fatalf("inline preview: %v", err)
		}
		if diff := cmp.Diff(map[string]string{mock.KeyJobID: "job-1", mock.KeyToken: "42", mock.KeyRendererID: testRendererID}, chunks,
			onlyKeys(mock.KeyJobID, mock.KeyToken, mock.KeyRendererID)); diff != "" {
			t.Errorf("preview text chunks (-want +got):\n%s", diff)
		}

		done := b.waitLog(t, "completed")
		if diff := cmp.Diff(map[string]string{"job": "job-1", "token": "42", "outcome": "success", "phase": "PHASE_SUCCEEDED", "replayed": "false"}, done.attrs); diff != "" {
			t.Errorf("completed log (-want +got):\n%s", diff)
		}
		if got, want := b.readRecord(t), "job-1 42\n"; got != want {
			t.Errorf("record file = %q, want %q", got, want)
		}
		synctest.Wait()
		select {
		case u := <-b.srv.uploads:
			t.Errorf("an inline preview was uploaded too: %v", u.meta)
		default:
		}
	})
}

// TestWorkerAcknowledgesReceipt ensures a grant is acknowledged in received
// while its render is still running.
func TestWorkerAcknowledgesReceipt(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		p := newGated(t)
		p.hold("job-r")
		b := setup(t, renderer.Config{Provider: p, Capacity: 1}, nil)
		s := b.session(t)
		s.grantNow(grant("job-r", 3, pdf("x")))
		recv(t, p.started, "the render to start")
		req := s.waitReq(t, "a receipt", func(r *leaseholdv1.SessionRequest) bool { return len(r.GetReceived()) > 0 })
		if diff := cmp.Diff([]*leaseholdv1.LeaseRef{ref("job-r", 3)}, req.GetReceived(), protocmp.Transform()); diff != "" {
			t.Errorf("received (-want +got):\n%s", diff)
		}
		if n := len(req.GetCompletions()); n != 0 {
			t.Errorf("the receipt came with %d completions of a held render", n)
		}
	})
}

// TestWorkerUploadsLargePreview ensures a preview above the welcome's inline
// limit is uploaded first and completed by digest.
func TestWorkerUploadsLargePreview(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		p := newGated(t)
		p.size = 70 << 10
		b := setup(t, renderer.Config{Provider: p, Capacity: 1}, func(f *fakeCoordinator) {
			f.welcome.MaxInlineArtifactBytes = 64 << 10
		})
		s := b.session(t)
		s.grantNow(grant("job-big", 8, pdf("x")))

		up := recv(t, b.srv.uploads, "the upload")
		wantMeta := &leaseholdv1.ArtifactMetadata{JobId: "job-big", Token: 8, RendererId: testRendererID, ContentType: "application/octet-stream", ExpectedSha256: up.digest}
		if diff := cmp.Diff(wantMeta, up.meta, protocmp.Transform()); diff != "" {
			t.Errorf("upload metadata (-want +got):\n%s", diff)
		}
		if got := len(up.content); got != 70<<10 {
			t.Errorf("uploaded %d bytes, want %d", got, 70<<10)
		}
		req := s.waitReq(t, "the completion", func(r *leaseholdv1.SessionRequest) bool { return len(r.GetCompletions()) > 0 })
		want := &leaseholdv1.SessionCompletion{
			JobId: "job-big", Token: 8,
			Outcome: &leaseholdv1.SessionCompletion_Success{Success: &leaseholdv1.CompleteSuccess{ArtifactDigest: up.digest}},
		}
		if diff := cmp.Diff(want, req.GetCompletions()[0], protocmp.Transform()); diff != "" {
			t.Errorf("completion (-want +got):\n%s", diff)
		}
		b.waitLog(t, "completed")
	})
}

// TestWorkerReportsFailures ensures render failures complete with their
// class.
func TestWorkerReportsFailures(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := setup(t, renderer.Config{Provider: newMock(t, mock.Config{}), Capacity: 1}, nil)
		s := b.session(t)
		s.grantNow(grant("job-m", 5, &leaseholdv1.Document{Name: "macro.docm"}))
		req := s.waitReq(t, "the completion", func(r *leaseholdv1.SessionRequest) bool { return len(r.GetCompletions()) > 0 })
		c := req.GetCompletions()[0]
		if got, want := c.GetFailure().GetClass(), leaseholdv1.FailureClass_FAILURE_CLASS_UNSUPPORTED_FORMAT; got != want {
			t.Errorf("failure class = %v, want %v", got, want)
		}
		done := b.waitLog(t, "completed")
		if diff := cmp.Diff(map[string]string{"job": "job-m", "outcome": "failure", "class": "FAILURE_CLASS_UNSUPPORTED_FORMAT"}, done.attrs,
			onlyKeys("job", "outcome", "class")); diff != "" {
			t.Errorf("completed log (-want +got):\n%s", diff)
		}
		if got, want := b.metric(t, `leasehold_renderer_render_failures_total{class="FAILURE_CLASS_UNSUPPORTED_FORMAT"}`),
			`leasehold_renderer_render_failures_total{class="FAILURE_CLASS_UNSUPPORTED_FORMAT"} 1`; got != want {
			t.Errorf("metric = %q, want %q", got, want)
		}
	})
}

// TestWorkerCredits ensures the worker never holds more leases than its
// capacity: a grant beyond it is handed back, and a slot's credit comes back
// only once its lease has ended.
func TestWorkerCredits(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		p := newGated(t)
		p.hold("job-1", "job-2", "job-3")
		b := setup(t, renderer.Config{Provider: p, Capacity: 2}, nil)
		s := b.session(t)
		if got := s.hello.GetCredits(); got != 2 {
			t.Fatalf("hello credits = %d, want 2", got)
		}
		s.grantNow(grant("job-1", 1, pdf("a")), grant("job-2", 2, pdf("b")), grant("job-3", 3, pdf("c")))
		req := s.waitReq(t, "a hand-back", func(r *leaseholdv1.SessionRequest) bool { return len(r.GetHandBacks()) > 0 })
		if diff := cmp.Diff([]*leaseholdv1.LeaseRef{ref("job-3", 3)}, req.GetHandBacks(), protocmp.Transform()); diff != "" {
			t.Errorf("hand-backs (-want +got):\n%s", diff)
		}
		started := []string{recv(t, p.started, "a render"), recv(t, p.started, "a render")}
		slices.Sort(started)
		if diff := cmp.Diff([]string{"job-1", "job-2"}, started); diff != "" {
			t.Errorf("renders started (-want +got):\n%s", diff)
		}
		if req.GetCredits() != 0 {
			t.Errorf("credits = %d while every slot is busy, want 0", req.GetCredits())
		}

		p.release("job-1")
		req = s.waitReq(t, "a credit", func(r *leaseholdv1.SessionRequest) bool { return r.GetCredits() > 0 })
		if req.GetCredits() != 1 {
			t.Errorf("credits = %d after one lease ended, want 1", req.GetCredits())
		}
		if n := len(req.GetCompletions()); n != 1 {
			t.Errorf("the credit came with %d completions, want the freed lease's 1", n)
		}
		synctest.Wait()
		select {
		case job := <-p.started:
			t.Errorf("the handed-back %s was rendered", job)
		default:
		}
		if got := b.readRecord(t); got != "job-1 1\njob-2 2\njob-3 3\n" {
			t.Errorf("record file = %q, want every grant, the handed-back one too", got)
		}
	})
}

// TestWorkerHeartbeats ensures leases in progress are heartbeated at the
// interval the coordinator announces, counted from the welcome: not
// sooner, not later, and again at every interval while the render runs.
func TestWorkerHeartbeats(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		const interval = 5 * time.Second
		p := newGated(t)
		p.hold("job-h")
		b := setup(t, renderer.Config{Provider: p, Capacity: 2}, func(f *fakeCoordinator) {
			f.welcome.HeartbeatInterval = durationpb.New(interval)
		})
		s := b.session(t)
		welcomed := time.Now()
		s.grantNow(grant("job-h", 4, pdf("x")))
		for i := 1; i <= 3; i++ {
			req := s.waitReq(t, "a heartbeat", func(r *leaseholdv1.SessionRequest) bool { return len(r.GetHeartbeats()) > 0 })
			if got, want := time.Since(welcomed), time.Duration(i)*interval; got != want {
				t.Errorf("heartbeat %d came %v after the welcome, want %v", i, got, want)
			}
			if diff := cmp.Diff([]*leaseholdv1.LeaseRef{ref("job-h", 4)}, req.GetHeartbeats(), protocmp.Transform()); diff != "" {
				t.Errorf("heartbeat %d (-want +got):\n%s", i, diff)
			}
		}
	})
}

// pausingProvider renders a fixed preview after a simulated stall that the
// test starts and ends. Jobs other than the pausing one are held until their
// context ends.
type pausingProvider struct {
	job     string
	started chan string
	pause   chan struct{}
	paused  chan struct{}
	resume  chan struct{}
}

func (p *pausingProvider) Render(ctx context.Context, in renderer.Input) (renderer.Output, error) {
	p.started <- in.JobID
	if in.JobID != p.job {
		<-ctx.Done()
		return renderer.Output{}, ctx.Err()
	}
	<-p.pause
	in.OnPause()
	p.paused <- struct{}{}
	select {
	case <-p.resume:
	case <-ctx.Done():
		return renderer.Output{}, ctx.Err()
	}
	return renderer.Output{Content: []byte("preview"), ContentType: "image/png"}, nil
}

// TestWorkerPausedRender ensures a lease is left out of heartbeats while its
// render simulates a stall, and is completed with its own token afterwards.
func TestWorkerPausedRender(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		p := &pausingProvider{
			job: "job-p", started: make(chan string, 2), pause: make(chan struct{}),
			paused: make(chan struct{}, 1), resume: make(chan struct{}),
		}
		b := setup(t, renderer.Config{Provider: p, Capacity: 2, HeartbeatInterval: 5 * time.Millisecond}, nil)
		s := b.session(t)
		s.grantNow(grant("job-p", 31, pdf("x")), grant("job-other", 32, pdf("y")))
		recv(t, p.started, "a render to start")
		recv(t, p.started, "a render to start")
		both := []*leaseholdv1.LeaseRef{ref("job-other", 32), ref("job-p", 31)}
		s.waitReq(t, "both leases before the pause", func(r *leaseholdv1.SessionRequest) bool {
			return cmp.Equal(both, r.GetHeartbeats(), protocmp.Transform())
		})

		close(p.pause)
		recv(t, p.paused, "the pause to start")
		if got := b.waitLog(t, "render paused").attrs["job"]; got != "job-p" {
			t.Errorf("render paused job = %q, want job-p", got)
		}
		// Both leases are held throughout, so a heartbeat without job-p can only
		// come from its pause.
		s.waitReq(t, "only the other lease during the pause", func(r *leaseholdv1.SessionRequest) bool {
			return cmp.Equal([]*leaseholdv1.LeaseRef{ref("job-other", 32)}, r.GetHeartbeats(), protocmp.Transform())
		})

		close(p.resume)
		req := s.waitReq(t, "the completion", func(r *leaseholdv1.SessionRequest) bool { return len(r.GetCompletions()) > 0 })
		if got := req.GetCompletions()[0].GetToken(); got != 31 {
			t.Errorf("completion token = %d, want 31", got)
		}
	})
}

// TestWorkerStopsLostLeases ensures a lease answered LOST, or revoked, stops
// its render and is never completed, and that a revocation is acknowledged
// once the render has stopped.
func TestWorkerStopsLostLeases(t *testing.T) {
	t.Parallel()

	t.Run("a lease answered LOST stops and frees its slot", func(t *testing.T) {
		t.Parallel()
		synctest.Test(t, func(t *testing.T) {
			p := newGated(t)
			p.hold("job-l")
			b := setup(t, renderer.Config{Provider: p, Capacity: 1}, nil)
			s := b.session(t)
			s.grantNow(grant("job-l", 11, pdf("x")))
			recv(t, p.started, "the render to start")
			s.push <- &leaseholdv1.SessionResponse{Leases: []*leaseholdv1.LeaseStatus{{
				JobId: "job-l", Token: 11, State: leaseholdv1.LeaseState_LEASE_STATE_LOST, Reason: "LEASE_EXPIRED",
			}}}
			if got := recv(t, p.stopped, "the render to stop"); got != "job-l" {
				t.Errorf("stopped %q, want job-l", got)
			}
			req := s.waitReq(t, "the freed slot's credit", func(r *leaseholdv1.SessionRequest) bool { return r.GetCredits() > 0 })
			if n := len(req.GetCompletions()); n != 0 {
				t.Errorf("a lost lease was completed: %v", req.GetCompletions())
			}
			if diff := cmp.Diff(map[string]string{"job": "job-l", "token": "11", "reason": "LEASE_EXPIRED"}, b.waitLog(t, "lease lost").attrs); diff != "" {
				t.Errorf("lease lost log (-want +got):\n%s", diff)
			}
		})
	})

	t.Run("a revoked lease stops and is acknowledged", func(t *testing.T) {
		t.Parallel()
		synctest.Test(t, func(t *testing.T) {
			p := newGated(t)
			p.hold("job-c")
			b := setup(t, renderer.Config{Provider: p, Capacity: 2}, nil)
			s := b.session(t)
			s.grantNow(grant("job-c", 7, pdf("x")))
			recv(t, p.started, "the render to start")
			s.push <- &leaseholdv1.SessionResponse{Revoked: []*leaseholdv1.LeaseStatus{{
				JobId: "job-c", Token: 7, State: leaseholdv1.LeaseState_LEASE_STATE_LOST, Reason: "JOB_CANCELLED",
			}}}
			recv(t, p.stopped, "the render to stop")
			req := s.waitReq(t, "a cancel ack", func(r *leaseholdv1.SessionRequest) bool { return len(r.GetCancelAcks()) > 0 })
			if diff := cmp.Diff([]*leaseholdv1.LeaseRef{ref("job-c", 7)}, req.GetCancelAcks(), protocmp.Transform()); diff != "" {
				t.Errorf("cancel acks (-want +got):\n%s", diff)
			}
			// The ack is queued together with the end of the render, so a
			// completion would have come with it or before it.
			if n := len(req.GetCompletions()); n != 0 {
				t.Errorf("a revoked lease was completed: %v", req.GetCompletions())
			}
			if diff := cmp.Diff(map[string]string{"job": "job-c", "token": "7", "reason": "JOB_CANCELLED"}, b.waitLog(t, "lease lost").attrs); diff != "" {
				t.Errorf("lease lost log (-want +got):\n%s", diff)
			}
			b.waitLog(t, "cancel acknowledged")
		})
	})

	t.Run("a revocation of a lease not running is acknowledged at once", func(t *testing.T) {
		t.Parallel()
		synctest.Test(t, func(t *testing.T) {
			b := setup(t, renderer.Config{Provider: newGated(t), Capacity: 1}, nil)
			s := b.session(t)
			s.push <- &leaseholdv1.SessionResponse{Revoked: []*leaseholdv1.LeaseStatus{{JobId: "job-x", Token: 70, Reason: "JOB_CANCELLED"}}}
			req := s.waitReq(t, "a cancel ack", func(r *leaseholdv1.SessionRequest) bool { return len(r.GetCancelAcks()) > 0 })
			if diff := cmp.Diff([]*leaseholdv1.LeaseRef{ref("job-x", 70)}, req.GetCancelAcks(), protocmp.Transform()); diff != "" {
				t.Errorf("cancel acks (-want +got):\n%s", diff)
			}
		})
	})
}

// TestWorkerCompletionRejected ensures a completion answered ABORTED is
// logged as "completion rejected" with the reason, and counted.
func TestWorkerCompletionRejected(t *testing.T) {
	t.Parallel()

	t.Run("an aborted completion is rejected with its reason", func(t *testing.T) {
		t.Parallel()
		synctest.Test(t, func(t *testing.T) {
			b := setup(t, renderer.Config{Provider: newMock(t, mock.Config{}), Capacity: 1}, func(f *fakeCoordinator) {
				f.answer = func(c *leaseholdv1.SessionCompletion) *leaseholdv1.CompletionResult {
					return &leaseholdv1.CompletionResult{JobId: c.GetJobId(), Token: c.GetToken(), Code: int32(codes.Aborted),
						Reason: "LEASE_EXPIRED", Phase: leaseholdv1.Phase_PHASE_SUCCEEDED, CurrentToken: 2}
				}
			})
			s := b.session(t)
			s.grantNow(grant("j-1", 1, pdf("x")))
			rejected := b.waitLog(t, "completion rejected")
			if rejected.level != slog.LevelWarn {
				t.Errorf("completion rejected logged at %v, want WARN", rejected.level)
			}
			if diff := cmp.Diff(map[string]string{"job": "j-1", "token": "1", "reason": "LEASE_EXPIRED"}, rejected.attrs); diff != "" {
				t.Errorf("completion rejected log (-want +got):\n%s", diff)
			}
			if got, want := b.metric(t, `leasehold_renderer_completions_rejected_total{reason="LEASE_EXPIRED"}`),
				`leasehold_renderer_completions_rejected_total{reason="LEASE_EXPIRED"} 1`; got != want {
				t.Errorf("metric = %q, want %q", got, want)
			}
		})
	})

	t.Run("a completion missing its refused upload is rejected with the upload's reason", func(t *testing.T) {
		t.Parallel()
		synctest.Test(t, func(t *testing.T) {
			p := newGated(t)
			p.size = 2 << 20 // above the 1 MiB inline limit
			b := setup(t, renderer.Config{Provider: p, Capacity: 1}, func(f *fakeCoordinator) {
				f.uploadErrs = []error{statusErr(t, codes.Aborted, "LEASE_EXPIRED")}
				f.answer = func(c *leaseholdv1.SessionCompletion) *leaseholdv1.CompletionResult {
					return &leaseholdv1.CompletionResult{JobId: c.GetJobId(), Token: c.GetToken(), Code: int32(codes.FailedPrecondition), Reason: "ARTIFACT_NOT_FOUND"}
				}
			})
			s := b.session(t)
			s.grantNow(grant("job-e", 13, pdf("x")))
			up := recv(t, b.srv.uploads, "the upload")
			req := s.waitReq(t, "the completion", func(r *leaseholdv1.SessionRequest) bool { return len(r.GetCompletions()) > 0 })
			if got := req.GetCompletions()[0].GetSuccess().GetArtifactDigest(); got != up.digest {
				t.Errorf("completion digest = %q, want the refused upload's %q", got, up.digest)
			}
			rejected := b.waitLog(t, "completion rejected")
			if diff := cmp.Diff(map[string]string{"job": "job-e", "token": "13", "reason": "LEASE_EXPIRED", "stage": "upload"}, rejected.attrs,
				onlyKeys("job", "token", "reason", "stage")); diff != "" {
				t.Errorf("completion rejected log (-want +got):\n%s", diff)
			}
		})
	})
}

// TestWorkerMatchesAnswersByLease ensures each CompletionResult is applied
// to the completion of the lease it names, whatever its place among the
// answers, and that a result naming no completion in flight is logged as
// an error and takes no other completion's answer.
func TestWorkerMatchesAnswersByLease(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := setup(t, renderer.Config{Provider: newMock(t, mock.Config{}), Capacity: 2}, func(f *fakeCoordinator) {
			f.answer = func(*leaseholdv1.SessionCompletion) *leaseholdv1.CompletionResult { return nil }
		})
		s := b.session(t)
		s.grantNow(grant("job-a", 1, pdf("a")), grant("job-b", 2, &leaseholdv1.Document{Name: "macro.docm"}))
		var sent []string
		for len(sent) < 2 {
			req := s.waitReq(t, "the completions", func(r *leaseholdv1.SessionRequest) bool { return len(r.GetCompletions()) > 0 })
			for _, c := range req.GetCompletions() {
				sent = append(sent, c.GetJobId())
			}
		}
		slices.Sort(sent)
		if diff := cmp.Diff([]string{"job-a", "job-b"}, sent); diff != "" {
			t.Fatalf("completions sent (-want +got):\n%s", diff)
		}

		s.push <- &leaseholdv1.SessionResponse{Results: []*leaseholdv1.CompletionResult{
			{JobId: "job-x", Token: 9, Phase: leaseholdv1.Phase_PHASE_SUCCEEDED, CurrentToken: 9},
			{JobId: "job-b", Token: 2, Phase: leaseholdv1.Phase_PHASE_FAILED, CurrentToken: 2},
		}}
		s.push <- &leaseholdv1.SessionResponse{Results: []*leaseholdv1.CompletionResult{
			{JobId: "job-a", Token: 1, Code: int32(codes.Aborted), Reason: "STALE_LEASE", Phase: leaseholdv1.Phase_PHASE_LEASED, CurrentToken: 3},
		}}
		got := b.logsOf(t, 3, "completed", "completion rejected", "completion result without a completion", "completion result out of order")
		want := []logEvent{
			{level: slog.LevelError, msg: "completion result without a completion", attrs: map[string]string{"job": "job-x", "token": "9"}},
			{level: slog.LevelDebug, msg: "completed", attrs: map[string]string{"job": "job-b", "token": "2", "outcome": "failure",
				"class": "FAILURE_CLASS_UNSUPPORTED_FORMAT", "phase": "PHASE_FAILED", "replayed": "false"}},
			{level: slog.LevelWarn, msg: "completion rejected", attrs: map[string]string{"job": "job-a", "token": "1", "reason": "STALE_LEASE"}},
		}
		if diff := cmp.Diff(want, got, cmp.AllowUnexported(logEvent{})); diff != "" {
			t.Errorf("logs of the answers (-want +got):\n%s", diff)
		}
		if got, want := b.metric(t, `leasehold_renderer_completions_rejected_total{reason="STALE_LEASE"}`),
			`leasehold_renderer_completions_rejected_total{reason="STALE_LEASE"} 1`; got != want {
			t.Errorf("metric = %q, want %q", got, want)
		}
	})
}

// TestWorkerReconnects ensures a broken session is reopened with the leases
// in progress in hello.holding, that unanswered completions are sent again,
// and that a lease the welcome says is lost stops.
func TestWorkerReconnects(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		p := newGated(t)
		p.hold("job-hold", "job-gone")
		var firstSession atomic.Bool
		firstSession.Store(true)
		b := setup(t, renderer.Config{Provider: p, Capacity: 3}, func(f *fakeCoordinator) {
			f.lost["job-gone"] = "LEASE_EXPIRED"
			// The first session never answers completions.
			f.answer = func(c *leaseholdv1.SessionCompletion) *leaseholdv1.CompletionResult {
				if firstSession.Load() {
					return nil
				}
				return answerOK(c)
			}
		})
		s := b.session(t)
		s.grantNow(grant("job-hold", 1, pdf("a")), grant("job-gone", 2, pdf("b")), grant("job-done", 3, pdf("c")))
		first := s.waitReq(t, "the completion", func(r *leaseholdv1.SessionRequest) bool { return len(r.GetCompletions()) > 0 })
		if got := first.GetCompletions()[0].GetJobId(); got != "job-done" {
			t.Fatalf("completed %s, want job-done", got)
		}

		firstSession.Store(false)
		s.end <- status.Error(codes.Unavailable, "coordinator restarting")
		s2 := b.session(t)
		want := &leaseholdv1.SessionHello{
			RendererId:      testRendererID,
			InstanceId:      s.hello.GetHello().GetInstanceId(),
			Capacity:        3,
			MaxMessageBytes: renderer.DefaultMaxReceiveBytes,
			Holding:         []*leaseholdv1.LeaseRef{ref("job-gone", 2), ref("job-hold", 1)},
		}
		if diff := cmp.Diff(want, s2.hello.GetHello(), protocmp.Transform()); diff != "" {
			t.Errorf("hello after reconnect (-want +got):\n%s", diff)
		}
		if got := s2.hello.GetCredits(); got != 1 {
			t.Errorf("hello credits = %d with two of three slots busy, want 1", got)
		}
		again := s2.waitReq(t, "the completion again", func(r *leaseholdv1.SessionRequest) bool { return len(r.GetCompletions()) > 0 })
		if diff := cmp.Diff(first.GetCompletions(), again.GetCompletions(), protocmp.Transform()); diff != "" {
			t.Errorf("resent completions (-first +again):\n%s", diff)
		}
		if got := b.waitLog(t, "completed").attrs["job"]; got != "job-done" {
			t.Errorf("completed %q, want job-done", got)
		}
		if got := recv(t, p.stopped, "the lost lease's render to stop"); got != "job-gone" {
			t.Errorf("stopped %q, want job-gone (lost in the welcome)", got)
		}
		synctest.Wait()
		select {
		case job := <-p.stopped:
			t.Errorf("%s stopped, want job-hold still rendering", job)
		default:
		}
		if got := b.metric(t, "leasehold_renderer_stream_reconnects_total"); got != "leasehold_renderer_stream_reconnects_total 1" {
			t.Errorf("metric = %q, want 1 reconnect", got)
		}
	})
}

// TestWorkerSessionEnds ensures permanent refusals end Run, while a renderer
// id in use and a replaced session are retried.
func TestWorkerSessionEnds(t *testing.T) {
	t.Parallel()

	t.Run("a permission refusal ends Run with the error", func(t *testing.T) {
		t.Parallel()
		synctest.Test(t, func(t *testing.T) {
			b := setup(t, renderer.Config{Provider: newGated(t)}, func(f *fakeCoordinator) {
				f.refusals = []error{statusErr(t, codes.PermissionDenied, "RENDERER_ID_NOT_ALLOWED")}
			})
			err := b.wait(t)
			if status.Code(err) != codes.PermissionDenied {
				t.Errorf("Run returned %v, want PERMISSION_DENIED", err)
			}
		})
	})

	t.Run("a renderer id in use is retried and logged as an error", func(t *testing.T) {
		t.Parallel()
		synctest.Test(t, func(t *testing.T) {
			b := setup(t, renderer.Config{Provider: newGated(t)}, func(f *fakeCoordinator) {
				f.refusals = []error{statusErr(t, codes.AlreadyExists, "RENDERER_ID_IN_USE")}
			})
			first := recv(t, b.srv.hellos, "the refused hello")
			refused := time.Now()
			inUse := b.waitLog(t, "renderer id in use")
			if inUse.level != slog.LevelError {
				t.Errorf("renderer id in use logged at %v, want ERROR", inUse.level)
			}
			d := retryIn(t, inUse)
			if d < 800*time.Millisecond || d > 1200*time.Millisecond {
				t.Errorf("retry_in = %v, want 1s within the 20%% jitter", d)
			}
			s := b.session(t)
			if got := time.Since(refused); got != d {
				t.Errorf("retried %v after the refusal, want retry_in %v", got, d)
			}
			if got, want := s.hello.GetHello().GetInstanceId(), first.GetHello().GetInstanceId(); got != want {
				t.Errorf("instance id changed from %q to %q on retry", want, got)
			}
		})
	})

	t.Run("a replaced session is reopened", func(t *testing.T) {
		t.Parallel()
		synctest.Test(t, func(t *testing.T) {
			b := setup(t, renderer.Config{Provider: newGated(t)}, nil)
			s := b.session(t)
			s.end <- statusErr(t, codes.Aborted, "SESSION_REPLACED")
			b.waitLog(t, "session replaced")
			b.session(t)
		})
	})
}

// retryIn returns the retry_in of a log record.
func retryIn(t *testing.T, ev logEvent) time.Duration {
	t.Helper()
	d, err := time.ParseDuration(ev.attrs["retry_in"])
	if err != nil {
		t.Fatalf("%s: retry_in %q: %v", ev.msg, ev.attrs["retry_in"], err)
	}
	return d
}

// TestWorkerBackoff ensures a session that breaks is reopened after the
// delay it logs, which doubles from Config.BackoffMin up to BackoffMax
// with at most 20% jitter, and starts again from BackoffMin once a session
// was welcomed.
func TestWorkerBackoff(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		const lo, hi = time.Second, 4 * time.Second
		down := status.Error(codes.Unavailable, "coordinator down")
		b := setup(t, renderer.Config{Provider: newGated(t), BackoffMin: lo, BackoffMax: hi}, func(f *fakeCoordinator) {
			f.refusals = []error{down, down, down, down}
		})
		// reopened waits for the next hello and checks that it came the
		// delay logged after the one before, and that the delay is within
		// the jitter of want.
		hello := recv(t, b.srv.hellos, "the first hello")
		last := time.Now()
		reopened := func(want time.Duration) {
			t.Helper()
			d := retryIn(t, b.waitLog(t, "session ended"))
			if d < want-want/5 || d > want+want/5 || d < lo || d > hi {
				t.Errorf("retry_in = %v, want %v within the 20%% jitter, within [%v, %v]", d, want, lo, hi)
			}
			hello = recv(t, b.srv.hellos, "the next hello")
			if got := time.Since(last); got != d {
				t.Errorf("reopened %v after the session ended, want retry_in %v", got, d)
			}
			last = time.Now()
		}
		for _, want := range []time.Duration{lo, 2 * lo, hi, hi} {
			reopened(want)
		}
		if got := hello.GetHello().GetRendererId(); got != testRendererID {
			t.Errorf("hello names %q, want %q", got, testRendererID)
		}
		s := b.session(t)
		s.end <- down
		last = time.Now()
		reopened(lo)
	})
}

// TestWorkerRequestBudget ensures completions queued during an outage are
// sent in requests that each stay under the byte budget, in order.
func TestWorkerRequestBudget(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		const budget = renderer.MinMessageBytes
		p := newGated(t)
		p.size = 40 << 10 // inline (under budget less headroom), but two do not fit one request
		jobs := []string{"job-a", "job-b", "job-c"}
		p.hold(jobs...)
		b := setup(t, renderer.Config{Provider: p, Capacity: 3, MaxRequestBytes: budget}, nil)
		s := b.session(t)
		for i, j := range jobs {
			s.grantNow(grant(j, uint64(i+1), pdf(j)))
			recv(t, p.started, "a render")
		}

		gate := make(chan struct{})
		b.srv.mu.Lock()
		b.srv.gate = gate
		b.srv.mu.Unlock()
		s.end <- status.Error(codes.Unavailable, "outage")
		b.waitLog(t, "session ended")
		for _, j := range jobs {
			p.release(j)
			b.waitLog(t, "render done")
		}
		close(gate)
		s2 := b.session(t)
		var got []string
		for len(got) < len(jobs) {
			req := recv(t, s2.reqs, "a request")
			if n := proto.Size(req); n > budget {
				t.Errorf("a request of %d bytes, over the %d budget", n, budget)
			}
			for _, c := range req.GetCompletions() {
				if len(c.GetSuccess().GetContent()) != 40<<10 {
					t.Errorf("completion of %s carries %d inline bytes, want %d", c.GetJobId(), len(c.GetSuccess().GetContent()), 40<<10)
				}
				got = append(got, c.GetJobId())
			}
		}
		slices.Sort(got)
		if diff := cmp.Diff(jobs, got); diff != "" {
			t.Errorf("completions (-want +got):\n%s", diff)
		}
	})
}

// TestWorkerDrains ensures a cancelled Run drains: it says so at once,
// hands back grants, lets a render in flight complete, hands back a stalled
// one after the drain timeout, and returns nil.
func TestWorkerDrains(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		const drainTimeout = 15 * time.Second
		p := newGated(t)
		p.hold("job-fast", "job-stall")
		b := setup(t, renderer.Config{Provider: p, Capacity: 2, DrainTimeout: drainTimeout}, nil)
		s := b.session(t)
		s.grantNow(grant("job-fast", 1, pdf("a")), grant("job-stall", 2, pdf("b")))
		recv(t, p.started, "a render")
		recv(t, p.started, "a render")
		if code, _ := b.get("/readyz"); code != http.StatusOK {
			t.Errorf("/readyz = %d while connected, want 200", code)
		}

		start := time.Now()
		b.cancel()
		req := s.waitReq(t, "draining", func(r *leaseholdv1.SessionRequest) bool { return r.GetDraining() })
		if code, body := b.get("/readyz"); code != http.StatusServiceUnavailable {
			t.Errorf("/readyz = %d %q while draining, want 503", code, body)
		}
		if code, _ := b.get("/healthz"); code != http.StatusOK {
			t.Errorf("/healthz = %d while draining, want 200", code)
		}
		if req.GetCredits() != 0 {
			t.Errorf("draining request grants %d credits, want 0", req.GetCredits())
		}

		s.grantNow(grant("job-late", 3, pdf("c")))
		late := s.waitReq(t, "the late grant handed back", func(r *leaseholdv1.SessionRequest) bool { return len(r.GetHandBacks()) > 0 })
		if diff := cmp.Diff([]*leaseholdv1.LeaseRef{ref("job-late", 3)}, late.GetHandBacks(), protocmp.Transform()); diff != "" {
			t.Errorf("hand-backs while draining (-want +got):\n%s", diff)
		}

		p.release("job-fast")
		done := s.waitReq(t, "the completion", func(r *leaseholdv1.SessionRequest) bool { return len(r.GetCompletions()) > 0 })
		if got := done.GetCompletions()[0].GetJobId(); got != "job-fast" {
			t.Errorf("completed %s during the drain, want job-fast", got)
		}
		if done.GetCredits() != 0 {
			t.Errorf("a completion while draining grants %d credits, want 0", done.GetCredits())
		}

		back := s.waitReq(t, "the stalled lease handed back", func(r *leaseholdv1.SessionRequest) bool { return len(r.GetHandBacks()) > 0 })
		if elapsed := time.Since(start); elapsed != drainTimeout {
			t.Errorf("handed back %v after the drain began, want the drain timeout %v", elapsed, drainTimeout)
		}
		if diff := cmp.Diff([]*leaseholdv1.LeaseRef{ref("job-stall", 2)}, back.GetHandBacks(), protocmp.Transform()); diff != "" {
			t.Errorf("hand-backs after the timeout (-want +got):\n%s", diff)
		}
		if got := recv(t, p.stopped, "the stalled render to stop"); got != "job-stall" {
			t.Errorf("stopped %q, want job-stall", got)
		}
		if err := b.wait(t); err != nil {
			t.Errorf("Run returned %v after the drain, want nil", err)
		}
		if elapsed := time.Since(start); elapsed != drainTimeout {
			t.Errorf("Run returned %v after the drain began, want %v: the hand-back was answered at once", elapsed, drainTimeout)
		}
		recv(t, s.done, "the session to close")
		if got := b.metric(t, "leasehold_renderer_hand_backs_total"); got != "leasehold_renderer_hand_backs_total 2" {
			t.Errorf("metric = %q, want 2 hand-backs", got)
		}
		if got := b.waitLog(t, "completed").attrs["job"]; got != "job-fast" {
			t.Errorf("completed %q, want job-fast", got)
		}
	})
}

// TestWorkerDrainWaitsForAnswers ensures a drain whose hand-backs are
// not answered waits for them 2 s, then closes the session and returns
// nil.
func TestWorkerDrainWaitsForAnswers(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		const drainTimeout = 10 * time.Second
		p := newGated(t)
		p.hold("job-s")
		b := setup(t, renderer.Config{Provider: p, Capacity: 1, DrainTimeout: drainTimeout}, func(f *fakeCoordinator) {
			f.keepHandBacks = true
		})
		s := b.session(t)
		s.grantNow(grant("job-s", 9, pdf("x")))
		recv(t, p.started, "the render to start")
		start := time.Now()
		b.cancel()
		s.waitReq(t, "the hand-back", func(r *leaseholdv1.SessionRequest) bool { return len(r.GetHandBacks()) > 0 })
		if err := b.wait(t); err != nil {
			t.Errorf("Run returned %v, want nil", err)
		}
		if got, want := time.Since(start), drainTimeout+2*time.Second; got != want {
			t.Errorf("Run returned %v after the drain began, want %v: the drain timeout, then 2 s for the answers", got, want)
		}
		recv(t, s.done, "the session to close")
	})
}

// TestWorkerDrainWaitsForHandBackAnswer ensures a drain waits for the
// answer to its hand-back: the HELD answer to a heartbeat sent before the
// hand-back, arriving after it, is not taken for it.
func TestWorkerDrainWaitsForHandBackAnswer(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		const interval, drainTimeout = 5 * time.Second, 12 * time.Second
		p := newGated(t)
		p.hold("job-s")
		b := setup(t, renderer.Config{Provider: p, Capacity: 1, DrainTimeout: drainTimeout}, func(f *fakeCoordinator) {
			f.welcome.HeartbeatInterval = durationpb.New(interval)
			f.keepHandBacks = true
		})
		s := b.session(t)
		s.grantNow(grant("job-s", 9, pdf("x")))
		recv(t, p.started, "the render to start")
		b.cancel()
		// The heartbeats at 5 s and 10 s go unanswered for now; the drain
		// hands the lease back at 12 s.
		s.waitReq(t, "the first heartbeat", func(r *leaseholdv1.SessionRequest) bool { return len(r.GetHeartbeats()) > 0 })
		s.waitReq(t, "the second heartbeat", func(r *leaseholdv1.SessionRequest) bool { return len(r.GetHeartbeats()) > 0 })
		s.waitReq(t, "the hand-back", func(r *leaseholdv1.SessionRequest) bool { return len(r.GetHandBacks()) > 0 })
		handedBack := time.Now()
		held := &leaseholdv1.LeaseStatus{JobId: "job-s", Token: 9, State: leaseholdv1.LeaseState_LEASE_STATE_HELD}
		s.push <- &leaseholdv1.SessionResponse{Leases: []*leaseholdv1.LeaseStatus{held, held}}
		synctest.Wait()
		select {
		case <-s.done:
			t.Fatalf("the session closed on the heartbeats' answers, before the hand-back's")
		default:
		}
		time.Sleep(time.Second)
		s.push <- &leaseholdv1.SessionResponse{Leases: []*leaseholdv1.LeaseStatus{{
			JobId: "job-s", Token: 9, State: leaseholdv1.LeaseState_LEASE_STATE_LOST, Reason: "HANDED_BACK",
		}}}
		recv(t, s.done, "the session to close")
		if got := time.Since(handedBack); got != time.Second {
			t.Errorf("the session closed %v after the hand-back, want 1s: when its answer came", got)
		}
		if err := b.wait(t); err != nil {
			t.Errorf("Run returned %v, want nil", err)
		}
	})
}

// TestWorkerEndDrain ensures EndDrain hands back the leases in progress at
// once, without waiting for the drain timeout.
func TestWorkerEndDrain(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		p := newGated(t)
		p.hold("job-s")
		b := setup(t, renderer.Config{Provider: p, Capacity: 1, DrainTimeout: time.Hour}, nil)
		s := b.session(t)
		s.grantNow(grant("job-s", 9, pdf("x")))
		recv(t, p.started, "the render to start")
		b.cancel()
		s.waitReq(t, "draining", func(r *leaseholdv1.SessionRequest) bool { return r.GetDraining() })
		b.w.EndDrain()
		back := s.waitReq(t, "the hand-back", func(r *leaseholdv1.SessionRequest) bool { return len(r.GetHandBacks()) > 0 })
		if diff := cmp.Diff([]*leaseholdv1.LeaseRef{ref("job-s", 9)}, back.GetHandBacks(), protocmp.Transform()); diff != "" {
			t.Errorf("hand-backs (-want +got):\n%s", diff)
		}
		if err := b.wait(t); err != nil {
			t.Errorf("Run returned %v, want nil", err)
		}
	})
}

// TestWorkerReadiness ensures /readyz answers 200 only while a welcomed
// session is open, and /healthz always.
func TestWorkerReadiness(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		gate := make(chan struct{})
		b := setup(t, renderer.Config{Provider: newGated(t)}, func(f *fakeCoordinator) { f.gate = gate })
		recv(t, b.srv.hellos, "the hello")
		if code, body := b.get("/readyz"); code != http.StatusServiceUnavailable {
			t.Errorf("/readyz = %d %q before the welcome, want 503", code, body)
		}
		if code, _ := b.get("/healthz"); code != http.StatusOK {
			t.Errorf("/healthz = %d, want 200", code)
		}
		close(gate)
		s := b.session(t)
		b.waitLog(t, "session started")
		if code, body := b.get("/readyz"); code != http.StatusOK {
			t.Errorf("/readyz = %d %q once welcomed, want 200", code, body)
		}
		if got := b.metric(t, "leasehold_renderer_connected"); got != "leasehold_renderer_connected 1" {
			t.Errorf("metric = %q, want connected 1", got)
		}

		b.srv.mu.Lock()
		b.srv.gate = make(chan struct{}) // never opened: the worker stays disconnected
		b.srv.mu.Unlock()
		s.end <- status.Error(codes.Unavailable, "gone")
		b.waitLog(t, "session ended")
		if code, body := b.get("/readyz"); code != http.StatusServiceUnavailable {
			t.Errorf("/readyz = %d %q while disconnected, want 503", code, body)
		}
		if got := b.metric(t, "leasehold_renderer_connected"); got != "leasehold_renderer_connected 0" {
			t.Errorf("metric = %q, want connected 0", got)
		}
	})
}

// TestNew ensures invalid configurations are refused.
func TestNew(t *testing.T) {
	t.Parallel()
	p := newMock(t, mock.Config{})
	valid := renderer.Config{Coordinator: "127.0.0.1:7070", ID: "r-1", Provider: p}
	if _, err := renderer.New(valid); err != nil {
		t.Fatalf("New(valid): %v", err)
	}
	tests := []struct {
		name   string
		modify func(*renderer.Config)
	}{
		{"a missing coordinator is refused", func(c *renderer.Config) { c.Coordinator = "" }},
		{"an id with spaces is refused", func(c *renderer.Config) { c.ID = "my renderer" }},
		{"a missing id is refused", func(c *renderer.Config) { c.ID = "" }},
		{"an instance id with a slash is refused", func(c *renderer.Config) { c.InstanceID = "a/b" }},
		{"a capacity above 4096 is refused", func(c *renderer.Config) { c.Capacity = 4097 }},
		{"a negative capacity is refused", func(c *renderer.Config) { c.Capacity = -1 }},
		{"a missing provider is refused", func(c *renderer.Config) { c.Provider = nil }},
		{"inverted backoff bounds are refused", func(c *renderer.Config) { c.BackoffMin, c.BackoffMax = time.Second, time.Millisecond }},
		{"a tiny receive limit is refused", func(c *renderer.Config) { c.MaxReceiveBytes = 1024 }},
		{"a tiny request budget is refused", func(c *renderer.Config) { c.MaxRequestBytes = 1024 }},
		{"a negative drain timeout is refused", func(c *renderer.Config) { c.DrainTimeout = -time.Second }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := valid
			tt.modify(&cfg)
			if _, err := renderer.New(cfg); err == nil {
				t.Errorf("New succeeded, want an error")
			}
		})
	}
}

// TestRunTwice ensures a second Run is refused.
func TestRunTwice(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := setup(t, renderer.Config{Provider: newGated(t)}, nil)
		b.session(t)
		if err := b.w.Run(context.Background()); err == nil || errors.Is(err, context.Canceled) {
			t.Errorf("second Run returned %v, want an error", err)
		}
	})
}
