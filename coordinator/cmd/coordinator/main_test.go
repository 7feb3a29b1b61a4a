package main

import (
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// TestParseFlags checks defaults, environment defaults and the command
// line's precedence over them.
func TestParseFlags(t *testing.T) {
	t.Run("Defaults match the documented ones", func(t *testing.T) {
		cfg, level, err := parseFlags(nil, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		if cfg.Listen != "127.0.0.1:7070" || cfg.LeaseTTL != 15*time.Second || cfg.MaxAttempts != 5 || cfg.DisableRunningCancel || level != slog.LevelInfo {
			t.Errorf("defaults = %+v level %v", cfg, level)
		}
		if len(cfg.Unsupported) == 0 {
			t.Errorf("no default unsupported formats")
		}
	})
	t.Run("The environment sets defaults and flags override them", func(t *testing.T) {
		t.Setenv("LEASEHOLD_LEASE_TTL", "30s")
		t.Setenv("LEASEHOLD_LISTEN", "127.0.0.1:1")
		t.Setenv("LEASEHOLD_RUNNING_CANCEL", "false")
		cfg, _, err := parseFlags([]string{"--listen", "127.0.0.1:2", "--team-weights", "alpha=3, beta=1", "--unsupported", ".exe, ,.js", "--log-level", "debug"}, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		if cfg.LeaseTTL != 30*time.Second || cfg.Listen != "127.0.0.1:2" || !cfg.DisableRunningCancel {
			t.Errorf("lease ttl %v listen %s disable running cancel %v; want 30s, 127.0.0.1:2, true", cfg.LeaseTTL, cfg.Listen, cfg.DisableRunningCancel)
		}
		if diff := cmp.Diff(map[string]int{"alpha": 3, "beta": 1}, cfg.TeamWeights); diff != "" {
			t.Errorf("weights (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff([]string{".exe", ".js"}, cfg.Unsupported); diff != "" {
			t.Errorf("unsupported (-want +got):\n%s", diff)
		}
	})
	t.Run("A malformed environment value is an error", func(t *testing.T) {
		t.Setenv("LEASEHOLD_MAX_ATTEMPTS", "many")
		if _, _, err := parseFlags(nil, io.Discard); err == nil {
			t.Errorf("parseFlags accepted LEASEHOLD_MAX_ATTEMPTS=many")
		}
	})
	t.Run("Malformed team weights are an error", func(t *testing.T) {
		for _, s := range []string{"alpha", "alpha=0", "=3", "alpha=x"} {
			if _, err := parseWeights(s); err == nil {
				t.Errorf("parseWeights(%q) succeeded", s)
			}
		}
	})
}
