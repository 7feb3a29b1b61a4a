package renderer

import (
	"context"
	"fmt"

	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
)

// Provider renders one document under one lease. The worker calls Render
// on a goroutine of the lease's own, once per lease, so a Provider must be
// safe for concurrent use by up to Config.Capacity renders.
//
// Render must return promptly with ctx.Err() once ctx is done: the lease
// was lost, revoked or handed back, or the worker stops. A *Failure error
// is reported to the coordinator with its class; any other error is
// reported as FAILURE_CLASS_TRANSIENT, and so is an Output without
// content.
type Provider interface {
	Render(ctx context.Context, in Input) (Output, error)
}

// Document is what a provider knows about the document to preview: what
// the submitter sent, as the grant carries it.
type Document struct {
	// Name is the document's name; its extension may be used for format
	// checks.
	Name string
	// ContentType is a MIME type or a file extension such as ".pdf".
	ContentType string
	// Content is the inline content; it may be empty.
	Content []byte
	// SourceURI is where the document lives.
	SourceURI string
}

// Input is one render request: the document and the lease it is made
// under.
type Input struct {
	// JobID and Token name the lease.
	JobID string
	Token uint64
	// RendererID is Config.ID.
	RendererID string
	// Document is the document to preview.
	Document Document
	// OnPause, which the worker always sets, may be called by a provider
	// that simulates a stop-the-world stall of the whole process (a
	// garbage-collection pause, a SIGSTOP) as the stall begins. The worker
	// then stops heartbeating this lease until Render returns, so that the
	// lease can expire behind the stalled render and its late completion
	// meets the coordinator's fencing check. A real provider never calls
	// it.
	OnPause func()
}

// Output is a rendered preview.
type Output struct {
	// Content is the encoded preview. A preview up to the session's inline
	// limit travels with the completion; a larger one is uploaded first.
	Content []byte
	// ContentType is the preview's media type. The coordinator stores only
	// raster images (image/png, image/jpeg, image/gif, image/webp) and
	// refuses a completion with any other.
	ContentType string
}

// Failure is a classified render failure. The worker reports it to the
// coordinator with its class: the permanent classes
// (FAILURE_CLASS_UNSUPPORTED_FORMAT, FAILURE_CLASS_INVALID_DOCUMENT) end
// the job at once, FAILURE_CLASS_TRANSIENT retries it with backoff.
type Failure struct {
	// Class is how the coordinator treats the failure.
	Class leaseholdv1.FailureClass
	// Message says what went wrong; it should not quote document content.
	// The worker sends at most 1 KiB of it, with control and bidirectional
	// formatting characters turned into spaces.
	Message string
}

// Error implements error.
func (f *Failure) Error() string {
	return fmt.Sprintf("%s: %s", f.Class, f.Message)
}
