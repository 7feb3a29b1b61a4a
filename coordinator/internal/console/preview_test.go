package console

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/leasehold/leasehold/coordinator/internal/auth"
	"github.com/leasehold/leasehold/coordinator/internal/engine"
	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	"github.com/leasehold/leasehold/coordinator/internal/server"
	"github.com/leasehold/leasehold/coordinator/internal/store"
)

// succeeded submits one document of team alpha and completes it through
// the writer with content stored under contentType, as an earlier release
// stored whatever type its renderer named. It returns the job.
func (b *testBundle) succeeded(t *testing.T, content []byte, contentType string) jobs.Job {
	t.Helper()
	ctx := context.Background()
	res, err := b.eng.Submit(ctx, engine.SubmitRequest{Team: "alpha", RequestID: "r", Docs: []jobs.DocInput{
		{Document: jobs.Document{Name: "a.pdf", ContentType: "application/pdf"}, Content: []byte("pdf")}}})
	if err != nil {
		t.Fatal(err)
	}
	r := engine.Renderer{ID: "r-1", Principal: "render"}
	// A session with one credit is granted the job in its open's group.
	conn, _, err := b.eng.Open(ctx, engine.SessionOpen{Renderer: r, Capacity: 1, Credits: 1})
	if err != nil {
		t.Fatal(err)
	}
	grants, _, _ := conn.Outbox.Take()
	if len(grants) != 1 {
		t.Fatalf("the session was granted %d leases, want 1", len(grants))
	}
	g := grants[0].Job
	out, err := b.eng.Receive(ctx, conn, engine.SessionInput{Completions: []engine.CompleteRequest{{Job: g.ID,
		Completion: jobs.Completion{Token: g.Lease.Token, Renderer: r.ID, Success: true},
		Preview:    &jobs.Preview{Digest: "d", ContentType: contentType, Content: content}}}})
	if err == nil {
		err = out.Completions[0].Err
	}
	if err != nil || out.Completions[0].Job.ID != res.Batch.Batch.FirstJob {
		t.Fatalf("the completion = %+v, %v", out, err)
	}
	if _, err := b.eng.Close(ctx, conn, nil); err != nil {
		t.Fatal(err)
	}
	return out.Completions[0].Job
}

// storeType rewrites the media type stored with a succeeded job's preview,
// in its record and in the preview's own, directly in the store.
func (b *testBundle) storeType(t *testing.T, j jobs.Job, contentType string) {
	t.Helper()
	err := b.st.Update(func(tx *store.Tx) error {
		rec, _, err := tx.Job(j.ID)
		if err != nil {
			return err
		}
		rec.Artifact.ContentType = contentType
		if err := tx.PutJob(rec); err != nil {
			return err
		}
		a, err := tx.Artifact(j.ID, j.Artifact.Token)
		if err != nil {
			return err
		}
		a.ContentType = contentType
		return tx.PutArtifact(j.ID, j.Artifact.Token, a)
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestPreviewHeaders(t *testing.T) {
	t.Parallel()
	png := []byte("\x89PNG\r\n\x1a\n fake")
	html := []byte(`<html><meta http-equiv="refresh" content="0;url=https://evil.example"><form action="https://evil.example">Sign in</form>`)

	t.Run("A raster preview is served inline under its normalised type, sandboxed and not sniffed", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		j := b.succeeded(t, png, "image/png")
		b.signIn(t, auth.DevAlphaToken)
		for _, stored := range []string{"image/png", "IMAGE/PNG", "image/png; foo=bar"} {
			b.storeType(t, j, stored)
			code, body, h := b.do(t, "GET", "/console/jobs/"+server.JobID(j.ID)+"/preview", nil, nil)
			if code != http.StatusOK || body != string(png) {
				t.Fatalf("preview stored as %q = %d %q", stored, code, body)
			}
			if got := h.Get("Content-Type"); got != "image/png" {
				t.Errorf("stored as %q: Content-Type %q, want image/png", stored, got)
			}
			if got := h.Get("Content-Disposition"); got != "" {
				t.Errorf("stored as %q: Content-Disposition %q, want none (inline)", stored, got)
			}
			if got := h.Get("Content-Security-Policy"); got != "sandbox" {
				t.Errorf("stored as %q: Content-Security-Policy %q, want sandbox", stored, got)
			}
			if got := h.Get("X-Content-Type-Options"); got != "nosniff" {
				t.Errorf("stored as %q: X-Content-Type-Options %q, want nosniff", stored, got)
			}
		}
	})

	t.Run("A type an earlier release stored outside the preview types is a download", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		j := b.succeeded(t, html, "image/png")
		b.signIn(t, auth.DevAlphaToken)
		for _, stored := range []string{"image/png,text/html", "image/png; charset=utf-8,text/html", "image/SVG+xml",
			"image/svg+xml", "text/html", "image/x-icon", "", "image/"} {
			b.storeType(t, j, stored)
			code, body, h := b.do(t, "GET", "/console/jobs/"+server.JobID(j.ID)+"/preview", nil, nil)
			if code != http.StatusOK || body != string(html) {
				t.Fatalf("preview stored as %q = %d %q", stored, code, body)
			}
			if got := h.Get("Content-Type"); got != "application/octet-stream" {
				t.Errorf("stored as %q: Content-Type %q, want application/octet-stream", stored, got)
			}
			if got := h.Get("Content-Disposition"); !strings.HasPrefix(got, "attachment") {
				t.Errorf("stored as %q: Content-Disposition %q, want an attachment", stored, got)
			}
			if got := h.Get("Content-Security-Policy"); got != "sandbox" {
				t.Errorf("stored as %q: Content-Security-Policy %q, want sandbox", stored, got)
			}
			if got := h.Get("X-Content-Type-Options"); got != "nosniff" {
				t.Errorf("stored as %q: X-Content-Type-Options %q, want nosniff", stored, got)
			}
		}
	})
}
