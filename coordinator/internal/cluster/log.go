package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"strings"

	"github.com/hashicorp/go-hclog"
)

// hclogOf adapts l for raft and raft-wal, which log through hclog: every
// line they write becomes one record of l at its own level (an error at
// ERROR, a warning at WARN), its message prefixed by the logger's name
// ("raft: ", "raft.net: ") and its fields as attributes.
func hclogOf(l *slog.Logger) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{
		Name:       "raft",
		Level:      hclog.Info,
		Output:     &slogWriter{l: l},
		JSONFormat: true,
	})
}

// slogWriter turns hclog's JSON lines into slog records.
type slogWriter struct{ l *slog.Logger }

// hclogKeys are the keys of hclog's JSON lines that are not a field.
var hclogKeys = []string{"@timestamp", "@level", "@message", "@module", "@caller"}

// Write implements io.Writer: one record a line.
func (w *slogWriter) Write(p []byte) (int, error) {
	for line := range bytes.SplitSeq(bytes.TrimRight(p, "\n"), []byte("\n")) {
		w.record(line)
	}
	return len(p), nil
}

// record logs one of hclog's lines.
func (w *slogWriter) record(line []byte) {
	var m map[string]any
	if err := json.Unmarshal(line, &m); err != nil {
		w.l.Info(strings.TrimSpace(string(line)))
		return
	}
	msg := fmt.Sprint(m["@message"])
	if mod, ok := m["@module"].(string); ok && mod != "" {
		msg = mod + ": " + msg
	}
	var attrs []slog.Attr
	for k, v := range m {
		if !slices.Contains(hclogKeys, k) {
			attrs = append(attrs, slog.Any(k, v))
		}
	}
	slices.SortFunc(attrs, func(a, b slog.Attr) int { return strings.Compare(a.Key, b.Key) })
	w.l.LogAttrs(context.Background(), slogLevel(m["@level"]), msg, attrs...)
}

// slogLevel maps an hclog level name to slog's.
func slogLevel(level any) slog.Level {
	switch level {
	case "error":
		return slog.LevelError
	case "warn":
		return slog.LevelWarn
	case "debug", "trace":
		return slog.LevelDebug
	}
	return slog.LevelInfo
}
