package mock_test

import (
	"bytes"
	"compress/zlib"
	"context"
	"crypto/sha256"
	"errors"
	"image/png"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"github.com/leasehold/leasehold/renderer"
	"github.com/leasehold/leasehold/renderer/mock"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func newProvider(t *testing.T, cfg mock.Config) *mock.Provider {
	t.Helper()
	p, err := mock.New(cfg)
	if err != nil {
		t.Fatalf("mock.New: %v", err)
	}
	return p
}

func input(jobID string, token uint64, content string) renderer.Input {
	return renderer.Input{
		JobID:      jobID,
		Token:      token,
		RendererID: "r-1",
		Document:   renderer.Document{Name: "report.pdf", ContentType: "application/pdf", Content: []byte(content)},
	}
}

func render(t *testing.T, p *mock.Provider, in renderer.Input) renderer.Output {
	t.Helper()
	out, err := p.Render(context.Background(), in)
	if err != nil {
		t.Fatalf("Render(%s, %d): %v", in.JobID, in.Token, err)
	}
	return out
}

func digest(b []byte) [sha256.Size]byte { return sha256.Sum256(b) }

// TestRenderDeterminism ensures previews depend only on the document and the
// lease, and that the lease is visible in the preview.
func TestRenderDeterminism(t *testing.T) {
	t.Parallel()
	p := newProvider(t, mock.Config{})

	t.Run("the same input renders the same bytes", func(t *testing.T) {
		a := render(t, p, input("j1", 7, "hello"))
		b := render(t, newProvider(t, mock.Config{}), input("j1", 7, "hello"))
		if !bytes.Equal(a.Content, b.Content) {
			t.Fatalf("two renders of the same input differ (%d vs %d bytes)", len(a.Content), len(b.Content))
		}
		if a.ContentType != "image/png" {
			t.Fatalf("ContentType = %q, want image/png", a.ContentType)
		}
	})

	t.Run("a different token gives a different digest but the same pixels", func(t *testing.T) {
		a := render(t, p, input("j1", 7, "hello"))
		b := render(t, p, input("j1", 8, "hello"))
		if digest(a.Content) == digest(b.Content) {
			t.Fatalf("tokens 7 and 8 produced the same digest")
		}
		if diff := cmp.Diff(pixels(t, a.Content), pixels(t, b.Content)); diff != "" {
			t.Fatalf("pixels differ between tokens (-7 +8):\n%s", diff)
		}
	})

	t.Run("pixels depend on the content", func(t *testing.T) {
		a := render(t, p, input("j1", 7, "hello"))
		b := render(t, p, input("j1", 7, "hellp"))
		if bytes.Equal(pixels(t, a.Content), pixels(t, b.Content)) {
			t.Fatalf("different contents rendered the same pixels")
		}
	})

	t.Run("without content pixels depend on name and source", func(t *testing.T) {
		in := renderer.Input{JobID: "j", Token: 1, Document: renderer.Document{Name: "a.pdf", SourceURI: "s3://b/a.pdf"}}
		a := render(t, p, in)
		in.Document.SourceURI = "s3://b/other.pdf"
		b := render(t, p, in)
		if bytes.Equal(pixels(t, a.Content), pixels(t, b.Content)) {
			t.Fatalf("different source URIs rendered the same pixels")
		}
	})

	t.Run("text chunks carry job, token and renderer", func(t *testing.T) {
		out := render(t, p, input("job-42", 1234, "x"))
		got, err := mock.TextChunks(out.Content)
		if err != nil {
			t.Fatalf("TextChunks: %v", err)
		}
		want := map[string]string{
			mock.KeySoftware:   "leasehold mock renderer",
			mock.KeyJobID:      "job-42",
			mock.KeyToken:      strconv.Itoa(1234),
			mock.KeyRendererID: "r-1",
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Fatalf("text chunks (-want +got):\n%s", diff)
		}
	})
}

// pixels decodes a preview and returns its raw pixel bytes.
func pixels(t *testing.T, b []byte) []byte {
	t.Helper()
	img, err := png.Decode(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("png.Decode: %v", err)
	}
	bounds := img.Bounds()
	if bounds.Dx() != mock.Size || bounds.Dy() != mock.Size {
		t.Fatalf("preview is %dx%d, want %dx%d", bounds.Dx(), bounds.Dy(), mock.Size, mock.Size)
	}
	var out []byte
	for y := bounds.Min.Y; y < bounds.Max.Y; y++ {
		for x := bounds.Min.X; x < bounds.Max.X; x++ {
			r, g, b, a := img.At(x, y).RGBA()
			out = append(out, byte(r>>8), byte(g>>8), byte(b>>8), byte(a>>8))
		}
	}
	return out
}

// TestRenderClassification ensures refused documents fail with the right
// permanent class.
func TestRenderClassification(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		cfg  mock.Config
		doc  renderer.Document
		want leaseholdv1.FailureClass // UNSPECIFIED means it renders
	}{
		{"a macro document by extension is unsupported", mock.Config{}, renderer.Document{Name: "Budget.XLSM"}, leaseholdv1.FailureClass_FAILURE_CLASS_UNSUPPORTED_FORMAT},
		{"an executable by extension is unsupported", mock.Config{}, renderer.Document{Name: "setup.exe"}, leaseholdv1.FailureClass_FAILURE_CLASS_UNSUPPORTED_FORMAT},
		{"an extension given as content type is unsupported", mock.Config{}, renderer.Document{Name: "x", ContentType: ".docm"}, leaseholdv1.FailureClass_FAILURE_CLASS_UNSUPPORTED_FORMAT},
		{"a macro MIME type is unsupported in any case and with parameters", mock.Config{}, renderer.Document{Name: "x", ContentType: "application/vnd.ms-word.document.macroEnabled.12; charset=binary"}, leaseholdv1.FailureClass_FAILURE_CLASS_UNSUPPORTED_FORMAT},
		{"an executable MIME type is unsupported", mock.Config{}, renderer.Document{Name: "x", ContentType: "application/x-msdownload"}, leaseholdv1.FailureClass_FAILURE_CLASS_UNSUPPORTED_FORMAT},
		{"a content starting with the invalid marker is an invalid document", mock.Config{}, renderer.Document{Name: "a.pdf", Content: []byte("%INVALID rest")}, leaseholdv1.FailureClass_FAILURE_CLASS_INVALID_DOCUMENT},
		{"a plain PDF renders", mock.Config{}, renderer.Document{Name: "a.pdf", ContentType: "application/pdf", Content: []byte("%PDF-1.7")}, leaseholdv1.FailureClass_FAILURE_CLASS_UNSPECIFIED},
		{"a configured list replaces the default", mock.Config{Unsupported: []string{".PDF"}}, renderer.Document{Name: "a.pdf"}, leaseholdv1.FailureClass_FAILURE_CLASS_UNSUPPORTED_FORMAT},
		{"an empty configured list refuses nothing", mock.Config{Unsupported: []string{}}, renderer.Document{Name: "a.exe"}, leaseholdv1.FailureClass_FAILURE_CLASS_UNSPECIFIED},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := newProvider(t, tt.cfg)
			_, err := p.Render(context.Background(), renderer.Input{JobID: "j", Token: 1, Document: tt.doc})
			var f *renderer.Failure
			switch {
			case tt.want == leaseholdv1.FailureClass_FAILURE_CLASS_UNSPECIFIED && err != nil:
				t.Fatalf("Render: %v, want success", err)
			case tt.want == leaseholdv1.FailureClass_FAILURE_CLASS_UNSPECIFIED:
			case !errors.As(err, &f):
				t.Fatalf("Render error = %v, want *renderer.Failure", err)
			case f.Class != tt.want:
				t.Fatalf("class = %v, want %v", f.Class, tt.want)
			}
		})
	}
}

