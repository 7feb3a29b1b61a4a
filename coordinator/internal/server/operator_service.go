package server

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash"

	"github.com/leasehold/leasehold/coordinator/internal/artifacts"
	"github.com/leasehold/leasehold/coordinator/internal/auth"
	"github.com/leasehold/leasehold/coordinator/internal/engine"
	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	"github.com/leasehold/leasehold/coordinator/internal/reads"
	"github.com/leasehold/leasehold/coordinator/internal/store"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"google.golang.org/protobuf/proto"
)

// OperatorServer implements leasehold.v1.OperatorService. Every answer
// carries job metadata only.
type OperatorServer struct {
	leaseholdv1.UnimplementedOperatorServiceServer
	*core
	e OperatorEngine
}

var _ leaseholdv1.OperatorServiceServer = (*OperatorServer)(nil)

// ListRejectedCompletions implements OperatorService.ListRejectedCompletions.
func (s *OperatorServer) ListRejectedCompletions(ctx context.Context, req *leaseholdv1.ListRejectedCompletionsRequest) (*leaseholdv1.ListRejectedCompletionsResponse, error) {
	p, err := require(ctx, auth.RoleOperator)
	if err != nil {
		return nil, s.status(err)
	}
	f := reads.RejectionFilter{
		Renderer: req.GetRendererId(),
		Since:    fromTS(req.GetSince()),
		Until:    fromTS(req.GetUntil()),
	}
	if req.GetJobId() != "" {
		if f.Job, err = parseJobID(req.GetJobId(), "job_id"); err != nil {
			return nil, s.status(err)
		}
	}
	if f.Limit, err = pageSize(req.GetPageSize()); err != nil {
		return nil, s.status(err)
	}
	if f.Before, err = decodePageToken(req.GetPageToken()); err != nil {
		return nil, s.status(err)
	}
	if f.Teams, err = readTeams(p); err != nil {
		return nil, s.status(err)
	}
	page, err := s.e.ListRejections(f)
	if err != nil {
		return nil, s.status(err)
	}
	resp := &leaseholdv1.ListRejectedCompletionsResponse{}
	if page.Next != 0 {
		resp.NextPageToken = encodePageToken(page.Next)
	}
	for _, r := range page.Rejections {
		if p.InScope(r.Team) {
			resp.Rejections = append(resp.Rejections, rejectionToProto(r))
		}
	}
	return resp, nil
}

// ReplayJobs implements OperatorService.ReplayJobs.
func (s *OperatorServer) ReplayJobs(ctx context.Context, req *leaseholdv1.ReplayJobsRequest) (*leaseholdv1.ReplayJobsResponse, error) {
	p, err := require(ctx, auth.RoleOperator)
	if err != nil {
		return nil, s.status(err)
	}
	rr := engine.ReplayRequest{
		Principal:        p.Name,
		RequestID:        req.GetRequestId(),
		Reason:           req.GetReason(),
		TerminalReason:   jobs.TerminalReason(req.GetTerminalReason()),
		DryRun:           req.GetDryRun(),
		IncludePermanent: req.GetIncludePermanent(),
		InScope:          p.InScope,
		Encode: func(r engine.ReplayResult) []byte {
			b, err := proto.Marshal(replayToProto(r))
			if err != nil {
				// A response built from plain fields always marshals.
				panic(fmt.Sprintf("marshalling a replay response: %v", err))
			}
			return b
		},
	}
	if n := len(req.GetJobIds()); n > maxReplayJobIDs {
		return nil, s.status(invalidArg("job_ids", reasonTooManyJobIDs, "%d job_ids, at most %d per call", n, maxReplayJobIDs))
	}
	if err := checkReason("reason", req.GetReason(), !req.GetDryRun()); err != nil {
		return nil, s.status(err)
	}
	if id := req.GetRequestId(); id != "" && !jobs.ValidRequestID(id) {
		return nil, s.status(invalidArg("request_id", reasonInvalidRequestID, "request_id must be 1 to %d bytes of UTF-8 text without control or bidirectional formatting characters", jobs.MaxRequestIDBytes))
	}
	for i, wid := range req.GetJobIds() {
		id, err := parseJobID(wid, fmt.Sprintf("job_ids[%d]", i))
		if err != nil {
			return nil, s.status(err)
		}
		rr.JobIDs = append(rr.JobIDs, id)
	}
	if req.GetBatchId() != "" {
		if rr.Batch, err = parseBatchID(req.GetBatchId(), "batch_id"); err != nil {
			return nil, s.status(err)
		}
	}
	if _, ok := leaseholdv1.TerminalReason_name[int32(req.GetTerminalReason())]; !ok {
		return nil, s.status(invalidArg("terminal_reason", reasonInvalidTerminalReason, "unknown terminal reason %d", req.GetTerminalReason()))
	}
	// The engine selects by batch when one is named and narrows only a
	// batch by terminal reason; a request that names more is refused
	// rather than answered with a wider replay than it asked for.
	switch {
	case len(rr.JobIDs) == 0 && rr.Batch == 0:
		return nil, s.status(invalidArg("job_ids", reasonMissingSelection, "select jobs by job_ids or by batch_id"))
	case len(rr.JobIDs) > 0 && rr.Batch != 0:
		return nil, s.status(invalidArg("batch_id", reasonConflictingSelection, "select jobs by job_ids or by batch_id, not both"))
	case rr.TerminalReason != jobs.ReasonUnspecified && rr.Batch == 0:
		return nil, s.status(invalidArg("terminal_reason", reasonConflictingSelection, "terminal_reason narrows a batch_id selection; it needs batch_id"))
	case !rr.DryRun && rr.RequestID == "":
		return nil, s.status(invalidArg("request_id", reasonMissingRequestID, "a replay needs a request_id (or dry_run)"))
	}
	res, err := s.e.Replay(ctx, rr)
	if err != nil {
		return nil, s.status(notFound(err, reasonBatchNotFound, "batch %s not found", req.GetBatchId()))
	}
	if res.Previous != nil {
		prev := &leaseholdv1.ReplayJobsResponse{}
		if err := proto.Unmarshal(res.Previous, prev); err != nil {
			return nil, s.status(fmt.Errorf("decoding the stored replay answer: %w", err))
		}
		prev.Replayed = true
		return prev, nil
	}
	return replayToProto(res), nil
}

