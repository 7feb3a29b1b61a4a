// Package fakeserver is an in-memory JobService and OperatorService for
// testing the client library and the CLI over an in-process gRPC connection
// (bufconn). It keeps just enough state to answer consistently; it enforces
// the coordinator's batch limits and its gRPC receive limit, but no leases,
// fencing or authorization. It records every submit, watch and replay
// request so that tests can assert what was sent, and it can break watch
// streams and restart, as a coordinator does when it is redeployed.
// StartCluster serves it as the replicas of a coordinator cluster on
// loopback TCP, with real health servers and a leader that tests move.
package fakeserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/leasehold/leasehold/client/limits"
	"github.com/leasehold/leasehold/client/reason"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
)

// Target is the gRPC target to dial together with DialOption.
const Target = "passthrough:///bufconn"

// Artifact is a stored preview: the metadata the server announces and the
// bytes it streams (which a test may make disagree with the digest).
type Artifact struct {
	Meta  *leaseholdv1.Artifact
	Bytes []byte
}

// Server is the fake. Set its exported configuration fields before the first
// call; read the recorded requests with the accessor methods.
type Server struct {
	leaseholdv1.UnimplementedJobServiceServer
	leaseholdv1.UnimplementedOperatorServiceServer
	leaseholdv1.UnimplementedOverviewServiceServer

	// Overview, when set, is what GetOverview and WatchOverview answer;
	// Renderers is what ListRenderers (and WatchOverview with renderers)
	// answer.
	Overview  *leaseholdv1.Overview
	Renderers []*leaseholdv1.Renderer

	// Outcome decides the terminal phase a job reaches while its batch is
	// watched. The default fails documents whose name contains "fail" and
	// succeeds the rest.
	Outcome func(*leaseholdv1.Document) leaseholdv1.Phase
	// MaxPageSize caps list page sizes, to exercise pagination.
	MaxPageSize int

	// Limits is what SubmitBatch enforces, as the coordinator does: a batch
	// over it is refused with INVALID_ARGUMENT BATCH_TOO_LARGE (or
	// CONTENT_TOO_LARGE for one document). New sets the coordinator's
	// defaults; a zero field is no limit.
	Limits Limits
	// MaxRecvMsgSize is the server's gRPC receive limit, read when the
	// server starts. New sets it, as the coordinator does, above the largest
	// request Limits allow; 0 keeps gRPC's default of 4 MiB.
	MaxRecvMsgSize int

	// WatchFault, if set, is called before WatchBatch sends message msg
	// (from 0) of watch call call (from 0, counting every WatchBatch call),
	// on the stream's goroutine with the stream's context. A non-nil error
	// ends the stream with that error instead (EndStream: with OK); the
	// events the fake committed for that call stay committed.
	WatchFault func(ctx context.Context, call, msg int) error
	// LeaseFirst makes WatchBatch commit a LEASED event for every unfinished
	// job before the jobs' terminal events, so that a job has events before
	// its outcome.
	LeaseFirst bool
	// UpdatesPerMessage is how many updates a message carries when the
	// watcher asks for batched messages; 0 means 2.
	UpdatesPerMessage int

	mu          sync.Mutex
	nextJob     int
	nextBatch   int
	jobs        map[string]*leaseholdv1.Job
	docs        map[string]*leaseholdv1.Document
	batches     map[string]*leaseholdv1.Batch
	artifacts   map[string]Artifact
	backup      *Backup
	rejections  []*leaseholdv1.RejectedCompletion
	audit       []*leaseholdv1.AuditRecord
	submits     []*leaseholdv1.SubmitBatchRequest
	watches     []*leaseholdv1.WatchBatchRequest
	replays     []*leaseholdv1.ReplayJobsRequest
	authHeaders []string
	paused      bool
}

var (
	_ leaseholdv1.JobServiceServer      = (*Server)(nil)
	_ leaseholdv1.OperatorServiceServer = (*Server)(nil)
	_ leaseholdv1.OverviewServiceServer = (*Server)(nil)
)

// Limits are the batch limits the fake enforces; a zero field is no limit.
type Limits struct {
	MaxDocuments      int
	MaxInlineBytes    int64
	MaxDocumentInline int64
	MaxDeclaredBytes  int64
}

// DefaultLimits are the coordinator's default batch limits.
var DefaultLimits = Limits{
	MaxDocuments:      limits.DefaultMaxBatchDocuments,
	MaxInlineBytes:    limits.DefaultMaxBatchInlineBytes,
	MaxDocumentInline: limits.DefaultMaxDocumentInlineBytes,
	MaxDeclaredBytes:  limits.DefaultMaxBatchDeclaredBytes,
}

