package renderer

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"strings"
	"unicode"
	"unicode/utf8"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"github.com/leasehold/leasehold/renderer/mock"
)

// chunkSize is the size of one UploadArtifact chunk.
const chunkSize = 64 << 10

// maxFailureMessage bounds the message of a reported failure.
const maxFailureMessage = 1 << 10

// leaseKey names a lease: a job and the fencing token it was granted under.
type leaseKey struct {
	jobID string
	token uint64
}

func (k leaseKey) ref() *leaseholdv1.LeaseRef {
	return &leaseholdv1.LeaseRef{JobId: k.jobID, Token: k.token}
}

// keyOf returns the key of anything that names a lease.
func keyOf(r interface {
	GetJobId() string
	GetToken() uint64
}) leaseKey {
	return leaseKey{jobID: r.GetJobId(), token: r.GetToken()}
}

// lease is one lease in progress. key, grant, ctx and cancel never change;
// the flags are guarded by Worker.mu.
type lease struct {
	key   leaseKey
	grant *leaseholdv1.Grant
	// ctx is the lease's work context, cancelled when the lease is lost,
	// revoked or handed back, or when Run returns.
	ctx    context.Context
	cancel context.CancelCauseFunc

	// span is the completion span, started when the render ends; it is
	// set and read on the lease's own goroutine only, then handed to the
	// completion.
	span trace.Span

	lost       bool // answered LOST or revoked: the result is dropped
	revoked    bool // revoked: acknowledged once the work stops
	paused     bool // in a simulated stall: not heartbeated meanwhile
	handedBack bool // handed back by a drain: the result is dropped
}

// completion is an outcome waiting to be sent, or sent and waiting for its
// CompletionResult.
type completion struct {
	key leaseKey
	msg *leaseholdv1.SessionCompletion
	// outcome is "success" or "failure", for the log.
	outcome string
	// uploadRefused is the reason an upload under this lease was refused
	// with ABORTED, if it was.
	uploadRefused string
	// span is the lease's completion span, ended with the answer.
	span trace.Span
}

// Cancellation causes of a lease's context.
var (
	errLeaseLost  = errors.New("lease lost")
	errHandedBack = errors.New("lease handed back")
)

// errDropped reports that the work of a lease was dropped (the lease is gone
// or the worker stops); it has been logged.
var errDropped = errors.New("work dropped")

// errUploadRefused reports an upload refused with ABORTED because the lease
// looked stale.
var errUploadRefused = errors.New("upload refused")

// work renders one lease and queues its completion. It runs on the lease's
// own goroutine and drops the work as soon as the lease's context is done.
func (w *Worker) work(l *lease) {
	defer w.wg.Done()
	doc := l.grant.GetDocument()
	rctx, rspan := w.startSpan(l.ctx, l, spanRender)
	out, err := w.cfg.Provider.Render(rctx, mock.Input{
		JobID:      l.key.jobID,
		Token:      l.key.token,
		RendererID: w.cfg.ID,
		Document: mock.Document{
			Name:        doc.GetName(),
			ContentType: doc.GetContentType(),
			Content:     doc.GetContent(),
			SourceURI:   doc.GetSourceUri(),
		},
		OnPause: func() {
			w.log.Info("render paused", "job", l.key.jobID, "token", l.key.token)
			w.mu.Lock()
			l.paused = true
			w.mu.Unlock()
		},
	})
	endRender(rspan, err)
	w.mu.Lock()
	l.paused = false
	w.mu.Unlock()
	if l.ctx.Err() != nil {
		w.metrics.renders.WithLabelValues("stopped").Inc()
		w.log.Debug("render stopped", "job", l.key.jobID, "token", l.key.token, "cause", context.Cause(l.ctx))
		w.finish(l, nil)
		return
	}
	_, l.span = w.startSpan(l.ctx, l, spanComplete)
	if err == nil && len(out.Content) == 0 {
		err = errors.New("the provider rendered an empty preview")
	}
	if err != nil {
		w.finish(l, w.failure(l, err))
		return
	}
	w.metrics.renders.WithLabelValues("success").Inc()
	c, err := w.success(l, out)
	if errors.Is(err, errDropped) {
		w.finish(l, nil)
		return
	}
	w.finish(l, c)
}

