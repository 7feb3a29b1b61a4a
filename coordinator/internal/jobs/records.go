package jobs

import "time"

// Batch is a submitted set of jobs. Its jobs have the consecutive ids
// FirstJob .. FirstJob+Count-1, allocated in the transaction that stored it.
type Batch struct {
	ID        uint64
	Team      string
	RequestID string
	CreatedAt time.Time
	FirstJob  uint64
	Count     uint32
	Policy    RetryPolicy
	// RequestHash identifies the submitted documents, to tell a retry of
	// the same request from a request id reused for something else.
	RequestHash []byte
	// Purged counts the batch's jobs that retention deleted; the others
	// are stored.
	Purged uint32
}

// JobIDs returns the batch's job ids in submission order.
func (b Batch) JobIDs() []uint64 {
	ids := make([]uint64, b.Count)
	for i := range ids {
		ids[i] = b.FirstJob + uint64(i)
	}
	return ids
}

// Rejection is a completion refused by the fencing check.
type Rejection struct {
	ID           uint64
	Job          uint64
	Team         string
	Token        uint64
	Renderer     string
	Reason       string
	At           time.Time
	CurrentToken uint64
	CurrentPhase Phase
	Outcome      string
	Digest       string
}

// Audit actions.
const (
	AuditReplay        = "REPLAY"
	AuditPause         = "PAUSE_DISPATCH"
	AuditResume        = "RESUME_DISPATCH"
	AuditCancelJob     = "CANCEL_JOB"
	AuditCancelBatch   = "CANCEL_BATCH"
	AuditDenied        = "DENIED"
	AuditCancelRefused = "CANCEL_REFUSED"
	// Cluster changes (ClusterService): the record's Target names the
	// member.
	AuditTransferLeadership = "CLUSTER_TRANSFER_LEADERSHIP"
	AuditAddVoter           = "CLUSTER_ADD_VOTER"
	AuditRemoveServer       = "CLUSTER_REMOVE_SERVER"
)

// AuditRecord is one operator action.
type AuditRecord struct {
	ID               uint64
	At               time.Time
	Principal        string
	Action           string
	Reason           string
	RequestID        string
	JobIDs           []uint64
	IncludePermanent bool
	Skipped          uint32
	OutOfScope       uint32
	Batch            uint64
	TerminalReason   TerminalReason
	// Teams lists the teams whose jobs the action touched; an operator sees
	// the record only when its scope covers all of them.
	Teams []string
	// Target is what a cluster change applied to (a member and its
	// address); empty for actions on jobs and dispatch.
	Target string
	// Response is the serialized answer of a replay, returned again for a
	// repeated request id.
	Response []byte
}

// DispatchState is the operator's rollout switch.
type DispatchState struct {
	Paused    bool
	Since     time.Time
	Principal string
	Reason    string
}