// requireAllTeams refuses an operator whose scope does not cover every
// team, for an action that touches all of them (why says how).
func requireAllTeams(ctx context.Context, why string) (auth.Principal, error) {
	p, err := require(ctx, auth.RoleOperator)
	if err != nil {
		return p, err
	}
	if !p.AllScope() {
		return p, denied("%s may act only on some teams; %s", p.Name, why)
	}
	return p, nil
}

// dispatchForAll is why pausing and resuming need every team.
const dispatchForAll = "dispatch is paused and resumed for all"

// PauseDispatch implements OperatorService.PauseDispatch. It needs an
// operator whose scope is every team.
func (s *OperatorServer) PauseDispatch(ctx context.Context, req *leaseholdv1.PauseDispatchRequest) (*leaseholdv1.PauseDispatchResponse, error) {
	p, err := requireAllTeams(ctx, dispatchForAll)
	if err != nil {
		return nil, s.status(err)
	}
	if err := checkReason("reason", req.GetReason(), true); err != nil {
		return nil, s.status(err)
	}
	st, err := s.e.SetPaused(ctx, true, p.Name, req.GetReason())
	if err != nil {
		return nil, s.status(err)
	}
	return &leaseholdv1.PauseDispatchResponse{Paused: st.Paused, Since: ts(st.Since)}, nil
}

// ResumeDispatch implements OperatorService.ResumeDispatch. It needs an
// operator whose scope is every team.
func (s *OperatorServer) ResumeDispatch(ctx context.Context, req *leaseholdv1.ResumeDispatchRequest) (*leaseholdv1.ResumeDispatchResponse, error) {
	p, err := requireAllTeams(ctx, dispatchForAll)
	if err != nil {
		return nil, s.status(err)
	}
	if err := checkReason("reason", req.GetReason(), true); err != nil {
		return nil, s.status(err)
	}
	st, err := s.e.SetPaused(ctx, false, p.Name, req.GetReason())
	if err != nil {
		return nil, s.status(err)
	}
	return &leaseholdv1.ResumeDispatchResponse{Paused: st.Paused}, nil
}

// maxReplayJobIDs bounds the job ids one replay call may name.
const maxReplayJobIDs = 1000

// GetAudit implements OperatorService.GetAudit. An operator sees a record
// only when its scope covers every team the record touched; records that
// touch no team (pause, resume) only with scope "*".
func (s *OperatorServer) GetAudit(ctx context.Context, req *leaseholdv1.GetAuditRequest) (*leaseholdv1.GetAuditResponse, error) {
	p, err := require(ctx, auth.RoleOperator)
	if err != nil {
		return nil, s.status(err)
	}
	f := reads.AuditFilter{Visible: func(teams []string) bool {
		if len(teams) == 0 {
			return p.AllScope()
		}
		for _, t := range teams {
			if !p.InScope(t) {
				return false
			}
		}
		return true
	}}
	if f.Limit, err = pageSize(req.GetPageSize()); err != nil {
		return nil, s.status(err)
	}
	if f.Before, err = decodePageToken(req.GetPageToken()); err != nil {
		return nil, s.status(err)
	}
	page, err := s.e.ListAudit(f)
	if err != nil {
		return nil, s.status(err)
	}
	resp := &leaseholdv1.GetAuditResponse{}
	if page.Next != 0 {
		resp.NextPageToken = encodePageToken(page.Next)
	}
	for _, a := range page.Records {
		resp.Records = append(resp.Records, auditToProto(a))
	}
	return resp, nil
}