// failure builds the completion of a failed render: a *mock.Failure keeps
// its class, anything else is TRANSIENT.
func (w *Worker) failure(l *lease, err error) *completion {
	class, msg := leaseholdv1.FailureClass_FAILURE_CLASS_TRANSIENT, err.Error()
	if f, ok := errors.AsType[*mock.Failure](err); ok {
		class, msg = f.Class, f.Message
	}
	w.metrics.renders.WithLabelValues("failure").Inc()
	w.metrics.failures.WithLabelValues(class.String()).Inc()
	w.log.Info("render failed", "job", l.key.jobID, "token", l.key.token, "class", class, "err", err)
	return failureCompletion(l.key, class, msg)
}

func failureCompletion(key leaseKey, class leaseholdv1.FailureClass, msg string) *completion {
	return &completion{key: key, outcome: "failure", msg: &leaseholdv1.SessionCompletion{
		JobId: key.jobID, Token: key.token,
		Outcome: &leaseholdv1.SessionCompletion_Failure{Failure: &leaseholdv1.CompleteFailure{Class: class, Message: failureMessage(msg)}},
	}}
}

// failureMessage makes an error's text a message the coordinator stores:
// at most maxFailureMessage bytes, cut between characters, of UTF-8 text
// with every control character (a wrapped error's line breaks), every
// bidirectional embedding, override or isolate, and every byte that is not
// UTF-8 turned into a space. The coordinator refuses the others
// (INVALID_ARGUMENT INVALID_MESSAGE), which would leave the lease to expire.
func failureMessage(msg string) string {
	var b strings.Builder
	for _, r := range msg {
		if r == utf8.RuneError || unicode.IsControl(r) || r >= 0x202a && r <= 0x202e || r >= 0x2066 && r <= 0x2069 {
			r = ' '
		}
		if b.Len()+utf8.RuneLen(r) > maxFailureMessage {
			break
		}
		b.WriteRune(r)
	}
	return b.String()
}

// success builds the completion of a rendered preview: inline when it fits
// the session's inline limit, else naming the digest of an upload made
// first. An upload refused with ABORTED still completes, naming the digest,
// because the check that decides is the completion's: that is where a stale
// completion is refused and recorded. An upload that fails otherwise
// completes as a TRANSIENT failure. It returns errDropped when the lease is
// gone.
func (w *Worker) success(l *lease, out mock.Output) (*completion, error) {
	sum := sha256.Sum256(out.Content)
	digest := hex.EncodeToString(sum[:])
	w.log.Debug("render done", "job", l.key.jobID, "token", l.key.token, "digest", digest, "bytes", len(out.Content))
	c := &completion{key: l.key, outcome: "success", msg: &leaseholdv1.SessionCompletion{JobId: l.key.jobID, Token: l.key.token}}
	w.mu.Lock()
	inline := len(out.Content) <= w.inlineLimit
	w.mu.Unlock()
	if inline {
		c.msg.Outcome = &leaseholdv1.SessionCompletion_Success{Success: &leaseholdv1.CompleteSuccess{
			Content: out.Content, ContentType: out.ContentType,
		}}
		return c, nil
	}
	stored, err := w.upload(l, out, digest)
	switch {
	case errors.Is(err, errDropped):
		return nil, err
	case errors.Is(err, errUploadRefused):
		c.uploadRefused = reasonOf(errors.Unwrap(err))
		stored = digest
	case err != nil:
		return failureCompletion(l.key, leaseholdv1.FailureClass_FAILURE_CLASS_TRANSIENT,
			"uploading the preview failed: "+err.Error()), nil
	}
	c.msg.Outcome = &leaseholdv1.SessionCompletion_Success{Success: &leaseholdv1.CompleteSuccess{ArtifactDigest: stored}}
	return c, nil
}

