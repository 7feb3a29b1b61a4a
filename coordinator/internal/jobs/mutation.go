package jobs

// mutation names a deliberate bug in the state machine, which the
// simulator's mutation tests (package sim, build tag simmutation) switch on
// to show that its invariant checks catch it. Without the simmutation build
// tag no mutation can be switched on: mutant is a constant false, and the
// compiler removes the branches it guards.
type mutation int32

const (
	noMutation mutation = iota
	// mutationFencing removes the fencing check: CheckLease accepts any
	// token, from any renderer, at any time, while the job is LEASED.
	mutationFencing
	// mutationCancel makes the cancel of a LEASED job answer and record the
	// cancellation without revoking the lease: the job stays LEASED.
	mutationCancel
)
