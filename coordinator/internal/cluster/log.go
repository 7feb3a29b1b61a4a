package cluster

import (
	"bytes"
	"context"
	"log/slog"
	"strings"

	"github.com/hashicorp/go-hclog"
)

// hclogOf adapts l for raft and raft-wal, which log through hclog: every
// line they write becomes one record of l at its own level (an error at
// ERROR, a warning at WARN), its message the line without the level:
// "raft: failed to make requestVote RPC: target=...". hclog writes no
// time, so that each line begins with its level.
func hclogOf(l *slog.Logger) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{
		Name:        "raft",
		Level:       hclog.Info,
		Output:      &slogWriter{l: l},
		DisableTime: true,
	})
}

// slogWriter turns hclog's text lines into slog records.
type slogWriter struct{ l *slog.Logger }

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
		w.l.Log(context.Background(), level, msg)
	}
	return len(p), nil
}