// DefaultMaxRecvMsgSize is above the largest request DefaultLimits allow:
// 16 MiB of content plus 500 documents' names, types and locations.
const DefaultMaxRecvMsgSize = 24 << 20

// EndStream, returned by WatchFault, ends the watch stream with OK before
// the batch is done.
var EndStream = errors.New("end the stream with OK")

// New returns an empty fake with the coordinator's default limits.
func New() *Server {
	return &Server{
		Limits:         DefaultLimits,
		MaxRecvMsgSize: DefaultMaxRecvMsgSize,
		jobs:           map[string]*leaseholdv1.Job{},
		docs:           map[string]*leaseholdv1.Document{},
		batches:        map[string]*leaseholdv1.Batch{},
		artifacts:      map[string]Artifact{},
	}
}

// Start serves s on an in-memory listener until the test ends and returns
// the dial option that connects to it (use it with Target).
func Start(t testing.TB, s *Server) grpc.DialOption {
	t.Helper()
	e := NewEndpoint(t, s)
	e.Start()
	return e.DialOption()
}

// Endpoint serves one fake on in-memory listeners and can stop and start it
// again, as a coordinator is restarted: Stop closes every connection and
// ends every call in flight (clients see UNAVAILABLE), Start serves the same
// fake, with the same state, on a fresh listener that the same dial option
// reaches. Its methods are safe for concurrent use.
type Endpoint struct {
	s *Server

	mu   sync.Mutex
	lis  *bufconn.Listener // nil while stopped
	srv  *grpc.Server
	done chan struct{}
}

// NewEndpoint returns a stopped endpoint for s; the test's cleanup stops it.
func NewEndpoint(t testing.TB, s *Server) *Endpoint {
	t.Helper()
	e := &Endpoint{s: s}
	t.Cleanup(e.Stop)
	return e
}

// DialOption returns the dial option that connects to the endpoint (use it
// with Target). While the endpoint is stopped, dialing fails.
func (e *Endpoint) DialOption() grpc.DialOption {
	return grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
		e.mu.Lock()
		lis := e.lis
		e.mu.Unlock()
		if lis == nil {
			return nil, errors.New("fakeserver: connection refused (stopped)")
		}
		return lis.DialContext(ctx)
	})
}

// Start serves the fake; it does nothing if it is serving already.
func (e *Endpoint) Start() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.lis != nil {
		return
	}
	srv := e.s.newGRPCServer()
	lis := bufconn.Listen(1 << 20)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(lis)
	}()
	e.lis, e.srv, e.done = lis, srv, done
}

// newGRPCServer returns a gRPC server with the fake's services, which
// records every call's authorization and enforces MaxRecvMsgSize; opts come
// after, and their interceptors run after the recording one.
func (s *Server) newGRPCServer(opts ...grpc.ServerOption) *grpc.Server {
	base := []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			if !healthMethod(info.FullMethod) {
				s.recordAuth(ctx)
			}
			return h(ctx, req)
		}),
		grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			if !healthMethod(info.FullMethod) {
				s.recordAuth(ss.Context())
			}
			return h(srv, ss)
		}),
	}
	if s.MaxRecvMsgSize > 0 {
		base = append(base, grpc.MaxRecvMsgSize(s.MaxRecvMsgSize))
	}
	srv := grpc.NewServer(append(base, opts...)...)
	leaseholdv1.RegisterJobServiceServer(srv, s)
	leaseholdv1.RegisterOperatorServiceServer(srv, s)
	leaseholdv1.RegisterOverviewServiceServer(srv, s)
	return srv
}

// Stop ends every connection and call and waits for the server to stop; it
// does nothing if the endpoint is stopped.
func (e *Endpoint) Stop() {
	e.mu.Lock()
	srv, done := e.srv, e.done
	e.lis, e.srv, e.done = nil, nil, nil
	e.mu.Unlock()
	if srv == nil {
		return
	}
	srv.Stop()
	<-done
}

// healthMethod reports whether method belongs to the health service, whose
// calls (a cluster's health checks) are not the fake's.
func healthMethod(method string) bool {
	return strings.HasPrefix(method, "/grpc.health.v1.Health/")
}

func (s *Server) recordAuth(ctx context.Context) {
	md, _ := metadata.FromIncomingContext(ctx)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.authHeaders = append(s.authHeaders, strings.Join(md.Get("authorization"), ","))
}

