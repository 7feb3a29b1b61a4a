package renderer_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/testing/protocmp"

	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"github.com/leasehold/leasehold/renderer"
	"github.com/leasehold/leasehold/renderer/mock"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// failsafe bounds every wait so that a broken worker fails the test instead
// of hanging it.
const failsafe = 20 * time.Second

const (
	testToken      = "secret-renderer-token"
	testRendererID = "renderer-test-1"
)

// fakeCoordinator is an in-process RendererService. Every call it receives is
// forwarded on a channel for the test to inspect; grants and heartbeat
// responses are pushed by the test.
type fakeCoordinator struct {
	leaseholdv1.UnimplementedRendererServiceServer

	acquires  chan *leaseholdv1.AcquireRequest
	grants    chan []*leaseholdv1.Grant
	hbReqs    chan *leaseholdv1.HeartbeatRequest
	hbPush    chan *leaseholdv1.HeartbeatResponse
	hbEnd     chan error
	uploads   chan upload
	completes chan *leaseholdv1.CompleteRequest

	mu sync.Mutex
	// completeErrs are returned by the next Complete calls, in order; when it
	// is empty Complete succeeds.
	completeErrs []error
	// uploadErrs are returned by the next UploadArtifact calls, in order,
	// after the whole upload has been read.
	uploadErrs []error
}

// upload is one UploadArtifact call as the server saw it.
type upload struct {
	meta    *leaseholdv1.ArtifactMetadata
	content []byte
	digest  string
}

var _ leaseholdv1.RendererServiceServer = (*fakeCoordinator)(nil)

func newFakeCoordinator() *fakeCoordinator {
	return &fakeCoordinator{
		acquires:  make(chan *leaseholdv1.AcquireRequest, 64),
		grants:    make(chan []*leaseholdv1.Grant, 8),
		hbReqs:    make(chan *leaseholdv1.HeartbeatRequest, 1024),
		hbPush:    make(chan *leaseholdv1.HeartbeatResponse, 8),
		hbEnd:     make(chan error, 1),
		uploads:   make(chan upload, 8),
		completes: make(chan *leaseholdv1.CompleteRequest, 64),
	}
}

// Acquire implements `service RendererService`: it hands out the next pushed
// grants, or waits until the caller gives up.
func (f *fakeCoordinator) Acquire(ctx context.Context, req *leaseholdv1.AcquireRequest) (*leaseholdv1.AcquireResponse, error) {
	f.acquires <- req
	select {
	case g := <-f.grants:
		return &leaseholdv1.AcquireResponse{Leases: g}, nil
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}
}

// Heartbeat implements `service RendererService`: it forwards requests,
// sends pushed responses, and ends the stream with an error pushed on hbEnd.
func (f *fakeCoordinator) Heartbeat(stream leaseholdv1.RendererService_HeartbeatServer) error {
	errc := make(chan error, 1)
	go func() {
		for {
			req, err := stream.Recv()
			if err != nil {
				errc <- err
				return
			}
			select {
			case f.hbReqs <- req:
			default: // the test stopped reading; drop
			}
		}
	}()
	for {
		select {
		case resp := <-f.hbPush:
			if err := stream.Send(resp); err != nil {
				return err
			}
		case err := <-f.hbEnd:
			return err
		case err := <-errc:
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
	}
}

// UploadArtifact implements `service RendererService`.
func (f *fakeCoordinator) UploadArtifact(stream leaseholdv1.RendererService_UploadArtifactServer) error {
	var u upload
	for {
		req, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		if m := req.GetMetadata(); m != nil {
			u.meta = m
			continue
		}
		u.content = append(u.content, req.GetChunk()...)
	}
	sum := sha256.Sum256(u.content)
	u.digest = hex.EncodeToString(sum[:])
	f.uploads <- u
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.uploadErrs) > 0 {
		err := f.uploadErrs[0]
		f.uploadErrs = f.uploadErrs[1:]
		return err
	}
	return stream.SendAndClose(&leaseholdv1.UploadArtifactResponse{Digest: u.digest, SizeBytes: int64(len(u.content))})
}

