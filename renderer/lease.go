package renderer

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"math/rand/v2"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"github.com/leasehold/leasehold/renderer/mock"
)

// chunkSize is the size of one UploadArtifact chunk.
const chunkSize = 64 << 10

// leaseKey names a lease: a job and the fencing token it was granted under.
type leaseKey struct {
	jobID string
	token uint64
}

func (k leaseKey) ref() *leaseholdv1.LeaseRef {
	return &leaseholdv1.LeaseRef{JobId: k.jobID, Token: k.token}
}

// lease is one held lease and the state of its work. key, grant, parent, ctx
// and cancel never change; the flags are guarded by Worker.mu.
type lease struct {
	key   leaseKey
	grant *leaseholdv1.Grant
	// parent is the worker's run context; completions use it so that a late
	// LOST does not cut off a completion whose answer decides.
	parent context.Context
	// ctx is the lease's work context, cancelled when the lease is lost,
	// revoked or the worker stops.
	ctx    context.Context
	cancel context.CancelCauseFunc

	lost       bool // a heartbeat answered LOST or the lease was revoked
	paused     bool // the provider simulates a stall; not heartbeated meanwhile
	revoked    bool // the coordinator revoked it; ack once the work stops
	completing bool // Complete is in flight; its answer decides the outcome

	// uploadRefused is the reason an upload was refused with ABORTED; only
	// the lease goroutine touches it.
	uploadRefused string
}

// errLeaseLost is the cancellation cause of a lost lease's context.
var errLeaseLost = errors.New("lease lost")

// errDropped reports that the work of a lease was dropped (the lease is gone
// or the worker stops); it has been logged.
var errDropped = errors.New("work dropped")

// errUploadRefused reports an upload refused early with ABORTED because the
// lease looked stale.
var errUploadRefused = errors.New("upload refused")

