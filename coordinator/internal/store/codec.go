package store

import (
	"time"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	storagev1 "github.com/leasehold/leasehold/gen/leasehold/storage/v1"
)

func ns(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func tm(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n).UTC()
}

func jobToRecord(j jobs.Job) *storagev1.JobRecord {
	r := &storagev1.JobRecord{}
	fillJobRecord(r, j)
	return r
}

// fillJobRecord overwrites r with the record of j, so that one record can
// serve every job a transaction writes.
func fillJobRecord(r *storagev1.JobRecord, j jobs.Job) {
	*r = storagev1.JobRecord{
		Id:                  j.ID,
		BatchId:             j.BatchID,
		Team:                j.Team,
		DocName:             j.Doc.Name,
		DocContentType:      j.Doc.ContentType,
		DocSizeBytes:        j.Doc.SizeBytes,
		DocSourceUri:        j.Doc.SourceURI,
		DocContentSha256:    j.Doc.ContentSHA256,
		Phase:               int32(j.Phase),
		Attempt:             j.Attempt,
		MaxAttempts:         j.Policy.MaxAttempts,
		BackoffBaseNs:       int64(j.Policy.BackoffBase),
		BackoffCapNs:        int64(j.Policy.BackoffCap),
		Cycle:               j.Cycle,
		LeaseToken:          j.Lease.Token,
		LeaseRenderer:       j.Lease.Renderer,
		LeaseGrantedAt:      ns(j.Lease.GrantedAt),
		LeaseDeadline:       ns(j.Lease.Deadline),
		NextAttemptAt:       ns(j.NextAttemptAt),
		TerminalReason:      int32(j.TerminalReason),
		TerminalMessage:     j.TerminalMessage,
		FinishedAt:          ns(j.FinishedAt),
		ArtifactDigest:      j.Artifact.Digest,
		ArtifactSize:        j.Artifact.Size,
		ArtifactContentType: j.Artifact.ContentType,
		ArtifactToken:       j.Artifact.Token,
		ArtifactRenderer:    j.Artifact.Renderer,
		ArtifactStored:      j.Artifact.Stored,
		CancelPrincipal:     j.Cancellation.Principal,
		CancelAt:            ns(j.Cancellation.At),
		CancelReason:        j.Cancellation.Reason,
		CancelFromPhase:     int32(j.Cancellation.FromPhase),
		CancelRenderer:      j.Cancellation.Renderer,
		CancelToken:         j.Cancellation.Token,
		CancelAckedAt:       ns(j.Cancellation.AckedAt),
		CreatedAt:           ns(j.CreatedAt),
		UpdatedAt:           ns(j.UpdatedAt),
		EnqueuedAt:          ns(j.EnqueuedAt),
		LastCause:           j.LastCause,
		RejectedCompletions: j.RejectedCompletions,
		EventSeq:            j.EventSeq,
		CancelRejected:      j.CancelRejected,
		ContentBytes:        j.ContentBytes,
		Undelivered:         j.Undelivered,
		HandedBack:          j.HandedBack,
		TraceParent:         j.TraceParent,
	}
	if len(j.Leases) > 0 {
		r.Leases = make([]*storagev1.LeaseEnd, len(j.Leases))
		for i, l := range j.Leases {
			r.Leases[i] = &storagev1.LeaseEnd{Token: l.Token, Renderer: l.Renderer, Kind: int32(l.Kind), Outcome: l.Outcome}
		}
	}
	if len(j.Rejected) > 0 {
		r.Rejected = make([]*storagev1.RejectionKey, len(j.Rejected))
		for i, k := range j.Rejected {
			r.Rejected[i] = &storagev1.RejectionKey{Token: k.Token, Reason: k.Reason, Renderer: k.Renderer}
		}
	}
}

func eventToRecord(e jobs.Event) *storagev1.Event {
	return &storagev1.Event{
		Seq: e.Seq, At: ns(e.At), Kind: int32(e.Kind), Phase: int32(e.Phase), Token: e.Token,
		Renderer: e.Renderer, Attempt: e.Attempt, Reason: e.Reason, Message: e.Message, Principal: e.Principal,
	}
}

