package server

import (
	"io"
	"testing"

	"github.com/leasehold/leasehold/coordinator/internal/store"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"google.golang.org/grpc/codes"
)

// refusedPreviewTypes are media types a preview may not have: each passes
// a test for an "image/" prefix, or is active content a browser runs.
var refusedPreviewTypes = []string{
	"image/png,text/html",
	"image/png; charset=utf-8,text/html",
	"image/SVG+xml",
	"image/svg+xml",
	"text/html",
	"text/html; charset=utf-8",
	"application/xhtml+xml",
	"image/x-icon",
	"image/",
	"image/png; charset=\"utf-8", // an unterminated parameter
}

// htmlPage is content a browser would run as a page on the console's origin.
var htmlPage = []byte(`<html><meta http-equiv="refresh" content="0;url=https://evil.example">`)

// downloadArtifact reads a job's preview as the development submitter of
// team alpha and returns its metadata.
func (b *testBundle) downloadArtifact(t *testing.T, id string) *leaseholdv1.Artifact {
	t.Helper()
	stream, err := b.jobs.GetArtifact(as(t, alpha), &leaseholdv1.GetArtifactRequest{JobId: id})
	if err != nil {
		t.Fatal(err)
	}
	var meta *leaseholdv1.Artifact
	for {
		m, err := stream.Recv()
		if err == io.EOF {
			return meta
		}
		if err != nil {
			t.Fatalf("GetArtifact(%s): %v", id, err)
		}
		if m.GetArtifact() != nil {
			meta = m.GetArtifact()
		}
	}
}

// TestPreviewTypes checks that every path that stores a preview accepts
// only a raster image type, stores it normalised, and that a type stored
// outside them by an earlier release is reported as opaque bytes.
func TestPreviewTypes(t *testing.T) {
	t.Parallel()

	t.Run("Every path refuses a type outside the raster images with INVALID_ARGUMENT INVALID_CONTENT_TYPE and stores nothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		g := b.leaseOne(t)
		sc := b.openSession(t, hello("r-1", "i-1", 1), 0)
		for _, ct := range append(refusedPreviewTypes, "") { // "" sniffs the HTML as text/html
			_, err := b.rend.Complete(as(t, renderer), &leaseholdv1.CompleteRequest{JobId: g.GetJobId(), Token: g.GetLease().GetToken(), RendererId: "r-1",
				Outcome: &leaseholdv1.CompleteRequest_Success{Success: &leaseholdv1.CompleteSuccess{Content: htmlPage, ContentType: ct}}})
			if c, info := errorInfo(err); c != codes.InvalidArgument || info.GetReason() != reasonInvalidContentType {
				t.Errorf("Complete with %q = %v %q, want INVALID_ARGUMENT INVALID_CONTENT_TYPE", ct, c, info.GetReason())
			}

			c := inline(g, htmlPage)
			c.GetSuccess().ContentType = ct
			r := sc.call(&leaseholdv1.SessionRequest{Completions: []*leaseholdv1.SessionCompletion{c}}).GetResults()[0]
			if codes.Code(r.GetCode()) != codes.InvalidArgument || r.GetReason() != reasonInvalidContentType {
				t.Errorf("session completion with %q = %v %q, want INVALID_ARGUMENT INVALID_CONTENT_TYPE", ct, codes.Code(r.GetCode()), r.GetReason())
			}

			meta := uploadMeta(g, g.GetLease().GetToken(), "r-1")
			meta.GetMetadata().ContentType = ct
			_, err = b.sendUpload(t, renderer, meta, chunk(htmlPage))
			if c, info := errorInfo(err); c != codes.InvalidArgument || info.GetReason() != reasonInvalidContentType {
				t.Errorf("UploadArtifact with %q = %v %q, want INVALID_ARGUMENT INVALID_CONTENT_TYPE", ct, c, info.GetReason())
			}
		}
		wantError(t, b.completeWith(t, g, g.GetLease().GetToken(), sha(htmlPage)), codes.FailedPrecondition, reasonArtifactNotFound)
		if j := b.getJob(t, g.GetJobId()); j.GetPhase() != leaseholdv1.Phase_PHASE_LEASED || j.GetArtifact() != nil || len(b.rejections(t)) != 0 {
			t.Errorf("after the refusals: %v artifact %v, %d rejections; want LEASED, none, none", j.GetPhase(), j.GetArtifact(), len(b.rejections(t)))
		}
	})

	t.Run("An accepted type is stored normalised on every path", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.submit(t, alpha, "alpha", "r", doc("a.pdf"), doc("b.pdf"), doc("c.pdf"))
		g := b.acquire(t, 3)
		png := []byte("\x89PNG\r\n\x1a\n not really")

		if _, err := b.rend.Complete(as(t, renderer), &leaseholdv1.CompleteRequest{JobId: g[0].GetJobId(), Token: g[0].GetLease().GetToken(), RendererId: "r-1",
			Outcome: &leaseholdv1.CompleteRequest_Success{Success: &leaseholdv1.CompleteSuccess{Content: png, ContentType: "IMAGE/PNG; Foo=bar"}}}); err != nil {
			t.Fatal(err)
		}
		sc := b.openSession(t, hello("r-1", "i-1", 1), 0)
		c := inline(g[1], png)
		c.GetSuccess().ContentType = "" // sniffed
		if r := sc.call(&leaseholdv1.SessionRequest{Completions: []*leaseholdv1.SessionCompletion{c}}).GetResults()[0]; r.GetCode() != 0 {
			t.Fatalf("session completion = %v", r)
		}
		meta := uploadMeta(g[2], g[2].GetLease().GetToken(), "r-1")
		meta.GetMetadata().ContentType = " image/WebP "
		up, err := b.sendUpload(t, renderer, meta, chunk(png))
		if err != nil {
			t.Fatal(err)
		}
		if err := b.completeWith(t, g[2], g[2].GetLease().GetToken(), up.GetDigest()); err != nil {
			t.Fatal(err)
		}
		for i, want := range []string{"image/png", "image/png", "image/webp"} {
			if got := b.getJob(t, g[i].GetJobId()).GetArtifact().GetContentType(); got != want {
				t.Errorf("job %s artifact type %q, want %q", g[i].GetJobId(), got, want)
			}
			if got := b.downloadArtifact(t, g[i].GetJobId()).GetContentType(); got != want {
				t.Errorf("GetArtifact(%s) type %q, want %q", g[i].GetJobId(), got, want)
			}
		}
	})

	t.Run("A type stored outside the raster images by an earlier release is reported as application/octet-stream", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		g := b.leaseOne(t)
		b.succeed(t, g, htmlPage)
		id := mustJobID(t, g.GetJobId())
		for _, ct := range refusedPreviewTypes {
			err := b.st.Update(func(tx *store.Tx) error {
				j, _, err := tx.Job(id)
				if err != nil {
					return err
				}
				j.Artifact.ContentType = ct
				return tx.PutJob(j)
			})
			if err != nil {
				t.Fatal(err)
			}
			if got := b.getJob(t, g.GetJobId()).GetArtifact().GetContentType(); got != "application/octet-stream" {
				t.Errorf("stored %q: GetJob reports %q, want application/octet-stream", ct, got)
			}
			if got := b.downloadArtifact(t, g.GetJobId()).GetContentType(); got != "application/octet-stream" {
				t.Errorf("stored %q: GetArtifact reports %q, want application/octet-stream", ct, got)
			}
		}
	})
}
