// Package reason is the one list of the stable reasons the coordinator
// gives: the google.rpc.ErrorInfo reason of every error it returns (domain
// leasehold.v1), and the reason a lease was lost that a renderer reads in a
// LeaseStatus and an operator reads in a job's history.
//
// The coordinator, the client library and the renderer all take their
// reasons from here, so a caller matching on one compares against the same
// constant the coordinator wrote:
//
//	if client.Reason(err) == string(reason.TeamQueueFull) { ... }
//
// Most callers need only the sentinels of package client
// (errors.Is(err, client.ErrQueueFull)); the reasons tell apart what one
// sentinel covers, such as the INVALID_ARGUMENT reasons of a refused batch.
// A reason's text never changes once released; new ones may be added.
//
// The package imports nothing, so that every layer, the coordinator's pure
// state machine included, can use it.
package reason

// Domain is the google.rpc.ErrorInfo domain of every error the coordinator
// returns.
const Domain = "leasehold.v1"

// Reason is a stable, machine-readable reason, written as UPPER_SNAKE_CASE
// on the wire.
type Reason string

// String returns the reason as it travels on the wire.
func (r Reason) String() string { return string(r) }

// Reasons of UNAUTHENTICATED and PERMISSION_DENIED.
const (
	// Unauthenticated: no bearer token, or one no principal has.
	Unauthenticated Reason = "UNAUTHENTICATED"
	// PermissionDenied: the principal's roles, team or scope do not cover the call.
	PermissionDenied Reason = "PERMISSION_DENIED"
	// RendererIDNotAllowed: the credential may not use the renderer id it names.
	RendererIDNotAllowed Reason = "RENDERER_ID_NOT_ALLOWED"
)

// Reasons of INVALID_ARGUMENT for a batch: one per limit or field rule,
// each with a google.rpc.BadRequest naming the offending fields.
const (
	// InvalidTeam: the team is not 1 to 64 bytes of [a-z0-9_-].
	InvalidTeam Reason = "INVALID_TEAM"
	// MissingRequestID: a request id is required and none was given.
	MissingRequestID Reason = "MISSING_REQUEST_ID"
	// InvalidRequestID: the request id is too long or not text.
	InvalidRequestID Reason = "INVALID_REQUEST_ID"
	// RequestIDReused: the request id was used before with different documents.
	RequestIDReused Reason = "REQUEST_ID_REUSED"
	// EmptyBatch: a batch needs at least one document.
	EmptyBatch Reason = "EMPTY_BATCH"
	// BatchTooLarge: too many documents, declared bytes or inline bytes in one batch.
	BatchTooLarge Reason = "BATCH_TOO_LARGE"
	// InvalidRetryPolicy: the batch's retry policy is outside its bounds.
	InvalidRetryPolicy Reason = "INVALID_RETRY_POLICY"
	// InvalidName: a document name is empty, too long or not text.
	InvalidName Reason = "INVALID_NAME"
	// DuplicateName: a document name repeats another of the batch.
	DuplicateName Reason = "DUPLICATE_NAME"
	// InvalidSize: a document's declared size is negative or below its inline content.
	InvalidSize Reason = "INVALID_SIZE"
	// DocumentTooLarge: a document declares more bytes than one document may.
	DocumentTooLarge Reason = "DOCUMENT_TOO_LARGE"
	// ContentTooLarge: a document carries more bytes inline than one document may.
	ContentTooLarge Reason = "CONTENT_TOO_LARGE"
	// MissingContent: a document has neither content nor a source URI.
	MissingContent Reason = "MISSING_CONTENT"
	// InvalidSourceURI: a document's source URI is too long or not text.
	InvalidSourceURI Reason = "INVALID_SOURCE_URI"
	// InvalidContentType: a content or media type is too long, not text, or not one accepted.
	InvalidContentType Reason = "INVALID_CONTENT_TYPE"
)

