package server

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/leasehold/leasehold/coordinator/internal/auth"
	"github.com/leasehold/leasehold/coordinator/internal/engine"
	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	"github.com/leasehold/leasehold/coordinator/internal/reads"
	"github.com/leasehold/leasehold/coordinator/internal/store"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"github.com/leasehold/leasehold/internal/testclock"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/types/known/durationpb"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// testBundle is a coordinator in process: real engine and bbolt store, real
// gRPC over bufconn with the authentication interceptors.
type testBundle struct {
	clock    *testclock.Clock
	st       *store.Store
	eng      *engine.Engine
	services *Services
	conn     *grpc.ClientConn
	jobs     leaseholdv1.JobServiceClient
	rend     leaseholdv1.RendererServiceClient
	ops      leaseholdv1.OperatorServiceClient
	ov       leaseholdv1.OverviewServiceClient
	health   healthpb.HealthClient
	// reg holds the engine's metrics.
	reg *prometheus.Registry
	lis *bufconn.Listener

	opts options
	dir  string
	// stop stops what start started.
	stop func()
}

// options adjust the bundle before it starts.
type options struct {
	engine           func(*engine.Config)
	maxArtifactBytes int64
	// fault, when set, is the store's fault hook.
	fault func(op string) error
	// store are further options of the store.
	store []store.Option
	// wrap, when set, wraps the engine the services call.
	wrap func(Engine) Engine
	// principals replaces the development principals.
	principals *auth.Set
	// server adjusts the services' configuration.
	server func(*Config)
	// services adjusts the services before they serve.
	services func(*Services)
	// intercept, when set, runs inside the authentication interceptor of
	// every stream.
	intercept grpc.StreamServerInterceptor
}

func setup(t testing.TB, opts ...func(*options)) *testBundle {
	t.Helper()
	b := &testBundle{clock: testclock.New(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)), dir: t.TempDir()}
	for _, f := range opts {
		f(&b.opts)
	}
	b.start(t)
	t.Cleanup(func() { b.stop() })
	return b
}

// restart stops the coordinator and starts it again on the same store, as
// a process restart does; clients connect anew.
func (b *testBundle) restart(t *testing.T) {
	t.Helper()
	b.stop()
	b.start(t)
}

// start opens the store, starts the engine and serves the services.
func (b *testBundle) start(t testing.TB) {
	t.Helper()
	o := b.opts
	b.reg = prometheus.NewRegistry()
	storeOpts := append([]store.Option(nil), o.store...)
	if o.fault != nil {
		storeOpts = append(storeOpts, store.WithFault(o.fault))
	}
	st, err := store.Open(filepath.Join(b.dir, "leasehold.db"), storeOpts...)
	if err != nil {
		t.Fatal(err)
	}
	b.st = st
	cfg := engine.Config{
		Store:         st,
		Now:           b.clock.Now,
		LeaseTTL:      15 * time.Second,
		Retry:         jobs.RetryPolicy{MaxAttempts: 3, BackoffBase: time.Second, BackoffCap: 10 * time.Second},
		RunningCancel: true,
		Seed:          1,
		Registerer:    b.reg,
	}
	if o.engine != nil {
		o.engine(&cfg)
	}
	b.eng, err = engine.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	b.eng.Start()
	var e Engine = b.eng
	if o.wrap != nil {
		e = o.wrap(e)
	}
	scfg := Config{Engine: e, MaxArtifactBytes: o.maxArtifactBytes}
	if o.server != nil {
		o.server(&scfg)
	}
	b.services, err = New(scfg)
	if err != nil {
		t.Fatal(err)
	}
	if o.services != nil {
		o.services(b.services)
	}
	principals := auth.DevPrincipals()
	if o.principals != nil {
		principals = o.principals
	}
	streams := []grpc.StreamServerInterceptor{principals.StreamServerInterceptor()}
	if o.intercept != nil {
		streams = append(streams, o.intercept)
	}
	gs := grpc.NewServer(
		// Stop waits for handlers, so none outlives the engine.
		grpc.WaitForHandlers(true),
		// As the coordinator does, receive the largest batch the limits
		// allow.
		grpc.MaxRecvMsgSize(32<<20),
		grpc.ChainUnaryInterceptor(principals.UnaryServerInterceptor()),
		grpc.ChainStreamInterceptor(streams...),
	)
	b.services.Register(gs)
	hs := health.NewServer()
	healthpb.RegisterHealthServer(gs, hs)
	lis := bufconn.Listen(1 << 20)
	b.lis = lis
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = gs.Serve(lis)
	}()
	b.conn = b.dial(t)
	b.jobs = leaseholdv1.NewJobServiceClient(b.conn)
	b.rend = leaseholdv1.NewRendererServiceClient(b.conn)
	b.ops = leaseholdv1.NewOperatorServiceClient(b.conn)
	b.ov = leaseholdv1.NewOverviewServiceClient(b.conn)
	b.health = healthpb.NewHealthClient(b.conn)
	b.stop = func() {
		b.conn.Close()
		b.services.Shutdown()
		gs.Stop()
		<-served
		b.eng.Stop()
		st.Close()
	}
}