func eventFromRecord(e *storagev1.Event) jobs.Event {
	return jobs.Event{
		Seq: e.Seq, At: tm(e.At), Kind: jobs.EventKind(e.Kind), Phase: jobs.Phase(e.Phase), Token: e.Token,
		Renderer: e.Renderer, Attempt: e.Attempt, Reason: e.Reason, Message: e.Message, Principal: e.Principal,
	}
}

func jobFromRecord(r *storagev1.JobRecord) jobs.Job {
	j := jobs.Job{
		ID:      r.Id,
		BatchID: r.BatchId,
		Team:    r.Team,
		Doc: jobs.Document{
			Name: r.DocName, ContentType: r.DocContentType, SizeBytes: r.DocSizeBytes,
			SourceURI: r.DocSourceUri, ContentSHA256: r.DocContentSha256,
		},
		Policy:          jobs.RetryPolicy{MaxAttempts: r.MaxAttempts, BackoffBase: time.Duration(r.BackoffBaseNs), BackoffCap: time.Duration(r.BackoffCapNs)},
		Phase:           jobs.Phase(r.Phase),
		Attempt:         r.Attempt,
		Cycle:           r.Cycle,
		Lease:           jobs.Lease{Token: r.LeaseToken, Renderer: r.LeaseRenderer, GrantedAt: tm(r.LeaseGrantedAt), Deadline: tm(r.LeaseDeadline)},
		NextAttemptAt:   tm(r.NextAttemptAt),
		TerminalReason:  jobs.TerminalReason(r.TerminalReason),
		TerminalMessage: r.TerminalMessage,
		FinishedAt:      tm(r.FinishedAt),
		Artifact: jobs.Artifact{
			Digest: r.ArtifactDigest, Size: r.ArtifactSize, ContentType: r.ArtifactContentType,
			Token: r.ArtifactToken, Renderer: r.ArtifactRenderer, Stored: r.ArtifactStored,
		},
		Cancellation: jobs.Cancellation{
			Principal: r.CancelPrincipal, At: tm(r.CancelAt), Reason: r.CancelReason, FromPhase: jobs.Phase(r.CancelFromPhase),
			Renderer: r.CancelRenderer, Token: r.CancelToken, AckedAt: tm(r.CancelAckedAt),
		},
		LastCause:           r.LastCause,
		CreatedAt:           tm(r.CreatedAt),
		UpdatedAt:           tm(r.UpdatedAt),
		EnqueuedAt:          tm(r.EnqueuedAt),
		RejectedCompletions: r.RejectedCompletions,
		EventSeq:            r.EventSeq,
		CancelRejected:      r.CancelRejected,
		ContentBytes:        r.ContentBytes,
		Undelivered:         r.Undelivered,
		HandedBack:          r.HandedBack,
		TraceParent:         r.TraceParent,
	}
	if len(r.Leases) > 0 {
		j.Leases = make([]jobs.LeaseRecord, len(r.Leases))
		for i, l := range r.Leases {
			j.Leases[i] = jobs.LeaseRecord{Token: l.Token, Renderer: l.Renderer, Kind: jobs.LeaseEndKind(l.Kind), Outcome: l.Outcome}
		}
	}
	if len(r.Rejected) > 0 {
		j.Rejected = make([]jobs.RejectionKey, len(r.Rejected))
		for i, k := range r.Rejected {
			j.Rejected[i] = jobs.RejectionKey{Token: k.Token, Reason: k.Reason, Renderer: k.Renderer}
		}
	}
	return j
}

func batchToRecord(b jobs.Batch) *storagev1.BatchRecord {
	return &storagev1.BatchRecord{
		Id: b.ID, Team: b.Team, RequestId: b.RequestID, CreatedAt: ns(b.CreatedAt), FirstJobId: b.FirstJob, JobCount: b.Count,
		RequestHash: b.RequestHash, MaxAttempts: b.Policy.MaxAttempts, BackoffBaseNs: int64(b.Policy.BackoffBase), BackoffCapNs: int64(b.Policy.BackoffCap),
		PurgedJobs: b.Purged,
	}
}

