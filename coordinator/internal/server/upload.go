package server

import (
	"context"
	"io"
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/artifacts"
	"github.com/leasehold/leasehold/coordinator/internal/auth"
	"github.com/leasehold/leasehold/coordinator/internal/engine"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// UploadArtifact implements RendererService.UploadArtifact. The lease is
// checked before a byte is read and again by the writer when the preview is
// stored, under (job, token), where only that lease's completion can
// reference it. The upload is bounded in bytes, in idle time between
// messages and in total time, and ends when the coordinator shuts down.
// One upload per lease runs at a time, and every upload's buffer is
// charged to one budget (Config.MaxUploadBufferBytes), of which the uploads
// of one credential may hold half; past any of these the upload is refused
// RESOURCE_EXHAUSTED.
func (s *RendererServer) UploadArtifact(stream leaseholdv1.RendererService_UploadArtifactServer) error {
	ctx, cancel := context.WithTimeout(stream.Context(), s.uploadTotal)
	defer cancel()
	p, err := require(ctx, auth.RoleRenderer)
	if err != nil {
		return s.status(err)
	}
	msgs, errC := receive(ctx, stream.Recv)
	first, err := s.nextUpload(ctx, msgs, errC)
	if err == io.EOF {
		return s.status(invalidArg("metadata", reasonMissingMetadata, "the first message must carry the metadata"))
	}
	if err != nil {
		return s.streamEnd(err)
	}
	md := first.GetMetadata()
	if md == nil {
		return s.status(invalidArg("metadata", reasonMissingMetadata, "the first message must carry the metadata"))
	}
	id, err := parseJobID(md.GetJobId(), "metadata.job_id")
	if err != nil {
		return s.status(err)
	}
	r, err := rendererFor(p, md.GetRendererId())
	if err != nil {
		return s.status(err)
	}
	s.holdRenderer(ctx, r.ID)
	// A given media type is judged before a byte is read; an empty one is
	// sniffed from the bytes and judged then.
	if _, err := checkContentType("metadata.content_type", md.GetContentType()); err != nil {
		return s.status(err)
	}
	if err := checkDigest("metadata.expected_sha256", md.GetExpectedSha256()); err != nil {
		return s.status(err)
	}
	j, err := s.e.Job(id)
	if err != nil {
		return s.status(notFound(err, reasonJobNotFound, "job %s not found", md.GetJobId()))
	}
	// An early answer only, on the lease's identity: the job is LEASED
	// under this token to this renderer. Whether the lease is still live
	// is judged by the writer when the preview is stored, on its monotonic
	// clock; the deadline in the record is a wall-clock reading that a step
	// of the clock, or a restart (which gives live leases a fresh TTL),
	// leaves behind. The zero time is before any deadline.
	if err := j.CheckLease(md.GetToken(), r.ID, time.Time{}); err != nil {
		return s.status(err)
	}
	buf, err := s.uploads.begin(engine.LeaseRef{Job: id, Token: md.GetToken()}, p.Name)
	if err != nil {
		return s.status(err)
	}
	defer buf.end()
	for {
		m, err := s.nextUpload(ctx, msgs, errC)
		if err == io.EOF {
			break
		}
		if err != nil {
			return s.streamEnd(err)
		}
		if m.GetMetadata() != nil {
			return s.status(invalidArg("metadata", reasonMissingMetadata, "metadata may be sent only in the first message"))
		}
		chunk := m.GetChunk()
		if cp := s.previews.InlineCap; cp > 0 && len(buf.content)+len(chunk) > cp {
			return s.status(storeRequired("chunk", cp))
		}
		if int64(len(buf.content)+len(chunk)) > s.maxBytes {
			return s.status(invalidArg("chunk", reasonArtifactTooLarge, "the artifact is larger than %d bytes", s.maxBytes))
		}
		if err := buf.add(chunk, s.maxBytes); err != nil {
			return s.status(err)
		}
	}
	content := buf.content
	if len(content) == 0 {
		return s.status(invalidArg("chunk", reasonEmptyArtifact, "the upload carried no bytes"))
	}
	pv, err := preview("metadata.content_type", content, md.GetContentType())
	if err != nil {
		return s.status(err)
	}
	if want := md.GetExpectedSha256(); want != "" && want != pv.Digest {
		return s.status(invalidArg("metadata.expected_sha256", reasonDigestMismatch, "the uploaded bytes hash to %s, not %s", pv.Digest, want))
	}
	stage := engine.StageRequest{Job: id, Token: md.GetToken(), Renderer: r.ID, Preview: *pv}
	if err := s.stageInStore(ctx, j.Team, &stage); err != nil {
		return s.status(err)
	}
	err = s.e.Stage(ctx, stage)
	if err != nil {
		return s.status(notFound(err, reasonJobNotFound, "job %s not found", md.GetJobId()))
	}
	return stream.SendAndClose(&leaseholdv1.UploadArtifactResponse{Digest: pv.Digest, SizeBytes: int64(len(content))})
}

// nextUpload returns the upload's next message, io.EOF at its end, or the
// error that ends it: UPLOAD_TIMEOUT when nothing came for
// UploadIdleTimeout or the whole upload ran out of time (UploadTimeout),
// SHUTTING_DOWN when the coordinator stops.
func (s *RendererServer) nextUpload(ctx context.Context, msgs <-chan *leaseholdv1.UploadArtifactRequest, errC <-chan error) (*leaseholdv1.UploadArtifactRequest, error) {
	idle := time.NewTimer(s.uploadIdle)
	defer idle.Stop()
	select {
	case m := <-msgs:
		return m, nil
	case err := <-errC:
		return nil, err
	case <-idle.C:
		return nil, &requestError{code: codes.DeadlineExceeded, reason: reasonUploadTimeout,
			msg: "the upload sent nothing for " + s.uploadIdle.String()}
	case <-ctx.Done():
		if ctx.Err() == context.DeadlineExceeded {
			return nil, &requestError{code: codes.DeadlineExceeded, reason: reasonUploadTimeout,
				msg: "the upload took longer than " + s.uploadTotal.String()}
		}
		return nil, ctx.Err()
	case <-s.closing:
		return nil, errShuttingDown
	}
}

// stageInStore puts an uploaded preview larger than the inline threshold
// in the artifact store, off the writer, so that the writer records only
// that it was uploaded under the lease, not its bytes.
func (s *RendererServer) stageInStore(ctx context.Context, team string, req *engine.StageRequest) error {
	if s.previews.Store == nil || len(req.Preview.Content) <= s.previews.StoreAbove {
		return nil
	}
	p := req.Preview
	seen, err := s.putObject(ctx, s.e, artifacts.Key{Team: team, Digest: p.Digest}, p.Content)
	if err != nil {
		return err
	}
	req.Stored, req.Size, req.Seen = true, int64(len(p.Content)), seen
	req.Preview.Content = nil
	return nil
}

// PrepareUpload implements RendererService.PrepareUpload: a presigned PUT
// of one key, its length and its checksum, for the caller's lease. The
// lease is checked as UploadArtifact checks it when it starts; the
// completion is what the writer fences.
func (s *RendererServer) PrepareUpload(ctx context.Context, req *leaseholdv1.PrepareUploadRequest) (*leaseholdv1.PrepareUploadResponse, error) {
	p, err := require(ctx, auth.RoleRenderer)
	if err != nil {
		return nil, s.status(err)
	}
	r, err := rendererFor(p, req.GetRendererId())
	if err != nil {
		return nil, s.status(err)
	}
	id, err := parseJobID(req.GetJobId(), "job_id")
	if err != nil {
		return nil, s.status(err)
	}
	switch size := req.GetSizeBytes(); {
	case req.GetSha256() == "":
		return nil, s.status(invalidArg("sha256", reasonInvalidDigest, "sha256 is required"))
	case size <= 0:
		return nil, s.status(invalidArg("size_bytes", reasonEmptyArtifact, "size_bytes must be at least 1"))
	case size > s.maxBytes:
		return nil, s.status(invalidArg("size_bytes", reasonArtifactTooLarge, "the artifact is larger than %d bytes", s.maxBytes))
	}
	if err := checkDigest("sha256", req.GetSha256()); err != nil {
		return nil, s.status(err)
	}
	if !s.previews.presigns() {
		return nil, s.status(failedPrecondition(reasonPresignUnsupported, "this coordinator's artifact store does not take presigned uploads; "+
			"send the preview inline or with UploadArtifact"))
	}
	j, err := s.e.Record(id)
	if err != nil {
		return nil, s.status(notFound(err, reasonJobNotFound, "job %s not found", req.GetJobId()))
	}
	// The early check of UploadArtifact: whether the lease is still live
	// is the completion's to decide, on the writer's clock.
	if err := j.CheckLease(req.GetToken(), r.ID, time.Time{}); err != nil {
		return nil, s.status(err)
	}
	ps, err := s.previews.Store.PresignPut(ctx, artifacts.Key{Team: j.Team, Digest: req.GetSha256()}, req.GetSizeBytes(), s.previews.PresignTTL)
	if err != nil {
		return nil, s.status(storeErr(err))
	}
	return &leaseholdv1.PrepareUploadResponse{Url: ps.URL, Method: ps.Method, Headers: headerMap(ps.Headers),
		ExpiresAt: timestamppb.New(ps.Expires)}, nil
}
