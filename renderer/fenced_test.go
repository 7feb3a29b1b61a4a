package renderer_test

import (
	"bytes"
	"context"
	"log/slog"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"

	"github.com/leasehold/leasehold/client"
	"github.com/leasehold/leasehold/coordinator"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"github.com/leasehold/leasehold/renderer"
	"github.com/leasehold/leasehold/renderer/mock"
)

// TestPausedRendererIsFenced tells the paused worker's story against a real
// coordinator (its writer, its bbolt file and its fencing check) in a
// synctest bubble, so that the lease TTL, the heartbeats and the retry
// backoff pass on the bubble's clock: renderer A stalls after rendering
// and stops heartbeating, and its lease expires exactly one TTL after the
// grant; renderer B leases the job under a larger token and completes it;
// A's completion, when the stall ends, is refused and recorded, and the
// preview stored is B's.
func TestPausedRendererIsFenced(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		const ttl = 3 * time.Second
		lis := newPipeListener()
		c, err := coordinator.New(coordinator.Config{DataDir: t.TempDir(), LeaseTTL: ttl, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatalf("coordinator.New: %v", err)
		}
		served := make(chan error, 1)
		go func() { served <- c.Serve(lis) }()
		t.Cleanup(func() {
			if err := c.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
			if err := <-served; err != nil {
				t.Errorf("Serve: %v", err)
			}
		})
		start := func(id string, cfg mock.Config, logs chan logEvent) {
			w, err := renderer.New(renderer.Config{
				Coordinator: "passthrough:///coordinator", ID: id, Token: "dev-renderer", Capacity: 1,
				Provider: newMock(t, cfg), Logger: newCaptureLogger(logs), DialOptions: []grpc.DialOption{lis.dialOption()},
			})
			if err != nil {
				t.Fatalf("renderer.New: %v", err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			ran := make(chan error, 1)
			go func() { ran <- w.Run(ctx) }()
			t.Cleanup(func() {
				w.EndDrain()
				cancel()
				if err := <-ran; err != nil {
					t.Errorf("%s: Run: %v", id, err)
				}
			})
		}
		cl, err := client.Dial("passthrough:///coordinator", client.WithToken("dev-alpha"), client.WithDialOptions(lis.dialOption()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cl.Close() })

		aLogs, bLogs := make(chan logEvent, 4096), make(chan logEvent, 4096)
		start("r-a", mock.Config{PauseBeforeComplete: 4 * ttl}, aLogs)
		resp, err := cl.SubmitBatch(t.Context(), "alpha", "paused", []*leaseholdv1.Document{pdf("%PDF-1.7")}, nil)
		if err != nil {
			t.Fatalf("SubmitBatch: %v", err)
		}
		jobID := resp.GetBatch().GetJobIds()[0]
		paused := waitLogOn(t, aLogs, "render paused")
		granted := time.Now()
		start("r-b", mock.Config{}, bLogs)
		waitLogOn(t, bLogs, "completed")
		rejected := waitLogOn(t, aLogs, "completion rejected")
		if got := time.Since(granted); got != 4*ttl {
			t.Errorf("A completed %v after its grant, want after its stall of %v", got, 4*ttl)
		}
		if diff := cmp.Diff(map[string]string{"job": jobID, "token": paused.attrs["token"], "reason": "LEASE_EXPIRED"}, rejected.attrs); diff != "" {
			t.Errorf("A's completion rejected log (-want +got):\n%s", diff)
		}

		j, err := cl.GetJob(t.Context(), jobID)
		if err != nil {
			t.Fatalf("GetJob: %v", err)
		}
		type step struct {
			Kind     leaseholdv1.EventKind
			Token    uint64
			Renderer string
			Reason   string
		}
		var got []step
		var leased time.Time
		for _, ev := range j.GetEvents() {
			switch ev.GetKind() {
			case leaseholdv1.EventKind_EVENT_KIND_LEASED, leaseholdv1.EventKind_EVENT_KIND_LEASE_EXPIRED,
				leaseholdv1.EventKind_EVENT_KIND_SUCCEEDED, leaseholdv1.EventKind_EVENT_KIND_COMPLETION_REJECTED:
				got = append(got, step{ev.GetKind(), ev.GetToken(), ev.GetRendererId(), ev.GetReason()})
			}
			switch at := ev.GetAt().AsTime(); {
			case ev.GetKind() == leaseholdv1.EventKind_EVENT_KIND_LEASED && leased.IsZero():
				leased = at
			case ev.GetKind() == leaseholdv1.EventKind_EVENT_KIND_LEASE_EXPIRED && at.Sub(leased) != ttl:
				t.Errorf("the lease expired %v after its grant, want the TTL %v", at.Sub(leased), ttl)
			}
		}
		want := []step{
			{leaseholdv1.EventKind_EVENT_KIND_LEASED, 1, "r-a", ""},
			{leaseholdv1.EventKind_EVENT_KIND_LEASE_EXPIRED, 1, "r-a", "LEASE_EXPIRED"},
			{leaseholdv1.EventKind_EVENT_KIND_LEASED, 2, "r-b", ""},
			{leaseholdv1.EventKind_EVENT_KIND_SUCCEEDED, 2, "r-b", ""},
			{leaseholdv1.EventKind_EVENT_KIND_COMPLETION_REJECTED, 1, "r-a", "LEASE_EXPIRED"},
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("the job's history (-want +got):\n%s", diff)
		}
		if paused.attrs["token"] != "1" {
			t.Errorf("A paused under token %s, want 1", paused.attrs["token"])
		}

		var preview bytes.Buffer
		if _, err := cl.DownloadArtifact(t.Context(), jobID, &preview); err != nil {
			t.Fatalf("DownloadArtifact: %v", err)
		}
		chunks, err := mock.TextChunks(preview.Bytes())
		if err != nil {
			t.Fatalf("the stored preview: %v", err)
		}
		if diff := cmp.Diff(map[string]string{mock.KeyToken: "2", mock.KeyRendererID: "r-b"}, chunks,
			onlyKeys(mock.KeyToken, mock.KeyRendererID)); diff != "" {
			t.Errorf("the stored preview's text chunks (-want +got):\n%s", diff)
		}
	})
}