// backupChunkBytes is the most bytes one Backup message carries.
const backupChunkBytes = 1 << 20

// Backup implements OperatorService.Backup. It needs the backup role,
// which no operator scope implies: the copy holds every team's documents
// and previews. The copy is taken into a file first (see engine.Backup),
// so that a slow or stalled reader holds no read transaction; the header
// goes first, the chunks next, and the trailer with their SHA-256 last.
func (s *OperatorServer) Backup(_ *leaseholdv1.BackupRequest, stream leaseholdv1.OperatorService_BackupServer) error {
	if _, err := require(stream.Context(), auth.RoleBackup); err != nil {
		return s.status(err)
	}
	w := &chunkWriter{send: func(b []byte) error {
		// A backup whose credential a reload revoked stops at its next
		// chunk (see auth.HoldWhile).
		if err := stream.Context().Err(); err != nil {
			return err
		}
		return stream.Send(&leaseholdv1.BackupResponse{Part: &leaseholdv1.BackupResponse_Chunk{Chunk: b}})
	}, hash: sha256.New(), buf: make([]byte, 0, backupChunkBytes)}
	var objects []store.ObjectRef
	_, err := s.e.Backup(w, func(info reads.BackupInfo) error {
		objects = info.Objects
		return stream.Send(&leaseholdv1.BackupResponse{Part: &leaseholdv1.BackupResponse_Header{Header: &leaseholdv1.BackupHeader{
			SizeBytes: info.Size, SchemaVersion: info.Schema, LastToken: info.LastToken, TakenAt: ts(info.TakenAt),
			Objects: uint64(len(objects)),
		}}})
	})
	if err == nil {
		err = w.flush()
	}
	if err == nil {
		err = sendBackupObjects(stream, objects)
	}
	if err == nil {
		err = stream.Send(&leaseholdv1.BackupResponse{Part: &leaseholdv1.BackupResponse_Trailer{Trailer: &leaseholdv1.BackupTrailer{
			Sha256: hex.EncodeToString(w.hash.Sum(nil)),
		}}})
	}
	if cerr := stream.Context().Err(); err != nil && cerr != nil {
		// The caller went away; bbolt's copy does not wrap the cause.
		return s.status(cerr)
	}
	return s.status(err)
}

// backupObjectsBatch is how many keys one BackupObjects message names
// (about 1 MiB of keys).
const backupObjectsBatch = 10000

// sendBackupObjects names the objects of the artifact store a backup's
// pointers need, in batches.
func sendBackupObjects(stream leaseholdv1.OperatorService_BackupServer, objects []store.ObjectRef) error {
	for len(objects) > 0 {
		n := min(len(objects), backupObjectsBatch)
		keys := make([]string, n)
		for i, o := range objects[:n] {
			keys[i] = artifacts.Key{Team: o.Team, Digest: o.Digest}.String()
		}
		if err := stream.Send(&leaseholdv1.BackupResponse{Part: &leaseholdv1.BackupResponse_Objects{Objects: &leaseholdv1.BackupObjects{Keys: keys}}}); err != nil {
			return err
		}
		objects = objects[n:]
	}
	return nil
}

// chunkWriter sends what is written to it in chunks of cap(buf) bytes,
// hashing them as they go.
type chunkWriter struct {
	send func([]byte) error
	hash hash.Hash
	buf  []byte
}

// Write implements io.Writer.
func (w *chunkWriter) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		k := min(len(p), cap(w.buf)-len(w.buf))
		w.buf = append(w.buf, p[:k]...)
		p = p[k:]
		if len(w.buf) == cap(w.buf) {
			if err := w.flush(); err != nil {
				return n - len(p), err
			}
		}
	}
	return n, nil
}

// flush sends what is buffered.
func (w *chunkWriter) flush() error {
	if len(w.buf) == 0 {
		return nil
	}
	w.hash.Write(w.buf)
	if err := w.send(w.buf); err != nil {
		return err
	}
	w.buf = w.buf[:0]
	return nil
}
