package server

import (
	"cmp"
	"encoding/base64"
	"encoding/binary"
	"strconv"
	"strings"
	"time"

	"github.com/leasehold/leasehold/client/limits"
	"github.com/leasehold/leasehold/coordinator/internal/engine"
	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	"github.com/leasehold/leasehold/coordinator/internal/reads"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Wire ids: a job is "j-<decimal>", a batch "b-<decimal>".
const (
	jobPrefix   = "j-"
	batchPrefix = "b-"
)

// JobID returns the wire id of job id.
func JobID(id uint64) string { return jobPrefix + strconv.FormatUint(id, 10) }

// BatchID returns the wire id of batch id.
func BatchID(id uint64) string { return batchPrefix + strconv.FormatUint(id, 10) }

// parseID parses a wire id with prefix. Only the canonical form is
// accepted: a positive decimal without sign or leading zeros.
func parseID(prefix, s, field string) (uint64, error) {
	rest, ok := strings.CutPrefix(s, prefix)
	if !ok {
		return 0, invalidArg(field, reasonInvalidID, "%s %q is not an id of the form %s<number>", field, s, prefix)
	}
	n, err := strconv.ParseUint(rest, 10, 64)
	if err != nil || n == 0 || strconv.FormatUint(n, 10) != rest {
		return 0, invalidArg(field, reasonInvalidID, "%s %q is not an id of the form %s<number>", field, s, prefix)
	}
	return n, nil
}

func parseJobID(s, field string) (uint64, error)   { return parseID(jobPrefix, s, field) }
func parseBatchID(s, field string) (uint64, error) { return parseID(batchPrefix, s, field) }

// Page sizes.
const (
	defaultPageSize = 100
	maxPageSize     = limits.MaxPageSize
)

// pageSize returns the effective page size: 0 means the default; outside
// 1 to maxPageSize is refused, as the API documents.
func pageSize(n int32) (int, error) {
	switch {
	case n < 0 || n > maxPageSize:
		return 0, invalidArg("page_size", reasonInvalidPageSize, "page_size must be 1 to %d (0 for %d)", maxPageSize, defaultPageSize)
	case n == 0:
		return defaultPageSize, nil
	}
	return int(n), nil
}

// encodePageToken returns the opaque token for the page after id.
func encodePageToken(id uint64) string {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], id)
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// decodePageToken returns the id a page token names; "" is 0.
func decodePageToken(tok string) (uint64, error) {
	if tok == "" {
		return 0, nil
	}
	b, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil || len(b) != 8 || binary.BigEndian.Uint64(b) == 0 {
		return 0, invalidArg("page_token", reasonInvalidPageToken, "page_token is not one this server issued")
	}
	return binary.BigEndian.Uint64(b), nil
}

// ts converts a time, leaving the zero time unset.
func ts(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}

// fromTS converts a timestamp, nil being the zero time.
func fromTS(t *timestamppb.Timestamp) time.Time {
	if t == nil {
		return time.Time{}
	}
	return t.AsTime()
}

// view says who a job is shown to.
type view int

const (
	// viewFull shows everything but inline content: submitters, renderers.
	viewFull view = iota
	// viewOperator also leaves out the document's source location.
	viewOperator
)

// documentInfoToProto converts a document's metadata; never its content.
func documentInfoToProto(d jobs.Document, v view) *leaseholdv1.DocumentInfo {
	info := &leaseholdv1.DocumentInfo{
		Name:          d.Name,
		ContentType:   d.ContentType,
		SizeBytes:     d.SizeBytes,
		SourceUri:     d.SourceURI,
		ContentSha256: d.ContentSHA256,
	}
	if v == viewOperator {
		info.SourceUri = ""
	}
	return info
}

// leaseToProto converts j's lease, nil unless LEASED.
func leaseToProto(j jobs.Job) *leaseholdv1.Lease {
	if j.Phase != jobs.PhaseLeased {
		return nil
	}
	return &leaseholdv1.Lease{
		Token:      j.Lease.Token,
		RendererId: j.Lease.Renderer,
		GrantedAt:  ts(j.Lease.GrantedAt),
		Deadline:   ts(j.Lease.Deadline),
		Attempt:    j.Attempt,
	}
}

// eventToProto converts one history entry.
func eventToProto(ev jobs.Event) *leaseholdv1.JobEvent {
	return &leaseholdv1.JobEvent{
		Seq:        ev.Seq,
		At:         ts(ev.At),
		Kind:       leaseholdv1.EventKind(ev.Kind),
		Phase:      leaseholdv1.Phase(ev.Phase),
		Token:      ev.Token,
		RendererId: ev.Renderer,
		Attempt:    ev.Attempt,
		Reason:     ev.Reason,
		Message:    ev.Message,
		Principal:  ev.Principal,
	}
}

