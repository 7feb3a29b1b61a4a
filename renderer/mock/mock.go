// Package mock is the deterministic preview provider renderer pods use: a
// [renderer.Provider] for the worker of package renderer.
//
// The provider never opens, parses or executes a document: it derives a small
// paletted PNG whose colours come from the document's bytes (or, when the
// document has no inline content, from its name and source URI) and stamps
// the job id, lease token and renderer id into PNG text chunks, so the same
// document rendered under two leases yields two different digests. The pixel
// indices are the same in every preview and compressed once per process, so a
// render without injected latency costs a few microseconds. Formats that could carry code (macro
// documents, executables, scripts) are refused as UNSUPPORTED_FORMAT, and a
// document whose content starts with [InvalidMarker] is refused as
// INVALID_DOCUMENT.
//
// Fault injection (latency, transient failures, a pause before completing and
// a crash on a poison document) makes races reproducible. Every random
// decision comes from a generator seeded with [Config.Seed] and the lease
// (job id and token), so a render's outcome does not depend on the order in
// which concurrent renders run.
package mock

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"mime"
	"os"
	"path"
	"strings"
	"time"

	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"github.com/leasehold/leasehold/renderer"
)

// InvalidMarker is the content prefix that marks a document as corrupt: a
// document whose inline content starts with it fails with
// FAILURE_CLASS_INVALID_DOCUMENT.
const InvalidMarker = "%INVALID"

// CrashExitCode is the process exit code used when a document matches
// [Config.CrashOn].
const CrashExitCode = 3

// ContentType is the media type of every preview the provider produces.
const ContentType = "image/png"

// The provider's compile-time check against the worker's seam.
var _ renderer.Provider = (*Provider)(nil)

// DefaultUnsupported returns the built-in list of refused formats: file
// extensions (with a leading dot) and MIME types of documents that may carry
// macros or executable code. It returns a new slice on every call.
func DefaultUnsupported() []string {
	return []string{
		".docm", ".xlsm", ".pptm", ".dotm", ".xltm", ".potm",
		".exe", ".dll", ".bat", ".cmd", ".com", ".js", ".vbs", ".ps1", ".scr", ".msi",
		"application/x-msdownload",
		"application/x-msdos-program",
		"application/x-msi",
		"application/vnd.ms-word.document.macroenabled.12",
		"application/vnd.ms-word.template.macroenabled.12",
		"application/vnd.ms-excel.sheet.macroenabled.12",
		"application/vnd.ms-excel.template.macroenabled.12",
		"application/vnd.ms-powerpoint.presentation.macroenabled.12",
		"application/vnd.ms-powerpoint.template.macroenabled.12",
		"application/javascript",
		"text/javascript",
		"text/vbscript",
	}
}

// Config configures a [Provider]. The zero value renders at once, never fails
// transiently, and refuses the [DefaultUnsupported] formats.
type Config struct {
	// Latency is how long every render takes.
	Latency time.Duration
	// LatencyJitter adds a random extra in [0, LatencyJitter) to Latency.
	LatencyJitter time.Duration
	// FailRate is the probability (0 to 1) that a render fails with
	// FAILURE_CLASS_TRANSIENT.
	FailRate float64
	// PauseBeforeComplete blocks after rendering and before returning the
	// output, as a garbage-collection pause would.
	PauseBeforeComplete time.Duration
	// CrashOn, when not empty, makes the process exit with [CrashExitCode] as
	// soon as it renders a document whose name contains it.
	CrashOn string
	// Unsupported lists refused extensions (".docm") and MIME types,
	// compared without case. Nil means [DefaultUnsupported]; an empty,
	// non-nil slice refuses nothing.
	Unsupported []string
	// Seed seeds every random decision.
	Seed uint64
	// PreviewBytes, when larger than a preview, pads it to this many bytes
	// with incompressible bytes in a private ancillary chunk (padChunk),
	// drawn from the document and the lease: previews of realistic size,
	// still valid PNGs, the same for the same document under the same
	// lease. 0 leaves previews as drawn (about 0.4 KiB).
	PreviewBytes int
	// Exit ends the process on a crash; nil means os.Exit. Tests replace it.
	Exit func(code int)
}

// Provider renders previews. It is safe for concurrent use.
type Provider struct {
	cfg         Config
	unsupported map[string]bool
	exit        func(int)
}

