package server

import (
	"context"
	"errors"
	"io"
	"net/http"
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/auth"
	"github.com/leasehold/leasehold/coordinator/internal/engine"
	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	"github.com/leasehold/leasehold/coordinator/internal/store"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// RendererServer implements leasehold.v1.RendererService.
type RendererServer struct {
	leaseholdv1.UnimplementedRendererServiceServer
	*core
}

var _ leaseholdv1.RendererServiceServer = (*RendererServer)(nil)

// Renderer request bounds.
const (
	maxRendererIDBytes = 128
	maxLeasesPerCall   = 64
	maxCapacity        = 4096
)

// validRendererID reports whether id is 1 to 128 bytes of [A-Za-z0-9._-].
func validRendererID(id string) bool {
	if id == "" || len(id) > maxRendererIDBytes {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

func checkRendererID(id string) error {
	if !validRendererID(id) {
		return invalidArg("renderer_id", reasonInvalidRendererID, "renderer_id must be 1 to %d bytes of [A-Za-z0-9._-]", maxRendererIDBytes)
	}
	return nil
}

// Acquire implements RendererService.Acquire: a long poll that asks the
// engine once, and again each time work may have become dispatchable,
// until a lease is granted or the wait elapses.
func (s *RendererServer) Acquire(ctx context.Context, req *leaseholdv1.AcquireRequest) (*leaseholdv1.AcquireResponse, error) {
	if _, err := require(ctx, auth.RoleRenderer); err != nil {
		return nil, s.status(err)
	}
	if err := checkRendererID(req.GetRendererId()); err != nil {
		return nil, s.status(err)
	}
	capacity := req.GetCapacity()
	if capacity == 0 {
		capacity = req.GetMaxLeases()
	}
	if req.GetMaxLeases() < 1 || req.GetMaxLeases() > maxLeasesPerCall {
		return nil, s.status(invalidArg("max_leases", reasonInvalidCapacity, "max_leases must be 1 to %d", maxLeasesPerCall))
	}
	if capacity < req.GetMaxLeases() || capacity > maxCapacity {
		return nil, s.status(invalidArg("capacity", reasonInvalidCapacity, "capacity must be at least max_leases and at most %d", maxCapacity))
	}
	wait := min(max(req.GetWait().AsDuration(), 0), MaxAcquireWait)
	if req.GetWait() == nil {
		wait = 0
	}
	areq := engine.AcquireRequest{Renderer: req.GetRendererId(), Max: int(req.GetMaxLeases()), Capacity: int(capacity)}

	var timer <-chan time.Time
	if wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		timer = t.C
	}
	for {
		// Take the wake-up channel before asking, so that work arriving
		// between the answer and the wait is not missed.
		woken := s.e.WorkAvailable()
		// The writer's answer is awaited even if the caller leaves, so that
		// grants made for it are handed back rather than left to expire
		// (which would count an attempt the renderer never started).
		res, err := s.e.Acquire(context.WithoutCancel(ctx), areq)
		if err != nil {
			return nil, s.status(err)
		}
		if ctx.Err() != nil {
			s.release(res.Grants)
			return nil, s.status(ctx.Err())
		}
		if len(res.Grants) > 0 || timer == nil {
			return s.acquireResponse(res), nil
		}
		select {
		case <-woken:
		case <-timer:
			return s.acquireResponse(res), nil
		case <-s.closing:
			return s.acquireResponse(res), nil
		case <-ctx.Done():
			return nil, s.status(ctx.Err())
		}
	}
}

// release hands undelivered grants back to their queues.
func (s *RendererServer) release(grants []engine.Grant) {
	if len(grants) == 0 {
		return
	}
	refs := make([]engine.LeaseRef, len(grants))
	for i, g := range grants {
		refs[i] = engine.LeaseRef{Job: g.Job.ID, Token: g.Job.Lease.Token}
	}
	if err := s.e.Release(context.Background(), refs); err != nil {
		s.log.Warn("undelivered leases left to expire", "leases", len(refs), "err", err)
	}
}

func (s *RendererServer) acquireResponse(res engine.AcquireResult) *leaseholdv1.AcquireResponse {
	resp := &leaseholdv1.AcquireResponse{
		DispatchPaused:    res.Paused,
		HeartbeatInterval: durationpb.New(s.e.HeartbeatInterval()),
	}
	for _, g := range res.Grants {
		resp.Leases = append(resp.Leases, grantToProto(g))
	}
	return resp
}

// leaseRefs converts lease references; a malformed job id is refused.
func leaseRefs(in []*leaseholdv1.LeaseRef, field string) ([]engine.LeaseRef, error) {
	out := make([]engine.LeaseRef, 0, len(in))
	for _, r := range in {
		id, err := parseJobID(r.GetJobId(), field+".job_id")
		if err != nil {
			return nil, err
		}
		out = append(out, engine.LeaseRef{Job: id, Token: r.GetToken()})
	}
	return out, nil
}

// Heartbeat implements RendererService.Heartbeat. A goroutine receives;
// this one answers each request in order and forwards revocations as soon
// as the engine publishes them. When the stream ends the renderer's live
// capacity is dropped.
func (s *RendererServer) Heartbeat(stream leaseholdv1.RendererService_HeartbeatServer) error {
	ctx := stream.Context()
	if _, err := require(ctx, auth.RoleRenderer); err != nil {
		return s.status(err)
	}
	first, err := stream.Recv()
	if err == io.EOF {
		return nil
	}
	if err != nil {
		return err
	}
	renderer := first.GetRendererId()
	if err := checkRendererID(renderer); err != nil {
		return s.status(err)
	}
	revoked, unsubscribe := s.e.SubscribeRevocations(renderer)
	defer unsubscribe()
	if err := s.e.RendererConnected(ctx, renderer, int(first.GetCapacity())); err != nil {
		return s.streamEnd(err)
	}
	defer s.e.RendererGone(renderer)

	reqC := make(chan *leaseholdv1.HeartbeatRequest)
	errC := make(chan error, 1)
	go func() {
		for {
			m, err := stream.Recv()
			if err != nil {
				errC <- err
				return
			}
			select {
			case reqC <- m:
			case <-ctx.Done():
				return
			}
		}
	}()

	answer := func(m *leaseholdv1.HeartbeatRequest) error {
		if id := m.GetRendererId(); id != "" && id != renderer {
			return invalidArg("renderer_id", reasonInvalidRendererID, "renderer_id changed from %q to %q on one stream", renderer, id)
		}
		leases, err := leaseRefs(m.GetLeases(), "leases")
		if err != nil {
			return err
		}
		acks, err := leaseRefs(m.GetCancelAcks(), "cancel_acks")
		if err != nil {
			return err
		}
		sts, err := s.e.Heartbeat(ctx, engine.HeartbeatRequest{Renderer: renderer, Capacity: int(m.GetCapacity()), Leases: leases, Acks: acks})
		if err != nil {
			return err
		}
		resp := &leaseholdv1.HeartbeatResponse{Leases: make([]*leaseholdv1.LeaseStatus, len(sts))}
		for i, st := range sts {
			resp.Leases[i] = leaseStatusToProto(st)
		}
		return stream.Send(resp)
	}

	if err := answer(first); err != nil {
		return s.streamEnd(err)
	}
	for {
		select {
		case <-s.closing:
			return s.status(errShuttingDown)
		case <-ctx.Done():
			return s.streamEnd(ctx.Err())
		case err := <-errC:
			if err == io.EOF {
				return nil
			}
			return s.streamEnd(err)
		case m := <-reqC:
			if err := answer(m); err != nil {
				return s.streamEnd(err)
			}
		case r, ok := <-revoked:
			if !ok {
				// The engine stopped publishing: it is shutting down.
				return s.status(engine.ErrStopped)
			}
			resp := &leaseholdv1.HeartbeatResponse{Revoked: []*leaseholdv1.LeaseStatus{leaseStatusToProto(r)}}
			for more := true; more; {
				select {
				case r, ok := <-revoked:
					if ok {
						resp.Revoked = append(resp.Revoked, leaseStatusToProto(r))
					} else {
						more = false
					}
				default:
					more = false
				}
			}
			if err := stream.Send(resp); err != nil {
				return s.streamEnd(err)
			}
		}
	}
}

// streamEnd returns a stream's final error: status errors from the
// transport unchanged (logged at Debug when the client went away), the rest
// through the error table.
func (s *RendererServer) streamEnd(err error) error {
	if st, ok := status.FromError(err); ok {
		if st.Code() == codes.Canceled || st.Code() == codes.DeadlineExceeded {
			s.log.Debug("heartbeat stream ended by the client", "err", err)
		}
		return err
	}
	return s.status(err)
}

// chunkReader reads an upload's chunks as one byte stream.
type chunkReader struct {
	stream leaseholdv1.RendererService_UploadArtifactServer
	buf    []byte
}

// Read implements io.Reader; a second metadata message is an error.
func (r *chunkReader) Read(p []byte) (int, error) {
	for len(r.buf) == 0 {
		m, err := r.stream.Recv()
		if err != nil {
			return 0, err
		}
		if m.GetMetadata() != nil {
			return 0, invalidArg("metadata", reasonMissingMetadata, "metadata may be sent only in the first message")
		}
		r.buf = m.GetChunk()
	}
	n := copy(p, r.buf)
	r.buf = r.buf[n:]
	return n, nil
}

// UploadArtifact implements RendererService.UploadArtifact. An upload under
// a lease that is already fenced off is refused before any byte is stored;
// the decisive check is Complete's.
func (s *RendererServer) UploadArtifact(stream leaseholdv1.RendererService_UploadArtifactServer) error {
	if _, err := require(stream.Context(), auth.RoleRenderer); err != nil {
		return s.status(err)
	}
	first, err := stream.Recv()
	if err == io.EOF {
		return s.status(invalidArg("metadata", reasonMissingMetadata, "the first message must carry the metadata"))
	}
	if err != nil {
		return err
	}
	md := first.GetMetadata()
	if md == nil {
		return s.status(invalidArg("metadata", reasonMissingMetadata, "the first message must carry the metadata"))
	}
	id, err := parseJobID(md.GetJobId(), "metadata.job_id")
	if err != nil {
		return s.status(err)
	}
	j, err := s.e.Job(id)
	if err != nil {
		return s.status(notFound(err, reasonJobNotFound, "job %s not found", md.GetJobId()))
	}
	if err := j.CheckLease(md.GetToken(), s.now()); err != nil {
		return s.status(err)
	}
	digest, size, err := s.art.Put(&chunkReader{stream: stream}, s.maxBytes)
	switch {
	case errors.Is(err, store.ErrArtifactTooLarge):
		return s.status(invalidArg("chunk", reasonArtifactTooLarge, "the artifact is larger than %d bytes", s.maxBytes))
	case err != nil:
		return s.status(err)
	}
	if want := md.GetExpectedSha256(); want != "" && want != digest {
		return s.status(invalidArg("metadata.expected_sha256", reasonDigestMismatch, "the uploaded bytes hash to %s, not %s", digest, want))
	}
	return stream.SendAndClose(&leaseholdv1.UploadArtifactResponse{Digest: digest, SizeBytes: size})
}

// Complete implements RendererService.Complete.
func (s *RendererServer) Complete(ctx context.Context, req *leaseholdv1.CompleteRequest) (*leaseholdv1.CompleteResponse, error) {
	if _, err := require(ctx, auth.RoleRenderer); err != nil {
		return nil, s.status(err)
	}
	id, err := parseJobID(req.GetJobId(), "job_id")
	if err != nil {
		return nil, s.status(err)
	}
	if err := checkRendererID(req.GetRendererId()); err != nil {
		return nil, s.status(err)
	}
	c := jobs.Completion{Token: req.GetToken(), Renderer: req.GetRendererId()}
	missing := false
	switch {
	case req.GetSuccess() != nil:
		c.Success = true
		c.Digest = req.GetSuccess().GetArtifactDigest()
		// A digest never uploaded is reported only after the fencing
		// check, so that a stale completion is refused (and recorded) as
		// stale whatever it names.
		c.Size, c.ContentType, err = s.artifactInfo(c.Digest)
		if errors.Is(err, errArtifactMissing) {
			missing, err = true, nil
		}
		if err != nil {
			return nil, s.status(err)
		}
	case req.GetFailure() != nil:
		c.Class = jobs.FailureClass(req.GetFailure().GetClass())
		c.Message = req.GetFailure().GetMessage()
		if c.Class <= jobs.ClassUnspecified || c.Class > jobs.ClassTransient {
			return nil, s.status(invalidArg("failure.class", reasonMissingOutcome, "failure.class must name a failure class"))
		}
	default:
		return nil, s.status(invalidArg("outcome", reasonMissingOutcome, "a completion needs success or failure"))
	}
	c.ArtifactMissing = missing
	res, err := s.e.Complete(ctx, engine.CompleteRequest{Job: id, Completion: c})
	if err != nil {
		return nil, s.status(notFound(err, reasonJobNotFound, "job %s not found", req.GetJobId()))
	}
	return &leaseholdv1.CompleteResponse{Job: jobToProto(res.Job, viewFull, true), Replayed: res.Replayed}, nil
}

// errArtifactMissing reports a success digest that was never uploaded.
var errArtifactMissing = errors.New("artifact never uploaded")

// artifactInfo returns an uploaded artifact's size and sniffed content
// type, or errArtifactMissing when it was never uploaded.
func (s *RendererServer) artifactInfo(digest string) (int64, string, error) {
	rc, size, err := s.art.Open(digest)
	if errors.Is(err, store.ErrArtifactNotFound) || errors.Is(err, store.ErrInvalidDigest) {
		return 0, "", errArtifactMissing
	}
	if err != nil {
		return 0, "", err
	}
	defer rc.Close()
	head := make([]byte, 512)
	n, err := io.ReadFull(rc, head)
	if err != nil && err != io.EOF && err != io.ErrUnexpectedEOF {
		return 0, "", err
	}
	return size, http.DetectContentType(head[:n]), nil
}