// finish ends a lease's goroutine: it frees the slot (one more credit,
// unless draining), queues the completion unless the lease was lost or
// handed back meanwhile, and queues the cancel ack of a revoked lease now
// that its work has stopped.
func (w *Worker) finish(l *lease, c *completion) {
	w.mu.Lock()
	delete(w.leases, l.key)
	queued := c != nil && !l.lost && !l.handedBack
	if queued {
		c.span = l.span
		w.outbox = append(w.outbox, c)
	}
	if l.revoked {
		w.cancelAcks = append(w.cancelAcks, l.key.ref())
	}
	if !w.draining {
		w.credits++
	}
	w.metrics.leasesHeld.Set(float64(len(w.leases)))
	w.mu.Unlock()
	if !queued {
		endDropped(l.span, context.Cause(l.ctx))
	}
	l.cancel(nil)
	if c != nil && !queued {
		w.log.Debug("result dropped", "job", l.key.jobID, "token", l.key.token, "cause", context.Cause(l.ctx))
	}
	signal(w.wake)
	signal(w.changed)
}

// uploadError wraps the ABORTED status of a refused upload.
type uploadError struct{ err error }

func (e *uploadError) Error() string { return "upload refused: " + e.err.Error() }
func (e *uploadError) Unwrap() error { return e.err }
func (e *uploadError) Is(target error) bool {
	return target == errUploadRefused
}

// upload stores the preview and returns its digest. It retries UNAVAILABLE
// while the lease is held and other errors up to RetryAttempts times, except
// those retrying cannot fix. It returns errDropped when the lease is gone,
// and an error matching errUploadRefused, wrapping the status, when the
// upload is ABORTED.
func (w *Worker) upload(l *lease, out mock.Output, digest string) (string, error) {
	bo := w.newBackoff()
	for attempt := 1; ; attempt++ {
		stored, err := w.uploadOnce(l, out, digest)
		if err == nil {
			return stored, nil
		}
		if l.ctx.Err() != nil {
			w.log.Debug("upload stopped", "job", l.key.jobID, "token", l.key.token, "cause", context.Cause(l.ctx))
			return "", errDropped
		}
		code := status.Code(err)
		if code == codes.Aborted {
			w.log.Info("upload refused", "job", l.key.jobID, "token", l.key.token, "reason", reasonOf(err))
			return "", &uploadError{err: err}
		}
		if !retryable(code) || (code != codes.Unavailable && attempt >= w.cfg.RetryAttempts) {
			w.log.Error("upload failed", "job", l.key.jobID, "token", l.key.token, "err", err, "attempts", attempt)
			return "", err
		}
		d := bo.next()
		w.log.Warn("upload failed, retrying", "job", l.key.jobID, "token", l.key.token, "err", err, "retry_in", d)
		if !sleepCtx(l.ctx, d) {
			return "", errDropped
		}
	}
}

// uploadOnce makes one UploadArtifact call: the metadata, then the chunks.
func (w *Worker) uploadOnce(l *lease, out mock.Output, digest string) (string, error) {
	ctx, cancel := context.WithTimeout(w.spanContext(l.ctx, l.span), rpcTimeout)
	defer cancel()
	stream, err := w.client.UploadArtifact(ctx, grpc.WaitForReady(true))
	if err != nil {
		return "", err
	}
	send := func(req *leaseholdv1.UploadArtifactRequest) error {
		if err := stream.Send(req); err != nil {
			if errors.Is(err, io.EOF) {
				// The server ended the call; its status says why.
				_, err = stream.CloseAndRecv()
			}
			return err
		}
		return nil
	}
	if err := send(&leaseholdv1.UploadArtifactRequest{Part: &leaseholdv1.UploadArtifactRequest_Metadata{Metadata: &leaseholdv1.ArtifactMetadata{
		JobId:          l.key.jobID,
		Token:          l.key.token,
		RendererId:     w.cfg.ID,
		ContentType:    out.ContentType,
		ExpectedSha256: digest,
	}}}); err != nil {
		return "", err
	}
	for b := out.Content; len(b) > 0; {
		n := min(len(b), chunkSize)
		if err := send(&leaseholdv1.UploadArtifactRequest{Part: &leaseholdv1.UploadArtifactRequest_Chunk{Chunk: b[:n]}}); err != nil {
			return "", err
		}
		b = b[n:]
	}
	resp, err := stream.CloseAndRecv()
	if err != nil {
		return "", err
	}
	return resp.GetDigest(), nil
}