// Other reasons of INVALID_ARGUMENT.
const (
	// MalformedRequest: the request could not be decoded (bytes that are not
	// the message, invalid UTF-8 in a string).
	MalformedRequest Reason = "MALFORMED_REQUEST"
	// InvalidText: a command reached the writer with a string that is not text.
	InvalidText Reason = "INVALID_TEXT"
	// InvalidID: a job or batch id is malformed.
	InvalidID Reason = "INVALID_ID"
	// InvalidPageToken: the page token was not issued for this listing.
	InvalidPageToken Reason = "INVALID_PAGE_TOKEN"
	// InvalidPageSize: the page size is outside 0 to 1,000.
	InvalidPageSize Reason = "INVALID_PAGE_SIZE"
	// InvalidPhase: a phase filter names no phase.
	InvalidPhase Reason = "INVALID_PHASE"
	// InvalidTerminalReason: a terminal reason filter names none a replay may select.
	InvalidTerminalReason Reason = "INVALID_TERMINAL_REASON"
	// InvalidBatchState: a batch state filter names no state.
	InvalidBatchState Reason = "INVALID_BATCH_STATE"
	// InvalidInterval: an overview interval is outside its bounds.
	InvalidInterval Reason = "INVALID_INTERVAL"
	// MissingReason: a required free-text reason is missing or blank.
	MissingReason Reason = "MISSING_REASON"
	// InvalidReason: a free-text reason is too long or not text.
	InvalidReason Reason = "INVALID_REASON"
	// InvalidMessage: a failure message is too long or not text.
	InvalidMessage Reason = "INVALID_MESSAGE"
	// MissingSelection: a replay names neither job ids nor a batch.
	MissingSelection Reason = "MISSING_SELECTION"
	// ConflictingSelection: a replay names both job ids and a batch.
	ConflictingSelection Reason = "CONFLICTING_SELECTION"
	// TooManyJobIDs: a request names more jobs than one call may.
	TooManyJobIDs Reason = "TOO_MANY_JOB_IDS"
	// InvalidRendererID: a renderer id is not 1 to 128 bytes of [A-Za-z0-9._-].
	InvalidRendererID Reason = "INVALID_RENDERER_ID"
	// InvalidInstanceID: a renderer process's instance id is malformed.
	InvalidInstanceID Reason = "INVALID_INSTANCE_ID"
	// InvalidCapacity: a renderer's capacity is outside 1 to 4,096 or its credential's share.
	InvalidCapacity Reason = "INVALID_CAPACITY"
	// TooManyLeaseRefs: a renderer message names more leases in one list than its capacity.
	TooManyLeaseRefs Reason = "TOO_MANY_LEASE_REFS"
	// MissingHello: a renderer session did not begin with its hello.
	MissingHello Reason = "MISSING_HELLO"
	// MessageLimitTooSmall: the renderer accepts messages too small for one grant.
	MessageLimitTooSmall Reason = "MESSAGE_LIMIT_TOO_SMALL"
	// MissingOutcome: a completion carries neither success nor failure.
	MissingOutcome Reason = "MISSING_OUTCOME"
	// MissingMetadata: an upload did not begin with its metadata.
	MissingMetadata Reason = "MISSING_METADATA"
	// ArtifactTooLarge: a preview is over the artifact limit.
	ArtifactTooLarge Reason = "ARTIFACT_TOO_LARGE"
	// EmptyArtifact: an upload or inline preview has no bytes.
	EmptyArtifact Reason = "EMPTY_ARTIFACT"
	// DigestMismatch: the preview's bytes do not have the digest it claims.
	DigestMismatch Reason = "DIGEST_MISMATCH"
	// InvalidDigest: a digest is not a lower-case hex SHA-256.
	InvalidDigest Reason = "INVALID_DIGEST"
	// ArtifactStoreUnavailable: the artifact store did not answer (a
	// completion naming a stored preview, an upload, a read); nothing
	// changed: keep the lease and retry.
	ArtifactStoreUnavailable Reason = "ARTIFACT_STORE_UNAVAILABLE"
	// ArtifactStoreRequired: a cluster without a shared artifact store
	// keeps previews inline, up to a cap; configure --artifact-store to
	// take larger ones.
	ArtifactStoreRequired Reason = "ARTIFACT_STORE_REQUIRED"
	// PresignUnsupported: the artifact store cannot presign URLs (the
	// coordinator's own directory): send the preview inline or upload it.
	PresignUnsupported Reason = "PRESIGN_UNSUPPORTED"
	// InvalidMemberID: a cluster member id is malformed.
	InvalidMemberID Reason = "INVALID_MEMBER_ID"
	// InvalidRaftAddress: a cluster member's raft address is malformed.
	InvalidRaftAddress Reason = "INVALID_RAFT_ADDRESS"
)

