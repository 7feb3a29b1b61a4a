package cluster

import (
	"bytes"
	"context"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/leasehold/leasehold/internal/ratelog"
)

// hclogOf adapts l for raft and raft-wal, which log through hclog: every
// line they write becomes one record of l at its own level (an error at
// ERROR, a warning at WARN), its message the line without the level:
// "raft: failed to make requestVote RPC: target=...". hclog writes no
// time, so that each line begins with its level.
//
// Raft logs a failure to reach a peer at every retry, for as long as the
// peer stays away: heartbeats alone every HeartbeatTimeout/2 at most, 66
// lines in 20 s with the default timeout. Those lines (retryFailures)
// pass once a minute per message and peer, each saying how many of its
// kind were held back since the one before (unlogged): a follower down for
// an hour costs a line or two a minute, not some twelve thousand, and its
// first failure is logged at once.
func hclogOf(l *slog.Logger) hclog.Logger { return hclogWithClock(l, nil) }

// hclogWithClock is hclogOf with the clock of its rate limit (nil:
// time.Now).
func hclogWithClock(l *slog.Logger, now func() time.Time) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{
		Name:        "raft",
		Level:       hclog.Info,
		Output:      &slogWriter{l: l, retries: ratelog.New(retryFailureEvery, now)},
		DisableTime: true,
	})
}

// retryFailures are the messages raft logs at each retry towards a peer,
// and the field of each that names the peer.
var retryFailures = []struct{ prefix, peer string }{
	{"raft: failed to heartbeat to: ", "peer="},
	{"raft: failed to appendEntries to: ", "peer="},
	{"raft: failed to pipeline appendEntries: ", "peer="},
	{"raft: failed to start pipeline replication to: ", "peer="},
	{"raft: failed to make requestVote RPC: ", "target="},
}

// retryFailureEvery is how often a line of retryFailures passes, per
// message and peer.
const retryFailureEvery = time.Minute

// slogWriter turns hclog's text lines into slog records.
type slogWriter struct {
	l       *slog.Logger
	retries *ratelog.Limiter
}

// retryKind returns the rate limit's kind of msg, a line of
// retryFailures: its message and its peer's field. The peers are the
// cluster's members, so the kinds are few.
func retryKind(msg string) (string, bool) {
	for _, f := range retryFailures {
		if !strings.HasPrefix(msg, f.prefix) {
			continue
		}
		_, v, _ := strings.Cut(msg[len(f.prefix):], f.peer)
		if q, err := strconv.QuotedPrefix(v); err == nil {
			v = q
		} else if i := strings.IndexByte(v, ' '); i >= 0 {
			v = v[:i]
		}
		return f.prefix + v, true
	}
	return "", false
}

// hclogLevels are the level prefixes of hclog's lines and slog's levels.
var hclogLevels = []struct {
	prefix string
	level  slog.Level
}{
	{"[ERROR]", slog.LevelError},
	{"[WARN]", slog.LevelWarn},
	{"[INFO]", slog.LevelInfo},
	{"[DEBUG]", slog.LevelDebug},
	{"[TRACE]", slog.LevelDebug},
}

// Write implements io.Writer: one record a line.
func (w *slogWriter) Write(p []byte) (int, error) {
	for line := range bytes.SplitSeq(bytes.TrimRight(p, "\n"), []byte("\n")) {
		msg := strings.TrimSpace(string(line))
		level := slog.LevelInfo
		for _, l := range hclogLevels {
			if rest, ok := strings.CutPrefix(msg, l.prefix); ok {
				msg, level = strings.TrimSpace(rest), l.level
				break
			}
		}
		if kind, ok := retryKind(msg); ok {
			pass, held := w.retries.Allow(kind)
			if !pass {
				continue
			}
			w.l.Log(context.Background(), level, msg, "unlogged", held)
			continue
		}
		w.l.Log(context.Background(), level, msg)
	}
	return len(p), nil
}