// New returns a provider for cfg. It returns an error when a setting is out
// of range.
func New(cfg Config) (*Provider, error) {
	if cfg.Latency < 0 || cfg.LatencyJitter < 0 || cfg.PauseBeforeComplete < 0 {
		return nil, fmt.Errorf("mock: durations must not be negative")
	}
	if cfg.PreviewBytes < 0 || cfg.PreviewBytes > MaxPreviewBytes {
		return nil, fmt.Errorf("mock: preview bytes %d is not between 0 and %d", cfg.PreviewBytes, MaxPreviewBytes)
	}
	if cfg.FailRate < 0 || cfg.FailRate > 1 {
		return nil, fmt.Errorf("mock: fail rate %v is not between 0 and 1", cfg.FailRate)
	}
	list := cfg.Unsupported
	if list == nil {
		list = DefaultUnsupported()
	}
	p := &Provider{cfg: cfg, unsupported: make(map[string]bool, len(list)), exit: cfg.Exit}
	for _, f := range list {
		if f = normalizeFormat(f); f != "" {
			p.unsupported[f] = true
		}
	}
	if p.exit == nil {
		p.exit = os.Exit
	}
	return p, nil
}

// Render previews in.Document under the lease (in.JobID, in.Token).
//
// It returns a *renderer.Failure for documents it refuses and for injected
// transient faults, and ctx.Err() as soon as ctx is done while it waits
// (latency or the pause before completing, which it announces with
// in.OnPause). A document matching Config.CrashOn ends the
// process before anything else happens; if the injected exit function
// returns, Render returns an error.
func (p *Provider) Render(ctx context.Context, in renderer.Input) (renderer.Output, error) {
	if p.cfg.CrashOn != "" && strings.Contains(in.Document.Name, p.cfg.CrashOn) {
		p.exit(CrashExitCode)
		return renderer.Output{}, fmt.Errorf("mock: crashed on %q", in.Document.Name)
	}
	// The generator is built only when a random decision is configured; its
	// draws come in a fixed order (jitter, then failure).
	var rng *rand.Rand
	if p.cfg.LatencyJitter > 0 || p.cfg.FailRate > 0 {
		rng = p.rng(in)
	}
	delay := p.cfg.Latency
	if p.cfg.LatencyJitter > 0 {
		delay += time.Duration(rng.Int64N(int64(p.cfg.LatencyJitter)))
	}
	if err := wait(ctx, delay); err != nil {
		return renderer.Output{}, err
	}
	if f := p.classify(in.Document); f != nil {
		return renderer.Output{}, f
	}
	if p.cfg.FailRate > 0 && rng.Float64() < p.cfg.FailRate {
		return renderer.Output{}, &renderer.Failure{Class: leaseholdv1.FailureClass_FAILURE_CLASS_TRANSIENT, Message: "injected transient fault"}
	}
	img := pad(renderPNG(in), p.cfg.PreviewBytes, in)
	if p.cfg.PauseBeforeComplete > 0 {
		if in.OnPause != nil {
			in.OnPause()
		}
		if err := wait(ctx, p.cfg.PauseBeforeComplete); err != nil {
			return renderer.Output{}, err
		}
	}
	return renderer.Output{Content: img, ContentType: ContentType}, nil
}

// Supported reports whether a document with this name and content type is
// accepted by the format check.
func (p *Provider) Supported(name, contentType string) bool {
	return p.classify(renderer.Document{Name: name, ContentType: contentType}) == nil
}

// classify returns the permanent failure for doc, or nil when it can be
// rendered.
func (p *Provider) classify(doc renderer.Document) *renderer.Failure {
	for _, f := range []string{normalizeFormat(path.Ext(doc.Name)), normalizeFormat(doc.ContentType)} {
		if f != "" && p.unsupported[f] {
			return &renderer.Failure{
				Class:   leaseholdv1.FailureClass_FAILURE_CLASS_UNSUPPORTED_FORMAT,
				Message: fmt.Sprintf("format %q is not supported", f),
			}
		}
	}
	if bytes.HasPrefix(doc.Content, []byte(InvalidMarker)) {
		return &renderer.Failure{Class: leaseholdv1.FailureClass_FAILURE_CLASS_INVALID_DOCUMENT, Message: "document content is not readable"}
	}
	return nil
}

// rng returns the generator for one render, seeded by the provider's seed and
// the lease, so that its draws do not depend on other renders.
func (p *Provider) rng(in renderer.Input) *rand.Rand {
	h := sha256.New()
	h.Write([]byte(in.JobID))
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], in.Token)
	h.Write(b[:])
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	return rand.New(rand.NewPCG(p.cfg.Seed, binary.BigEndian.Uint64(sum[:])))
}

// normalizeFormat lowercases an extension or MIME type and drops MIME
// parameters.
func normalizeFormat(s string) string {
	s = strings.ToLower(strings.TrimSpace(s))
	if strings.Contains(s, "/") {
		if mt, _, err := mime.ParseMediaType(s); err == nil {
			return mt
		}
		if i := strings.IndexByte(s, ';'); i >= 0 {
			s = strings.TrimSpace(s[:i])
		}
	}
	return s
}

// wait blocks for d or until ctx is done, and returns ctx.Err() in the latter
// case.
func wait(ctx context.Context, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
