//go:build !failpoints

package engine

// Without the failpoints build tag the writer's failpoints (failpoints.go)
// are empty functions, inlined away: a production build carries neither
// gofail's runtime nor a check on the writer's path.

func failpointBeforeCommit()      {}
func failpointGrantsUnpublished() {}
func failpointAfterCommit()       {}
func failpointReplayMidway()      {}
