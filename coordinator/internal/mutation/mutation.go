package mutation

import "fmt"

// Env is the environment variable that switches a bug on for a whole
// process, in a build with a mutation tag.
const Env = "LEASEHOLD_MUTATION"

// Bug is one deliberate bug of the table.
type Bug uint8

// The bugs, by where they are planted. Table holds each one's name and
// what it breaks.
const (
	// None is no bug.
	None Bug = iota

	// Fencing removes the fencing check (jobs.Job.CheckLease).
	Fencing
	// CancelKeepsLease cancels a LEASED job without revoking its lease.
	CancelKeepsLease

	// ApplyIndexApart writes the applied index in a transaction of its
	// own after the entries' writes (store.Batch.Commit).
	ApplyIndexApart
	// Reapply applies an entry at or below the applied index again
	// (store.ApplyWriteSets, the state machine's idempotence).
	Reapply
	// BatchAppliedAhead commits a follower's batch cut short by its bound
	// with the applied index of the last entry raft handed the state
	// machine, past the entries the batch wrote (cluster.FSM).
	BatchAppliedAhead

	// PublishEarly publishes a group's effects and answers its commands
	// before its commit returns (engine.runGroup).
	PublishEarly
	// KeepSoftState keeps the writer's in-memory state across terms
	// (engine.Promote, Demote).
	KeepSoftState
	// LocalToken takes fencing tokens from a counter in the writer's
	// memory instead of the store's sequence (engine's grants).
	LocalToken
	// NoExtend makes engine.Promote ignore the lease extension it is given.
	NoExtend
	// DemoteKeepsStreams ends the writer's term on Demote but leaves its
	// renderer sessions and watches open (engine.Demote).
	DemoteKeepsStreams
	// AdmitEarlierTerm has a writer term apply commands sent to an earlier
	// one (engine's term admission).
	AdmitEarlierTerm

	// PromoteNoExtend promotes the writer with no lease extension
	// (cluster's leadership: Promote(0, ...)).
	PromoteNoExtend
	// PromoteNoBarrier promotes the writer without raft's barrier
	// (cluster's leadership).
	PromoteNoBarrier
	// BarrierUnawaited issues raft's barrier and returns without waiting
	// for it (cluster.Node.Barrier).
	BarrierUnawaited
	// LostIsNotLeader classifies raft.ErrLeadershipLost as an entry never
	// committed (cluster's commitOutcome).
	LostIsNotLeader
	// IgnoreStaleBase takes an entry the state machine refused for its
	// stale base as committed (cluster.Committer).
	IgnoreStaleBase
	// PendingForeignEntry has the state machine commit the leader's
	// evaluated group for the first command entry raft hands it, without
	// checking that it is the entry proposed with it (cluster's own-entry
	// path).
	PendingForeignEntry
	// HeartbeatLaterTerm lets a heartbeat of a later term take raft's
	// fast path (cluster's transport, heartbeatSafe).
	HeartbeatLaterTerm
	// VerifyRaftState confirms leadership from raft's own state, without
	// a quorum round (cluster's VerifyLeader).
	VerifyRaftState
	// VerifyWriterState confirms leadership from the writer's term alone,
	// asking raft nothing (cluster's VerifyLeader).
	VerifyWriterState

	// StaleRead serves linearizable reads without verifying leadership
	// (server.Consistency).
	StaleRead
	// ReadTableGap leaves ListJobs out of the read-consistency table and
	// serves a method the table does not name as a local read
	// (server's modeOf).
	ReadTableGap

	numBugs
)

// Info is a bug's entry in the table.
type Info struct {
	Bug Bug
	// Name is how Set and Env name it.
	Name string
	// Where is the code it is planted in; Breaks what goes wrong.
	Where, Breaks string
}

// Table lists every bug, in the order of the constants.
var Table = [...]Info{
	{Fencing, "fencing", "jobs: CheckLease",
		"a completion under any token of a LEASED job is accepted"},
	{CancelKeepsLease, "cancel", "jobs: Cancel",
		"a cancelled job stays LEASED and its holder's completion is accepted"},
	{ApplyIndexApart, "apply-index-apart", "store: Batch.Commit",
		"a node killed between the two commits applies its entries again on restart, a sequence moves back, and it stops on every restart"},
	{Reapply, "reapply", "store: applyWriteSet",
		"an entry replayed after a restart is applied again: refused as stale, it moves the applied index back"},
	{BatchAppliedAhead, "batch-applied-ahead", "cluster: FSM's follower batch",
		"a follower killed with a batch open restarts past entries its store never wrote, and its store differs from the others'"},
	{PublishEarly, "publish-early", "engine: runGroup",
		"a grant or an answer leaves the leader for a group whose entry never commits"},
	{KeepSoftState, "keep-soft-state", "engine: Promote, Demote",
		"a new term dispatches from a deposed term's memory instead of the store"},
	{LocalToken, "local-token", "engine: grants",
		"a new leader grants tokens another leader already granted"},
	{NoExtend, "no-extend", "engine: Promote",
		"a renderer reaching the new leader later than one TTL after the failover loses its lease"},
	{DemoteKeepsStreams, "demote-keeps-streams", "engine: Demote",
		"renderer sessions and WatchBatch streams hang on a deposed leader"},
	{AdmitEarlierTerm, "admit-earlier-term", "engine: term admission",
		"a command answered NOT_LEADER is applied anyway by the next term"},
	{PromoteNoExtend, "promote-no-extend", "cluster: leadership's promote",
		"a renderer reaching the new leader later than one TTL after promotion loses its lease"},
	{PromoteNoBarrier, "promote-no-barrier", "cluster: leadership's promote",
		"the new writer evaluates on a store missing committed entries: stale reads, current leases judged stale"},
	{BarrierUnawaited, "barrier-unawaited", "cluster: Node.Barrier",
		"the barrier returns before the store applied every committed entry: as promote-no-barrier"},
	{LostIsNotLeader, "lost-is-not-leader", "cluster: commitOutcome",
		"a write that may yet commit is reported not applied"},
	{IgnoreStaleBase, "ignore-stale-base", "cluster: Committer.Commit",
		"the leader acknowledges a group whose entry the state machine refused"},
	{PendingForeignEntry, "pending-foreign-entry", "cluster: FSM's own-entry path",
		"a deposed leader's store takes its own evaluated group for another leader's entry at that index, and differs from the others'"},
	{HeartbeatLaterTerm, "heartbeat-later-term", "cluster: the transport's heartbeat guard",
		"a leader made a follower of a later term beside raft's main loop writes its entry at that term, taken for the new leader's: the logs diverge (hashicorp/raft#695)"},
	{VerifyRaftState, "verify-raft-state", "cluster: VerifyLeader",
		"a leader cut off or paused serves linearizable reads until raft steps down"},
	{VerifyWriterState, "verify-writer-state", "cluster: VerifyLeader",
		"a deposed leader serves linearizable reads until its writer is demoted"},
	{StaleRead, "stale-read", "server: Consistency",
		"followers and deposed leaders serve linearizable reads from their own stores"},
	{ReadTableGap, "read-table-gap", "server: modeOf",
		"a linearizable ListJobs is served stale by a follower or a deposed leader"},
}

// Lookup returns the bug named name.
func Lookup(name string) (Bug, error) {
	for _, in := range Table {
		if in.Name == name {
			return in.Bug, nil
		}
	}
	return None, fmt.Errorf("mutation: no bug named %q", name)
}

// String returns the bug's name.
func (b Bug) String() string {
	if b > None && b < numBugs {
		return Table[b-1].Name
	}
	return "none"
}
