package renderer

import (
	"context"
	"math/rand/v2"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

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

// leaderAddr returns the leader's address that a NOT_LEADER refusal names
// in its ErrorInfo metadata, or "" when it names none.
func leaderAddr(err error) string {
	for _, d := range status.Convert(err).Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetReason() != "" {
			return info.GetMetadata()["leader_addr"]
		}
	}
	return ""
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
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
