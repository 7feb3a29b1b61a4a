package lincheck

import (
	"fmt"
	"math"
	"sync"
	"time"

	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"google.golang.org/grpc/codes"
)

// Kind names the RPC a Record is of.
type Kind uint8

// The recorded RPCs.
const (
	// Submit is JobService.SubmitBatch.
	Submit Kind = iota + 1
	// Acquire is RendererService.Acquire.
	Acquire
	// Upload is RendererService.UploadArtifact.
	Upload
	// Complete is RendererService.Complete.
	Complete
	// Cancel is JobService.CancelJob.
	Cancel
	// Get is JobService.GetJob.
	Get
)

// String implements fmt.Stringer.
func (k Kind) String() string {
	switch k {
	case Submit:
		return "Submit"
	case Acquire:
		return "Acquire"
	case Upload:
		return "Upload"
	case Complete:
		return "Complete"
	case Cancel:
		return "Cancel"
	case Get:
		return "Get"
	}
	return fmt.Sprintf("Kind(%d)", k)
}

// Never is the return time of a Pending call: it may take effect at any
// time after its invocation, or never.
const Never int64 = math.MaxInt64

// Outcome is what a completion reports: success with the preview's digest,
// or a failure class.
type Outcome struct {
	Success bool
	// Digest is the lowercase hex SHA-256 of the preview, on success.
	Digest string
	// Class is the failure class otherwise.
	Class leaseholdv1.FailureClass
}

// String returns the outcome's identity: two completions with the same
// token and the same string are the same completion.
func (o Outcome) String() string {
	if o.Success {
		return "success:" + o.Digest
	}
	return "failure:" + o.Class.String()
}

// Grant is one lease of an Acquire answer.
type Grant struct {
	Job      string
	Token    uint64
	Renderer string
	Attempt  uint32
}

// View is what an answer showed of a job: the fields the model checks.
type View struct {
	Phase         leaseholdv1.Phase
	Attempt       uint32
	LeaseToken    uint64
	LeaseRenderer string
	Reason        leaseholdv1.TerminalReason
	// ArtifactToken and ArtifactDigest are the artifact reference.
	ArtifactToken  uint64
	ArtifactDigest string
	// CancelFrom, CancelRenderer and RevokedToken are the cancellation.
	CancelFrom     leaseholdv1.Phase
	CancelRenderer string
	RevokedToken   uint64
}

// ViewOf extracts a View from a job as the API returned it.
func ViewOf(j *leaseholdv1.Job) *View {
	if j == nil {
		return nil
	}
	return &View{
		Phase:          j.GetPhase(),
		Attempt:        j.GetAttempt(),
		LeaseToken:     j.GetLease().GetToken(),
		LeaseRenderer:  j.GetLease().GetRendererId(),
		Reason:         j.GetTerminalReason(),
		ArtifactToken:  j.GetArtifact().GetToken(),
		ArtifactDigest: j.GetArtifact().GetDigest(),
		CancelFrom:     j.GetCancellation().GetFromPhase(),
		CancelRenderer: j.GetCancellation().GetRendererId(),
		RevokedToken:   j.GetCancellation().GetRevokedToken(),
	}
}

// String implements fmt.Stringer.
func (v *View) String() string {
	if v == nil {
		return "<no job>"
	}
	s := fmt.Sprintf("%s a%d", phaseName(v.Phase), v.Attempt)
	if v.LeaseToken != 0 || v.LeaseRenderer != "" {
		s += fmt.Sprintf(" lease t%d@%s", v.LeaseToken, v.LeaseRenderer)
	}
	if v.Reason != leaseholdv1.TerminalReason_TERMINAL_REASON_UNSPECIFIED {
		s += " " + reasonName(v.Reason)
	}
	if v.ArtifactDigest != "" || v.ArtifactToken != 0 {
		s += fmt.Sprintf(" artifact t%d %s", v.ArtifactToken, short(v.ArtifactDigest))
	}
	if v.CancelFrom != leaseholdv1.Phase_PHASE_UNSPECIFIED {
		s += " from " + phaseName(v.CancelFrom)
		if v.CancelRenderer != "" || v.RevokedToken != 0 {
			s += fmt.Sprintf(" revoked t%d@%s", v.RevokedToken, v.CancelRenderer)
		}
	}
	return s
}

