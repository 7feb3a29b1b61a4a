package renderer_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"github.com/leasehold/leasehold/renderer"
	"github.com/leasehold/leasehold/renderer/mock"
)

// failsafe bounds every wait so that a broken worker fails the test instead
// of hanging it. In a synctest bubble it is fake time: a worker that is
// stuck fails at once, when the bubble's clock jumps to it.
const failsafe = 20 * time.Second

const (
	testToken      = "secret-renderer-token"
	testRendererID = "renderer-test-1"
)

// fakeCoordinator is an in-process RendererService serving Session and
// UploadArtifact. Every session it welcomes is handed to the test on
// sessions; completions and hand-backs are answered by the fake itself
// (see answer), everything else is pushed by the test. Started by setup
// inside a synctest bubble, it and the worker run on the bubble's clock.
type fakeCoordinator struct {
	leaseholdv1.UnimplementedRendererServiceServer

	// hellos receives the first request of every Session call, welcomed or
	// not.
	hellos chan *leaseholdv1.SessionRequest
	// sessions receives every welcomed session.
	sessions chan *fakeSession
	// uploads receives every UploadArtifact call.
	uploads chan upload

	mu sync.Mutex
	// welcome is sent to every session; holding is filled in from the
	// hello, HELD unless listed in lost.
	welcome *leaseholdv1.SessionWelcome
	// lost maps job ids to the reason their lease is answered LOST in
	// welcome.holding.
	lost map[string]string
	// refusals end the next Session calls at once, in order.
	refusals []error
	// gate, when set, holds new sessions before their welcome until it is
	// closed.
	gate chan struct{}
	// answer answers a completion; a nil result leaves it unanswered.
	answer func(*leaseholdv1.SessionCompletion) *leaseholdv1.CompletionResult
	// keepHandBacks leaves hand-backs unanswered.
	keepHandBacks bool
	// uploadErrs are returned by the next UploadArtifact calls, in order,
	// after the whole upload has been read.
	uploadErrs []error
}

// fakeSession is one welcomed Session as the fake sees it.
type fakeSession struct {
	// hello is the session's first request.
	hello *leaseholdv1.SessionRequest
	// reqs receives the requests after the first.
	reqs chan *leaseholdv1.SessionRequest
	// push sends a response to the renderer.
	push chan *leaseholdv1.SessionResponse
	// end ends the session with an error status (nil: OK).
	end chan error
	// done is closed when the session's handler has returned.
	done chan struct{}
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
		hellos:   make(chan *leaseholdv1.SessionRequest, 64),
		sessions: make(chan *fakeSession, 16),
		uploads:  make(chan upload, 16),
		welcome: &leaseholdv1.SessionWelcome{
			HeartbeatInterval:      durationpb.New(time.Hour), // heartbeats only where a test asks
			LeaseTtl:               durationpb.New(15 * time.Second),
			MaxInlineArtifactBytes: 1 << 20,
			MaxMessageBytes:        4 << 20,
		},
		lost:   map[string]string{},
		answer: answerOK,
	}
}

// answerOK applies every completion.
func answerOK(c *leaseholdv1.SessionCompletion) *leaseholdv1.CompletionResult {
	phase := leaseholdv1.Phase_PHASE_SUCCEEDED
	if c.GetFailure() != nil {
		phase = leaseholdv1.Phase_PHASE_FAILED
	}
	return &leaseholdv1.CompletionResult{JobId: c.GetJobId(), Token: c.GetToken(), Phase: phase, CurrentToken: c.GetToken()}
}

// Session implements `service RendererService`.
func (f *fakeCoordinator) Session(stream leaseholdv1.RendererService_SessionServer) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	f.hellos <- first
	f.mu.Lock()
	if len(f.refusals) > 0 {
		err := f.refusals[0]
		f.refusals = f.refusals[1:]
		f.mu.Unlock()
		return err
	}
	gate := f.gate
	welcome := proto.CloneOf(f.welcome)
	for _, r := range first.GetHello().GetHolding() {
		st := &leaseholdv1.LeaseStatus{JobId: r.GetJobId(), Token: r.GetToken(), State: leaseholdv1.LeaseState_LEASE_STATE_HELD}
		if reason, ok := f.lost[r.GetJobId()]; ok {
			st.State, st.Reason = leaseholdv1.LeaseState_LEASE_STATE_LOST, reason
		}
		welcome.Holding = append(welcome.Holding, st)
	}
	f.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-stream.Context().Done():
			return stream.Context().Err()
		}
	}
	s := &fakeSession{
		hello: first,
		reqs:  make(chan *leaseholdv1.SessionRequest, 1024),
		push:  make(chan *leaseholdv1.SessionResponse, 1024),
		end:   make(chan error, 1),
		done:  make(chan struct{}),
	}
	defer close(s.done)
	if err := stream.Send(&leaseholdv1.SessionResponse{Welcome: welcome}); err != nil {
		return err
	}
	f.sessions <- s
	errc := make(chan error, 1)
	go func() {
		for {
			req, err := stream.Recv()
			if err != nil {
				errc <- err
				return
			}
			if resp := f.autoAnswer(req); resp != nil {
				s.push <- resp
			}
			select {
			case s.reqs <- req:
			default: // the test stopped reading; drop
			}
		}
	}()
	for {
		select {
		case resp := <-s.push:
			if err := stream.Send(resp); err != nil {
				return err
			}
		case err := <-s.end:
			return err
		case err := <-errc:
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
	}
}

