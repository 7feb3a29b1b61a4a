package server

import (
	"context"
	"errors"
	"io"

	"github.com/leasehold/leasehold/coordinator/internal/auth"
	"github.com/leasehold/leasehold/coordinator/internal/engine"
	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	"github.com/leasehold/leasehold/coordinator/internal/store"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"google.golang.org/grpc/codes"
)

// JobServer implements leasehold.v1.JobService.
type JobServer struct {
	leaseholdv1.UnimplementedJobServiceServer
	*core
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
	})
	if err != nil {
		return nil, s.status(err)
	}
	bv, err := s.e.Batch(res.Batch.ID)
	if err != nil {
		return nil, s.status(err)
	}
	return &leaseholdv1.SubmitBatchResponse{Batch: batchToProto(bv, true), Replayed: res.Replayed}, nil
}

// job returns the job named by a wire id if p may see it, and how. When p
// may not, the error is PERMISSION_DENIED and the job is returned only so
// that the refusal can be audited.
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
		// The job is returned with the refusal for the audit record only.
		return j, 0, denied("%s may not act on jobs of team %q", p.Name, j.Team)
	}
	return j, v, nil
}

// batch returns the batch named by a wire id if p may see it, and how; a
// refused batch is returned as job does.
func (s *JobServer) batch(p auth.Principal, wireID string) (engine.BatchView, view, error) {
	id, err := parseBatchID(wireID, "batch_id")
	if err != nil {
		return engine.BatchView{}, 0, err
	}
	bv, err := s.e.Batch(id)
	if err != nil {
		return engine.BatchView{}, 0, notFound(err, reasonBatchNotFound, "batch %s not found", wireID)
	}
	v, ok := access(p, bv.Batch.Team)
	if !ok {
		// The batch is returned with the refusal for the audit record only.
		return bv, 0, denied("%s may not act on batches of team %q", p.Name, bv.Batch.Team)
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
	f := engine.JobFilter{Phase: jobs.Phase(req.GetPhase())}
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
	want := f.Limit
	f.Limit++ // one more tells whether there is a next page
	list, err := s.e.ListJobs(f)
	if err != nil {
		return nil, s.status(err)
	}
	resp := &leaseholdv1.ListJobsResponse{}
	if len(list) > want {
		list = list[:want]
		resp.NextPageToken = encodePageToken(list[len(list)-1].ID)
	}
	for _, j := range list {
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

// WatchBatch implements JobService.WatchBatch: it subscribes first, then
// sends a snapshot of every job, then each committed event not already
// reflected in the snapshot, and ends with OK once every job is terminal.
func (s *JobServer) WatchBatch(req *leaseholdv1.WatchBatchRequest, stream leaseholdv1.JobService_WatchBatchServer) error {
	ctx := stream.Context()
	p, err := principal(ctx)
	if err != nil {
		return s.status(err)
	}
	bv, _, err := s.batch(p, req.GetBatchId())
	if err != nil {
		return s.status(err)
	}
	w, err := s.e.WatchBatch(bv.Batch.ID)
	if err != nil {
		return s.status(notFound(err, reasonBatchNotFound, "batch %s not found", req.GetBatchId()))
	}
	defer w.Close()

	// The snapshot is read after subscribing, so no event falls between;
	// events it already reflects are skipped by their sequence number.
	phases := make(map[uint64]jobs.Phase, bv.Batch.Count)
	lastSeq := make(map[uint64]uint32, bv.Batch.Count)
	var snapshot []jobs.Job
	for after := uint64(0); ; {
		page, err := s.e.ListJobs(engine.JobFilter{Batch: bv.Batch.ID, After: after, Limit: maxPageSize})
		if err != nil {
			return s.status(err)
		}
		snapshot = append(snapshot, page...)
		if len(page) < maxPageSize {
			break
		}
		after = page[len(page)-1].ID
	}
	for _, j := range snapshot {
		phases[j.ID] = j.Phase
		if n := len(j.Events); n > 0 {
			lastSeq[j.ID] = j.Events[n-1].Seq
		}
	}
	batchNow := func() *leaseholdv1.Batch {
		view := engine.BatchView{Batch: bv.Batch, Counts: make(map[jobs.Phase]int), Done: true}
		for _, ph := range phases {
			view.Counts[ph]++
			if !ph.Terminal() {
				view.Done = false
			}
		}
		return batchToProto(view, false)
	}
	done := func() bool {
		for _, ph := range phases {
			if !ph.Terminal() {
				return false
			}
		}
		return true
	}
	for _, j := range snapshot {
		if err := stream.Send(&leaseholdv1.WatchBatchResponse{JobId: JobID(j.ID), Phase: leaseholdv1.Phase(j.Phase), Batch: batchNow()}); err != nil {
			return err
		}
	}
	if done() {
		return nil
	}
	for {
		select {
		case <-s.closing:
			return s.status(errShuttingDown)
		case <-ctx.Done():
			return s.status(ctx.Err())
		case ev, ok := <-w.C:
			if !ok {
				switch {
				case w.Overflowed():
					return s.status(&requestError{code: codes.ResourceExhausted, reason: reasonSlowWatcher, msg: "the watcher fell too far behind; watch again"})
				case done():
					return nil
				}
				return s.status(engine.ErrStopped)
			}
			id := ev.Job.ID
			if _, ours := phases[id]; !ours || ev.Event.Seq <= lastSeq[id] {
				continue
			}
			// One group may commit several events of a job; each message
			// shows the phase right after its own event.
			phase := ev.Event.Phase
			if phase == jobs.PhaseUnspecified {
				phase = ev.Job.Phase
			}
			lastSeq[id] = ev.Event.Seq
			phases[id] = phase
			if err := stream.Send(&leaseholdv1.WatchBatchResponse{
				JobId: JobID(id),
				Phase: leaseholdv1.Phase(phase),
				Event: eventToProto(ev.Event),
				Batch: batchNow(),
			}); err != nil {
				return err
			}
			if done() {
				return nil
			}
		}
	}
}

// CancelJob implements JobService.CancelJob.
func (s *JobServer) CancelJob(ctx context.Context, req *leaseholdv1.CancelJobRequest) (*leaseholdv1.CancelJobResponse, error) {
	p, err := principal(ctx)
	if err != nil {
		return nil, s.status(err)
	}
	j, v, err := s.job(p, req.GetJobId())
	if err != nil {
		s.auditDenied(ctx, p, err, engine.CancelRequest{Reason: req.GetReason()}, j.ID, req.GetJobId())
		return nil, s.status(err)
	}
	res, err := s.e.Cancel(ctx, engine.CancelRequest{Job: j.ID, Principal: p.Name, Reason: req.GetReason(), Operator: v == viewOperator})
	if err != nil {
		return nil, s.status(err)
	}
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
	bv, v, err := s.batch(p, req.GetBatchId())
	if err != nil {
		s.auditDenied(ctx, p, err, engine.CancelRequest{Reason: req.GetReason(), Batch: bv.Batch.ID}, 0, req.GetBatchId())
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
// refused because the team is outside its scope. The refusal stands even
// if the record cannot be written.
func (s *JobServer) auditDenied(ctx context.Context, p auth.Principal, err error, req engine.CancelRequest, job uint64, wireID string) {
	var re *requestError
	if !p.Can(auth.RoleOperator) || !errors.As(err, &re) || re.code != codes.PermissionDenied {
		return
	}
	rec := jobs.AuditRecord{Principal: p.Name, Action: jobs.AuditDenied, Reason: "cancel " + wireID + ": out of scope; " + req.Reason, Batch: req.Batch}
	if job != 0 {
		rec.JobIDs = []uint64{job}
	}
	if aerr := s.e.RecordAudit(ctx, rec); aerr != nil {
		s.log.Warn("recording a denied cancel", "principal", p.Name, "target", wireID, "err", aerr)
	}
}

// GetArtifact implements JobService.GetArtifact. Only submitters of the
// job's team may read previews; operators never see document data.
func (s *JobServer) GetArtifact(req *leaseholdv1.GetArtifactRequest, stream leaseholdv1.JobService_GetArtifactServer) error {
	p, err := require(stream.Context(), auth.RoleSubmitter)
	if err != nil {
		return s.status(err)
	}
	j, v, err := s.job(p, req.GetJobId())
	if err != nil {
		return s.status(err)
	}
	if v != viewFull {
		return s.status(denied("%s may not read previews of team %q", p.Name, j.Team))
	}
	if j.Phase != jobs.PhaseSucceeded {
		return s.status(failedPrecondition(reasonNotSucceeded, "job %s is %s, not SUCCEEDED", req.GetJobId(), j.Phase))
	}
	rc, size, err := s.art.Open(j.Artifact.Digest)
	if errors.Is(err, store.ErrArtifactNotFound) || errors.Is(err, store.ErrInvalidDigest) {
		return s.status(&requestError{code: codes.NotFound, reason: reasonArtifactNotFound, msg: "the artifact of job " + req.GetJobId() + " is missing", err: err})
	}
	if err != nil {
		return s.status(err)
	}
	defer rc.Close()
	meta := artifactToProto(j.Artifact)
	meta.SizeBytes = size
	buf := make([]byte, artifactChunkBytes)
	first := true
	for {
		n, rerr := io.ReadFull(rc, buf)
		if n > 0 || first {
			msg := &leaseholdv1.GetArtifactResponse{Chunk: buf[:n]}
			if first {
				msg.Artifact = meta
				first = false
			}
			if err := stream.Send(msg); err != nil {
				return err
			}
		}
		switch {
		case rerr == io.EOF || rerr == io.ErrUnexpectedEOF:
			return nil
		case rerr != nil:
			return s.status(rerr)
		}
	}
}
