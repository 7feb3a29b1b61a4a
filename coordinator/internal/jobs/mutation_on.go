//go:build simmutation

package jobs

import (
	"fmt"
	"sync/atomic"
)

// active is the mutation switched on.
var active atomic.Int32

// Mutations lists the names SetMutation takes.
var Mutations = []string{"fencing", "cancel"}

// SetMutation switches on the named deliberate bug ("fencing": CheckLease
// accepts any token while the job is LEASED; "cancel": cancelling a LEASED
// job leaves its lease in force), or none with "". It exists only in a
// build with the simmutation tag, for the simulator's mutation tests; it
// affects every job of the process.
func SetMutation(name string) error {
	m := noMutation
	switch name {
	case "":
	case "fencing":
		m = mutationFencing
	case "cancel":
		m = mutationCancel
	default:
		return fmt.Errorf("jobs: no mutation %q (have %v)", name, Mutations)
	}
	active.Store(int32(m))
	return nil
}

// mutant reports whether m is switched on.
func mutant(m mutation) bool { return mutation(active.Load()) == m }