// work renders, uploads and completes one lease. It runs on the lease's own
// goroutine and drops the work as soon as the lease context is done.
func (w *Worker) work(client leaseholdv1.RendererServiceClient, l *lease) {
	doc := l.grant.GetDocument()
	out, err := w.cfg.Provider.Render(l.ctx, mock.Input{
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
	w.mu.Lock()
	l.paused = false
	w.mu.Unlock()
	if l.ctx.Err() != nil {
		w.log.Debug("render stopped", "job", l.key.jobID, "token", l.key.token, "cause", context.Cause(l.ctx))
		return
	}
	req := &leaseholdv1.CompleteRequest{JobId: l.key.jobID, Token: l.key.token, RendererId: w.cfg.ID}
	if err != nil {
		class, msg := leaseholdv1.FailureClass_FAILURE_CLASS_TRANSIENT, err.Error()
		if f, ok := errors.AsType[*mock.Failure](err); ok {
			class, msg = f.Class, f.Message
		}
		w.log.Info("render failed", "job", l.key.jobID, "token", l.key.token, "class", class, "err", err)
		req.Outcome = &leaseholdv1.CompleteRequest_Failure{Failure: &leaseholdv1.CompleteFailure{Class: class, Message: msg}}
	} else {
		sum := sha256.Sum256(out.Content)
		digest := hex.EncodeToString(sum[:])
		w.log.Info("render done", "job", l.key.jobID, "token", l.key.token, "digest", digest)
		stored, err := w.upload(client, l, out, digest)
		switch {
		case errors.Is(err, errDropped):
			return
		case errors.Is(err, errUploadRefused):
			// The check that decides is the one in Complete: report the
			// result, so that a stale completion is refused and recorded.
			req.Outcome = &leaseholdv1.CompleteRequest_Success{Success: &leaseholdv1.CompleteSuccess{ArtifactDigest: digest}}
		case err != nil:
			req.Outcome = &leaseholdv1.CompleteRequest_Failure{Failure: &leaseholdv1.CompleteFailure{
				Class:   leaseholdv1.FailureClass_FAILURE_CLASS_TRANSIENT,
				Message: "uploading the preview failed: " + err.Error(),
			}}
		default:
			req.Outcome = &leaseholdv1.CompleteRequest_Success{Success: &leaseholdv1.CompleteSuccess{ArtifactDigest: stored}}
		}
	}
	w.complete(client, l, req)
}

// upload stores the preview and returns its digest. It retries UNAVAILABLE
// while the lease is held and other errors up to RetryAttempts times, except
// those retrying cannot fix. It returns errDropped when the lease is gone and
// errUploadRefused when the upload is ABORTED.
func (w *Worker) upload(client leaseholdv1.RendererServiceClient, l *lease, out mock.Output, digest string) (string, error) {
	bo := w.newBackoff()
	for attempt := 1; ; attempt++ {
		stored, err := w.uploadOnce(client, l, out, digest)
		if err == nil {
			return stored, nil
		}
		if l.ctx.Err() != nil {
			w.log.Debug("upload stopped", "job", l.key.jobID, "token", l.key.token, "cause", context.Cause(l.ctx))
			return "", errDropped
		}
		code := status.Code(err)
		if code == codes.Aborted {
			l.uploadRefused = reasonOf(err)
			w.log.Info("upload refused", "job", l.key.jobID, "token", l.key.token, "reason", l.uploadRefused)
			return "", errUploadRefused
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
func (w *Worker) uploadOnce(client leaseholdv1.RendererServiceClient, l *lease, out mock.Output, digest string) (string, error) {
	ctx, cancel := context.WithTimeout(l.ctx, rpcTimeout)
	defer cancel()
	stream, err := client.UploadArtifact(ctx)
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

// complete reports the outcome. ABORTED is final and logged as "completion
// rejected"; UNAVAILABLE is retried until the worker stops; errors that a
// retry cannot fix (see retryable) end at once; others are retried up to
// RetryAttempts times. Complete is idempotent for the same token
// and outcome, so a retry after a lost answer is safe.
func (w *Worker) complete(client leaseholdv1.RendererServiceClient, l *lease, req *leaseholdv1.CompleteRequest) {
	w.mu.Lock()
	if l.lost {
		w.mu.Unlock()
		return
	}
	l.completing = true
	w.mu.Unlock()

	outcome := "success"
	if req.GetFailure() != nil {
		outcome = "failure"
	}
	bo := w.newBackoff()
	for attempt := 1; ; attempt++ {
		ctx, cancel := context.WithTimeout(l.parent, rpcTimeout)
		resp, err := client.Complete(ctx, req)
		cancel()
		if err == nil {
			attrs := []any{"job", l.key.jobID, "token", l.key.token, "outcome", outcome,
				"phase", resp.GetJob().GetPhase(), "replayed", resp.GetReplayed()}
			if f := req.GetFailure(); f != nil {
				attrs = append(attrs, "class", f.GetClass())
			}
			w.log.Info("completed", attrs...)
			return
		}
		if l.parent.Err() != nil {
			return
		}
		code := status.Code(err)
		if code == codes.Aborted {
			w.log.Warn("completion rejected", "job", l.key.jobID, "token", l.key.token, "reason", reasonOf(err))
			return
		}
		if l.uploadRefused != "" {
			// Without an artifact the completion cannot succeed; the
			// upload's refusal is the fencing answer.
			w.log.Warn("completion rejected", "job", l.key.jobID, "token", l.key.token, "reason", l.uploadRefused, "stage", "upload", "err", err)
			return
		}
		w.mu.Lock()
		revoked := l.revoked
		w.mu.Unlock()
		if revoked {
			// Cancellation won; a retry could only be rejected.
			return
		}
		if !retryable(code) || (code != codes.Unavailable && attempt >= w.cfg.RetryAttempts) {
			w.log.Error("completion failed", "job", l.key.jobID, "token", l.key.token, "err", err, "attempts", attempt)
			return
		}
		d := bo.next()
		w.log.Warn("completion failed, retrying", "job", l.key.jobID, "token", l.key.token, "err", err, "retry_in", d)
		if !sleepCtx(l.parent, d) {
			return
		}
	}
}

// retryable reports whether a call failing with code may succeed when
// repeated unchanged.
func retryable(code codes.Code) bool {
	switch code {
	case codes.InvalidArgument, codes.FailedPrecondition, codes.NotFound, codes.PermissionDenied,
		codes.Unauthenticated, codes.Unimplemented, codes.OutOfRange, codes.AlreadyExists:
		return false
	}
	return true
}

// reasonOf returns the ErrorInfo reason of a gRPC error, or its code name when
// it carries none.
func reasonOf(err error) string {
	st := status.Convert(err)
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetReason() != "" {
			return info.GetReason()
		}
	}
	return st.Code().String()
}

// backoff is exponential backoff with jitter between min and max. It is not
// safe for concurrent use.
type backoff struct {
	min, max time.Duration
	n        uint
}

func (w *Worker) newBackoff() *backoff {
	return &backoff{min: w.cfg.BackoffMin, max: w.cfg.BackoffMax}
}

// next returns the next delay: min·2ⁿ capped at max, with ±20% jitter, kept
// within [min, max].
func (b *backoff) next() time.Duration {
	d := b.max
	if b.n < 32 {
		if e := b.min << b.n; e > 0 && e < b.max {
			d = e
			b.n++
		}
	}
	j := d / 5
	return min(max(d-j+rand.N(2*j+1), b.min), b.max)
}

// reset starts the sequence again after a success.
func (b *backoff) reset() { b.n = 0 }

// sleepCtx waits for d and reports whether it did; it returns false as soon as
// ctx is done.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