// dial opens another client connection to the bundle's server. The
// bundle closes the first one; the caller closes the others.
func (b *testBundle) dial(t testing.TB, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	opts = append([]grpc.DialOption{
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return b.lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
	}, opts...)
	conn, err := grpc.NewClient("passthrough:///bufnet", opts...)
	if err != nil {
		t.Fatal(err)
	}
	return conn
}

// as returns a context carrying token as its bearer token.
func as(t *testing.T, token string) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	if token == "" {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
}

// Tokens of the development principals.
const (
	alpha    = auth.DevAlphaToken
	beta     = auth.DevBetaToken
	renderer = auth.DevRendererToken
	operator = auth.DevOperatorToken
	opAlpha  = auth.DevOperatorAlphaToken
)

// secretURI and secretContent mark document data operators must never see.
const (
	secretURI     = "s3://private-bucket/quarterly-secret.pdf"
	secretContent = "TOP-SECRET-INLINE-CONTENT"
)

// doc returns a small inline PDF document.
func doc(name string) *leaseholdv1.Document {
	return &leaseholdv1.Document{Name: name, ContentType: "application/pdf", Content: []byte(secretContent + " " + name), SourceUri: secretURI}
}

// submit submits docs for team as token and returns the batch.
func (b *testBundle) submit(t *testing.T, token, team, requestID string, docs ...*leaseholdv1.Document) *leaseholdv1.Batch {
	t.Helper()
	resp, err := b.jobs.SubmitBatch(as(t, token), &leaseholdv1.SubmitBatchRequest{Team: team, RequestId: requestID, Documents: docs})
	if err != nil {
		t.Fatalf("SubmitBatch: %v", err)
	}
	return resp.GetBatch()
}

// acquire asks for up to n leases without waiting.
func (b *testBundle) acquire(t *testing.T, n uint32) []*leaseholdv1.Grant {
	t.Helper()
	resp, err := b.rend.Acquire(as(t, renderer), &leaseholdv1.AcquireRequest{RendererId: "r-1", MaxLeases: n, Capacity: 8})
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	return resp.GetLeases()
}

// leaseOne submits one alpha document and leases it.
func (b *testBundle) leaseOne(t *testing.T) *leaseholdv1.Grant {
	t.Helper()
	b.submit(t, alpha, "alpha", "one-"+sha([]byte(t.Name()))[:16], doc("a.pdf"))
	grants := b.acquire(t, 1)
	if len(grants) != 1 {
		t.Fatalf("Acquire granted %d leases, want 1", len(grants))
	}
	return grants[0]
}

// upload stores data as the artifact of g's lease and returns its digest.
func (b *testBundle) upload(t *testing.T, g *leaseholdv1.Grant, data []byte) string {
	t.Helper()
	stream, err := b.rend.UploadArtifact(as(t, renderer))
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&leaseholdv1.UploadArtifactRequest{Part: &leaseholdv1.UploadArtifactRequest_Metadata{Metadata: &leaseholdv1.ArtifactMetadata{
		JobId: g.GetJobId(), Token: g.GetLease().GetToken(), RendererId: "r-1", ContentType: "image/png"}}}); err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&leaseholdv1.UploadArtifactRequest{Part: &leaseholdv1.UploadArtifactRequest_Chunk{Chunk: data}}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.CloseAndRecv()
	if err != nil {
		t.Fatalf("UploadArtifact: %v", err)
	}
	return resp.GetDigest()
}