// AddJob stores a job (and its batch, if new) as if it had been submitted.
func (s *Server) AddJob(j *leaseholdv1.Job) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.jobs[j.GetId()] = proto.CloneOf(j)
	b, ok := s.batches[j.GetBatchId()]
	if !ok {
		b = &leaseholdv1.Batch{Id: j.GetBatchId(), Team: j.GetTeam()}
		s.batches[j.GetBatchId()] = b
	}
	b.JobIds = append(b.JobIds, j.GetId())
	b.JobCount++
}

// SetArtifact stores the artifact GetArtifact streams for jobID.
func (s *Server) SetArtifact(jobID string, a Artifact) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.artifacts[jobID] = a
}

// Backup is what the fake's Backup streams: Bytes, announced as SizeBytes
// and digested as SHA256 (which a test may make disagree with Bytes).
type Backup struct {
	Bytes     []byte
	SizeBytes int64
	SHA256    string
	LastToken uint64
	TakenAt   time.Time
}

// SetBackup sets what Backup streams; without it Backup is NOT_FOUND.
func (s *Server) SetBackup(b Backup) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.backup = &b
}

// AddRejection stores a rejected completion.
func (s *Server) AddRejection(r *leaseholdv1.RejectedCompletion) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rejections = append(s.rejections, r)
}

// AddAudit stores an audit record.
func (s *Server) AddAudit(r *leaseholdv1.AuditRecord) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.audit = append(s.audit, r)
}

// Submits returns the SubmitBatch requests received, in order.
func (s *Server) Submits() []*leaseholdv1.SubmitBatchRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.submits)
}

// Watches returns the WatchBatch requests received, in order.
func (s *Server) Watches() []*leaseholdv1.WatchBatchRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.watches)
}

// Replays returns the ReplayJobs requests received, in order.
func (s *Server) Replays() []*leaseholdv1.ReplayJobsRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.replays)
}

// AuthHeaders returns the authorization metadata of every call, in order.
func (s *Server) AuthHeaders() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.authHeaders)
}

// Paused reports whether dispatch is paused.
func (s *Server) Paused() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.paused
}

// statusError builds a status error with ErrorInfo in the leasehold.v1 domain.
func statusError(c codes.Code, r reason.Reason, msg string, md map[string]string) error {
	st, err := status.New(c, msg).WithDetails(&errdetails.ErrorInfo{Reason: string(r), Domain: reason.Domain, Metadata: md})
	if err != nil {
		return status.Error(c, msg)
	}
	return st.Err()
}

func terminal(p leaseholdv1.Phase) bool {
	return p == leaseholdv1.Phase_PHASE_SUCCEEDED || p == leaseholdv1.Phase_PHASE_FAILED || p == leaseholdv1.Phase_PHASE_CANCELLED
}

// batchLocked returns a copy of the batch with fresh counts. s.mu must be held.
func (s *Server) batchLocked(id string) *leaseholdv1.Batch {
	b := proto.CloneOf(s.batches[id])
	counts := map[leaseholdv1.Phase]uint32{}
	done := true
	for _, jid := range b.GetJobIds() {
		p := s.jobs[jid].GetPhase()
		counts[p]++
		done = done && terminal(p)
	}
	b.Counts = nil
	for p := leaseholdv1.Phase_PHASE_QUEUED; p <= leaseholdv1.Phase_PHASE_CANCELLED; p++ {
		if counts[p] > 0 {
			b.Counts = append(b.Counts, &leaseholdv1.PhaseCount{Phase: p, Count: counts[p]})
		}
	}
	b.Done = done
	return b
}

// SubmitBatch implements `service JobService`.
func (s *Server) SubmitBatch(_ context.Context, req *leaseholdv1.SubmitBatchRequest) (*leaseholdv1.SubmitBatchResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.submits = append(s.submits, req)
	if len(req.GetDocuments()) == 0 {
		return nil, statusError(codes.InvalidArgument, reason.EmptyBatch, "batch has no documents", nil)
	}
	if err := s.Limits.check(req.GetDocuments()); err != nil {
		return nil, err
	}
	if b := s.replayedLocked(req); b != nil {
		return &leaseholdv1.SubmitBatchResponse{Batch: b, Replayed: true}, nil
	}
	s.nextBatch++
	b := &leaseholdv1.Batch{Id: fmt.Sprintf("b-%d", s.nextBatch), Team: req.GetTeam(), RequestId: req.GetRequestId(), RetryPolicy: req.GetRetryPolicy()}
	s.batches[b.Id] = b
	for _, d := range req.GetDocuments() {
		s.nextJob++
		j := &leaseholdv1.Job{
			Id:       fmt.Sprintf("j-%d", s.nextJob),
			BatchId:  b.Id,
			Team:     req.GetTeam(),
			Phase:    leaseholdv1.Phase_PHASE_QUEUED,
			Cycle:    1,
			Document: &leaseholdv1.DocumentInfo{Name: d.GetName(), ContentType: d.GetContentType(), SizeBytes: d.GetSizeBytes(), SourceUri: d.GetSourceUri()},
		}
		s.jobs[j.Id] = j
		s.docs[j.Id] = d
		b.JobIds = append(b.JobIds, j.Id)
		b.JobCount++
	}
	return &leaseholdv1.SubmitBatchResponse{Batch: s.batchLocked(b.Id)}, nil
}