// TestRenderFailRate ensures injected transient faults are reproducible for a
// seed and close to the configured rate.
func TestRenderFailRate(t *testing.T) {
	t.Parallel()
	outcomes := func(seed uint64) []bool {
		p := newProvider(t, mock.Config{FailRate: 0.3, Seed: seed})
		var got []bool
		for i := range 100 {
			_, err := p.Render(context.Background(), input("job-"+strconv.Itoa(i), uint64(i+1), "doc"))
			var f *renderer.Failure
			if err != nil && (!errors.As(err, &f) || f.Class != leaseholdv1.FailureClass_FAILURE_CLASS_TRANSIENT) {
				t.Fatalf("Render error = %v, want a transient *renderer.Failure", err)
			}
			got = append(got, err != nil)
		}
		return got
	}

	t.Run("the same seed fails the same renders", func(t *testing.T) {
		if diff := cmp.Diff(outcomes(42), outcomes(42)); diff != "" {
			t.Fatalf("outcomes differ for one seed:\n%s", diff)
		}
	})

	t.Run("another seed fails other renders", func(t *testing.T) {
		if cmp.Equal(outcomes(42), outcomes(43)) {
			t.Fatalf("seeds 42 and 43 failed exactly the same renders")
		}
	})

	t.Run("the failure share is near the rate", func(t *testing.T) {
		n := 0
		for _, failed := range outcomes(7) {
			if failed {
				n++
			}
		}
		if n < 15 || n > 45 {
			t.Fatalf("%d of 100 renders failed, want about 30", n)
		}
	})
}

