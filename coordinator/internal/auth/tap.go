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
// UNAUTHENTICATED error the caller gets. authenticated, when not nil, is
// told of each call whose headers carry a token AuthFunc accepts, exempt
// methods included (clients send their token on health checks too), with
// the call's context, which names its peer: the coordinator closes a
// connection that never makes one. gRPC runs the tap on the connection's
// reading goroutine, so neither may block.
func (s *Set) InTapHandle(refused func(ctx context.Context, fullMethod string, err error), authenticated func(ctx context.Context)) tap.ServerInHandle {
	return func(ctx context.Context, info *tap.Info) (context.Context, error) {
		_, err := s.AuthFunc(metadata.NewIncomingContext(ctx, info.Header))
		switch {
		case err == nil:
			if authenticated != nil {
				authenticated(ctx)
			}
		case Exempt(info.FullMethodName):
		default:
			if refused != nil {
				refused(ctx, info.FullMethodName, err)
			}
			return nil, err
		}
		return ctx, nil
	}
}