// Record is one RPC as a client saw it.
type Record struct {
	// Client is the index of the client that made the call.
	Client int
	Kind   Kind
	// Call and Return are nanoseconds since the history's base; Return is
	// Never when Pending.
	Call, Return int64

	// Job is the job an Upload, Complete, Cancel or Get names.
	Job string
	// Renderer is the renderer id of an Acquire, Upload or Complete.
	Renderer string
	// Token is the lease token of an Upload or Complete.
	Token uint64
	// Outcome is what a Complete reports.
	Outcome Outcome
	// Unsupported says, per document of a Submit, whether its format is
	// known unsupported.
	Unsupported []bool
	// Foreign marks a Cancel or Get by a submitter of another team.
	Foreign bool

	// Pending is set when the call ended with a transport error or a
	// timeout: it may or may not have taken effect.
	Pending bool
	// Code and Reason are the status code and ErrorInfo reason.
	Code   codes.Code
	Reason string
	// Err is the error's text, for the visualisation.
	Err string
	// Replayed is a Submit's or Complete's replayed flag.
	Replayed bool
	// JobIDs are a Submit's jobs in document order; for a Pending Submit,
	// the ids a retry with the same request id revealed.
	JobIDs []string
	// Grants are an Acquire's leases.
	Grants []Grant
	// AlreadyCancelled and RunningRenderer are a Cancel's answer.
	AlreadyCancelled bool
	RunningRenderer  string
	// View is the job a Get, or an applied Complete or Cancel, returned.
	View *View

	// Node is the node a call was sent to, counted from 1, on a cluster
	// whose clients also call nodes directly; 0 is the channel that follows
	// the leader.
	Node int
	// Stale marks a Get that asked for a stale read: any node serves it
	// from its store as it is. Such reads are not operations of the model;
	// CheckStaleReads checks them.
	Stale bool
	// AppliedIndex is the applied index a stale read's answer carried.
	AppliedIndex uint64
}

// Refused reports whether the call was refused UNAVAILABLE NOT_LEADER: a
// replicated coordinator's answer for a call that was not applied and
// will not be, sent to a follower or to a leader that stepped down.
func (r Record) Refused() bool { return r.Code == codes.Unavailable && r.Reason == NotLeader }

// Recorder collects Records from concurrent clients, timed on one
// monotonic clock. Its methods are safe for concurrent use.
type Recorder struct {
	base time.Time

	mu      sync.Mutex
	records []Record
}

// NewRecorder returns a Recorder whose clock starts now.
func NewRecorder() *Recorder { return &Recorder{base: time.Now()} }

// Now returns the time since the recorder's base, in nanoseconds. It is
// monotonic: time.Since uses the monotonic clock reading of the base.
func (r *Recorder) Now() int64 { return int64(time.Since(r.base)) }

// Add appends a finished record; a Pending one gets the return time Never.
func (r *Recorder) Add(rec Record) {
	if rec.Pending {
		rec.Return = Never
	}
	r.mu.Lock()
	r.records = append(r.records, rec)
	r.mu.Unlock()
}

// Len returns the number of records so far.
func (r *Recorder) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.records)
}

// Records returns a copy of the records so far.
func (r *Recorder) Records() []Record {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Record(nil), r.records...)
}

func phaseName(p leaseholdv1.Phase) string {
	if p == leaseholdv1.Phase_PHASE_UNSPECIFIED {
		return "NONE"
	}
	return trimPrefix(p.String(), "PHASE_")
}

func reasonName(r leaseholdv1.TerminalReason) string {
	return trimPrefix(r.String(), "TERMINAL_REASON_")
}

func trimPrefix(s, prefix string) string {
	if len(s) > len(prefix) && s[:len(prefix)] == prefix {
		return s[len(prefix):]
	}
	return s
}

func short(digest string) string {
	if len(digest) > 8 {
		return digest[:8]
	}
	return digest
}
