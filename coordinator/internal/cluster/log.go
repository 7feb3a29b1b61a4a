package cluster

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
)

// hclogOf adapts l for raft, which logs through hclog: every line raft
// writes becomes one record of l, at raft's level.
func hclogOf(l *slog.Logger) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{
		Name:       "raft",
		Level:      hclog.Info,
		Output:     &slogWriter{l: l},
		JSONFormat: false,
		TimeFn:     func() time.Time { return time.Time{} },
	})
}

// slogWriter turns hclog's text lines into slog records.
type slogWriter struct{ l *slog.Logger }

func (w *slogWriter) Write(p []byte) (int, error) {
	for line := range bytes.SplitSeq(bytes.TrimRight(p, "\n"), []byte("\n")) {
		msg := strings.TrimSpace(string(line))
		level := slog.LevelInfo
		switch {
		case strings.HasPrefix(msg, "[ERROR]"):
			level = slog.LevelError
		case strings.HasPrefix(msg, "[WARN]"):
			level = slog.LevelWarn
		case strings.HasPrefix(msg, "[DEBUG]"), strings.HasPrefix(msg, "[TRACE]"):
			level = slog.LevelDebug
		}
		w.l.Log(context.Background(), level, msg)
	}
	return len(p), nil
}