// check refuses docs over the limits as the coordinator does.
func (l Limits) check(docs []*leaseholdv1.Document) error {
	var inline, declared int64
	for i, d := range docs {
		n := int64(len(d.GetContent()))
		if l.MaxDocumentInline > 0 && n > l.MaxDocumentInline {
			return statusError(codes.InvalidArgument, reason.ContentTooLarge, fmt.Sprintf("documents[%d] has %d bytes of inline content, at most %d", i, n, l.MaxDocumentInline), nil)
		}
		inline += n
		declared += max(n, d.GetSizeBytes())
	}
	switch {
	case l.MaxDocuments > 0 && len(docs) > l.MaxDocuments:
		return statusError(codes.InvalidArgument, reason.BatchTooLarge, fmt.Sprintf("batch has %d documents, at most %d", len(docs), l.MaxDocuments), nil)
	case l.MaxInlineBytes > 0 && inline > l.MaxInlineBytes:
		return statusError(codes.InvalidArgument, reason.BatchTooLarge, fmt.Sprintf("batch has %d bytes of inline content, at most %d", inline, l.MaxInlineBytes), nil)
	case l.MaxDeclaredBytes > 0 && declared > l.MaxDeclaredBytes:
		return statusError(codes.InvalidArgument, reason.BatchTooLarge, fmt.Sprintf("batch declares %d bytes, at most %d", declared, l.MaxDeclaredBytes), nil)
	}
	return nil
}

// replayedLocked returns the batch already submitted by the team with the
// request's id, or nil. s.mu must be held.
func (s *Server) replayedLocked(req *leaseholdv1.SubmitBatchRequest) *leaseholdv1.Batch {
	for id, b := range s.batches {
		if b.GetRequestId() != "" && b.GetRequestId() == req.GetRequestId() && b.GetTeam() == req.GetTeam() {
			return s.batchLocked(id)
		}
	}
	return nil
}

// GetJob implements `service JobService`.
func (s *Server) GetJob(_ context.Context, req *leaseholdv1.GetJobRequest) (*leaseholdv1.GetJobResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	j, ok := s.jobs[req.GetJobId()]
	if !ok {
		return nil, statusError(codes.NotFound, reason.JobNotFound, fmt.Sprintf("job %s not found", req.GetJobId()), nil)
	}
	return &leaseholdv1.GetJobResponse{Job: proto.CloneOf(j)}, nil
}

