package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	"github.com/leasehold/leasehold/renderer"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// envOf returns a lookupEnv over a fixed environment.
func envOf(vars map[string]string) func(string) (string, bool) {
	return func(name string) (string, bool) {
		v, ok := vars[name]
		return v, ok
	}
}

// TestParseOptionsToken ensures the renderer's token comes from --token or
// LEASEHOLD_RENDERER_TOKEN, and never from LEASEHOLD_TOKEN, which CLI users
// export in the same shells.
func TestParseOptionsToken(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"the development token is the default", nil, nil, defaultToken},
		{"LEASEHOLD_TOKEN is not read", nil, map[string]string{"LEASEHOLD_TOKEN": "cli-user-token"}, defaultToken},
		{"LEASEHOLD_RENDERER_TOKEN is read", nil,
			map[string]string{"LEASEHOLD_TOKEN": "cli-user-token", "LEASEHOLD_RENDERER_TOKEN": "render-pool"}, "render-pool"},
		{"--token wins over the environment", []string{"--token", "from-flag"},
			map[string]string{"LEASEHOLD_RENDERER_TOKEN": "render-pool"}, "from-flag"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			o, err := parseOptions(tt.args, envOf(tt.env), &bytes.Buffer{})
			if err != nil {
				t.Fatalf("parseOptions: %v", err)
			}
			if got := o.worker.Token; got != tt.want {
				t.Errorf("token = %q, want %q", got, tt.want)
			}
		})
	}
}

// TestParseOptions ensures the session, drain and HTTP settings come from
// flags and environment, and that old command lines still parse.
func TestParseOptions(t *testing.T) {
	t.Parallel()

	t.Run("defaults", func(t *testing.T) {
		t.Parallel()
		o, err := parseOptions(nil, envOf(nil), &bytes.Buffer{})
		if err != nil {
			t.Fatalf("parseOptions: %v", err)
		}
		got := []any{o.worker.DrainTimeout, o.worker.MaxReceiveBytes, o.httpListen, o.worker.Capacity}
		want := []any{renderer.DefaultDrainTimeout, renderer.DefaultMaxReceiveBytes, "", renderer.DefaultCapacity}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("defaults (-want +got):\n%s", diff)
		}
	})

	t.Run("environment", func(t *testing.T) {
		t.Parallel()
		o, err := parseOptions(nil, envOf(map[string]string{
			"LEASEHOLD_DRAIN_TIMEOUT": "7s",
			"LEASEHOLD_HTTP_LISTEN":   "127.0.0.1:9091",
			"LEASEHOLD_CAPACITY":      "8",
		}), &bytes.Buffer{})
		if err != nil {
			t.Fatalf("parseOptions: %v", err)
		}
		got := []any{o.worker.DrainTimeout, o.httpListen, o.worker.Capacity}
		want := []any{7 * time.Second, "127.0.0.1:9091", 8}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("from the environment (-want +got):\n%s", diff)
		}
	})

	t.Run("flags, including the retired --acquire-wait", func(t *testing.T) {
		t.Parallel()
		o, err := parseOptions([]string{"--drain-timeout", "3s", "--http-listen", ":0", "--acquire-wait", "2s",
			"--record", "/tmp/r", "--latency", "150ms", "--heartbeat-interval", "1h"}, envOf(nil), &bytes.Buffer{})
		if err != nil {
			t.Fatalf("parseOptions: %v", err)
		}
		got := []any{o.worker.DrainTimeout, o.httpListen, o.worker.RecordFile, o.mock.Latency, o.worker.HeartbeatInterval}
		want := []any{3 * time.Second, ":0", "/tmp/r", 150 * time.Millisecond, time.Hour}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("from flags (-want +got):\n%s", diff)
		}
	})

	t.Run("a malformed variable is an error", func(t *testing.T) {
		t.Parallel()
		_, err := parseOptions(nil, envOf(map[string]string{"LEASEHOLD_DRAIN_TIMEOUT": "soon"}), &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), "LEASEHOLD_DRAIN_TIMEOUT") {
			t.Errorf("parseOptions = %v, want an error naming LEASEHOLD_DRAIN_TIMEOUT", err)
		}
	})

	t.Run("help names the renderer's token variable", func(t *testing.T) {
		t.Parallel()
		var out bytes.Buffer
		if _, err := parseOptions([]string{"--help"}, envOf(nil), &out); err != errHelp {
			t.Fatalf("parseOptions(--help) = %v, want errHelp", err)
		}
		for _, want := range []string{"LEASEHOLD_RENDERER_TOKEN", "-drain-timeout", "LEASEHOLD_DRAIN_TIMEOUT", "-http-listen", "/readyz"} {
			if !strings.Contains(out.String(), want) {
				t.Errorf("help does not mention %q", want)
			}
		}
	})
}
