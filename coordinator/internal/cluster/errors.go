package cluster

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/hashicorp/raft"
	"github.com/leasehold/leasehold/coordinator/internal/engine"
	"github.com/leasehold/leasehold/coordinator/internal/server"
)

// The one place where raft's errors become the coordinator's: the commit
// outcomes of package engine (which the error table of package server
// turns into NOT_LEADER and OUTCOME_UNKNOWN) and the server's
// ErrTransferFailed. Nothing else in the coordinator reads raft's errors.

// commitOutcome classifies what raft's Apply returned for a group's
// entry: nil once it is committed and applied; engine.ErrNotLeader when
// it was never appended to the leader's log, or was applied as nothing
// because it was evaluated on a base the log had moved past (the FSM's
// response is store.ErrStaleBase): the group was not committed and never
// will be; engine.ErrOutcomeUnknown when it may be in the log, and commits
// if the next leader holds it.
//
// raft fails an entry it never took with ErrNotLeader (this node does not
// lead), ErrEnqueueTimeout (not taken in time) and
// ErrLeadershipTransferInProgress (refused during a transfer). It fails an
// entry in its log with ErrLeadershipLost. ErrRaftShutdown is both: raft
// returns it for an entry it never took when it is already shut down, and
// for one it took, stored and sent to followers, when it shuts down while
// the caller waits (the future's wait ends on raft's shutdown channel); so
// its outcome is unknown. So is that of any error raft may add.
func commitOutcome(resp any, err error) error {
	switch {
	case err == nil:
		if refused, ok := resp.(error); ok && refused != nil {
			return fmt.Errorf("%w: %w", engine.ErrNotLeader, refused)
		}
		return nil
	case errors.Is(err, raft.ErrNotLeader), errors.Is(err, raft.ErrEnqueueTimeout),
		errors.Is(err, raft.ErrLeadershipTransferInProgress):
		return fmt.Errorf("%w: %w", engine.ErrNotLeader, err)
	}
	return fmt.Errorf("%w: %w", engine.ErrOutcomeUnknown, err)
}

// changeOutcome classifies an error of a membership change or a
// leadership transfer: a change this node cannot make or see through
// because it does not lead, or stopped leading, is engine.ErrNotLeader
// (the operator asks the leader, after looking at the cluster, as for a
// change whose fate is unknown); one that found no voter to take over, or
// after which none did, is server.ErrTransferFailed. raft words a transfer
// that found no target or timed out only in the error's text.
func changeOutcome(err error) error {
	msg := err.Error()
	switch {
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, engine.ErrNotLeader), errors.Is(err, server.ErrTransferFailed):
		return err
	case errors.Is(err, raft.ErrNotLeader), errors.Is(err, raft.ErrLeadershipLost),
		errors.Is(err, raft.ErrLeadershipTransferInProgress), errors.Is(err, raft.ErrRaftShutdown),
		errors.Is(err, raft.ErrEnqueueTimeout), errors.Is(err, raft.ErrAbortedByRestore):
		return fmt.Errorf("%w: %w", engine.ErrNotLeader, err)
	case strings.Contains(msg, "leadership transfer"), strings.Contains(msg, "transfer leadership"),
		strings.HasPrefix(msg, "cannot find"):
		return fmt.Errorf("%w: %w", server.ErrTransferFailed, err)
	}
	return err
}
