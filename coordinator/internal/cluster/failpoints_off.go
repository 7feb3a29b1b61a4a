//go:build !failpoints

package cluster

// Without the failpoints build tag the state machine's failpoints
// (failpoints.go) are empty functions, inlined away.

func failpointBeforeApply() {}
func failpointBatchOpen()   {}