// jobToProto converts a job as v may see it, with or without its history.
func jobToProto(j jobs.Job, v view, withEvents bool) *leaseholdv1.Job {
	pj := &leaseholdv1.Job{
		Id:                  JobID(j.ID),
		BatchId:             BatchID(j.BatchID),
		Team:                j.Team,
		Document:            documentInfoToProto(j.Doc, v),
		Phase:               leaseholdv1.Phase(j.Phase),
		Attempt:             j.Attempt,
		MaxAttempts:         j.Policy.MaxAttempts,
		Cycle:               j.Cycle,
		Lease:               leaseToProto(j),
		TerminalReason:      leaseholdv1.TerminalReason(j.TerminalReason),
		TerminalMessage:     j.TerminalMessage,
		FinishedAt:          ts(j.FinishedAt),
		CreatedAt:           ts(j.CreatedAt),
		UpdatedAt:           ts(j.UpdatedAt),
		RejectedCompletions: j.RejectedCompletions,
	}
	if j.Phase == jobs.PhaseRetryWait {
		pj.NextAttemptAt = ts(j.NextAttemptAt)
	}
	if j.Phase == jobs.PhaseSucceeded && j.Artifact.Digest != "" {
		pj.Artifact = artifactToProto(j.Artifact)
	}
	if j.Phase == jobs.PhaseCancelled {
		c := j.Cancellation
		pj.Cancellation = &leaseholdv1.Cancellation{
			Principal:      c.Principal,
			At:             ts(c.At),
			Reason:         c.Reason,
			FromPhase:      leaseholdv1.Phase(c.FromPhase),
			RendererId:     c.Renderer,
			RevokedToken:   c.Token,
			Acknowledged:   !c.AckedAt.IsZero(),
			AcknowledgedAt: ts(c.AckedAt),
		}
	}
	if withEvents {
		pj.Events = make([]*leaseholdv1.JobEvent, len(j.History))
		for i, ev := range j.History {
			pj.Events[i] = eventToProto(ev)
		}
	}
	return pj
}

// artifactToProto converts an artifact reference. Its media type is the
// one the preview is served under (jobs.ServedPreviewType): a type outside
// the preview types, stored by an earlier release, is reported as
// application/octet-stream, so that no reader serves it as what it claims.
func artifactToProto(a jobs.Artifact) *leaseholdv1.Artifact {
	return &leaseholdv1.Artifact{
		Digest:      a.Digest,
		SizeBytes:   a.Size,
		ContentType: jobs.ServedPreviewType(a.ContentType),
		Token:       a.Token,
		RendererId:  a.Renderer,
	}
}

// policyToProto converts a retry policy.
func policyToProto(p jobs.RetryPolicy) *leaseholdv1.RetryPolicy {
	return &leaseholdv1.RetryPolicy{
		MaxAttempts: p.MaxAttempts,
		BackoffBase: durationpb.New(p.BackoffBase),
		BackoffCap:  durationpb.New(p.BackoffCap),
	}
}

// policyFromProto converts a retry-policy override; nil is no override.
func policyFromProto(p *leaseholdv1.RetryPolicy) jobs.PolicyInput {
	if p == nil {
		return jobs.PolicyInput{}
	}
	in := jobs.PolicyInput{MaxAttempts: p.GetMaxAttempts()}
	if p.BackoffBase != nil {
		in.BackoffBase = p.GetBackoffBase().AsDuration()
	}
	if p.BackoffCap != nil {
		in.BackoffCap = p.GetBackoffCap().AsDuration()
	}
	return in
}

// countsToProto lists the non-zero counts in phase order.
func countsToProto(counts jobs.Counts) []*leaseholdv1.PhaseCount {
	var out []*leaseholdv1.PhaseCount
	for p, n := range counts {
		if n > 0 {
			out = append(out, &leaseholdv1.PhaseCount{Phase: leaseholdv1.Phase(p), Count: uint32(n)})
		}
	}
	return out
}

// batchToProto converts a batch view; withIDs adds the job ids.
func batchToProto(bv reads.BatchView, withIDs bool) *leaseholdv1.Batch {
	b := bv.Batch
	pb := &leaseholdv1.Batch{
		Id:          BatchID(b.ID),
		Team:        b.Team,
		RequestId:   b.RequestID,
		CreatedAt:   ts(b.CreatedAt),
		JobCount:    b.Count,
		Counts:      countsToProto(bv.Counts),
		Done:        bv.Done,
		RetryPolicy: policyToProto(b.Policy),
	}
	if withIDs {
		for _, id := range b.JobIDs() {
			pb.JobIds = append(pb.JobIds, JobID(id))
		}
	}
	return pb
}

