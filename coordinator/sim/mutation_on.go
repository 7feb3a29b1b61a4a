//go:build simmutation

package sim

import "fmt"

// active is the simulator's mutation switched on.
var active mutation

// Mutations lists the names SetMutation takes.
var Mutations = []string{"skip-barrier", "stale-read"}

// SetMutation switches on the named deliberate bug of the simulated
// coordinator's part in replication ("skip-barrier": a new leader's writer
// promoted before its store applied every committed entry; "stale-read":
// reads served without verifying leadership), or none with "". It exists
// only in a build with the simmutation tag; it affects every run of the
// process, so the runs of a mutation test must not run in parallel.
func SetMutation(name string) error {
	m := noMutation
	switch name {
	case "":
	case "skip-barrier":
		m = mutationSkipBarrier
	case "stale-read":
		m = mutationStaleRead
	default:
		return fmt.Errorf("sim: no mutation %q (have %v)", name, Mutations)
	}
	active = m
	return nil
}

// mutant reports whether m is switched on.
func mutant(m mutation) bool { return active == m }
