// Package logformat chooses how the coordinator and the renderer write
// their logs: slog's text lines for a person at a terminal, or one JSON
// object per line for a log collector.
package logformat

import (
	"fmt"
	"io"
	"log/slog"
	"os"

	"golang.org/x/term"
)

// Format is a value of --log-format.
type Format string

// The formats.
const (
	// Auto writes JSON unless the output is a terminal. It is the default.
	Auto Format = "auto"
	// Text writes slog's key=value lines.
	Text Format = "text"
	// JSON writes one JSON object per line.
	JSON Format = "json"
)

// Parse returns the Format named s: text, json or auto.
func Parse(s string) (Format, error) {
	switch f := Format(s); f {
	case Auto, Text, JSON:
		return f, nil
	}
	return "", fmt.Errorf("%q is not a log format: want text, json or auto", s)
}

// Set implements flag.Value.
func (f *Format) Set(s string) error {
	v, err := Parse(s)
	if err != nil {
		return err
	}
	*f = v
	return nil
}

// String implements flag.Value.
func (f *Format) String() string {
	if f == nil || *f == "" {
		return string(Auto)
	}
	return string(*f)
}

// NewHandler returns the slog handler writing to w in format f at level.
// Auto is JSON unless w is an *os.File that is a terminal.
func NewHandler(w io.Writer, f Format, level slog.Leveler) slog.Handler {
	opts := &slog.HandlerOptions{Level: level}
	if f == Text || (f != JSON && isTerminal(w)) {
		return slog.NewTextHandler(w, opts)
	}
	return slog.NewJSONHandler(w, opts)
}

// isTerminal reports whether w is an interactive terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}