// rejectionToProto converts a rejected completion.
func rejectionToProto(r jobs.Rejection) *leaseholdv1.RejectedCompletion {
	return &leaseholdv1.RejectedCompletion{
		Id:             r.ID,
		JobId:          JobID(r.Job),
		Team:           r.Team,
		Token:          r.Token,
		RendererId:     r.Renderer,
		Reason:         r.Reason,
		At:             ts(r.At),
		CurrentToken:   r.CurrentToken,
		CurrentPhase:   leaseholdv1.Phase(r.CurrentPhase),
		Outcome:        r.Outcome,
		ArtifactDigest: r.Digest,
	}
}

// auditToProto converts an audit record (never its stored response).
func auditToProto(a jobs.AuditRecord) *leaseholdv1.AuditRecord {
	pa := &leaseholdv1.AuditRecord{
		Id:               a.ID,
		At:               ts(a.At),
		Principal:        a.Principal,
		Action:           a.Action,
		Reason:           a.Reason,
		RequestId:        a.RequestID,
		IncludePermanent: a.IncludePermanent,
		Skipped:          a.Skipped,
		OutOfScope:       a.OutOfScope,
		TerminalReason:   leaseholdv1.TerminalReason(a.TerminalReason),
		Teams:            a.Teams,
		Target:           a.Target,
	}
	if a.Batch != 0 {
		pa.BatchId = BatchID(a.Batch)
	}
	for _, id := range a.JobIDs {
		pa.JobIds = append(pa.JobIds, JobID(id))
	}
	return pa
}

// leaseStatusToProto converts a heartbeat answer or a revocation.
func leaseStatusToProto(s engine.LeaseStatus) *leaseholdv1.LeaseStatus {
	ps := &leaseholdv1.LeaseStatus{
		JobId:        JobID(s.Job),
		Token:        s.Token,
		State:        leaseholdv1.LeaseState_LEASE_STATE_LOST,
		Reason:       s.Reason,
		CurrentToken: s.CurrentToken,
		CurrentPhase: leaseholdv1.Phase(s.CurrentPhase),
	}
	if s.Held {
		ps.State = leaseholdv1.LeaseState_LEASE_STATE_HELD
		ps.Deadline = ts(s.Deadline)
		ps.Reason = ""
	}
	return ps
}

// grantToProto converts a granted lease with the document the renderer
// needs, inline content included.
func grantToProto(g engine.Grant) *leaseholdv1.Grant {
	j := g.Job
	return &leaseholdv1.Grant{
		JobId: JobID(j.ID),
		Team:  j.Team,
		Lease: leaseToProto(j),
		Document: &leaseholdv1.Document{
			Name:        j.Doc.Name,
			ContentType: j.Doc.ContentType,
			SizeBytes:   j.Doc.SizeBytes,
			Content:     g.Content,
			SourceUri:   j.Doc.SourceURI,
		},
		TraceParent: j.TraceParent,
	}
}

// replayToProto converts a replay's answer: metadata only.
func replayToProto(r engine.ReplayResult) *leaseholdv1.ReplayJobsResponse {
	resp := &leaseholdv1.ReplayJobsResponse{
		DryRun:     r.DryRun,
		Requeued:   uint32(r.Requeued),
		Skipped:    uint32(r.Skipped),
		OutOfScope: uint32(r.OutOfScope),
		Truncated:  r.Truncated,
		Selected:   uint32(r.Selected),
		Limit:      uint32(r.Limit),
		AuditId:    r.AuditID,
	}
	for _, it := range r.Items {
		pi := &leaseholdv1.ReplayItem{
			JobId:      JobID(cmp.Or(it.Job.ID, it.ID)),
			Action:     leaseholdv1.ReplayAction_REPLAY_ACTION_SKIP,
			SkipReason: it.SkipReason,
		}
		if it.Job.ID != 0 {
			pi.BatchId = BatchID(it.Job.BatchID)
			pi.Team = it.Job.Team
			pi.Phase = leaseholdv1.Phase(it.Job.Phase)
			pi.TerminalReason = leaseholdv1.TerminalReason(it.Job.TerminalReason)
			pi.Attempt = it.Job.Attempt
			pi.Cycle = it.Job.Cycle
		}
		if it.Requeue {
			pi.Action = leaseholdv1.ReplayAction_REPLAY_ACTION_REQUEUE
			pi.SkipReason = ""
		}
		resp.Items = append(resp.Items, pi)
	}
	return resp
}
