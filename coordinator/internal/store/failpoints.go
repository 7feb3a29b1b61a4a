//go:build failpoints

package store

import gofail "go.etcd.io/gofail/runtime"

// The replica's apply failpoints, for crash tests: built in only with the
// failpoints build tag (failpoints_off.go has the default build's empty
// functions), armed through gofail's runtime by name in the environment
// before the process starts, as the writer's are (see
// coordinator/internal/engine/failpoints.go):
//
//	GOFAIL_FAILPOINTS='applyBeforeCommit=5*off->panic("applyBeforeCommit")' coordinator ...
var (
	// fpApplyBeforeCommit: every write of the entries a batch applied is
	// made in its open transaction, with the index that says they are
	// applied, and nothing is committed.
	fpApplyBeforeCommit = gofail.NewFailpoint("applyBeforeCommit")
	// fpApplyCommitted: the entries are committed to the store, and the
	// state machine has not told raft they are applied (raft applies
	// them again after a restart, from its last snapshot on).
	fpApplyCommitted = gofail.NewFailpoint("applyCommitted")
)

// Batch.Commit calls these at the points above; each evaluates its
// failpoint, which acts only when armed.

func failpointApplyBeforeCommit() { _, _ = fpApplyBeforeCommit.Acquire() }
func failpointApplyCommitted()    { _, _ = fpApplyCommitted.Acquire() }
