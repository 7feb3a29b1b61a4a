// Package mock is the deterministic preview provider renderer pods use.
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

// Document is what the provider knows about the document to preview.
type Document struct {
	// Name is the document's name; its extension is used for format checks.
	Name string
	// ContentType is a MIME type or a file extension such as ".pdf".
	ContentType string
	// Content is the inline content; it may be empty.
	Content []byte
	// SourceURI is where the document lives; it is never fetched.
	SourceURI string
}

// Input is one render request: the document and the lease it is made under.
type Input struct {
	// JobID and Token name the lease; both are stamped into the preview.
	JobID string
	Token uint64
	// RendererID names the renderer; it is stamped into the preview.
	RendererID string
	// Document is the document to preview.
	Document Document
	// OnPause, when set, is called as the simulated pause before completing
	// begins. The pause stands for a stop-the-world stall of the whole
	// process, so the caller should stop heartbeating this lease until Render
	// returns; that is what lets the lease expire behind the paused render.
	OnPause func()
}

// Output is a rendered preview.
type Output struct {
	// Content is the encoded preview.
	Content []byte
	// ContentType is the preview's media type, always [ContentType].
	ContentType string
}

// Failure is a classified render failure. Renderers report it to the
// coordinator with its class; permanent classes end the job at once.
type Failure struct {
	// Class is how the coordinator treats the failure.
	Class leaseholdv1.FailureClass
	// Message says what went wrong; it never quotes document content.
	Message string
}

// Error implements error.
func (f *Failure) Error() string {
	return fmt.Sprintf("%s: %s", f.Class, f.Message)
}

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
// It returns a *Failure for documents it refuses and for injected transient
// faults, and ctx.Err() as soon as ctx is done while it waits (latency or the
// pause before completing). A document matching Config.CrashOn ends the
// process before anything else happens; if the injected exit function
// returns, Render returns an error.
func (p *Provider) Render(ctx context.Context, in Input) (Output, error) {
	if p.cfg.CrashOn != "" && strings.Contains(in.Document.Name, p.cfg.CrashOn) {
		p.exit(CrashExitCode)
		return Output{}, fmt.Errorf("mock: crashed on %q", in.Document.Name)
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
		return Output{}, err
	}
	if f := p.classify(in.Document); f != nil {
		return Output{}, f
	}
	if p.cfg.FailRate > 0 && rng.Float64() < p.cfg.FailRate {
		return Output{}, &Failure{Class: leaseholdv1.FailureClass_FAILURE_CLASS_TRANSIENT, Message: "injected transient fault"}
	}
	img := renderPNG(in)
	if p.cfg.PauseBeforeComplete > 0 {
		if in.OnPause != nil {
			in.OnPause()
		}
		if err := wait(ctx, p.cfg.PauseBeforeComplete); err != nil {
			return Output{}, err
		}
	}
	return Output{Content: img, ContentType: ContentType}, nil
}

// Supported reports whether a document with this name and content type is
// accepted by the format check.
func (p *Provider) Supported(name, contentType string) bool {
	return p.classify(Document{Name: name, ContentType: contentType}) == nil
}

// classify returns the permanent failure for doc, or nil when it can be
// rendered.
func (p *Provider) classify(doc Document) *Failure {
	for _, f := range []string{normalizeFormat(path.Ext(doc.Name)), normalizeFormat(doc.ContentType)} {
		if f != "" && p.unsupported[f] {
			return &Failure{
				Class:   leaseholdv1.FailureClass_FAILURE_CLASS_UNSUPPORTED_FORMAT,
				Message: fmt.Sprintf("format %q is not supported", f),
			}
		}
	}
	if bytes.HasPrefix(doc.Content, []byte(InvalidMarker)) {
		return &Failure{Class: leaseholdv1.FailureClass_FAILURE_CLASS_INVALID_DOCUMENT, Message: "document content is not readable"}
	}
	return nil
}

// rng returns the generator for one render, seeded by the provider's seed and
// the lease, so that its draws do not depend on other renders.
func (p *Provider) rng(in Input) *rand.Rand {
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
