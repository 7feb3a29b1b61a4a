package renderer_test

import (
	"context"
	"net"

	"github.com/leasehold/leasehold/internal/pipenet"
	"google.golang.org/grpc"
)

// pipeListener is an in-memory listener (package pipenet): a gRPC server
// and its clients connected through it run inside a synctest bubble, on
// the bubble's fake clock, as they would over TCP.
type pipeListener struct{ *pipenet.Listener }

func newPipeListener() pipeListener { return pipeListener{pipenet.Listen(nil)} }

// dialOption connects a gRPC client to the listener, whatever its target.
func (l pipeListener) dialOption() grpc.DialOption {
	return grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
		return l.Dial(ctx, nil)
	})
}
