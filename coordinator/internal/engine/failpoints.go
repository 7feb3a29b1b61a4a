//go:build failpoints

package engine

import gofail "go.etcd.io/gofail/runtime"

// The writer's failpoints, for crash tests: built in only with the
// failpoints build tag (see failpoints_off.go for the default build, where
// each is an empty function the compiler removes). A failpoint does
// nothing until armed through gofail's runtime, by name, in the
// environment before the process starts:
//
//	GOFAIL_FAILPOINTS='beforeCommit=20*off->panic("beforeCommit")' coordinator ...
//
// arms beforeCommit to pass 20 times and panic the 21st, which kills the
// process at that point as a crash would (the panic's value names it in
// the log; a bare panic would print "{}"). Terms are gofail's (panic,
// sleep(ms), print, count "N*" and probability "P%" prefixes, "->" chains);
// a value a term returns is ignored. The crash campaign (tests/chaos)
// arms them in turn.
var (
	// fpBeforeCommit: every command of a group applied and its grants made
	// in the open transaction, nothing committed.
	fpBeforeCommit = gofail.NewFailpoint("beforeCommit")
	// fpGrantsUnpublished: a group that granted leases to sessions or
	// waiters is committed, and no renderer has been told.
	fpGrantsUnpublished = gofail.NewFailpoint("grantsUnpublished")
	// fpAfterCommit: a group is committed and published, and no caller
	// has been answered.
	fpAfterCommit = gofail.NewFailpoint("afterCommit")
	// fpReplayMidway: an operator replay has re-queued a job in the open
	// transaction, before the rest of its jobs, its audit record and the
	// commit.
	fpReplayMidway = gofail.NewFailpoint("replayMidway")
)

// The writer calls these at the points above; each evaluates its
// failpoint, which acts only when armed.

func failpointBeforeCommit()      { _, _ = fpBeforeCommit.Acquire() }
func failpointGrantsUnpublished() { _, _ = fpGrantsUnpublished.Acquire() }
func failpointAfterCommit()       { _, _ = fpAfterCommit.Acquire() }
func failpointReplayMidway()      { _, _ = fpReplayMidway.Acquire() }