// Reasons of NOT_FOUND.
const (
	// NotFound: a job or batch does not exist (handlers say which, below).
	NotFound Reason = "NOT_FOUND"
	// JobNotFound: no such job, or one the caller may not see.
	JobNotFound Reason = "JOB_NOT_FOUND"
	// BatchNotFound: no such batch, or one the caller may not see.
	BatchNotFound Reason = "BATCH_NOT_FOUND"
	// MemberNotFound: no such cluster member.
	MemberNotFound Reason = "MEMBER_NOT_FOUND"
)

// Reasons of ABORTED: a fencing failure (this lease is over; drop the
// work) or a replaced session. The metadata carries current_token and
// current_phase when the caller held a lease of the job.
const (
	// StaleLease: a newer lease exists or the job moved on.
	StaleLease Reason = "STALE_LEASE"
	// LeaseExpired: the lease deadline passed.
	LeaseExpired Reason = "LEASE_EXPIRED"
	// JobCancelled: the leased job was cancelled.
	JobCancelled Reason = "JOB_CANCELLED"
	// NotLeaseHolder: the token is current but was granted to another renderer.
	NotLeaseHolder Reason = "NOT_LEASE_HOLDER"
	// OutcomeMismatch: a repeated completion claims a different outcome.
	OutcomeMismatch Reason = "OUTCOME_MISMATCH"
	// SessionReplaced: a newer session of the same renderer process took over.
	SessionReplaced Reason = "SESSION_REPLACED"
)

// Reasons of FAILED_PRECONDITION: the job's phase, or the cluster's state,
// forbids the call; retrying it unchanged cannot succeed.
const (
	// FailedPrecondition: the job's phase forbids the call, for no more
	// particular reason of this list.
	FailedPrecondition Reason = "FAILED_PRECONDITION"
	// AlreadyTerminal: the job already SUCCEEDED or FAILED.
	AlreadyTerminal Reason = "ALREADY_TERMINAL"
	// RunningCancelDisabled: cancelling a LEASED job while running-cancel is off.
	RunningCancelDisabled Reason = "RUNNING_CANCEL_DISABLED"
	// NotFailed: a replay names a job that is not FAILED.
	NotFailed Reason = "NOT_FAILED"
	// PermanentFailure: a replay names a job whose failure no replay can mend.
	PermanentFailure Reason = "PERMANENT_FAILURE"
	// IllegalTransition: the command does not apply to the job's phase.
	IllegalTransition Reason = "ILLEGAL_TRANSITION"
	// NotSucceeded: the job has no preview because it has not SUCCEEDED.
	NotSucceeded Reason = "NOT_SUCCEEDED"
	// ArtifactNotFound: a succeeded job's preview is missing from the store.
	ArtifactNotFound Reason = "ARTIFACT_NOT_FOUND"
	// NotReplicated: a cluster call reached a coordinator that is not a cluster.
	NotReplicated Reason = "NOT_REPLICATED"
	// QuorumAtRisk: the change would leave the cluster without a quorum.
	QuorumAtRisk Reason = "QUORUM_AT_RISK"
	// LastVoter: the change would remove the cluster's last voter.
	LastVoter Reason = "LAST_VOTER"
	// NoTransferTarget: no other voter is able to take over leadership.
	NoTransferTarget Reason = "NO_TRANSFER_TARGET"
	// MemberUnreachable: the member to add does not answer.
	MemberUnreachable Reason = "MEMBER_UNREACHABLE"
	// RaftAddressInUse: another member has the raft address.
	RaftAddressInUse Reason = "RAFT_ADDRESS_IN_USE"
)