// Complete implements `service RendererService`.
func (f *fakeCoordinator) Complete(_ context.Context, req *leaseholdv1.CompleteRequest) (*leaseholdv1.CompleteResponse, error) {
	f.completes <- req
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.completeErrs) > 0 {
		err := f.completeErrs[0]
		f.completeErrs = f.completeErrs[1:]
		return nil, err
	}
	phase := leaseholdv1.Phase_PHASE_SUCCEEDED
	if req.GetFailure() != nil {
		phase = leaseholdv1.Phase_PHASE_FAILED
	}
	return &leaseholdv1.CompleteResponse{Job: &leaseholdv1.Job{Phase: phase}}, nil
}

// checkAuth refuses calls without the test renderer's bearer token.
func checkAuth(ctx context.Context) error {
	md, _ := metadata.FromIncomingContext(ctx)
	if got := md.Get("authorization"); len(got) != 1 || got[0] != "Bearer "+testToken {
		return status.Errorf(codes.Unauthenticated, "authorization = %q", got)
	}
	return nil
}

// abortedErr is a fencing refusal as the coordinator sends it.
func abortedErr(t *testing.T, reason string) error {
	t.Helper()
	st, err := status.New(codes.Aborted, "lease is stale").WithDetails(&errdetails.ErrorInfo{
		Reason:   reason,
		Domain:   "leasehold.v1",
		Metadata: map[string]string{"current_token": "99", "current_phase": "PHASE_LEASED"},
	})
	if err != nil {
		t.Fatalf("WithDetails: %v", err)
	}
	return st.Err()
}

// logEvent is one captured log record.
type logEvent struct {
	level slog.Level
	msg   string
	attrs map[string]string
}

// captureHandler is a slog.Handler that forwards every record on a channel.
type captureHandler struct{ events chan logEvent }

func (h captureHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h captureHandler) Handle(_ context.Context, r slog.Record) error {
	ev := logEvent{level: r.Level, msg: r.Message, attrs: map[string]string{}}
	r.Attrs(func(a slog.Attr) bool {
		ev.attrs[a.Key] = a.Value.String()
		return true
	})
	select {
	case h.events <- ev:
	default:
	}
	return nil
}

func (h captureHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h captureHandler) WithGroup(string) slog.Handler      { return h }

// testBundle is a running worker connected to a fake coordinator.
type testBundle struct {
	srv    *fakeCoordinator
	logs   chan logEvent
	record string
}

// setup starts a fake coordinator and a worker; both are stopped when the
// test ends, and the worker must then return nil from Run.
func setup(t *testing.T, cfg renderer.Config) *testBundle {
	t.Helper()
	srv := newFakeCoordinator()
	lis := bufconn.Listen(1 << 20)
	gs := grpc.NewServer(
		grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			if err := checkAuth(ctx); err != nil {
				return nil, err
			}
			return h(ctx, req)
		}),
		grpc.StreamInterceptor(func(s any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			if err := checkAuth(ss.Context()); err != nil {
				return err
			}
			return h(s, ss)
		}),
	)
	leaseholdv1.RegisterRendererServiceServer(gs, srv)
	serveDone := make(chan struct{})
	go func() {
		defer close(serveDone)
		_ = gs.Serve(lis)
	}()

	b := &testBundle{srv: srv, logs: make(chan logEvent, 4096), record: filepath.Join(t.TempDir(), "record.txt")}
	cfg.Coordinator = "passthrough:///bufnet"
	cfg.ID = testRendererID
	cfg.Token = testToken
	cfg.Logger = slog.New(captureHandler{events: b.logs})
	cfg.RecordFile = b.record
	cfg.AcquireWait = time.Minute
	if cfg.HeartbeatInterval == 0 {
		cfg.HeartbeatInterval = time.Hour // only the first message and acks
	}
	cfg.BackoffMin, cfg.BackoffMax = time.Millisecond, 5*time.Millisecond
	cfg.DialOptions = []grpc.DialOption{grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
		return lis.DialContext(ctx)
	})}
	w, err := renderer.New(cfg)
	if err != nil {
		t.Fatalf("renderer.New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	runDone := make(chan error, 1)
	go func() { runDone <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-runDone:
			if err != nil {
				t.Errorf("Run returned %v, want nil after cancellation", err)
			}
		case <-time.After(failsafe):
			t.Errorf("Run did not return after cancellation")
		}
		gs.Stop()
		<-serveDone
	})
	return b
}

