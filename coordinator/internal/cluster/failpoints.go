//go:build failpoints

package cluster

import gofail "go.etcd.io/gofail/runtime"

// The state machine's failpoints, for crash tests: built in only with the
// failpoints build tag (failpoints_off.go has the default build's empty
// function), armed through gofail's runtime by name in the environment
// before the process starts, as the writer's are (see
// coordinator/internal/engine/failpoints.go):
//
//	GOFAIL_FAILPOINTS='beforeApply=5*off->panic("beforeApply")' coordinator ...
var (
	// fpBeforeApply: raft has appended the entries to this node's log
	// and committed them, and hands them to the state machine, which has
	// applied none of them to the store; on a leader, also just before
	// its state machine commits the evaluated group of its own entry.
	fpBeforeApply = gofail.NewFailpoint("beforeApply")
	// fpBatchOpen: a follower's batch holds entries raft was told are
	// applied, and the store has committed none of them; raft hands the
	// state machine the next ones.
	fpBatchOpen = gofail.NewFailpoint("batchOpen")
)

// ApplyBatch calls these at the points above; each acts only when armed.

func failpointBeforeApply() { _, _ = fpBeforeApply.Acquire() }
func failpointBatchOpen()   { _, _ = fpBatchOpen.Acquire() }