// autoAnswer answers a request's completions and hand-backs, as the
// coordinator does, before the test sees the request.
func (f *fakeCoordinator) autoAnswer(req *leaseholdv1.SessionRequest) *leaseholdv1.SessionResponse {
	resp := &leaseholdv1.SessionResponse{}
	f.mu.Lock()
	answer, keepHandBacks := f.answer, f.keepHandBacks
	f.mu.Unlock()
	for _, c := range req.GetCompletions() {
		r := answer(c)
		if r == nil {
			break // later answers would be out of order
		}
		resp.Results = append(resp.Results, r)
	}
	for _, h := range req.GetHandBacks() {
		if keepHandBacks {
			break
		}
		resp.Leases = append(resp.Leases, &leaseholdv1.LeaseStatus{
			JobId: h.GetJobId(), Token: h.GetToken(), State: leaseholdv1.LeaseState_LEASE_STATE_LOST, Reason: "HANDED_BACK",
		})
	}
	if len(resp.Results) == 0 && len(resp.Leases) == 0 {
		return nil
	}
	return resp
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

// checkAuth refuses calls without the test renderer's bearer token.
func checkAuth(ctx context.Context) error {
	md, _ := metadata.FromIncomingContext(ctx)
	if got := md.Get("authorization"); len(got) != 1 || got[0] != "Bearer "+testToken {
		return status.Errorf(codes.Unauthenticated, "authorization = %q", got)
	}
	return nil
}

// statusErr is a refusal with an ErrorInfo reason, as the coordinator sends
// it.
func statusErr(t *testing.T, code codes.Code, reason string) error {
	t.Helper()
	st, err := status.New(code, strings.ToLower(reason)).WithDetails(&errdetails.ErrorInfo{
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
	w      *renderer.Worker
	logs   chan logEvent
	record string
	// cancel cancels Run's context: the worker drains.
	cancel context.CancelFunc

	runDone chan error
	once    sync.Once
	runErr  error
	waited  bool
}

// setup starts a fake coordinator, configured by configure (if not nil), and
// a worker, connected in memory; called in a synctest bubble, both run on
// its clock. When the test ends the drain is cut short, Run must return
// nil (unless the test waited for Run itself) and both are stopped.
func setup(t *testing.T, cfg renderer.Config, configure func(*fakeCoordinator)) *testBundle {
	t.Helper()
	srv := newFakeCoordinator()
	if configure != nil {
		configure(srv)
	}
	lis := newPipeListener()
	gs := grpc.NewServer(
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
	cfg.Coordinator = "passthrough:///fake"
	cfg.ID = testRendererID
	cfg.Token = testToken
	cfg.Logger = slog.New(captureHandler{events: b.logs})
	cfg.RecordFile = b.record
	if cfg.BackoffMin == 0 {
		cfg.BackoffMin, cfg.BackoffMax = time.Millisecond, 5*time.Millisecond
	}
	cfg.DialOptions = []grpc.DialOption{lis.dialOption()}
	w, err := renderer.New(cfg)
	if err != nil {
		t.Fatalf("renderer.New: %v", err)
	}
	b.w = w
	ctx, cancel := context.WithCancel(context.Background())
	b.cancel = cancel
	b.runDone = make(chan error, 1)
	go func() { b.runDone <- w.Run(ctx) }()
	t.Cleanup(func() {
		w.EndDrain()
		cancel()
		waited := b.waited
		if err := b.wait(t); err != nil && !waited {
			t.Errorf("Run returned %v, want nil after cancellation", err)
		}
		gs.Stop()
		<-serveDone
	})
	return b
}

// wait waits for Run to return and returns its result.
func (b *testBundle) wait(t *testing.T) error {
	t.Helper()
	b.once.Do(func() {
		select {
		case b.runErr = <-b.runDone:
		case <-time.After(failsafe):
			b.runErr = errors.New("Run did not return")
			t.Errorf("Run did not return within %v", failsafe)
		}
	})
	b.waited = true
	return b.runErr
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

// waitLog waits for a log record with message msg and returns it; records
// before it are consumed.
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

// logsOf returns the next n log records whose message is one of msgs, in
// order; records before and between them are consumed.
func (b *testBundle) logsOf(t *testing.T, n int, msgs ...string) []logEvent {
	t.Helper()
	deadline := time.After(failsafe)
	var got []logEvent
	for len(got) < n {
		select {
		case ev := <-b.logs:
			if slices.Contains(msgs, ev.msg) {
				got = append(got, ev)
			}
		case <-deadline:
			t.Fatalf("timed out waiting for %d logs of %q, got %d", n, msgs, len(got))
		}
	}
	return got
}

// session waits for the next welcomed session.
func (b *testBundle) session(t *testing.T) *fakeSession {
	t.Helper()
	return recv(t, b.srv.sessions, "a session")
}

// waitReq waits for a request of s that satisfies ok and returns it;
// requests before it are consumed.
func (s *fakeSession) waitReq(t *testing.T, what string, ok func(*leaseholdv1.SessionRequest) bool) *leaseholdv1.SessionRequest {
	t.Helper()
	deadline := time.After(failsafe)
	for {
		select {
		case req := <-s.reqs:
			if ok(req) {
				return req
			}
		case <-deadline:
			t.Fatalf("timed out waiting for a request with %s", what)
		}
	}
}

// grantNow pushes grants on s.
func (s *fakeSession) grantNow(grants ...*leaseholdv1.Grant) {
	s.push <- &leaseholdv1.SessionResponse{Grants: grants}
}

// get serves one request to the worker's HTTP handler and returns the
// status and body.
func (b *testBundle) get(path string) (int, string) {
	rec := httptest.NewRecorder()
	b.w.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	return rec.Code, rec.Body.String()
}

// metric returns the line of the metrics page that starts with the series
// name, or "" when there is none.
func (b *testBundle) metric(t *testing.T, series string) string {
	t.Helper()
	code, body := b.get("/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics answered %d", code)
	}
	for line := range strings.Lines(body) {
		if strings.HasPrefix(line, series+" ") {
			return strings.TrimSpace(line)
		}
	}
	return ""
}

func (b *testBundle) readRecord(t *testing.T) string {
	t.Helper()
	rec, err := os.ReadFile(b.record)
	if err != nil {
		t.Fatalf("reading record file: %v", err)
	}
	return string(rec)
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

func ref(jobID string, token uint64) *leaseholdv1.LeaseRef {
	return &leaseholdv1.LeaseRef{JobId: jobID, Token: token}
}

func newMock(t *testing.T, cfg mock.Config) *mock.Provider {
	t.Helper()
	p, err := mock.New(cfg)
	if err != nil {
		t.Fatalf("mock.New: %v", err)
	}
	return p
}

// gatedProvider renders with the mock, except that jobs the test holds wait
// for their release (or for their context to end) first. Jobs not held
// render at once. With size set, every preview is size bytes instead.
type gatedProvider struct {
	mock    *mock.Provider
	size    int
	started chan string
	// stopped receives the jobs whose context ended while held.
	stopped chan string

	mu    sync.Mutex
	gates map[string]chan struct{}
}

func newGated(t *testing.T) *gatedProvider {
	t.Helper()
	return &gatedProvider{
		mock:    newMock(t, mock.Config{}),
		started: make(chan string, 64),
		stopped: make(chan string, 64),
		gates:   map[string]chan struct{}{},
	}
}

// hold makes renders of jobID wait for release.
func (p *gatedProvider) hold(jobIDs ...string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, id := range jobIDs {
		p.gates[id] = make(chan struct{})
	}
}

// release lets the held render of jobID finish.
func (p *gatedProvider) release(jobID string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	close(p.gates[jobID])
}

// Render implements renderer.Provider.
func (p *gatedProvider) Render(ctx context.Context, in renderer.Input) (renderer.Output, error) {
	p.started <- in.JobID
	p.mu.Lock()
	gate := p.gates[in.JobID]
	p.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			p.stopped <- in.JobID
			return renderer.Output{}, ctx.Err()
		}
	}
	if p.size > 0 {
		return renderer.Output{Content: []byte(strings.Repeat("x", p.size)), ContentType: "application/octet-stream"}, nil
	}
	return p.mock.Render(ctx, in)
}
