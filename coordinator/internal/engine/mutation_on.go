//go:build simmutation

package engine

import (
	"fmt"
	"sync/atomic"
)

// active is the mutation switched on.
var active atomic.Int32

// Mutations lists the names SetMutation takes.
var Mutations = []string{"publish-early", "keep-soft-state", "local-token", "no-extend"}

// SetMutation switches on the named deliberate bug of the writer's
// leadership ("publish-early": effects published and commands answered
// before the commit returns; "keep-soft-state": in-memory state kept across terms;
// "local-token": tokens from a counter in memory; "no-extend": no lease
// extension on promotion), or none with "". It exists only in a build with
// the simmutation tag, for the simulator's mutation tests; it affects
// every engine of the process.
func SetMutation(name string) error {
	m := noMutation
	switch name {
	case "":
	case "publish-early":
		m = mutationPublishEarly
	case "keep-soft-state":
		m = mutationKeepSoft
	case "local-token":
		m = mutationLocalToken
	case "no-extend":
		m = mutationNoExtend
	default:
		return fmt.Errorf("engine: no mutation %q (have %v)", name, Mutations)
	}
	active.Store(int32(m))
	return nil
}

// mutant reports whether m is switched on.
func mutant(m mutation) bool { return mutation(active.Load()) == m }
