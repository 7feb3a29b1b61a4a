//go:build !failpoints

package cluster

// Without the failpoints build tag the state machine's failpoint
// (failpoints.go) is an empty function, inlined away.

func failpointBeforeApply() {}
