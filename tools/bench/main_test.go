package main

import (
	"io"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestParseFlags(t *testing.T) {
	t.Parallel()
	t.Run("Defaults", func(t *testing.T) {
		t.Parallel()
		cfg, err := parseFlags(nil, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(allPhases, cfg.phases); diff != "" {
			t.Errorf("phases (-want +got):\n%s", diff)
		}
		if cfg.drainDocs != 50000 || cfg.renderers != 4 || cfg.capacity != 64 || cfg.batch != 500 {
			t.Errorf("defaults = %+v", cfg)
		}
		if diff := cmp.Diff([]int{4, 8, 16, 32, 48}, cfg.steadyInflight); diff != "" {
			t.Errorf("steady levels (-want +got):\n%s", diff)
		}
	})
	t.Run("ListsAndExtraFlags", func(t *testing.T) {
		t.Parallel()
		cfg, err := parseFlags([]string{
			"-phases", "drain, steady,drain", "-steady-inflight", "2,4", "-coordinator-flags", "--fifo  --lease-ttl 5s",
			"-duration", "3s",
		}, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff([]string{"drain", "steady"}, cfg.phases); diff != "" {
			t.Errorf("phases (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff([]string{"--fifo", "--lease-ttl", "5s"}, cfg.coordinatorFlags); diff != "" {
			t.Errorf("coordinator flags (-want +got):\n%s", diff)
		}
		if cfg.duration != 3*time.Second || !cfg.has("steady") || cfg.has("idle") {
			t.Errorf("config = %+v", cfg)
		}
	})
	for _, tt := range []struct {
		name string
		args []string
		want string
	}{
		{"UnknownPhase", []string{"-phases", "warp"}, "unknown phase"},
		{"NoPhase", []string{"-phases", ""}, "no phase"},
		{"LevelAboveWatches", []string{"-steady-inflight", "8,70"}, "more than -max-watches"},
		{"BadLevel", []string{"-steady-inflight", "8,x"}, "not a positive number"},
		{"LatencyWithoutRate", []string{"-phases", "latency"}, "-latency-rate"},
		{"NoRenderers", []string{"-renderers", "0"}, "-renderers"},
		{"Arguments", []string{"extra"}, "unexpected arguments"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := parseFlags(tt.args, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("parseFlags(%q) error = %v, want one containing %q", tt.args, err, tt.want)
			}
		})
	}
	t.Run("LatencyAloneWithARate", func(t *testing.T) {
		t.Parallel()
		if _, err := parseFlags([]string{"-phases", "latency", "-latency-rate", "100"}, io.Discard); err != nil {
			t.Error(err)
		}
	})
	t.Run("StoreNeedsNoPhases", func(t *testing.T) {
		t.Parallel()
		if _, err := parseFlags([]string{"-store", "1000", "-phases", ""}, io.Discard); err != nil {
			t.Error(err)
		}
	})
}
