package leaderdial

import (
	"context"
	"errors"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// ErrLeaderMoved ends a stream, or an attempt of a call, made under a
// leader that the discovery has since left (see Leader): the replica it
// went to no longer leads, says so, or has been silent past the silence
// bound. Its gRPC status is UNAVAILABLE, so that whoever retries a
// failover retries it; match it with errors.Is.
var ErrLeaderMoved error = movedError{}

// movedError is ErrLeaderMoved: an error with a gRPC status.
type movedError struct{}

func (movedError) Error() string {
	return "the coordinator's leader moved: the call was made to a replica that no longer leads"
}

// GRPCStatus is how status.FromError and status.Code read it.
func (e movedError) GRPCStatus() *status.Status { return status.New(codes.Unavailable, e.Error()) }

// Attempt returns a context for one attempt of a call, derived from ctx
// and cancelled with the cause ErrLeaderMoved when the leader in place
// when it was made is left; cancel releases it. For a single server it is
// ctx with a cancel. Moved reads what ended the attempt.
func (l *Leader) Attempt(ctx context.Context) (context.Context, context.CancelFunc) {
	actx, cancel := context.WithCancelCause(ctx)
	if !l.target.Replicated() {
		return actx, func() { cancel(context.Canceled) }
	}
	stop := context.AfterFunc(l.epoch(), func() { cancel(ErrLeaderMoved) })
	return actx, func() {
		stop()
		cancel(context.Canceled)
	}
}

// Moved returns ErrLeaderMoved when err ended an attempt whose context
// (from Attempt) was cancelled because the leader was left, and err
// otherwise.
func Moved(actx context.Context, err error) error {
	if err != nil && errors.Is(context.Cause(actx), ErrLeaderMoved) && status.Code(err) == codes.Canceled {
		return ErrLeaderMoved
	}
	return err
}

// streamInterceptor makes every stream of a leader channel end with
// ErrLeaderMoved when the leader it was made under is left, however long
// it has been quiet: a watch or a renderer's session on a frozen leader
// moves to the new one instead of waiting for the old one to wake.
func (l *Leader) streamInterceptor(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string,
	streamer grpc.Streamer, opts ...grpc.CallOption,
) (grpc.ClientStream, error) {
	actx, release := l.Attempt(ctx)
	cs, err := streamer(actx, desc, cc, method, opts...)
	if err != nil {
		err = Moved(actx, err)
		release()
		return nil, err
	}
	return &followedStream{ClientStream: cs, ctx: actx, release: release}, nil
}

// followedStream is a stream that ends with ErrLeaderMoved when its leader
// is left; its context is released once the stream has ended.
type followedStream struct {
	grpc.ClientStream
	ctx     context.Context
	release context.CancelFunc
}

// RecvMsg implements grpc.ClientStream. Any error (io.EOF included) ends
// the stream.
func (s *followedStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if err != nil {
		err = Moved(s.ctx, err)
		s.release()
	}
	return err
}

// SendMsg implements grpc.ClientStream.
func (s *followedStream) SendMsg(m any) error {
	return Moved(s.ctx, s.ClientStream.SendMsg(m))
}

// Header implements grpc.ClientStream.
func (s *followedStream) Header() (metadata.MD, error) {
	md, err := s.ClientStream.Header()
	return md, Moved(s.ctx, err)
}
