package engine

// mutation names a deliberate bug of the writer's leadership, which the
// simulator's mutation tests (package sim, build tag simmutation) switch on
// in its cluster mode to show that its checks catch it. Without the
// simmutation build tag no mutation can be switched on: mutant is a
// constant false, and the compiler removes the branches it guards.
type mutation int32

const (
	noMutation mutation = iota
	// mutationPublishEarly publishes a group's effects (grants,
	// revocations, watch events) and answers its commands before its
	// commit returns, so that a group whose entry never commits has been
	// seen and acknowledged.
	mutationPublishEarly
	// mutationKeepSoft keeps the writer's in-memory state when its term
	// ends (no session ends, nothing dropped), and Promote reuses what is
	// in memory instead of rebuilding it from the store.
	mutationKeepSoft
	// mutationLocalToken takes fencing tokens from a counter in the
	// writer's memory, loaded when the engine is made, instead of from the
	// store's sequence that every leader's entries advance.
	mutationLocalToken
	// mutationNoExtend makes Promote give live leases their TTL only,
	// without the failover's extension.
	mutationNoExtend
)
