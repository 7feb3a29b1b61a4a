package logformat_test

import (
	"bytes"
	"encoding/json"
	"flag"
	"log/slog"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/leasehold/leasehold/internal/logformat"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestParse(t *testing.T) {
	t.Parallel()
	for _, s := range []string{"text", "json", "auto"} {
		if got, err := logformat.Parse(s); err != nil || string(got) != s {
			t.Errorf("Parse(%q) = %q, %v", s, got, err)
		}
	}
	for _, s := range []string{"", "JSON", "logfmt"} {
		if _, err := logformat.Parse(s); err == nil {
			t.Errorf("Parse(%q) succeeded", s)
		}
	}
}

// TestNewHandler checks that auto writes JSON to what is not a terminal,
// and that text and json are honoured.
func TestNewHandler(t *testing.T) {
	t.Parallel()
	tests := []struct {
		format logformat.Format
		json   bool
	}{
		{logformat.Auto, true},
		{logformat.JSON, true},
		{logformat.Text, false},
	}
	for _, tc := range tests {
		var b bytes.Buffer
		slog.New(logformat.NewHandler(&b, tc.format, slog.LevelInfo)).Info("hello", "k", "v")
		var m map[string]any
		isJSON := json.Unmarshal(b.Bytes(), &m) == nil
		if isJSON != tc.json {
			t.Errorf("format %s wrote %q; JSON = %v, want %v", tc.format, b.String(), isJSON, tc.json)
		}
		if !strings.Contains(b.String(), "hello") {
			t.Errorf("format %s lost the message: %q", tc.format, b.String())
		}
	}
}

func TestFlagValue(t *testing.T) {
	t.Parallel()
	f := logformat.Auto
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	fs.Var(&f, "log-format", "")
	if err := fs.Parse([]string{"--log-format", "text"}); err != nil || f != logformat.Text {
		t.Errorf("--log-format text: %q, %v", f, err)
	}
	fs.SetOutput(&bytes.Buffer{})
	if err := fs.Parse([]string{"--log-format", "xml"}); err == nil {
		t.Errorf("--log-format xml succeeded")
	}
}
