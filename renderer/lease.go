package renderer

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
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

// lease is one lease in progress, as the loop holds it. key, grant, ctx
// and cancel never change; the rest belongs to the loop.
type lease struct {
	key   leaseKey
	grant *leaseholdv1.Grant
	// ctx is the lease's work context, cancelled when the lease is lost,
	// revoked or handed back, or when the work stops: from then on the
	// lease is not worked on, and its result is dropped.
	ctx    context.Context
	cancel context.CancelCauseFunc

	// span is the completion span, started when the render ends and
	// handed to the completion.
	span trace.Span

	lost    bool // answered LOST or revoked
	revoked bool // revoked: acknowledged once the work stops
	paused  bool // in a simulated stall: not heartbeated meanwhile
}

// completion is an outcome waiting to be sent, or sent and waiting for its
// CompletionResult.
type completion struct {
	msg *leaseholdv1.SessionCompletion
	// outcome is "success" or "failure", for the log.
	outcome string
	// uploadRefused is the reason an upload under this lease was refused
	// with ABORTED, if it was.
	uploadRefused string
	// span is the lease's completion span, ended with the answer.
	span trace.Span
	// storeBackoff paces sending it again while the coordinator's artifact
	// store is unavailable.
	storeBackoff *backoff
}

// rendered is what a lease's render goroutine reports when the render
// ends.
type rendered struct {
	key leaseKey
	// stopped is set when the lease's context ended the render.
	stopped bool
	// failure is the completion of a failed render.
	failure *completion
	// out is the preview of a successful render, and digest its SHA-256.
	out    Output
	digest string
}

