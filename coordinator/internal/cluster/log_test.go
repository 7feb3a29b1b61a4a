package cluster

import (
	"log/slog"
	"strings"
	"testing"
)

// TestRaftLogLevels: what raft and raft-wal log through hclog arrives in
// slog at its own level, named by its logger, with its fields; an error
// that raft itself logs (a vote it could not ask for) arrives at ERROR,
// and its warning (an election started) at WARN.
func TestRaftLogLevels(t *testing.T) {
	t.Parallel()
	t.Run("Each level", func(t *testing.T) {
		t.Parallel()
		logs := &records{}
		hl := hclogOf(slog.New(logs))
		hl.Error("failed to append", "index", 7)
		hl.Named("net").Warn("connection refused", "peer", "n2")
		hl.Info("entering follower state")
		hl.Debug("below the level")
		for _, want := range []struct {
			level slog.Level
			msg   string
		}{{slog.LevelError, "raft: failed to append"}, {slog.LevelWarn, "raft.net: connection refused: peer=n2"}, {slog.LevelInfo, "raft: entering follower state"}} {
			if r := logs.await(t, want.level, want.msg); !strings.HasPrefix(r.Message, want.msg) {
				t.Errorf("message %q, want it to begin %q", r.Message, want.msg)
			}
		}
		if r := logs.await(t, slog.LevelError, "failed to append"); r.Message != "raft: failed to append: index=7" {
			t.Errorf("the error's message = %q, want its fields after it", r.Message)
		}
		if got := logs.find("below the level"); len(got) != 0 {
			t.Errorf("a debug line passed: %v", got)
		}
	})
	t.Run("Raft's own", func(t *testing.T) {
		t.Parallel()
		// Two of three voters are nowhere: n1 starts elections, and its
		// vote requests fail.
		_, logs, err := startPlaintextNode(t, "127.0.0.1:0", false,
			Peer{ID: "n1", RaftAddr: "127.0.0.1:7201"}, Peer{ID: "n2", RaftAddr: "127.0.0.1:1"}, Peer{ID: "n3", RaftAddr: "127.0.0.1:2"})
		if err != nil {
			t.Fatal(err)
		}
		logs.await(t, slog.LevelWarn, "raft: heartbeat timeout reached, starting election")
		logs.await(t, slog.LevelError, "raft: failed to make requestVote RPC")
	})
}
