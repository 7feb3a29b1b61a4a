package auth

import (
	"context"
	"sync/atomic"

	middleware "github.com/grpc-ecosystem/go-grpc-middleware/v2"
	"google.golang.org/grpc"
)

// Caller records who made a call, for interceptors that run before
// authentication and report on the call after it ends: the logging
// interceptor runs outside authentication so that it sees its refusals,
// and so cannot read the principal from the context it passed on.
// CallerUnaryServerInterceptor puts an empty Caller in the context; the
// authentication interceptors fill it with the principal they
// authenticate. It is safe for concurrent use.
type Caller struct {
	p atomic.Pointer[Principal]
}

// Principal returns the principal authenticated for the call, if any.
func (c *Caller) Principal() (Principal, bool) {
	if c == nil {
		return Principal{}, false
	}
	p := c.p.Load()
	if p == nil {
		return Principal{}, false
	}
	return *p, true
}

// callerKey is the context key of the Caller.
type callerKey struct{}

// WithCaller returns ctx carrying a new, empty Caller, and the Caller.
func WithCaller(ctx context.Context) (context.Context, *Caller) {
	c := &Caller{}
	return context.WithValue(ctx, callerKey{}, c), c
}

// CallerFromContext returns the Caller of ctx, or nil.
func CallerFromContext(ctx context.Context) *Caller {
	c, _ := ctx.Value(callerKey{}).(*Caller)
	return c
}

// record stores p in ctx's Caller, if ctx has one.
func record(ctx context.Context, p Principal) {
	if c := CallerFromContext(ctx); c != nil {
		c.p.Store(&p)
	}
}

// CallerUnaryServerInterceptor returns the interceptor that gives every
// unary call an empty Caller. It must come before (outside) the
// interceptors that read the Caller and before authentication.
func CallerUnaryServerInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		ctx, _ = WithCaller(ctx)
		return handler(ctx, req)
	}
}

// CallerStreamServerInterceptor returns the interceptor that gives every
// streaming call an empty Caller, placed as CallerUnaryServerInterceptor.
func CallerStreamServerInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		ws := middleware.WrapServerStream(ss)
		ws.WrappedContext, _ = WithCaller(ss.Context())
		return handler(srv, ws)
	}
}
