package coordinator

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/engine"
	"github.com/leasehold/leasehold/coordinator/internal/jobs"
)

// TestCheck runs the check on a data directory a coordinator wrote: a
// batch of three documents, one of them leased.
func TestCheck(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "data")
	c, err := New(Config{Listen: "127.0.0.1:0", DataDir: dir, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	docs := []jobs.DocInput{
		{Document: jobs.Document{Name: "a.txt", ContentType: "text/plain", SizeBytes: 1}, Content: []byte("a")},
		{Document: jobs.Document{Name: "b.txt", ContentType: "text/plain", SizeBytes: 1}, Content: []byte("b")},
		{Document: jobs.Document{Name: "c.exe", ContentType: "application/x-msdownload", SizeBytes: 1}, Content: []byte("c")},
	}
	if _, err := c.eng.Submit(ctx, engine.SubmitRequest{Team: "alpha", RequestID: "r-1", Docs: docs}); err != nil {
		t.Fatalf("Submit: %v", err)
	}
	// A session with one credit takes one lease.
	if _, _, err := c.eng.Open(ctx, engine.SessionOpen{Renderer: engine.Renderer{ID: "r", Principal: "p"}, Capacity: 1, Credits: 1}); err != nil {
		t.Fatalf("Open: %v", err)
	}

	if _, err := Check(t.Context(), dir, ""); !errors.Is(err, ErrDataDirInUse) {
		t.Errorf("Check while the coordinator runs = %v, want ErrDataDirInUse", err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}

	got, err := Check(t.Context(), dir, "")
	if err != nil {
		t.Fatalf("Check: %v", err)
	}
	want := CheckReport{Path: filepath.Join(dir, DBFile), Schema: 2, Jobs: 3, Unfinished: 2, Batches: 1, LastToken: 1, Problems: []string{}}
	if got.Path != want.Path || got.Schema != want.Schema || got.Jobs != want.Jobs || got.Unfinished != want.Unfinished ||
		got.Batches != want.Batches || got.LastToken != want.LastToken || !got.OK() {
		t.Errorf("Check() = %+v, want %+v", got, want)
	}
	if len(got.Digest) != 64 || got.AppliedIndex != 0 {
		t.Errorf("Check() digest %q, applied index %d; want 64 hex digits and 0 on a single node", got.Digest, got.AppliedIndex)
	}
	if again, err := Check(t.Context(), dir, ""); err != nil || again.Digest != got.Digest {
		t.Errorf("a second Check() has digest %q (%v), want %q", again.Digest, err, got.Digest)
	}

	if _, err := Check(t.Context(), filepath.Join(t.TempDir(), "none"), ""); err == nil {
		t.Errorf("Check of a directory without a database = nil error, want one")
	}
}
