package auth

import (
	"context"

	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/tap"
)

// InTapHandle returns the function for grpc.InTapHandle that refuses a
// call without a known bearer token as soon as its headers arrive, before
// the server reads any of its request: a unary handler decodes the whole
// request before the interceptors run, so an unauthenticated peer could
// otherwise make the server buffer up to the largest message it receives,
// on every stream it opens. The test is AuthFunc's, on the headers alone;
// the interceptors still authenticate the call that passes and put its
// principal in the context. Exempt methods (health, reflection) pass.
//
// refused, when not nil, is told of each refusal, with the method and the
// UNAUTHENTICATED error the caller gets; gRPC runs the tap on the
// connection's reading goroutine, so refused must not block.
func (s *Set) InTapHandle(refused func(ctx context.Context, fullMethod string, err error)) tap.ServerInHandle {
	return func(ctx context.Context, info *tap.Info) (context.Context, error) {
		if Exempt(info.FullMethodName) {
			return ctx, nil
		}
		if _, err := s.AuthFunc(metadata.NewIncomingContext(ctx, info.Header)); err != nil {
			if refused != nil {
				refused(ctx, info.FullMethodName, err)
			}
			return nil, err
		}
		return ctx, nil
	}
}
