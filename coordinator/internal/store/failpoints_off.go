//go:build !failpoints

package store

// Without the failpoints build tag the apply failpoints (failpoints.go)
// are empty functions, inlined away.

func failpointApplyBeforeCommit() {}
func failpointApplyCommitted()    {}