// ListJobs implements `service JobService`. The page token is the index of
// the next job in id order.
func (s *Server) ListJobs(_ context.Context, req *leaseholdv1.ListJobsRequest) (*leaseholdv1.ListJobsResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var ids []string
	for id, j := range s.jobs {
		if (req.GetBatchId() == "" || j.GetBatchId() == req.GetBatchId()) &&
			(req.GetTeam() == "" || j.GetTeam() == req.GetTeam()) &&
			(req.GetPhase() == leaseholdv1.Phase_PHASE_UNSPECIFIED || j.GetPhase() == req.GetPhase()) {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	start := 0
	if req.GetPageToken() != "" {
		n, err := strconv.Atoi(req.GetPageToken())
		if err != nil || n < 0 || n > len(ids) {
			return nil, statusError(codes.InvalidArgument, reason.InvalidPageToken, "bad page token", nil)
		}
		start = n
	}
	size := int(req.GetPageSize())
	if size == 0 {
		size = 100
	}
	if s.MaxPageSize > 0 && size > s.MaxPageSize {
		size = s.MaxPageSize
	}
	end := min(start+size, len(ids))
	resp := &leaseholdv1.ListJobsResponse{}
	for _, id := range ids[start:end] {
		j := proto.CloneOf(s.jobs[id])
		if req.GetOmitEvents() {
			j.Events = nil
		}
		resp.Jobs = append(resp.Jobs, j)
	}
	if end < len(ids) {
		resp.NextPageToken = strconv.Itoa(end)
	}
	return resp, nil
}

// GetBatch implements `service JobService`.
func (s *Server) GetBatch(_ context.Context, req *leaseholdv1.GetBatchRequest) (*leaseholdv1.GetBatchResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.batches[req.GetBatchId()]; !ok {
		return nil, statusError(codes.NotFound, reason.BatchNotFound, fmt.Sprintf("batch %s not found", req.GetBatchId()), nil)
	}
	b := s.batchLocked(req.GetBatchId())
	b.JobIds = nil
	return &leaseholdv1.GetBatchResponse{Batch: b}, nil
}

// WatchBatch implements `service JobService`. It opens with one snapshot
// per job, or for a job listed in resume its stored events after the
// cursor; then it commits the rest of the batch's history at once (a LEASED
// event per unfinished job with LeaseFirst, then each job's Outcome) and
// sends those events; then it ends with OK. With terminal_only it sends
// only terminal events after the opening; with batched it packs
// UpdatesPerMessage updates into each message. Every message carries the
// batch's counts as of its last update. WatchFault may end the stream early.
func (s *Server) WatchBatch(req *leaseholdv1.WatchBatchRequest, stream leaseholdv1.JobService_WatchBatchServer) error {
	call, msgs, err := s.watchPlan(req)
	if err != nil {
		return err
	}
	for i, m := range msgs {
		if s.WatchFault != nil {
			if err := s.WatchFault(stream.Context(), call, i); err != nil {
				if errors.Is(err, EndStream) {
					return nil
				}
				return err
			}
		}
		if err := stream.Send(m); err != nil {
			return err
		}
	}
	return nil
}

// watchUpdate is one update the fake sends, with the batch's counts after it.
type watchUpdate struct {
	u     *leaseholdv1.JobUpdate
	batch *leaseholdv1.Batch
}

// watchPlan records req, commits the batch's remaining history and returns
// the call's index and the messages to send.
func (s *Server) watchPlan(req *leaseholdv1.WatchBatchRequest) (int, []*leaseholdv1.WatchBatchResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	call := len(s.watches)
	s.watches = append(s.watches, proto.CloneOf(req))
	b, ok := s.batches[req.GetBatchId()]
	if !ok {
		return call, nil, statusError(codes.NotFound, reason.BatchNotFound, fmt.Sprintf("batch %s not found", req.GetBatchId()), nil)
	}
	ids := b.GetJobIds()
	resume := map[string]uint32{}
	for _, c := range req.GetResume() {
		resume[c.GetJobId()] = c.GetSeq()
	}
	var updates []watchUpdate
	emit := func(id string, phase leaseholdv1.Phase, ev *leaseholdv1.JobEvent) {
		if ev != nil && req.GetTerminalOnly() && !terminal(ev.GetPhase()) {
			return
		}
		updates = append(updates, watchUpdate{&leaseholdv1.JobUpdate{JobId: id, Phase: phase, Event: ev}, s.batchLocked(req.GetBatchId())})
	}
	add := func(id string, ev *leaseholdv1.JobEvent) { emit(id, s.jobs[id].GetPhase(), ev) }

	for _, id := range ids {
		cursor, listed := resume[id]
		if !listed {
			add(id, nil)
			continue
		}
		for _, ev := range s.jobs[id].GetEvents() {
			if ev.GetSeq() > cursor {
				emit(id, ev.GetPhase(), proto.CloneOf(ev))
			}
		}
	}
	if s.LeaseFirst {
		for _, id := range ids {
			if j := s.jobs[id]; !terminal(j.GetPhase()) && j.GetPhase() != leaseholdv1.Phase_PHASE_LEASED {
				add(id, s.commitLocked(j, leaseholdv1.Phase_PHASE_LEASED))
			}
		}
	}
	for _, id := range ids {
		if j := s.jobs[id]; !terminal(j.GetPhase()) {
			add(id, s.commitLocked(j, s.outcome(s.docs[id])))
		}
	}
	return call, s.packLocked(updates, req.GetBatched()), nil
}

// eventKinds names the event that moves a job into a phase.
var eventKinds = map[leaseholdv1.Phase]leaseholdv1.EventKind{
	leaseholdv1.Phase_PHASE_LEASED:    leaseholdv1.EventKind_EVENT_KIND_LEASED,
	leaseholdv1.Phase_PHASE_SUCCEEDED: leaseholdv1.EventKind_EVENT_KIND_SUCCEEDED,
	leaseholdv1.Phase_PHASE_FAILED:    leaseholdv1.EventKind_EVENT_KIND_FAILED,
	leaseholdv1.Phase_PHASE_CANCELLED: leaseholdv1.EventKind_EVENT_KIND_CANCELLED,
}

// commitLocked moves j to phase and appends the event that says so, with
// the next sequence number. s.mu must be held.
func (s *Server) commitLocked(j *leaseholdv1.Job, phase leaseholdv1.Phase) *leaseholdv1.JobEvent {
	j.Phase = phase
	ev := &leaseholdv1.JobEvent{Seq: uint32(len(j.Events) + 1), Kind: eventKinds[phase], Phase: phase, Attempt: 1}
	j.Events = append(j.Events, ev)
	return proto.CloneOf(ev)
}

// packLocked turns updates into messages: one per update, or with batched
// UpdatesPerMessage per message in the updates field.
func (s *Server) packLocked(updates []watchUpdate, batched bool) []*leaseholdv1.WatchBatchResponse {
	var msgs []*leaseholdv1.WatchBatchResponse
	if !batched {
		for _, w := range updates {
			msgs = append(msgs, &leaseholdv1.WatchBatchResponse{JobId: w.u.GetJobId(), Phase: w.u.GetPhase(), Event: w.u.GetEvent(), Batch: w.batch})
		}
		return msgs
	}
	per := s.UpdatesPerMessage
	if per <= 0 {
		per = 2
	}
	for chunk := range slices.Chunk(updates, per) {
		m := &leaseholdv1.WatchBatchResponse{Batch: chunk[len(chunk)-1].batch}
		for _, w := range chunk {
			m.Updates = append(m.Updates, w.u)
		}
		msgs = append(msgs, m)
	}
	return msgs
}

func (s *Server) outcome(d *leaseholdv1.Document) leaseholdv1.Phase {
	if s.Outcome != nil {
		return s.Outcome(d)
	}
	if strings.Contains(d.GetName(), "fail") {
		return leaseholdv1.Phase_PHASE_FAILED
	}
	return leaseholdv1.Phase_PHASE_SUCCEEDED
}

// CancelJob implements `service JobService`.
func (s *Server) CancelJob(_ context.Context, req *leaseholdv1.CancelJobRequest) (*leaseholdv1.CancelJobResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	j, ok := s.jobs[req.GetJobId()]
	if !ok {
		return nil, statusError(codes.NotFound, reason.JobNotFound, fmt.Sprintf("job %s not found", req.GetJobId()), nil)
	}
	switch j.GetPhase() {
	case leaseholdv1.Phase_PHASE_CANCELLED:
		return &leaseholdv1.CancelJobResponse{Job: proto.CloneOf(j), AlreadyCancelled: true}, nil
	case leaseholdv1.Phase_PHASE_SUCCEEDED, leaseholdv1.Phase_PHASE_FAILED:
		return nil, statusError(codes.FailedPrecondition, reason.AlreadyTerminal, fmt.Sprintf("job %s already %s", j.GetId(), j.GetPhase()), map[string]string{"phase": j.GetPhase().String()})
	}
	from := j.GetPhase()
	j.Phase = leaseholdv1.Phase_PHASE_CANCELLED
	j.Cancellation = &leaseholdv1.Cancellation{Reason: req.GetReason(), FromPhase: from}
	return &leaseholdv1.CancelJobResponse{Job: proto.CloneOf(j)}, nil
}

// CancelBatch implements `service JobService`.
func (s *Server) CancelBatch(_ context.Context, req *leaseholdv1.CancelBatchRequest) (*leaseholdv1.CancelBatchResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, ok := s.batches[req.GetBatchId()]
	if !ok {
		return nil, statusError(codes.NotFound, reason.BatchNotFound, fmt.Sprintf("batch %s not found", req.GetBatchId()), nil)
	}
	resp := &leaseholdv1.CancelBatchResponse{}
	for _, id := range b.GetJobIds() {
		j := s.jobs[id]
		switch j.GetPhase() {
		case leaseholdv1.Phase_PHASE_CANCELLED:
			resp.AlreadyCancelled++
		case leaseholdv1.Phase_PHASE_SUCCEEDED:
			resp.AlreadySucceeded++
		case leaseholdv1.Phase_PHASE_FAILED:
			resp.AlreadyFailed++
		default:
			j.Phase = leaseholdv1.Phase_PHASE_CANCELLED
			resp.CancelledQueued++
		}
	}
	resp.Batch = s.batchLocked(b.GetId())
	return resp, nil
}

// GetArtifact implements `service JobService`, streaming in 4 KiB chunks.
func (s *Server) GetArtifact(req *leaseholdv1.GetArtifactRequest, stream leaseholdv1.JobService_GetArtifactServer) error {
	s.mu.Lock()
	a, ok := s.artifacts[req.GetJobId()]
	s.mu.Unlock()
	if !ok {
		return statusError(codes.NotFound, reason.ArtifactNotFound, fmt.Sprintf("no artifact for job %s", req.GetJobId()), nil)
	}
	msg := &leaseholdv1.GetArtifactResponse{Artifact: a.Meta}
	data := a.Bytes
	for {
		n := min(len(data), 4096)
		msg.Chunk = data[:n]
		data = data[n:]
		if err := stream.Send(msg); err != nil {
			return err
		}
		if len(data) == 0 {
			return nil
		}
		msg = &leaseholdv1.GetArtifactResponse{}
	}
}

// Backup implements `service OperatorService`: the header, 4 KiB chunks
// and the trailer of what SetBackup set.
func (s *Server) Backup(_ *leaseholdv1.BackupRequest, stream leaseholdv1.OperatorService_BackupServer) error {
	s.mu.Lock()
	b := s.backup
	s.mu.Unlock()
	if b == nil {
		return statusError(codes.NotFound, reason.NotFound, "no backup set", nil)
	}
	err := stream.Send(&leaseholdv1.BackupResponse{Part: &leaseholdv1.BackupResponse_Header{Header: &leaseholdv1.BackupHeader{
		SizeBytes: b.SizeBytes, SchemaVersion: 2, LastToken: b.LastToken, TakenAt: timestamppb.New(b.TakenAt)}}})
	for data := b.Bytes; err == nil && len(data) > 0; {
		n := min(len(data), 4096)
		err = stream.Send(&leaseholdv1.BackupResponse{Part: &leaseholdv1.BackupResponse_Chunk{Chunk: data[:n]}})
		data = data[n:]
	}
	if err != nil {
		return err
	}
	return stream.Send(&leaseholdv1.BackupResponse{Part: &leaseholdv1.BackupResponse_Trailer{Trailer: &leaseholdv1.BackupTrailer{Sha256: b.SHA256}}})
}

// ListRejectedCompletions implements `service OperatorService`, one page of
// everything stored.
func (s *Server) ListRejectedCompletions(_ context.Context, req *leaseholdv1.ListRejectedCompletionsRequest) (*leaseholdv1.ListRejectedCompletionsResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	resp := &leaseholdv1.ListRejectedCompletionsResponse{}
	for _, r := range s.rejections {
		if req.GetJobId() == "" || r.GetJobId() == req.GetJobId() {
			resp.Rejections = append(resp.Rejections, r)
		}
	}
	return resp, nil
}

// ReplayJobs implements `service OperatorService`: FAILED jobs are
// re-queued (or would be, in a dry run), others are skipped as NOT_FAILED.
func (s *Server) ReplayJobs(_ context.Context, req *leaseholdv1.ReplayJobsRequest) (*leaseholdv1.ReplayJobsResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.replays = append(s.replays, req)
	if !req.GetDryRun() && req.GetRequestId() == "" {
		return nil, statusError(codes.InvalidArgument, reason.MissingRequestID, "a real replay needs a request id", nil)
	}
	ids := req.GetJobIds()
	if req.GetBatchId() != "" {
		ids = slices.Clone(s.batches[req.GetBatchId()].GetJobIds())
	}
	resp := &leaseholdv1.ReplayJobsResponse{DryRun: req.GetDryRun(), Limit: 1000}
	for _, id := range ids {
		j, ok := s.jobs[id]
		if !ok {
			resp.Items = append(resp.Items, &leaseholdv1.ReplayItem{JobId: id, Action: leaseholdv1.ReplayAction_REPLAY_ACTION_SKIP, SkipReason: string(reason.JobNotFound)})
			resp.Skipped++
			continue
		}
		if req.GetTerminalReason() != leaseholdv1.TerminalReason_TERMINAL_REASON_UNSPECIFIED && j.GetTerminalReason() != req.GetTerminalReason() {
			continue
		}
		it := &leaseholdv1.ReplayItem{JobId: id, BatchId: j.GetBatchId(), Team: j.GetTeam(), Phase: j.GetPhase(), TerminalReason: j.GetTerminalReason(), Attempt: j.GetAttempt(), Cycle: j.GetCycle()}
		if j.GetPhase() == leaseholdv1.Phase_PHASE_FAILED {
			it.Action = leaseholdv1.ReplayAction_REPLAY_ACTION_REQUEUE
			resp.Requeued++
			if !req.GetDryRun() {
				j.Phase = leaseholdv1.Phase_PHASE_QUEUED
				j.Cycle++
			}
		} else {
			it.Action = leaseholdv1.ReplayAction_REPLAY_ACTION_SKIP
			it.SkipReason = string(reason.NotFailed)
			resp.Skipped++
		}
		resp.Items = append(resp.Items, it)
	}
	resp.Selected = uint32(len(resp.Items))
	if !req.GetDryRun() {
		resp.AuditId = uint64(len(s.audit) + 1)
		s.audit = append(s.audit, &leaseholdv1.AuditRecord{Id: resp.AuditId, Action: "REPLAY", Reason: req.GetReason(), RequestId: req.GetRequestId()})
	}
	return resp, nil
}

// PauseDispatch implements `service OperatorService`.
func (s *Server) PauseDispatch(context.Context, *leaseholdv1.PauseDispatchRequest) (*leaseholdv1.PauseDispatchResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.paused = true
	return &leaseholdv1.PauseDispatchResponse{Paused: true}, nil
}

// ResumeDispatch implements `service OperatorService`.
func (s *Server) ResumeDispatch(context.Context, *leaseholdv1.ResumeDispatchRequest) (*leaseholdv1.ResumeDispatchResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.paused = false
	return &leaseholdv1.ResumeDispatchResponse{}, nil
}

// GetAudit implements `service OperatorService`, newest first, one page.
func (s *Server) GetAudit(context.Context, *leaseholdv1.GetAuditRequest) (*leaseholdv1.GetAuditResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	resp := &leaseholdv1.GetAuditResponse{}
	for i := len(s.audit) - 1; i >= 0; i-- {
		resp.Records = append(resp.Records, s.audit[i])
	}
	return resp, nil
}

// GetOverview implements `service OverviewService`: Server.Overview.
func (s *Server) GetOverview(ctx context.Context, _ *leaseholdv1.GetOverviewRequest) (*leaseholdv1.GetOverviewResponse, error) {
	s.recordAuth(ctx)
	return &leaseholdv1.GetOverviewResponse{Overview: s.Overview}, nil
}

// ListRenderers implements `service OverviewService`: Server.Renderers.
func (s *Server) ListRenderers(ctx context.Context, _ *leaseholdv1.ListRenderersRequest) (*leaseholdv1.ListRenderersResponse, error) {
	s.recordAuth(ctx)
	return &leaseholdv1.ListRenderersResponse{Renderers: s.Renderers}, nil
}

// WatchOverview implements `service OverviewService`: it sends
// Server.Overview (and Server.Renderers when asked), one message after
// another, until the client goes away.
func (s *Server) WatchOverview(req *leaseholdv1.WatchOverviewRequest, stream leaseholdv1.OverviewService_WatchOverviewServer) error {
	s.recordAuth(stream.Context())
	msg := &leaseholdv1.WatchOverviewResponse{Overview: s.Overview}
	if req.GetIncludeRenderers() {
		msg.Renderers = s.Renderers
	}
	for {
		if err := stream.Send(msg); err != nil {
			return err
		}
		if err := stream.Context().Err(); err != nil {
			return err
		}
	}
}

// ListBatches implements `service OverviewService`: the stored batches,
// newest first, filtered by team and state, paged by MaxPageSize.
func (s *Server) ListBatches(ctx context.Context, req *leaseholdv1.ListBatchesRequest) (*leaseholdv1.ListBatchesResponse, error) {
	s.recordAuth(ctx)
	s.mu.Lock()
	defer s.mu.Unlock()
	var all []*leaseholdv1.Batch
	for id := range s.batches {
		b := s.batchLocked(id)
		switch {
		case req.GetTeam() != "" && b.GetTeam() != req.GetTeam():
		case req.GetState() == leaseholdv1.BatchState_BATCH_STATE_RUNNING && b.GetDone():
		case req.GetState() == leaseholdv1.BatchState_BATCH_STATE_DONE && !b.GetDone():
		default:
			b.JobIds = nil
			all = append(all, b)
		}
	}
	num := func(b *leaseholdv1.Batch) int { n, _ := strconv.Atoi(strings.TrimPrefix(b.GetId(), "b-")); return n }
	slices.SortFunc(all, func(a, b *leaseholdv1.Batch) int { return num(b) - num(a) })
	start := 0
	if tok := req.GetPageToken(); tok != "" {
		n, err := strconv.Atoi(tok)
		if err != nil {
			return nil, statusError(codes.InvalidArgument, reason.InvalidPageToken, "bad page token", nil)
		}
		start = n
	}
	size := int(req.GetPageSize())
	if size == 0 {
		size = 100
	}
	if s.MaxPageSize > 0 {
		size = min(size, s.MaxPageSize)
	}
	end := min(start+size, len(all))
	resp := &leaseholdv1.ListBatchesResponse{Batches: all[min(start, len(all)):end]}
	if end < len(all) {
		resp.NextPageToken = strconv.Itoa(end)
	}
	return resp, nil
}