// Reasons of ALREADY_EXISTS.
const (
	// RendererIDInUse: another renderer process holds a live session under the id.
	RendererIDInUse Reason = "RENDERER_ID_IN_USE"
)

// Reasons of RESOURCE_EXHAUSTED.
const (
	// TeamQueueFull: the team has as many unfinished jobs as it may
	// (with a google.rpc.QuotaFailure and limit and used metadata).
	TeamQueueFull Reason = "TEAM_QUEUE_FULL"
	// TooManyStreams: the caller holds as many streams of the kind as it may.
	TooManyStreams Reason = "TOO_MANY_STREAMS"
	// SlowWatcher: a watch fell too far behind; watching again is safe.
	SlowWatcher Reason = "SLOW_WATCHER"
	// UploadInProgress: an upload for the lease is already running.
	UploadInProgress Reason = "UPLOAD_IN_PROGRESS"
	// UploadBudgetExhausted: uploads in flight hold all the buffer they may; retry with backoff.
	UploadBudgetExhausted Reason = "UPLOAD_BUDGET_EXHAUSTED"
	// BackupNoSpace: no room for a backup's copy of the database.
	BackupNoSpace Reason = "BACKUP_NO_SPACE"
)

// Reasons of DEADLINE_EXCEEDED.
const (
	// UploadTimeout: an artifact upload stalled or ran too long.
	UploadTimeout Reason = "UPLOAD_TIMEOUT"
)

// Reasons of UNAVAILABLE: retry later, or elsewhere.
const (
	// StorageUnavailable: the coordinator stopped taking writes.
	StorageUnavailable Reason = "STORAGE_UNAVAILABLE"
	// StorageFull: the coordinator's disk has no room; it stopped taking writes.
	StorageFull Reason = "STORAGE_FULL"
	// ShuttingDown: the coordinator is stopping.
	ShuttingDown Reason = "SHUTTING_DOWN"
	// NotLeader: this replica does not lead its cluster; the metadata may
	// name the leader as leader_id and leader_addr.
	NotLeader Reason = "NOT_LEADER"
	// OutcomeUnknown: leadership was lost with the write proposed; it may or
	// may not have been applied, and sending it again is safe.
	OutcomeUnknown Reason = "OUTCOME_UNKNOWN"
	// LeadershipTransferFailed: no other voter took over leadership in time.
	LeadershipTransferFailed Reason = "LEADERSHIP_TRANSFER_FAILED"
)

// Reasons of INTERNAL.
const (
	// Internal: an error no rule knows; the coordinator logged it.
	Internal Reason = "INTERNAL"
)

// Reasons a lease ended without a completion or a refusal, in a LOST
// LeaseStatus and in the REQUEUED event of the job's history. They are not
// ErrorInfo reasons.
const (
	// HandedBack: the holder gave the lease back unfinished.
	HandedBack Reason = "HANDED_BACK"
	// LeaseUndelivered: the grant never reached its renderer (the call or
	// stream that was to carry it ended first).
	LeaseUndelivered Reason = "LEASE_UNDELIVERED"
	// LeaseNeverHeard: the lease expired without the coordinator ever
	// hearing from its holder, so the grant was most likely never delivered.
	LeaseNeverHeard Reason = "LEASE_NEVER_HEARD"
)