// TestRenderTiming ensures latency and the pause before completing take the
// configured time and end early when the context is done.
func TestRenderTiming(t *testing.T) {
	t.Parallel()

	t.Run("latency and pause add up", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			p := newProvider(t, mock.Config{Latency: 2 * time.Second, PauseBeforeComplete: 3 * time.Second})
			start := time.Now()
			if _, err := p.Render(context.Background(), input("j", 1, "x")); err != nil {
				t.Fatalf("Render: %v", err)
			}
			if got, want := time.Since(start), 5*time.Second; got != want {
				t.Fatalf("render took %v, want %v", got, want)
			}
		})
	})

	t.Run("jitter stays within its bound", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			p := newProvider(t, mock.Config{Latency: time.Second, LatencyJitter: time.Second})
			for i := range 20 {
				start := time.Now()
				if _, err := p.Render(context.Background(), input("j", uint64(i), "x")); err != nil {
					t.Fatalf("Render: %v", err)
				}
				if got := time.Since(start); got < time.Second || got >= 2*time.Second {
					t.Fatalf("render took %v, want within [1s, 2s)", got)
				}
			}
		})
	})

	t.Run("the pause is announced before it starts", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			p := newProvider(t, mock.Config{Latency: time.Second, PauseBeforeComplete: 2 * time.Second})
			start := time.Now()
			var at []time.Duration
			in := input("j", 1, "x")
			in.OnPause = func() { at = append(at, time.Since(start)) }
			if _, err := p.Render(context.Background(), in); err != nil {
				t.Fatalf("Render: %v", err)
			}
			if diff := cmp.Diff([]time.Duration{time.Second}, at); diff != "" {
				t.Fatalf("OnPause calls (-want +got):\n%s", diff)
			}
		})
	})

	t.Run("latency returns the context error when the context ends", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			p := newProvider(t, mock.Config{Latency: time.Hour})
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			start := time.Now()
			_, err := p.Render(ctx, input("j", 1, "x"))
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("Render error = %v, want context.DeadlineExceeded", err)
			}
			if got := time.Since(start); got != time.Second {
				t.Fatalf("Render returned after %v, want 1s", got)
			}
		})
	})

	t.Run("the pause returns the context error on cancellation", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			p := newProvider(t, mock.Config{PauseBeforeComplete: time.Hour})
			ctx, cancel := context.WithCancel(context.Background())
			errc := make(chan error, 1)
			go func() {
				_, err := p.Render(ctx, input("j", 1, "x"))
				errc <- err
			}()
			synctest.Wait()
			select {
			case err := <-errc:
				t.Fatalf("Render returned %v before cancellation", err)
			default:
			}
			cancel()
			if err := <-errc; !errors.Is(err, context.Canceled) {
				t.Fatalf("Render error = %v, want context.Canceled", err)
			}
		})
	})
}

// TestRenderCrash ensures a poison document ends the process with exit code 3.
func TestRenderCrash(t *testing.T) {
	t.Parallel()
	var codes []int
	p := newProvider(t, mock.Config{CrashOn: "poison", Exit: func(code int) { codes = append(codes, code) }})

	t.Run("other documents render", func(t *testing.T) {
		render(t, p, input("j", 1, "x"))
		if len(codes) != 0 {
			t.Fatalf("exit called with %v for a harmless document", codes)
		}
	})

	t.Run("a matching name exits with code 3", func(t *testing.T) {
		in := input("j", 2, "x")
		in.Document.Name = "the-poison-pill.pdf"
		if _, err := p.Render(context.Background(), in); err == nil {
			t.Fatalf("Render succeeded after the injected exit returned")
		}
		if diff := cmp.Diff([]int{3}, codes); diff != "" {
			t.Fatalf("exit codes (-want +got):\n%s", diff)
		}
	})
}

// TestNewValidates ensures out-of-range settings are refused.
func TestNewValidates(t *testing.T) {
	t.Parallel()
	for _, cfg := range []mock.Config{{FailRate: 1.5}, {FailRate: -0.1}, {Latency: -time.Second}} {
		if _, err := mock.New(cfg); err == nil {
			t.Errorf("New(%+v) succeeded, want an error", cfg)
		}
	}
}

