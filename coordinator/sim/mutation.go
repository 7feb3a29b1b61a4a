package sim

// mutation names a deliberate bug of the simulated coordinator's part in
// replication (what package cluster and the read path do around
// the writer), which TestMutationsAreCaught switches on in cluster mode,
// with the engine's (engine.SetMutation). Without the simmutation build
// tag none can be switched on: mutant is a constant false.
type mutation int32

const (
	noMutation mutation = iota
	// mutationSkipBarrier promotes a new leader's writer without waiting
	// for its store to apply every committed entry.
	mutationSkipBarrier
	// mutationStaleRead serves a read from any node whose raft believes it
	// leads (a deposed leader that has not heard yet, a new one before its
	// barrier), without verifying its leadership with a quorum.
	mutationStaleRead
)
