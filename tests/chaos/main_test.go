package main

import (
	"context"
	"errors"
	"flag"
	"io"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestRunRefusesBadCommandLines checks the command line before anything is
// built or started.
func TestRunRefusesBadCommandLines(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "unknown or missing mode"},
		{[]string{"partition"}, "unknown or missing mode"},
		{[]string{"crash", "--cycles", "0"}, "--cycles must be at least 1"},
		{[]string{"crash", "--min-uptime", "1s", "--max-uptime", "10ms"}, "--min-uptime"},
		{[]string{"crash", "--renderers", "0"}, "--renderers"},
		{[]string{"crash", "extra"}, "unexpected arguments"},
	} {
		err := run(context.Background(), tc.args, io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("run(%q) = %v, want an error containing %q", tc.args, err, tc.want)
		}
	}
	if err := run(context.Background(), []string{"crash", "--help"}, io.Discard, io.Discard); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("run(crash --help) = %v, want flag.ErrHelp", err)
	}
}