// TestRenderIsValidPNG ensures every preview decodes with image/png as a
// Size x Size image, whatever the lengths of the stamped ids.
func TestRenderIsValidPNG(t *testing.T) {
	t.Parallel()
	p := newProvider(t, mock.Config{})
	for _, in := range []renderer.Input{
		input("j", 0, "x"),
		input(strings.Repeat("j", 300), ^uint64(0), strings.Repeat("long content ", 1000)),
		{JobID: "j", Token: 1, Document: renderer.Document{Name: "empty.pdf"}},
	} {
		out := render(t, p, in)
		cfg, err := png.DecodeConfig(bytes.NewReader(out.Content))
		if err != nil {
			t.Fatalf("png.DecodeConfig(job %.10s…): %v", in.JobID, err)
		}
		if cfg.Width != mock.Size || cfg.Height != mock.Size {
			t.Errorf("preview is %dx%d, want %dx%d", cfg.Width, cfg.Height, mock.Size, mock.Size)
		}
		pixels(t, out.Content) // decodes every pixel
		chunks, err := mock.TextChunks(out.Content)
		if err != nil {
			t.Fatalf("TextChunks: %v", err)
		}
		if got, want := chunks[mock.KeyToken], strconv.FormatUint(in.Token, 10); got != want {
			t.Errorf("token chunk = %q, want %q", got, want)
		}
	}
}

// TestRenderCells ensures the preview shows one colour per cell of the grid,
// so that its pixels are a picture of the document and not noise.
func TestRenderCells(t *testing.T) {
	t.Parallel()
	px := pixels(t, render(t, newProvider(t, mock.Config{}), input("j", 1, "cells")).Content)
	const cell = mock.Size / 8
	colours := map[[4]byte]bool{}
	for y := range mock.Size {
		for x := range mock.Size {
			o := (y*mock.Size + x) * 4
			got := [4]byte(px[o : o+4])
			corner := ((y/cell*cell)*mock.Size + x/cell*cell) * 4
			if want := [4]byte(px[corner : corner+4]); got != want {
				t.Fatalf("pixel (%d,%d) = %v, want its cell's colour %v", x, y, got, want)
			}
			if got[3] != 0xff {
				t.Fatalf("pixel (%d,%d) alpha = %d, want opaque", x, y, got[3])
			}
			colours[got] = true
		}
	}
	if len(colours) < 32 {
		t.Errorf("the preview has %d distinct colours, want most of its 64 cells distinct", len(colours))
	}
}

// BenchmarkRender measures one render without injected latency: the cost the
// mock adds to every document in an end-to-end benchmark.
func BenchmarkRender(b *testing.B) {
	p, err := mock.New(mock.Config{})
	if err != nil {
		b.Fatalf("mock.New: %v", err)
	}
	in := input("job-0123456789", 123456, "%PDF-1.7\nquarterly report\n")
	in.RendererID = "bench-renderer-1"
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := p.Render(ctx, in); err != nil {
			b.Fatalf("Render: %v", err)
		}
	}
}

// BenchmarkRenderInlineDocument measures one render of a document carrying
// 200 KiB inline, near the coordinator's per-document inline limit: the
// document is read to check its format and to seed the palette.
func BenchmarkRenderInlineDocument(b *testing.B) {
	p, err := mock.New(mock.Config{})
	if err != nil {
		b.Fatalf("mock.New: %v", err)
	}
	in := input("job-0123456789", 123456, "%PDF-1.7\n"+strings.Repeat("quarterly report\n", 200<<10/17))
	in.RendererID = "bench-renderer-1"
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := p.Render(ctx, in); err != nil {
			b.Fatalf("Render: %v", err)
		}
	}
}

func TestPreviewBytesPadsAValidPNG(t *testing.T) {
	t.Parallel()
	p, err := mock.New(mock.Config{PreviewBytes: 131072})
	if err != nil {
		t.Fatal(err)
	}
	in := renderer.Input{JobID: "j-1", Token: 7, RendererID: "r", Document: renderer.Document{Name: "a.pdf", Content: []byte("doc")}}
	out, err := p.Render(context.Background(), in)
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Content) != 131072 {
		t.Fatalf("preview is %d bytes, want 131072", len(out.Content))
	}
	if _, err := png.Decode(bytes.NewReader(out.Content)); err != nil {
		t.Fatalf("the padded preview is not a valid PNG: %v", err)
	}
	again, _ := p.Render(context.Background(), in)
	if !bytes.Equal(again.Content, out.Content) {
		t.Error("the same document under the same lease gave other bytes")
	}
	in.Token = 8
	other, _ := p.Render(context.Background(), in)
	if bytes.Equal(other.Content, out.Content) {
		t.Error("another lease gave the same bytes")
	}
	var z bytes.Buffer
	zw := zlib.NewWriter(&z)
	zw.Write(out.Content)
	zw.Close()
	if z.Len() < len(out.Content)*9/10 {
		t.Errorf("the padding compresses to %d of %d bytes", z.Len(), len(out.Content))
	}
}