// recv waits for a value on ch or fails the test.
func recv[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(failsafe):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

// waitLog waits for a log record with message msg and returns it.
func (b *testBundle) waitLog(t *testing.T, msg string) logEvent {
	t.Helper()
	deadline := time.After(failsafe)
	for {
		select {
		case ev := <-b.logs:
			if ev.msg == msg {
				return ev
			}
		case <-deadline:
			t.Fatalf("timed out waiting for log %q", msg)
		}
	}
}

// waitHeartbeat waits for a heartbeat request that satisfies ok.
func (b *testBundle) waitHeartbeat(t *testing.T, what string, ok func(*leaseholdv1.HeartbeatRequest) bool) *leaseholdv1.HeartbeatRequest {
	t.Helper()
	deadline := time.After(failsafe)
	for {
		select {
		case req := <-b.srv.hbReqs:
			if ok(req) {
				return req
			}
		case <-deadline:
			t.Fatalf("timed out waiting for a heartbeat with %s", what)
		}
	}
}

func grant(jobID string, token uint64, doc *leaseholdv1.Document) *leaseholdv1.Grant {
	return &leaseholdv1.Grant{
		JobId:    jobID,
		Team:     "team-a",
		Lease:    &leaseholdv1.Lease{Token: token, RendererId: testRendererID, Attempt: 1},
		Document: doc,
	}
}

func pdf(content string) *leaseholdv1.Document {
	return &leaseholdv1.Document{Name: "report.pdf", ContentType: "application/pdf", Content: []byte(content)}
}

func newMock(t *testing.T, cfg mock.Config) *mock.Provider {
	t.Helper()
	p, err := mock.New(cfg)
	if err != nil {
		t.Fatalf("mock.New: %v", err)
	}
	return p
}

// blockingProvider renders nothing: it reports each start and blocks until
// its context ends, then reports the context error.
type blockingProvider struct {
	started chan string
	stopped chan error
}

func (p *blockingProvider) Render(ctx context.Context, in mock.Input) (mock.Output, error) {
	p.started <- in.JobID
	<-ctx.Done()
	p.stopped <- ctx.Err()
	return mock.Output{}, ctx.Err()
}

// TestWorkerCompletesLease ensures a granted lease is rendered, uploaded and
// completed under its own token, and recorded.
func TestWorkerCompletesLease(t *testing.T) {
	t.Parallel()
	b := setup(t, renderer.Config{Provider: newMock(t, mock.Config{}), Capacity: 2})

	first := recv(t, b.srv.acquires, "the first Acquire")
	want := &leaseholdv1.AcquireRequest{RendererId: testRendererID, MaxLeases: 2, Capacity: 2}
	if diff := cmp.Diff(want, first, protocmp.Transform(), protocmp.IgnoreFields(&leaseholdv1.AcquireRequest{}, "wait")); diff != "" {
		t.Fatalf("first Acquire (-want +got):\n%s", diff)
	}
	b.srv.grants <- []*leaseholdv1.Grant{grant("job-1", 42, pdf("%PDF-1.7 hello"))}

	if got := recv(t, b.srv.acquires, "the second Acquire").GetMaxLeases(); got != 1 {
		t.Errorf("second Acquire max_leases = %d, want 1 while one lease is held", got)
	}

	up := recv(t, b.srv.uploads, "the upload")
	wantMeta := &leaseholdv1.ArtifactMetadata{JobId: "job-1", Token: 42, RendererId: testRendererID, ContentType: "image/png", ExpectedSha256: up.digest}
	if diff := cmp.Diff(wantMeta, up.meta, protocmp.Transform()); diff != "" {
		t.Errorf("upload metadata (-want +got):\n%s", diff)
	}
	chunks, err := mock.TextChunks(up.content)
	if err != nil {
		t.Fatalf("uploaded preview: %v", err)
	}
	if got := chunks[mock.KeyToken]; got != "42" {
		t.Errorf("preview token chunk = %q, want 42", got)
	}

	c := recv(t, b.srv.completes, "the completion")
	wantComplete := &leaseholdv1.CompleteRequest{
		JobId: "job-1", Token: 42, RendererId: testRendererID,
		Outcome: &leaseholdv1.CompleteRequest_Success{Success: &leaseholdv1.CompleteSuccess{ArtifactDigest: up.digest}},
	}
	if diff := cmp.Diff(wantComplete, c, protocmp.Transform()); diff != "" {
		t.Errorf("completion (-want +got):\n%s", diff)
	}

	done := b.waitLog(t, "completed")
	if diff := cmp.Diff(map[string]string{"job": "job-1", "token": "42", "outcome": "success"}, done.attrs,
		onlyKeys("job", "token", "outcome")); diff != "" {
		t.Errorf("completed log (-want +got):\n%s", diff)
	}
	rec, err := os.ReadFile(b.record)
	if err != nil {
		t.Fatalf("reading record file: %v", err)
	}
	if got, want := string(rec), "job-1 42\n"; got != want {
		t.Errorf("record file = %q, want %q", got, want)
	}
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

// TestWorkerReportsFailures ensures render failures are completed with their
// class, and that transient errors on Complete are retried.
func TestWorkerReportsFailures(t *testing.T) {
	t.Parallel()

	t.Run("an unsupported format completes as a permanent failure", func(t *testing.T) {
		t.Parallel()
		b := setup(t, renderer.Config{Provider: newMock(t, mock.Config{}), Capacity: 1})
		recv(t, b.srv.acquires, "the first Acquire")
		b.srv.grants <- []*leaseholdv1.Grant{grant("job-m", 5, &leaseholdv1.Document{Name: "macro.docm"})}
		c := recv(t, b.srv.completes, "the completion")
		if got, want := c.GetFailure().GetClass(), leaseholdv1.FailureClass_FAILURE_CLASS_UNSUPPORTED_FORMAT; got != want {
			t.Errorf("failure class = %v, want %v", got, want)
		}
		if got := c.GetToken(); got != 5 {
			t.Errorf("completion token = %d, want 5", got)
		}
	})

	t.Run("an unavailable coordinator is retried until it answers", func(t *testing.T) {
		t.Parallel()
		b := setup(t, renderer.Config{Provider: newMock(t, mock.Config{}), Capacity: 1})
		unavailable := status.Error(codes.Unavailable, "restarting")
		b.srv.mu.Lock()
		b.srv.completeErrs = []error{unavailable, unavailable, unavailable}
		b.srv.mu.Unlock()
		recv(t, b.srv.acquires, "the first Acquire")
		b.srv.grants <- []*leaseholdv1.Grant{grant("job-u", 6, pdf("x"))}
		var tokens []uint64
		for range 4 {
			tokens = append(tokens, recv(t, b.srv.completes, "a completion").GetToken())
		}
		if diff := cmp.Diff([]uint64{6, 6, 6, 6}, tokens); diff != "" {
			t.Errorf("completion tokens (-want +got):\n%s", diff)
		}
		if got := b.waitLog(t, "completed").attrs["job"]; got != "job-u" {
			t.Errorf("completed job = %q, want job-u", got)
		}
	})
}

// TestWorkerRevocation ensures a lease revoked on the heartbeat stream stops
// its render, is never completed, and is acknowledged.
func TestWorkerRevocation(t *testing.T) {
	t.Parallel()
	p := &blockingProvider{started: make(chan string, 1), stopped: make(chan error, 1)}
	b := setup(t, renderer.Config{Provider: p, Capacity: 2})

	hello := b.waitHeartbeat(t, "the renderer id", func(*leaseholdv1.HeartbeatRequest) bool { return true })
	if hello.GetRendererId() != testRendererID || hello.GetCapacity() != 2 {
		t.Errorf("first heartbeat names %q with capacity %d, want %q with 2", hello.GetRendererId(), hello.GetCapacity(), testRendererID)
	}
	recv(t, b.srv.acquires, "the first Acquire")
	b.srv.grants <- []*leaseholdv1.Grant{grant("job-2", 7, pdf("x"))}
	if got := recv(t, p.started, "the render to start"); got != "job-2" {
		t.Fatalf("render started for %q, want job-2", got)
	}

	b.srv.hbPush <- &leaseholdv1.HeartbeatResponse{Revoked: []*leaseholdv1.LeaseStatus{{
		JobId: "job-2", Token: 7, State: leaseholdv1.LeaseState_LEASE_STATE_LOST, Reason: "JOB_CANCELLED",
	}}}
	if err := recv(t, p.stopped, "the render context to end"); !errors.Is(err, context.Canceled) {
		t.Errorf("render context error = %v, want context.Canceled", err)
	}
	ack := b.waitHeartbeat(t, "a cancel ack", func(r *leaseholdv1.HeartbeatRequest) bool { return len(r.GetCancelAcks()) > 0 })
	wantAcks := []*leaseholdv1.LeaseRef{{JobId: "job-2", Token: 7}}
	if diff := cmp.Diff(wantAcks, ack.GetCancelAcks(), protocmp.Transform()); diff != "" {
		t.Errorf("cancel acks (-want +got):\n%s", diff)
	}
	if n := len(ack.GetLeases()); n != 0 {
		t.Errorf("the ack heartbeat still lists %d leases, want 0", n)
	}
	// The ack is sent only after the lease's goroutine ended, so any
	// completion it made has reached the server by now.
	select {
	case c := <-b.srv.completes:
		t.Errorf("a revoked lease was completed: %v", c)
	default:
	}
	select {
	case u := <-b.srv.uploads:
		t.Errorf("a revoked lease was uploaded: %v", u.meta)
	default:
	}
	lost := b.waitLog(t, "lease lost")
	if diff := cmp.Diff(map[string]string{"job": "job-2", "token": "7", "reason": "JOB_CANCELLED"}, lost.attrs); diff != "" {
		t.Errorf("lease lost log (-want +got):\n%s", diff)
	}
	b.waitLog(t, "cancel acknowledged")
}

// TestWorkerLeaseLost ensures a lease answered LOST in a heartbeat stops its
// render.
func TestWorkerLeaseLost(t *testing.T) {
	t.Parallel()
	p := &blockingProvider{started: make(chan string, 1), stopped: make(chan error, 1)}
	b := setup(t, renderer.Config{Provider: p, Capacity: 1})
	recv(t, b.srv.acquires, "the first Acquire")
	b.srv.grants <- []*leaseholdv1.Grant{grant("job-l", 11, pdf("x"))}
	recv(t, p.started, "the render to start")
	b.srv.hbPush <- &leaseholdv1.HeartbeatResponse{Leases: []*leaseholdv1.LeaseStatus{{
		JobId: "job-l", Token: 11, State: leaseholdv1.LeaseState_LEASE_STATE_LOST, Reason: "LEASE_EXPIRED",
	}}}
	if err := recv(t, p.stopped, "the render context to end"); !errors.Is(err, context.Canceled) {
		t.Errorf("render context error = %v, want context.Canceled", err)
	}
	// With capacity 1 the next Acquire starts only once the lease's
	// goroutine has ended.
	if got := recv(t, b.srv.acquires, "the next Acquire").GetMaxLeases(); got != 1 {
		t.Errorf("next Acquire max_leases = %d, want 1", got)
	}
	select {
	case c := <-b.srv.completes:
		t.Errorf("a lost lease was completed: %v", c)
	default:
	}
	if got := b.waitLog(t, "lease lost").attrs["reason"]; got != "LEASE_EXPIRED" {
		t.Errorf("lease lost reason = %q, want LEASE_EXPIRED", got)
	}
}

// TestWorkerHeartbeatReconnect ensures a broken heartbeat stream is reopened
// and keeps listing the leases still held.
func TestWorkerHeartbeatReconnect(t *testing.T) {
	t.Parallel()
	p := &blockingProvider{started: make(chan string, 1), stopped: make(chan error, 1)}
	b := setup(t, renderer.Config{Provider: p, Capacity: 2})
	b.waitHeartbeat(t, "the first message", func(*leaseholdv1.HeartbeatRequest) bool { return true })
	recv(t, b.srv.acquires, "the first Acquire")
	b.srv.grants <- []*leaseholdv1.Grant{grant("job-r", 21, pdf("x"))}
	recv(t, p.started, "the render to start")

	b.srv.hbEnd <- status.Error(codes.Unavailable, "coordinator restarting")
	// The interval is an hour, so a heartbeat listing the lease can only be
	// the first message of a reopened stream.
	req := b.waitHeartbeat(t, "the held lease", func(r *leaseholdv1.HeartbeatRequest) bool { return len(r.GetLeases()) > 0 })
	want := &leaseholdv1.HeartbeatRequest{
		RendererId: testRendererID,
		Capacity:   2,
		Leases:     []*leaseholdv1.LeaseRef{{JobId: "job-r", Token: 21}},
	}
	if diff := cmp.Diff(want, req, protocmp.Transform()); diff != "" {
		t.Errorf("heartbeat after reconnect (-want +got):\n%s", diff)
	}
	select {
	case err := <-p.stopped:
		t.Errorf("the render stopped (%v) when the stream broke", err)
	default:
	}
}

// pausingProvider renders a fixed preview after a simulated stall that the
// test starts and ends.
type pausingProvider struct {
	started chan struct{}
	pause   chan struct{}
	paused  chan struct{}
	resume  chan struct{}
}

func (p *pausingProvider) Render(ctx context.Context, in mock.Input) (mock.Output, error) {
	p.started <- struct{}{}
	<-p.pause
	in.OnPause()
	p.paused <- struct{}{}
	select {
	case <-p.resume:
	case <-ctx.Done():
		return mock.Output{}, ctx.Err()
	}
	return mock.Output{Content: []byte("preview"), ContentType: "image/png"}, nil
}

// TestWorkerPausedRender ensures a lease is left out of heartbeats while its
// render simulates a stall, and is completed with its own token afterwards.
func TestWorkerPausedRender(t *testing.T) {
	t.Parallel()
	p := &pausingProvider{
		started: make(chan struct{}, 1), pause: make(chan struct{}),
		paused: make(chan struct{}, 1), resume: make(chan struct{}),
	}
	b := setup(t, renderer.Config{Provider: p, Capacity: 1, HeartbeatInterval: 5 * time.Millisecond})
	recv(t, b.srv.acquires, "the first Acquire")
	b.srv.grants <- []*leaseholdv1.Grant{grant("job-p", 31, pdf("x"))}
	recv(t, p.started, "the render to start")
	b.waitHeartbeat(t, "the lease before the pause", func(r *leaseholdv1.HeartbeatRequest) bool { return len(r.GetLeases()) == 1 })

	close(p.pause)
	recv(t, p.paused, "the pause to start")
	// The lease is held throughout, so a heartbeat without it can only come
	// from the pause.
	b.waitHeartbeat(t, "no lease during the pause", func(r *leaseholdv1.HeartbeatRequest) bool { return len(r.GetLeases()) == 0 })
	if got := b.waitLog(t, "render paused").attrs["job"]; got != "job-p" {
		t.Errorf("render paused job = %q, want job-p", got)
	}

	close(p.resume)
	if got := recv(t, b.srv.completes, "the completion").GetToken(); got != 31 {
		t.Errorf("completion token = %d, want 31", got)
	}
}

// TestWorkerCompletionRejected ensures an ABORTED completion is logged and
// dropped without a retry.
func TestWorkerCompletionRejected(t *testing.T) {
	t.Parallel()
	b := setup(t, renderer.Config{Provider: newMock(t, mock.Config{}), Capacity: 1})
	b.srv.mu.Lock()
	b.srv.completeErrs = []error{abortedErr(t, "STALE_LEASE")}
	b.srv.mu.Unlock()

	recv(t, b.srv.acquires, "the first Acquire")
	b.srv.grants <- []*leaseholdv1.Grant{grant("job-3", 9, pdf("x"))}
	if got := recv(t, b.srv.completes, "the completion").GetToken(); got != 9 {
		t.Errorf("completion token = %d, want 9", got)
	}
	rejected := b.waitLog(t, "completion rejected")
	if rejected.level != slog.LevelWarn {
		t.Errorf("completion rejected logged at %v, want WARN", rejected.level)
	}
	if diff := cmp.Diff(map[string]string{"job": "job-3", "token": "9", "reason": "STALE_LEASE"}, rejected.attrs); diff != "" {
		t.Errorf("completion rejected log (-want +got):\n%s", diff)
	}
	// With capacity 1 the next Acquire starts only once the lease's goroutine
	// has ended; a retry would have reached the server before it.
	recv(t, b.srv.acquires, "the next Acquire")
	select {
	case c := <-b.srv.completes:
		t.Errorf("a rejected completion was retried: %v", c)
	default:
	}
}

// TestWorkerUploadRefused ensures an upload refused as stale is still
// followed by Complete, whose check decides, and that the refusal is logged.
func TestWorkerUploadRefused(t *testing.T) {
	t.Parallel()

	t.Run("a refused completion logs the completion's reason", func(t *testing.T) {
		t.Parallel()
		b := setup(t, renderer.Config{Provider: newMock(t, mock.Config{}), Capacity: 1})
		b.srv.mu.Lock()
		b.srv.uploadErrs = []error{abortedErr(t, "LEASE_EXPIRED")}
		b.srv.completeErrs = []error{abortedErr(t, "STALE_LEASE")}
		b.srv.mu.Unlock()
		recv(t, b.srv.acquires, "the first Acquire")
		b.srv.grants <- []*leaseholdv1.Grant{grant("job-s", 12, pdf("x"))}
		up := recv(t, b.srv.uploads, "the upload")
		c := recv(t, b.srv.completes, "the completion")
		if got, want := c.GetSuccess().GetArtifactDigest(), up.digest; got != want {
			t.Errorf("completion digest = %q, want the refused upload's %q", got, want)
		}
		if got := b.waitLog(t, "completion rejected").attrs["reason"]; got != "STALE_LEASE" {
			t.Errorf("completion rejected reason = %q, want STALE_LEASE", got)
		}
	})

	t.Run("a completion failing for want of the artifact logs the upload's reason", func(t *testing.T) {
		t.Parallel()
		b := setup(t, renderer.Config{Provider: newMock(t, mock.Config{}), Capacity: 1})
		b.srv.mu.Lock()
		b.srv.uploadErrs = []error{abortedErr(t, "LEASE_EXPIRED")}
		b.srv.completeErrs = []error{status.Error(codes.FailedPrecondition, "no artifact")}
		b.srv.mu.Unlock()
		recv(t, b.srv.acquires, "the first Acquire")
		b.srv.grants <- []*leaseholdv1.Grant{grant("job-e", 13, pdf("x"))}
		recv(t, b.srv.completes, "the completion")
		rejected := b.waitLog(t, "completion rejected")
		if diff := cmp.Diff(map[string]string{"job": "job-e", "token": "13", "reason": "LEASE_EXPIRED", "stage": "upload"}, rejected.attrs,
			onlyKeys("job", "token", "reason", "stage")); diff != "" {
			t.Errorf("completion rejected log (-want +got):\n%s", diff)
		}
		recv(t, b.srv.acquires, "the next Acquire")
		select {
		case c := <-b.srv.completes:
			t.Errorf("the completion was retried: %v", c)
		default:
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
		{"a capacity above 64 is refused", func(c *renderer.Config) { c.Capacity = 65 }},
		{"a negative capacity is refused", func(c *renderer.Config) { c.Capacity = -1 }},
		{"a missing provider is refused", func(c *renderer.Config) { c.Provider = nil }},
		{"an acquire wait above a minute is refused", func(c *renderer.Config) { c.AcquireWait = 2 * time.Minute }},
		{"inverted backoff bounds are refused", func(c *renderer.Config) { c.BackoffMin, c.BackoffMax = time.Second, time.Millisecond }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := valid
			tt.modify(&cfg)
			if _, err := renderer.New(cfg); err == nil {
				t.Errorf("New succeeded, want an error")
			}
		})
	}
}