// uploaded is what a lease's upload goroutine reports: the completion
// naming the stored preview, or a failure; nil when the lease is gone.
type uploaded struct {
	key leaseKey
	c   *completion
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

// grant takes one lease: it records its receipt, to be acknowledged, and
// starts its render, or hands it back at once while draining or when it
// would exceed the capacity.
func (l *loop) grant(g *leaseholdv1.Grant) {
	key := leaseKey{jobID: g.GetJobId(), token: g.GetLease().GetToken()}
	log := l.w.log
	l.received = append(l.received, key.ref())
	switch _, dup := l.leases[key]; {
	case dup:
		log.Warn("duplicate grant ignored", "job", key.jobID, "token", key.token)
		return
	case l.draining:
		l.handBack(key)
		log.Info("lease handed back", "job", key.jobID, "token", key.token, "why", "draining")
		return
	case len(l.leases) >= l.w.cfg.Capacity:
		// The coordinator grants at most the credits it was given, so this
		// is its bug or ours; either way the slot is not there.
		l.handBack(key)
		log.Warn("lease handed back", "job", key.jobID, "token", key.token, "why", "over capacity")
		return
	}
	ctx, cancel := context.WithCancelCause(l.w.leaseContext(l.workCtx, g))
	l.leases[key] = &lease{key: key, grant: g, ctx: ctx, cancel: cancel}
	l.w.metrics.leasesHeld.Set(float64(len(l.leases)))
	log.Debug("lease acquired", "job", key.jobID, "token", key.token, "attempt", g.GetLease().GetAttempt(), "team", g.GetTeam())
	go l.w.render(ctx, key, g)
}

// handBack queues the hand-back of key.
func (l *loop) handBack(key leaseKey) {
	l.outbox.add(key, nil)
	l.w.metrics.handBacks.Inc()
}

// handBackAll hands back every lease still in progress and stops its work.
// It returns how many it handed back.
func (l *loop) handBackAll() int {
	var stop []*lease
	for _, ls := range l.leases {
		if ls.ctx.Err() == nil {
			stop = append(stop, ls)
		}
	}
	slices.SortFunc(stop, func(a, b *lease) int {
		return cmp.Or(strings.Compare(a.key.jobID, b.key.jobID), cmp.Compare(a.key.token, b.key.token))
	})
	for _, ls := range stop {
		l.handBack(ls.key)
		l.w.log.Info("lease handed back", "job", ls.key.jobID, "token", ls.key.token, "why", "drain timeout")
		ls.cancel(errHandedBack)
	}
	return len(stop)
}

// pause marks a lease whose render has begun a simulated stall.
func (l *loop) pause(key leaseKey) {
	if ls := l.leases[key]; ls != nil {
		ls.paused = true
	}
}

// renderDone applies the end of a render: its completion is queued, or,
// for a preview too large to travel inline, an upload goroutine started.
func (l *loop) renderDone(r rendered) {
	ls := l.leases[r.key]
	ls.paused = false
	if r.stopped || ls.ctx.Err() != nil {
		l.finish(ls, nil)
		return
	}
	_, ls.span = l.w.startSpan(ls.ctx, ls.key, ls.grant, spanComplete)
	switch {
	case r.failure != nil:
		l.finish(ls, r.failure)
	case len(r.out.Content) <= l.inlineLimit:
		l.finish(ls, &completion{outcome: "success", msg: &leaseholdv1.SessionCompletion{
			JobId: ls.key.jobID, Token: ls.key.token,
			Outcome: &leaseholdv1.SessionCompletion_Success{Success: &leaseholdv1.CompleteSuccess{
				Content: r.out.Content, ContentType: r.out.ContentType,
			}},
		}})
	default:
		go l.w.upload(l.w.spanContext(ls.ctx, ls.span), l.client, ls.key, r.out, r.digest, l.presigned)
	}
}

// uploadDone applies the end of an upload.
func (l *loop) uploadDone(u uploaded) {
	l.finish(l.leases[u.key], u.c)
}

// finish ends a lease whose goroutine has ended: it frees the slot (one
// more credit, unless draining), queues the completion unless the lease
// was lost or handed back meanwhile, and queues the cancel ack of a
// revoked lease now that its work has stopped.
func (l *loop) finish(ls *lease, c *completion) {
	delete(l.leases, ls.key)
	l.w.metrics.leasesHeld.Set(float64(len(l.leases)))
	queued := c != nil && ls.ctx.Err() == nil
	if queued {
		c.span = ls.span
		l.outbox.add(ls.key, c)
	} else {
		endDropped(ls.span, context.Cause(ls.ctx))
	}
	if ls.revoked {
		l.cancelAcks = append(l.cancelAcks, ls.key.ref())
	}
	if !l.draining {
		l.credits++
	}
	if c != nil && !queued {
		l.w.log.Debug("result dropped", "job", ls.key.jobID, "token", ls.key.token, "cause", context.Cause(ls.ctx))
	}
	ls.cancel(nil)
}

// lose stops the work of a lease the coordinator says is no longer ours:
// its render is cancelled, or its completion dropped if not yet sent. A
// revoked lease is acknowledged once its render has stopped, or at once when
// none is running.
func (l *loop) lose(st *leaseholdv1.LeaseStatus, revoked bool) {
	key := keyOf(st)
	reason := cmp.Or(st.GetReason(), "UNKNOWN")
	log := l.w.log
	if ls := l.leases[key]; ls != nil {
		ls.revoked = ls.revoked || revoked
		if !ls.lost {
			ls.lost = true
			log.Info("lease lost", "job", key.jobID, "token", key.token, "reason", reason)
			ls.cancel(errLeaseLost)
		}
		return
	}
	if revoked {
		l.cancelAcks = append(l.cancelAcks, key.ref())
	}
	if l.dropStoreWait(key) {
		log.Info("lease lost", "job", key.jobID, "token", key.token, "reason", reason, "waiting_for", "artifact store")
		return
	}
	if c := l.outbox.dropPending(key); c != nil {
		endDropped(c.span, errLeaseLost)
		log.Info("lease lost", "job", key.jobID, "token", key.token, "reason", reason)
		return
	}
	log.Debug("lost lease not running", "job", key.jobID, "token", key.token, "reason", reason, "revoked", revoked)
}

// render is a lease's goroutine: it renders the document under ctx, the
// lease's context, and reports on w.rendered. The lease is the loop's; the
// goroutine knows only its key and grant.
func (w *Worker) render(ctx context.Context, key leaseKey, g *leaseholdv1.Grant) {
	doc := g.GetDocument()
	rctx, span := w.startSpan(ctx, key, g, spanRender)
	out, err := w.cfg.Provider.Render(rctx, Input{
		JobID:      key.jobID,
		Token:      key.token,
		RendererID: w.cfg.ID,
		Document: Document{
			Name:        doc.GetName(),
			ContentType: doc.GetContentType(),
			Content:     doc.GetContent(),
			SourceURI:   doc.GetSourceUri(),
		},
		OnPause: func() {
			w.log.Info("render paused", "job", key.jobID, "token", key.token)
			select {
			case w.paused <- key:
			case <-ctx.Done():
			}
		},
	})
	endRender(span, err)
	w.rendered <- w.renderResult(ctx, key, out, err)
}

// renderResult classifies a render's end: stopped with the lease's
// context, failed, or a preview with its digest.
func (w *Worker) renderResult(ctx context.Context, key leaseKey, out Output, err error) rendered {
	r := rendered{key: key}
	if ctx.Err() != nil {
		w.metrics.renders.WithLabelValues("stopped").Inc()
		w.log.Debug("render stopped", "job", key.jobID, "token", key.token, "cause", context.Cause(ctx))
		r.stopped = true
		return r
	}
	if err == nil && len(out.Content) == 0 {
		err = errors.New("the provider rendered an empty preview")
	}
	if err != nil {
		r.failure = w.failure(key, err)
		return r
	}
	w.metrics.renders.WithLabelValues("success").Inc()
	sum := sha256.Sum256(out.Content)
	r.out, r.digest = out, hex.EncodeToString(sum[:])
	w.log.Debug("render done", "job", key.jobID, "token", key.token, "digest", r.digest, "bytes", len(out.Content))
	return r
}

// failure builds the completion of a failed render: a *Failure keeps its
// class, anything else is TRANSIENT.
func (w *Worker) failure(key leaseKey, err error) *completion {
	class, msg := leaseholdv1.FailureClass_FAILURE_CLASS_TRANSIENT, err.Error()
	if f, ok := errors.AsType[*Failure](err); ok {
		class, msg = f.Class, f.Message
	}
	w.metrics.renders.WithLabelValues("failure").Inc()
	w.metrics.failures.WithLabelValues(class.String()).Inc()
	w.log.Info("render failed", "job", key.jobID, "token", key.token, "class", class, "err", err)
	return failureCompletion(key, class, msg)
}

func failureCompletion(key leaseKey, class leaseholdv1.FailureClass, msg string) *completion {
	return &completion{outcome: "failure", msg: &leaseholdv1.SessionCompletion{
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

// upload is the goroutine of a lease whose preview is too large to travel
// inline: it stores the preview, then reports on w.uploaded the completion
// that names its digest. An upload refused with ABORTED still completes,
// naming the digest, because the check that decides is the completion's:
// that is where a stale completion is refused and recorded. An upload that
// fails otherwise completes as a TRANSIENT failure. ctx is the lease's
// context, carrying the completion span.
//
// With presigned, the preview goes straight to the coordinator's artifact
// store with a presigned PUT, and the completion names its digest and size.
func (w *Worker) upload(ctx context.Context, client leaseholdv1.RendererServiceClient, key leaseKey, out Output, digest string, presigned bool) {
	var c *completion
	once := w.uploadOnce
	if presigned {
		once = w.putPresigned
	}
	stored, err := w.store(ctx, key, func(ctx context.Context) (string, error) { return once(ctx, client, key, out, digest) })
	switch {
	case errors.Is(err, errDropped):
	case err != nil && !errors.Is(err, errUploadRefused):
		c = failureCompletion(key, leaseholdv1.FailureClass_FAILURE_CLASS_TRANSIENT, "uploading the preview failed: "+err.Error())
	default:
		c = &completion{outcome: "success", msg: &leaseholdv1.SessionCompletion{JobId: key.jobID, Token: key.token}}
		if err != nil {
			c.uploadRefused = reasonOf(errors.Unwrap(err))
			stored = digest
		}
		success := &leaseholdv1.CompleteSuccess{ArtifactDigest: stored}
		if presigned {
			success.SizeBytes, success.ContentType = int64(len(out.Content)), out.ContentType
		}
		c.msg.Outcome = &leaseholdv1.SessionCompletion_Success{Success: success}
	}
	w.uploaded <- uploaded{key: key, c: c}
}

// uploadError wraps the ABORTED status of a refused upload.
type uploadError struct{ err error }

func (e *uploadError) Error() string { return "upload refused: " + e.err.Error() }
func (e *uploadError) Unwrap() error { return e.err }
func (e *uploadError) Is(target error) bool {
	return target == errUploadRefused
}

// store uploads the preview and returns its digest. It retries UNAVAILABLE
// while the lease is held and other errors up to RetryAttempts times, except
// those retrying cannot fix. It returns errDropped when the lease is gone,
// and an error matching errUploadRefused, wrapping the status, when the
// upload is ABORTED.
func (w *Worker) store(ctx context.Context, key leaseKey, once func(context.Context) (string, error)) (string, error) {
	bo := w.newBackoff()
	for attempt := 1; ; attempt++ {
		stored, err := once(ctx)
		if err == nil {
			return stored, nil
		}
		if ctx.Err() != nil {
			w.log.Debug("upload stopped", "job", key.jobID, "token", key.token, "cause", context.Cause(ctx))
			return "", errDropped
		}
		code := status.Code(err)
		if code == codes.Aborted {
			w.log.Info("upload refused", "job", key.jobID, "token", key.token, "reason", reasonOf(err))
			return "", &uploadError{err: err}
		}
		if !retryable(code) || (code != codes.Unavailable && attempt >= w.cfg.RetryAttempts) {
			w.log.Error("upload failed", "job", key.jobID, "token", key.token, "err", err, "attempts", attempt)
			return "", err
		}
		d := bo.next()
		w.log.Warn("upload failed, retrying", "job", key.jobID, "token", key.token, "err", err, "retry_in", d)
		if !sleepCtx(ctx, d) {
			return "", errDropped
		}
	}
}

// uploadOnce makes one UploadArtifact call: the metadata, then the chunks.
func (w *Worker) uploadOnce(ctx context.Context, client leaseholdv1.RendererServiceClient, key leaseKey, out Output, digest string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, rpcTimeout)
	defer cancel()
	stream, err := client.UploadArtifact(ctx, grpc.WaitForReady(true))
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
		JobId:          key.jobID,
		Token:          key.token,
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

// putPresigned stores the preview with one presigned PUT: PrepareUpload
// for the URL, then the request with exactly the signed headers. A store
// that refuses the request (expired URL, a changed header) is UNAVAILABLE
// for the retry loop: the next attempt asks for a new URL.
func (w *Worker) putPresigned(ctx context.Context, client leaseholdv1.RendererServiceClient, key leaseKey, out Output, digest string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, rpcTimeout)
	defer cancel()
	ps, err := client.PrepareUpload(ctx, &leaseholdv1.PrepareUploadRequest{JobId: key.jobID, Token: key.token, RendererId: w.cfg.ID,
		Sha256: digest, SizeBytes: int64(len(out.Content))}, grpc.WaitForReady(true))
	if err != nil {
		return "", err
	}
	req, err := http.NewRequestWithContext(ctx, ps.GetMethod(), ps.GetUrl(), bytes.NewReader(out.Content))
	if err != nil {
		return "", status.Errorf(codes.Internal, "presigned request: %v", err)
	}
	for k, v := range ps.GetHeaders() {
		req.Header.Set(k, v)
	}
	req.ContentLength = int64(len(out.Content))
	resp, err := w.http.Do(req)
	if err != nil {
		return "", status.Errorf(codes.Unavailable, "artifact store: %v", err)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return "", status.Errorf(codes.Unavailable, "artifact store answered %s", resp.Status)
	}
	return digest, nil
}