// succeed uploads data and completes g's lease with it.
func (b *testBundle) succeed(t *testing.T, g *leaseholdv1.Grant, data []byte) *leaseholdv1.CompleteResponse {
	t.Helper()
	digest := b.upload(t, g, data)
	resp, err := b.rend.Complete(as(t, renderer), &leaseholdv1.CompleteRequest{
		JobId: g.GetJobId(), Token: g.GetLease().GetToken(), RendererId: "r-1",
		Outcome: &leaseholdv1.CompleteRequest_Success{Success: &leaseholdv1.CompleteSuccess{ArtifactDigest: digest}},
	})
	if err != nil {
		t.Fatalf("Complete: %v", err)
	}
	return resp
}

// failure returns a completion request for a failed attempt.
func failure(g *leaseholdv1.Grant, class leaseholdv1.FailureClass) *leaseholdv1.CompleteRequest {
	return &leaseholdv1.CompleteRequest{
		JobId: g.GetJobId(), Token: g.GetLease().GetToken(), RendererId: "r-1",
		Outcome: &leaseholdv1.CompleteRequest_Failure{Failure: &leaseholdv1.CompleteFailure{Class: class, Message: "boom"}},
	}
}

func sha(data []byte) string {
	s := sha256.Sum256(data)
	return hex.EncodeToString(s[:])
}

func wait(d time.Duration) *durationpb.Duration { return durationpb.New(d) }

// errorInfo returns err's code and ErrorInfo.
func errorInfo(err error) (codes.Code, *errdetails.ErrorInfo) {
	st := status.Convert(err)
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return st.Code(), info
		}
	}
	return st.Code(), &errdetails.ErrorInfo{}
}

// wantError fails the test unless err has code and ErrorInfo reason (in
// domain leasehold.v1), and returns the ErrorInfo metadata.
func wantError(t *testing.T, err error, code codes.Code, reason string) map[string]string {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want %v %s", code, reason)
	}
	gotCode, info := errorInfo(err)
	if gotCode != code || info.GetReason() != reason {
		t.Fatalf("got %v %q (%v), want %v %q", gotCode, info.GetReason(), err, code, reason)
	}
	if info.GetDomain() != ErrorDomain {
		t.Errorf("ErrorInfo domain = %q, want %q", info.GetDomain(), ErrorDomain)
	}
	return info.GetMetadata()
}

// cmpDiff is cmp.Diff for plain values.
func cmpDiff(want, got any) string { return cmp.Diff(want, got) }

// state is what a refused call must leave as it was: every job with its
// history, every batch's counts, the audit trail, the rejections and the
// dispatch switch, read from the engine.
type state struct {
	Jobs       map[string]string
	Batches    map[string]string
	Audit      []string
	Rejections int
	Paused     bool
}

func (b *testBundle) snapshot(t *testing.T) state {
	t.Helper()
	s := state{Jobs: map[string]string{}, Batches: map[string]string{}}
	page, err := b.eng.ListJobs(reads.JobFilter{Limit: 10_000, History: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, j := range page.Jobs {
		s.Jobs[JobID(j.ID)] = prototext.Format(jobToProto(j, viewFull, true))
		if _, ok := s.Batches[BatchID(j.BatchID)]; ok {
			continue
		}
		bv, err := b.eng.Batch(j.BatchID)
		if err != nil {
			t.Fatal(err)
		}
		s.Batches[BatchID(j.BatchID)] = prototext.Format(batchToProto(bv, true))
	}
	audit, err := b.eng.ListAudit(reads.AuditFilter{Limit: 10_000})
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range audit.Records {
		s.Audit = append(s.Audit, prototext.Format(auditToProto(a)))
	}
	rej, err := b.eng.ListRejections(reads.RejectionFilter{Limit: 10_000})
	if err != nil {
		t.Fatal(err)
	}
	s.Rejections = len(rej.Rejections)
	s.Paused = b.eng.DispatchState().Paused
	return s
}
