package auth

import (
	"context"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// TestCaller checks that interceptors outside authentication learn the
// principal it found, through the Caller placed in front of it, and learn
// nothing of a refused call.
func TestCaller(t *testing.T) {
	t.Parallel()
	outer := CallerUnaryServerInterceptor()
	inner := DevPrincipals().UnaryServerInterceptor()
	call := func(authz string) (Principal, bool) {
		ctx := metadata.NewIncomingContext(fromLoopback(), metadata.Pairs("authorization", authz))
		var caller *Caller
		_, _ = outer(ctx, nil, &grpc.UnaryServerInfo{FullMethod: "/leasehold.v1.JobService/GetJob"}, func(ctx context.Context, req any) (any, error) {
			caller = CallerFromContext(ctx)
			return inner(ctx, req, &grpc.UnaryServerInfo{FullMethod: "/leasehold.v1.JobService/GetJob"},
				func(context.Context, any) (any, error) { return "ok", nil })
		})
		return caller.Principal()
	}
	if p, ok := call("Bearer dev-alpha"); !ok || p.Name != "dev-alpha" || p.Team != "alpha" {
		t.Errorf("after an authenticated call the caller is %+v, %v; want dev-alpha of team alpha", p, ok)
	}
	if p, ok := call("Bearer nope"); ok {
		t.Errorf("after a refused call the caller is %+v; want none", p)
	}
	if p, ok := CallerFromContext(context.Background()).Principal(); ok {
		t.Errorf("a context without a Caller gives %+v", p)
	}
}

// TestCallerStream checks that the stream interceptor gives the handler a
// context with a Caller.
func TestCallerStream(t *testing.T) {
	t.Parallel()
	var found bool
	err := CallerStreamServerInterceptor()(nil, fakeStream{ctx: context.Background()}, &grpc.StreamServerInfo{},
		func(_ any, ss grpc.ServerStream) error {
			found = CallerFromContext(ss.Context()) != nil
			return nil
		})
	if err != nil || !found {
		t.Errorf("stream handler saw a Caller: %v (err %v), want true", found, err)
	}
}

type fakeStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s fakeStream) Context() context.Context { return s.ctx }
