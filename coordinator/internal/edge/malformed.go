package edge

import (
	"context"
	"sync/atomic"

	"google.golang.org/grpc"
)

// MalformedUnaryInterceptor returns the unary interceptor that refuses a
// request ServerCodec could not decode with INVALID_ARGUMENT
// MALFORMED_REQUEST and a BadRequest naming the field and the decoder's
// error. grpc-go decodes a unary request before the interceptors run, so
// its place in the chain only decides which refusal comes first; the
// coordinator puts it after authentication.
func MalformedUnaryInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if mk, ok := markOf(req); ok {
			return nil, mk.err()
		}
		return handler(ctx, req)
	}
}

// MalformedStreamInterceptor returns the stream interceptor that refuses
// a streamed message ServerCodec could not decode: RecvMsg returns the
// INVALID_ARGUMENT MALFORMED_REQUEST refusal instead of the message, and
// the call ends with that refusal whatever the handler returns.
func MalformedStreamInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		cs := &checkedStream{ServerStream: ss}
		err := handler(srv, cs)
		if refused := cs.refused.Load(); refused != nil {
			return *refused
		}
		return err
	}
}

// checkedStream checks every received message for the codec's mark.
// Handlers may call RecvMsg from a goroutine of their own, hence the atomic.
type checkedStream struct {
	grpc.ServerStream
	refused atomic.Pointer[error]
}

// RecvMsg implements grpc.ServerStream.
func (s *checkedStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	if mk, ok := markOf(m); ok {
		err := mk.err()
		s.refused.CompareAndSwap(nil, &err)
		return err
	}
	return nil
}