func batchFromRecord(r *storagev1.BatchRecord) jobs.Batch {
	return jobs.Batch{
		ID: r.Id, Team: r.Team, RequestID: r.RequestId, CreatedAt: tm(r.CreatedAt), FirstJob: r.FirstJobId, Count: r.JobCount,
		RequestHash: r.RequestHash, Purged: r.PurgedJobs,
		Policy: jobs.RetryPolicy{MaxAttempts: r.MaxAttempts, BackoffBase: time.Duration(r.BackoffBaseNs), BackoffCap: time.Duration(r.BackoffCapNs)},
	}
}

func rejectionToRecord(r jobs.Rejection) *storagev1.RejectionRecord {
	return &storagev1.RejectionRecord{
		Id: r.ID, JobId: r.Job, Team: r.Team, Token: r.Token, Renderer: r.Renderer, Reason: r.Reason, At: ns(r.At),
		CurrentToken: r.CurrentToken, CurrentPhase: int32(r.CurrentPhase), Outcome: r.Outcome, ArtifactDigest: r.Digest,
	}
}

func rejectionFromRecord(r *storagev1.RejectionRecord) jobs.Rejection {
	return jobs.Rejection{
		ID: r.Id, Job: r.JobId, Team: r.Team, Token: r.Token, Renderer: r.Renderer, Reason: r.Reason, At: tm(r.At),
		CurrentToken: r.CurrentToken, CurrentPhase: jobs.Phase(r.CurrentPhase), Outcome: r.Outcome, Digest: r.ArtifactDigest,
	}
}

func auditToRecord(a jobs.AuditRecord) *storagev1.AuditRecord {
	return &storagev1.AuditRecord{
		Id: a.ID, At: ns(a.At), Principal: a.Principal, Action: a.Action, Reason: a.Reason, RequestId: a.RequestID,
		JobIds: a.JobIDs, IncludePermanent: a.IncludePermanent, Skipped: a.Skipped, OutOfScope: a.OutOfScope,
		BatchId: a.Batch, TerminalReason: int32(a.TerminalReason), Response: a.Response, Teams: a.Teams, Target: a.Target,
	}
}

func auditFromRecord(r *storagev1.AuditRecord) jobs.AuditRecord {
	return jobs.AuditRecord{
		ID: r.Id, At: tm(r.At), Principal: r.Principal, Action: r.Action, Reason: r.Reason, RequestID: r.RequestId,
		JobIDs: r.JobIds, IncludePermanent: r.IncludePermanent, Skipped: r.Skipped, OutOfScope: r.OutOfScope,
		Batch: r.BatchId, TerminalReason: jobs.TerminalReason(r.TerminalReason), Response: r.Response, Teams: r.Teams,
		Target: r.Target,
	}
}

// field is one field of an encoded record, as nextField reads it.
type field struct {
	num protowire.Number
	typ protowire.Type
	// x is the value of a varint field.
	x uint64
	// b is the value of a length-delimited field, aliasing the record.
	b []byte
}

// nextField reads the field at the start of v and returns it with the rest
// of v. The value of a field of another wire type is skipped.
func nextField(v []byte) (field, []byte, error) {
	num, typ, n := protowire.ConsumeTag(v)
	if n < 0 {
		return field{}, nil, protowire.ParseError(n)
	}
	v = v[n:]
	f := field{num: num, typ: typ}
	switch typ {
	case protowire.VarintType:
		f.x, n = protowire.ConsumeVarint(v)
	case protowire.BytesType:
		f.b, n = protowire.ConsumeBytes(v)
	default:
		n = protowire.ConsumeFieldValue(num, typ, v)
	}
	if n < 0 {
		return field{}, nil, protowire.ParseError(n)
	}
	return f, v[n:], nil
}
