package cli

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/client/internal/fakeserver"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// withOverview gives the fake an overview of team alpha and one renderer.
func withOverview(s *fakeserver.Server) {
	at := timestamppb.New(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	s.Overview = &leaseholdv1.Overview{AsOf: at, PublishedAt: at, LiveCapacity: 4, Teams: []*leaseholdv1.TeamOverview{{
		Team: "alpha", QueueDepth: 7, LeasesInFlight: 2, OldestQueuedAge: durationpb.New(90 * time.Second),
		Counts:     []*leaseholdv1.PhaseCount{{Phase: leaseholdv1.Phase_PHASE_QUEUED, Count: 7}, {Phase: leaseholdv1.Phase_PHASE_SUCCEEDED, Count: 30}},
		Throughput: []*leaseholdv1.Throughput{{Window: durationpb.New(5 * time.Minute), Succeeded: 30, Failed: 10, PerMinute: 8, FailureRate: 0.25}},
	}}}
	s.Renderers = []*leaseholdv1.Renderer{{RendererId: "r-1", Capacity: 4, Connected: true, LastSeenAt: at,
		Leases: []*leaseholdv1.RendererLease{{JobId: "j-3", Team: "alpha", Token: 9, Deadline: at}}}}
}

func TestTop(t *testing.T) {
	t.Parallel()

	t.Run("plain tables, one per refresh, when stdout is not a terminal", func(t *testing.T) {
		t.Parallel()
		b := setup(t, withOverview)
		code, out, errOut := b.run(t, "top", "--count", "2")
		if code != ExitOK {
			t.Fatalf("exit status = %d, stderr %q", code, errOut)
		}
		if strings.Contains(out, clearScreen) {
			t.Errorf("output redraws the screen when stdout is not a terminal")
		}
		if n := strings.Count(out, "leasehold top"); n != 2 {
			t.Errorf("%d tables, want 2:\n%s", n, out)
		}
		for _, want := range []string{"alpha", "1m30s", "8.0", "25%", "r-1", "connected"} {
			if !strings.Contains(out, want) {
				t.Errorf("output lacks %q:\n%s", want, out)
			}
		}
	})

	t.Run("a terminal is redrawn in place", func(t *testing.T) {
		t.Parallel()
		b := setup(t, withOverview)
		b.terminal = true
		_, out, _ := b.run(t, "top", "--count", "2", "--renderers=false")
		if n := strings.Count(out, clearScreen); n != 2 {
			t.Errorf("%d redraws, want 2", n)
		}
		if strings.Contains(out, "RENDERER") {
			t.Errorf("--renderers=false still shows renderers")
		}
	})

	t.Run("-o json prints one object per refresh", func(t *testing.T) {
		t.Parallel()
		b := setup(t, withOverview)
		_, out, _ := b.run(t, "top", "--count", "3", "-o", "json")
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if len(lines) != 3 {
			t.Fatalf("%d lines, want 3:\n%s", len(lines), out)
		}
		var msg struct {
			Overview struct {
				Teams []struct {
					Team       string `json:"team"`
					QueueDepth int    `json:"queue_depth"`
				} `json:"teams"`
			} `json:"overview"`
		}
		if err := json.Unmarshal([]byte(lines[0]), &msg); err != nil || len(msg.Overview.Teams) != 1 || msg.Overview.Teams[0].QueueDepth != 7 {
			t.Errorf("first line %s decodes to %+v, %v; want alpha with depth 7", lines[0], msg, err)
		}
	})

	t.Run("a bad interval is a usage error", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		if code, _, _ := b.run(t, "top", "--interval", "10ms"); code != ExitUsage {
			t.Errorf("exit status = %d, want %d", code, ExitUsage)
		}
	})
}

func TestRenderers(t *testing.T) {
	t.Parallel()
	b := setup(t, withOverview)
	code, out, _ := b.run(t, "renderers")
	if code != ExitOK || !strings.Contains(out, "r-1") || !strings.Contains(out, "j-3#9") {
		t.Errorf("exit %d, output:\n%s\nwant r-1 holding j-3#9", code, out)
	}
	_, out, _ = b.run(t, "renderers", "-o", "json")
	if !strings.Contains(out, `"renderer_id":"r-1"`) || !strings.Contains(out, `"job_id":"j-3"`) {
		t.Errorf("json output = %s", out)
	}
}

func TestBatches(t *testing.T) {
	t.Parallel()
	b := setup(t, func(s *fakeserver.Server) { s.MaxPageSize = 2 })
	dir := t.TempDir()
	writeFiles(t, dir, "a.pdf")
	for i := range 5 {
		if code, _, errOut := b.run(t, "submit", "--team", "alpha", "--request-id", fmt.Sprint("r", i), dir); code != ExitOK {
			t.Fatalf("submit: %s", errOut)
		}
	}

	t.Run("newest first, following pages", func(t *testing.T) {
		code, out, _ := b.run(t, "batches", "--limit", "0")
		if code != ExitOK {
			t.Fatalf("exit %d", code)
		}
		if i, j := strings.Index(out, "b-5"), strings.Index(out, "b-1"); i < 0 || j < 0 || i > j {
			t.Errorf("output not newest first:\n%s", out)
		}
	})

	t.Run("a limit stops early and says how to go on", func(t *testing.T) {
		_, out, _ := b.run(t, "batches", "--limit", "2")
		if strings.Contains(out, "b-3") || !strings.Contains(out, "more: leasehold batches --page-token") {
			t.Errorf("output:\n%s", out)
		}
		_, out, _ = b.run(t, "batches", "--limit", "2", "--page-token", "2")
		if !strings.Contains(out, "b-3") || strings.Contains(out, "b-5") {
			t.Errorf("second page:\n%s", out)
		}
	})

	t.Run("filters and -o json", func(t *testing.T) {
		_, out, _ := b.run(t, "batches", "--team", "beta", "-o", "json")
		if strings.TrimSpace(out) != "" {
			t.Errorf("team beta has batches: %s", out)
		}
		_, out, _ = b.run(t, "batches", "--state", "running", "-o", "json", "--limit", "1")
		if n := strings.Count(out, "\n"); n != 1 || !strings.Contains(out, `"id":"b-5"`) {
			t.Errorf("json output = %q, want b-5 alone", out)
		}
		_, out, _ = b.run(t, "batches", "--state", "done")
		if strings.Contains(out, "b-") {
			t.Errorf("done batches listed while none is done:\n%s", out)
		}
		if code, _, _ := b.run(t, "batches", "--state", "stuck"); code != ExitUsage {
			t.Errorf("--state stuck: exit %d, want %d", code, ExitUsage)
		}
		if code, _, _ := b.run(t, "batches", "--since", "yesterday"); code != ExitUsage {
			t.Errorf("--since yesterday: exit %d, want %d", code, ExitUsage)
		}
	})
}
