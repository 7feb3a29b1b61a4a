package cluster

import (
	"errors"
	"fmt"
	"testing"

	"github.com/hashicorp/raft"
	"github.com/leasehold/leasehold/coordinator/internal/engine"
	"github.com/leasehold/leasehold/coordinator/internal/server"
	"github.com/leasehold/leasehold/coordinator/internal/store"
)

// TestCommitOutcome is the table of what raft's Apply may return for a
// group's entry and what the writer is told: never committed
// (engine.ErrNotLeader, which it answers NOT_LEADER) only when the entry
// cannot be in any log; otherwise its outcome is unknown.
func TestCommitOutcome(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		resp any
		err  error
		want error
	}{
		{"A committed and applied entry is committed", nil, nil, nil},
		{"An entry a follower was asked to append was never appended", nil, raft.ErrNotLeader, engine.ErrNotLeader},
		{"An entry raft did not take in time was never appended", nil, raft.ErrEnqueueTimeout, engine.ErrNotLeader},
		{"An entry refused during a transfer was never appended", nil, raft.ErrLeadershipTransferInProgress, engine.ErrNotLeader},
		{"An entry the FSM refused for its stale base changed nothing", store.ErrStaleBase, nil, engine.ErrNotLeader},
		{"An entry in the log when leadership was lost may commit", nil, raft.ErrLeadershipLost, engine.ErrOutcomeUnknown},
		// raft ends the wait of an entry it took, stored and sent when it
		// shuts down, with the error it gives an entry it never took.
		{"An entry raft shut down under may commit", nil, raft.ErrRaftShutdown, engine.ErrOutcomeUnknown},
		{"A wrapped shutdown is still unknown", nil, fmt.Errorf("applying: %w", raft.ErrRaftShutdown), engine.ErrOutcomeUnknown},
		{"An entry a restore aborted may have committed", nil, raft.ErrAbortedByRestore, engine.ErrOutcomeUnknown},
		{"An error raft may add is unknown", nil, errors.New("something new"), engine.ErrOutcomeUnknown},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := commitOutcome(tt.resp, tt.err)
			if tt.want == nil {
				if got != nil {
					t.Fatalf("commitOutcome = %v, want nil", got)
				}
				return
			}
			if !errors.Is(got, tt.want) {
				t.Fatalf("commitOutcome = %v, want it to wrap %v", got, tt.want)
			}
			other := engine.ErrOutcomeUnknown
			if tt.want == engine.ErrOutcomeUnknown {
				other = engine.ErrNotLeader
			}
			if errors.Is(got, other) {
				t.Fatalf("commitOutcome = %v: both outcomes at once", got)
			}
			if cause := tt.err; cause != nil && !errors.Is(got, cause) {
				t.Errorf("commitOutcome = %v: raft's error is lost", got)
			}
		})
	}
}

// TestChangeOutcome is the table of what a membership change or a
// transfer may fail with and what the operator is told.
func TestChangeOutcome(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		err  error
		want error
	}{
		{"A follower cannot change the membership", raft.ErrNotLeader, engine.ErrNotLeader},
		{"Leadership lost during a change", raft.ErrLeadershipLost, engine.ErrNotLeader},
		{"Raft shut down during a change", raft.ErrRaftShutdown, engine.ErrNotLeader},
		{"A change during a transfer", raft.ErrLeadershipTransferInProgress, engine.ErrNotLeader},
		{"A transfer that found no voter", errors.New("cannot find peer"), server.ErrTransferFailed},
		{"A transfer that timed out", errors.New("leadership transfer timeout"), server.ErrTransferFailed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := changeOutcome(tt.err); !errors.Is(got, tt.want) {
				t.Fatalf("changeOutcome(%v) = %v, want it to wrap %v", tt.err, got, tt.want)
			}
		})
	}
}
