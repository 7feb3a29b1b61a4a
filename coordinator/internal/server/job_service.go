package server

import (
	"bytes"
	"context"
	"errors"
	"io"
	"slices"

	"github.com/leasehold/leasehold/coordinator/internal/artifacts"
	"github.com/leasehold/leasehold/coordinator/internal/auth"
	"github.com/leasehold/leasehold/coordinator/internal/engine"
	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	"github.com/leasehold/leasehold/coordinator/internal/reads"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"github.com/leasehold/leasehold/internal/tracing"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// JobServer implements leasehold.v1.JobService.
type JobServer struct {
	leaseholdv1.UnimplementedJobServiceServer
	*core
	e JobEngine
	// denied records refused cancels, aggregated per operator and team.
	denied *deniedAudits
}

var _ leaseholdv1.JobServiceServer = (*JobServer)(nil)

// SubmitBatch implements JobService.SubmitBatch.
func (s *JobServer) SubmitBatch(ctx context.Context, req *leaseholdv1.SubmitBatchRequest) (*leaseholdv1.SubmitBatchResponse, error) {
	p, err := require(ctx, auth.RoleSubmitter)
	if err != nil {
		return nil, s.status(err)
	}
	// A malformed team is reported as INVALID_TEAM by validation; a
	// well-formed team the caller does not submit for is refused here.
	if jobs.ValidTeam(req.GetTeam()) && !p.SubmitterOf(req.GetTeam()) {
		return nil, s.status(denied("%s is not a submitter for team %q", p.Name, req.GetTeam()))
	}
	docs := make([]jobs.DocInput, len(req.GetDocuments()))
	for i, d := range req.GetDocuments() {
		docs[i] = jobs.DocInput{
			Document: jobs.Document{
				Name:        d.GetName(),
				ContentType: d.GetContentType(),
				SizeBytes:   d.GetSizeBytes(),
				SourceURI:   d.GetSourceUri(),
			},
			Content: d.GetContent(),
		}
	}
	res, err := s.e.Submit(ctx, engine.SubmitRequest{
		Team:      req.GetTeam(),
		RequestID: req.GetRequestId(),
		Docs:      docs,
		Policy:    policyFromProto(req.GetRetryPolicy()),
		// The SubmitBatch span's context, when the call is traced.
		TraceParent: tracing.TraceParent(ctx),
	})
	if err != nil {
		return nil, s.status(err)
	}
	return &leaseholdv1.SubmitBatchResponse{Batch: batchToProto(res.Batch, true), Replayed: res.Replayed}, nil
}

// job returns the job named by a wire id if p may see it, and how. A job p
// may not see is answered exactly as one that does not exist (NOT_FOUND
// JOB_NOT_FOUND), so that a refusal names no team and does not tell which
// ids exist; the job is returned with the refusal only so that it can be
// audited.
func (s *JobServer) job(p auth.Principal, wireID string) (jobs.Job, view, error) {
	id, err := parseJobID(wireID, "job_id")
	if err != nil {
		return jobs.Job{}, 0, err
	}
	j, err := s.e.Job(id)
	if err != nil {
		return jobs.Job{}, 0, notFound(err, reasonJobNotFound, "job %s not found", wireID)
	}
	v, ok := access(p, j.Team)
	if !ok {
		return j, 0, hidden(reasonJobNotFound, "job %s not found", wireID)
	}
	return j, v, nil
}

// batch returns the batch named by a wire id if p may see it, and how; a
// batch p may not see is answered as job does.
func (s *JobServer) batch(p auth.Principal, wireID string) (reads.BatchView, view, error) {
	id, err := parseBatchID(wireID, "batch_id")
	if err != nil {
		return reads.BatchView{}, 0, err
	}
	bv, err := s.e.Batch(id)
	if err != nil {
		return reads.BatchView{}, 0, notFound(err, reasonBatchNotFound, "batch %s not found", wireID)
	}
	v, ok := access(p, bv.Batch.Team)
	if !ok {
		return bv, 0, hidden(reasonBatchNotFound, "batch %s not found", wireID)
	}
	return bv, v, nil
}

// GetJob implements JobService.GetJob.
func (s *JobServer) GetJob(ctx context.Context, req *leaseholdv1.GetJobRequest) (*leaseholdv1.GetJobResponse, error) {
	p, err := principal(ctx)
	if err != nil {
		return nil, s.status(err)
	}
	j, v, err := s.job(p, req.GetJobId())
	if err != nil {
		return nil, s.status(err)
	}
	return &leaseholdv1.GetJobResponse{Job: jobToProto(j, v, true)}, nil
}

// ListJobs implements JobService.ListJobs.
func (s *JobServer) ListJobs(ctx context.Context, req *leaseholdv1.ListJobsRequest) (*leaseholdv1.ListJobsResponse, error) {
	p, err := principal(ctx)
	if err != nil {
		return nil, s.status(err)
	}
	f := reads.JobFilter{Phase: jobs.Phase(req.GetPhase())}
	if _, ok := leaseholdv1.Phase_name[int32(req.GetPhase())]; !ok {
		return nil, s.status(invalidArg("phase", reasonInvalidPhase, "unknown phase %d", req.GetPhase()))
	}
	if f.Limit, err = pageSize(req.GetPageSize()); err != nil {
		return nil, s.status(err)
	}
	if f.After, err = decodePageToken(req.GetPageToken()); err != nil {
		return nil, s.status(err)
	}
	if req.GetBatchId() != "" {
		bv, _, err := s.batch(p, req.GetBatchId())
		if err != nil {
			return nil, s.status(err)
		}
		f.Batch = bv.Batch.ID
	}
	switch team := req.GetTeam(); {
	case team != "":
		if _, ok := access(p, team); !ok {
			return nil, s.status(denied("%s may not list jobs of team %q", p.Name, team))
		}
		f.Teams = []string{team}
	default:
		if f.Teams, err = readTeams(p); err != nil {
			return nil, s.status(err)
		}
	}
	f.History = !req.GetOmitEvents()
	page, err := s.e.ListJobs(f)
	if err != nil {
		return nil, s.status(err)
	}
	resp := &leaseholdv1.ListJobsResponse{}
	if page.Next != 0 {
		resp.NextPageToken = encodePageToken(page.Next)
	}
	for _, j := range page.Jobs {
		v, ok := access(p, j.Team)
		if !ok {
			// The engine filtered by team; never show what slipped through.
			continue
		}
		resp.Jobs = append(resp.Jobs, jobToProto(j, v, !req.GetOmitEvents()))
	}
	return resp, nil
}

// GetBatch implements JobService.GetBatch.
func (s *JobServer) GetBatch(ctx context.Context, req *leaseholdv1.GetBatchRequest) (*leaseholdv1.GetBatchResponse, error) {
	p, err := principal(ctx)
	if err != nil {
		return nil, s.status(err)
	}
	bv, _, err := s.batch(p, req.GetBatchId())
	if err != nil {
		return nil, s.status(err)
	}
	return &leaseholdv1.GetBatchResponse{Batch: batchToProto(bv, false)}, nil
}

// CancelJob implements JobService.CancelJob.
func (s *JobServer) CancelJob(ctx context.Context, req *leaseholdv1.CancelJobRequest) (*leaseholdv1.CancelJobResponse, error) {
	p, err := principal(ctx)
	if err != nil {
		return nil, s.status(err)
	}
	if err := checkReason("reason", req.GetReason(), false); err != nil {
		return nil, s.status(err)
	}
	j, v, err := s.job(p, req.GetJobId())
	if err != nil {
		s.auditDenied(ctx, p, err, engine.CancelRequest{Reason: req.GetReason()}, j, req.GetJobId())
		return nil, s.status(err)
	}
	res, err := s.e.Cancel(ctx, engine.CancelRequest{Job: j.ID, Principal: p.Name, Reason: req.GetReason(), Operator: v == viewOperator})
	if err != nil {
		return nil, s.status(err)
	}
	// The writer's record carries only the events this cancel recorded;
	// the reply carries the history up to them, as GetJob would have.
	evs, err := s.e.Events(res.Job.ID, 0)
	if err != nil {
		return nil, s.status(err)
	}
	res.Job.History = slices.DeleteFunc(evs, func(ev jobs.Event) bool { return ev.Seq > res.Job.EventSeq })
	resp := &leaseholdv1.CancelJobResponse{
		Job:              jobToProto(res.Job, v, true),
		AlreadyCancelled: res.Result == jobs.AlreadyCancelled,
	}
	if c := res.Job.Cancellation; c.FromPhase == jobs.PhaseLeased {
		resp.RunningRendererId = c.Renderer
		resp.Acknowledged = !c.AckedAt.IsZero()
	}
	return resp, nil
}

// CancelBatch implements JobService.CancelBatch.
func (s *JobServer) CancelBatch(ctx context.Context, req *leaseholdv1.CancelBatchRequest) (*leaseholdv1.CancelBatchResponse, error) {
	p, err := principal(ctx)
	if err != nil {
		return nil, s.status(err)
	}
	if err := checkReason("reason", req.GetReason(), false); err != nil {
		return nil, s.status(err)
	}
	bv, v, err := s.batch(p, req.GetBatchId())
	if err != nil {
		s.auditDenied(ctx, p, err, engine.CancelRequest{Reason: req.GetReason(), Batch: bv.Batch.ID}, jobs.Job{Team: bv.Batch.Team}, req.GetBatchId())
		return nil, s.status(err)
	}
	res, err := s.e.Cancel(ctx, engine.CancelRequest{Batch: bv.Batch.ID, Principal: p.Name, Reason: req.GetReason(), Operator: v == viewOperator})
	if err != nil {
		return nil, s.status(err)
	}
	after, err := s.e.Batch(bv.Batch.ID)
	if err != nil {
		return nil, s.status(err)
	}
	resp := &leaseholdv1.CancelBatchResponse{
		CancelledQueued:  uint32(res.CancelledQueued),
		CancelledRunning: uint32(res.CancelledRunning),
		AlreadyCancelled: uint32(res.AlreadyCancelled),
		AlreadySucceeded: uint32(res.AlreadySucceeded),
		AlreadyFailed:    uint32(res.AlreadyFailed),
		SkippedRunning:   uint32(res.SkippedRunning),
		Batch:            batchToProto(after, false),
	}
	for _, j := range res.Running {
		resp.Running = append(resp.Running, &leaseholdv1.RunningCancel{
			JobId:        JobID(j.ID),
			RendererId:   j.Cancellation.Renderer,
			RevokedToken: j.Cancellation.Token,
		})
	}
	return resp, nil
}

// auditDenied records a DENIED audit entry when an operator's cancel is
// refused because the team is outside its scope (the operator was told the
// job does not exist). The record names the team, so only operators whose
// scope covers it see it. The first refusal of an operator on a team is
// recorded at once, those that follow within a minute in one record at
// its end (see deniedAudits), so that repeating them cannot make the
// writer store a record per attempt. The refusal stands even if the
// record cannot be written.
func (s *JobServer) auditDenied(ctx context.Context, p auth.Principal, err error, req engine.CancelRequest, target jobs.Job, wireID string) {
	if !p.Can(auth.RoleOperator) || !errors.Is(err, errHidden) {
		return
	}
	rec := jobs.AuditRecord{Principal: p.Name, Action: jobs.AuditDenied, Reason: "cancel " + wireID + ": out of scope; " + req.Reason,
		Batch: req.Batch, Teams: []string{target.Team}}
	if target.ID != 0 {
		rec.JobIDs = []uint64{target.ID}
	}
	s.denied.deny(ctx, rec)
}

// GetArtifact implements JobService.GetArtifact. Only submitters of the
// job's team may read previews; operators never see document data.
func (s *JobServer) GetArtifact(req *leaseholdv1.GetArtifactRequest, stream leaseholdv1.JobService_GetArtifactServer) error {
	p, err := require(stream.Context(), auth.RoleSubmitter)
	if err != nil {
		return s.status(err)
	}
	j, _, err := s.job(p, req.GetJobId())
	if err != nil {
		return s.status(err)
	}
	if !p.CanReadArtifact(j.Team) {
		return s.status(denied("%s may not read previews of team %q", p.Name, j.Team))
	}
	if j.Phase != jobs.PhaseSucceeded {
		return s.status(failedPrecondition(reasonNotSucceeded, "job %s is %s, not SUCCEEDED", req.GetJobId(), j.Phase))
	}
	if j.Artifact.Stored {
		return s.streamStored(stream, j, req.GetPresign())
	}
	a, err := s.e.Artifact(j)
	if errors.Is(err, jobs.ErrArtifactNotFound) {
		return s.status(&requestError{code: codes.NotFound, reason: reasonArtifactNotFound, msg: "the artifact of job " + req.GetJobId() + " is missing", err: err})
	}
	if err != nil {
		return s.status(err)
	}
	meta := artifactToProto(j.Artifact)
	meta.SizeBytes = int64(len(a.Content))
	return sendChunks(stream, meta, bytes.NewReader(a.Content))
}

// sendChunks sends a preview's bytes from r in chunks, meta on the first
// message (which is sent even for no bytes).
func sendChunks(stream leaseholdv1.JobService_GetArtifactServer, meta *leaseholdv1.Artifact, r io.Reader) error {
	buf := make([]byte, artifactChunkBytes)
	for first := true; ; first = false {
		n, err := io.ReadFull(r, buf)
		if n > 0 || first {
			msg := &leaseholdv1.GetArtifactResponse{Chunk: buf[:n]}
			if first {
				msg.Artifact = meta
			}
			if err := stream.Send(msg); err != nil {
				return err
			}
		}
		switch {
		case err == io.EOF || err == io.ErrUnexpectedEOF:
			return nil
		case err != nil:
			return err
		}
	}
}

// streamStored answers GetArtifact for a preview in the artifact store:
// a presigned URL when asked for and the store presigns, else the bytes
// streamed from the store through the coordinator. The object is checked
// against the pointer's size as it is read; the caller checks the digest.
func (s *JobServer) streamStored(stream leaseholdv1.JobService_GetArtifactServer, j jobs.Job, presign bool) error {
	ctx := stream.Context()
	st := s.previews.Store
	meta := artifactToProto(j.Artifact)
	if st == nil {
		return s.status(&requestError{code: codes.NotFound, reason: reasonArtifactNotFound,
			msg: "the artifact of job " + JobID(j.ID) + " is in an artifact store this coordinator is not configured with"})
	}
	k := artifacts.Key{Team: j.Team, Digest: j.Artifact.Digest}
	if presign {
		ps, err := st.PresignGet(ctx, k, s.previews.PresignTTL)
		if err == nil {
			return stream.Send(&leaseholdv1.GetArtifactResponse{Artifact: meta, Url: ps.URL,
				UrlExpiresAt: timestamppb.New(ps.Expires), UrlHeaders: headerMap(ps.Headers)})
		}
		if !errors.Is(err, artifacts.ErrNotSupported) {
			return s.status(storeErr(err))
		}
	}
	octx, cancel := context.WithTimeout(ctx, s.previews.Timeout)
	defer cancel()
	rc, info, err := st.Open(octx, k)
	if errors.Is(s.previews.observe(err), artifacts.ErrNotFound) {
		return s.status(&requestError{code: codes.NotFound, reason: reasonArtifactNotFound, msg: "the artifact of job " + JobID(j.ID) + " is missing from the store", err: err})
	}
	if err != nil {
		return s.status(storeErr(err))
	}
	defer rc.Close()
	if info.Size != j.Artifact.Size {
		return s.status(&requestError{code: codes.NotFound, reason: reasonArtifactNotFound, msg: "the stored artifact of job " + JobID(j.ID) + " is not the one its pointer names"})
	}
	return sendChunks(stream, meta, io.LimitReader(rc, info.Size))
}
