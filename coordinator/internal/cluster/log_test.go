package cluster

import (
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"
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

// TestRaftRetryFailuresRateLimited: raft's line for each retry towards a
// peer that is away passes once a minute per message and peer, the first
// at once, the next saying how many were held back; another peer, another
// message and every other line pass each time.
func TestRaftRetryFailuresRateLimited(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	logs := &records{}
	hl := hclogWithClock(slog.New(logs), func() time.Time { return now })
	heartbeat := func(peer string) {
		hl.Error("failed to heartbeat to", "peer", peer, "backoff time", "250ms", "error", "dial tcp "+peer+": connect: connection refused")
	}
	for range 10 {
		heartbeat("127.0.0.1:7202")
		hl.Error("failed to appendEntries to", "peer", "{Voter n2 127.0.0.1:7202}", "error", "EOF")
		hl.Error("failed to append", "index", 7)
	}
	heartbeat("127.0.0.1:7203")
	hl.Error("failed to appendEntries to", "peer", "{Voter n3 127.0.0.1:7203}", "error", "EOF")
	now = now.Add(59 * time.Second)
	heartbeat("127.0.0.1:7202")
	now = now.Add(time.Second)
	heartbeat("127.0.0.1:7202")

	count := func(msg string) int { return len(logs.find(msg)) }
	for _, want := range []struct {
		msg string
		n   int
	}{
		{"raft: failed to heartbeat to: peer=127.0.0.1:7202", 2},
		{"raft: failed to heartbeat to: peer=127.0.0.1:7203", 1},
		{`raft: failed to appendEntries to: peer="{Voter n2 127.0.0.1:7202}"`, 1},
		{`raft: failed to appendEntries to: peer="{Voter n3 127.0.0.1:7203}"`, 1},
		{"raft: failed to append: index=7", 10},
	} {
		if got := count(want.msg); got != want.n {
			t.Errorf("%d records of %q, want %d", got, want.msg, want.n)
		}
	}
	var held []string
	for _, r := range logs.find("raft: failed to heartbeat to: peer=127.0.0.1:7202") {
		held = append(held, attr(r, "unlogged"))
	}
	if !slices.Equal(held, []string{"0", "10"}) {
		t.Errorf("unlogged of the peer's heartbeat lines = %v, want [0 10] (nine of the ten, and the one 59 s later)", held)
	}
}
