package auth

import (
	"context"
	"net"
	"testing"

	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
)

// heldRenderers is a RendererService whose Heartbeat answers once, then
// waits for its context to end; with rule set, it holds the stream under it.
// Its Acquire, a long poll, says on polling that it waits, then waits for
// its context to end, under rule too when set.
type heldRenderers struct {
	leaseholdv1.UnimplementedRendererServiceServer
	rule    func(Principal) error
	polling chan struct{}
}

func (h heldRenderers) Acquire(ctx context.Context, _ *leaseholdv1.AcquireRequest) (*leaseholdv1.AcquireResponse, error) {
	if h.rule != nil {
		HoldWhile(ctx, h.rule)
	}
	h.polling <- struct{}{}
	<-ctx.Done()
	return nil, status.FromContextError(ctx.Err()).Err()
}

func (h heldRenderers) Heartbeat(stream leaseholdv1.RendererService_HeartbeatServer) error {
	if h.rule != nil {
		HoldWhile(stream.Context(), h.rule)
	}
	if err := stream.Send(&leaseholdv1.HeartbeatResponse{}); err != nil {
		return err
	}
	<-stream.Context().Done()
	return status.FromContextError(stream.Context().Err()).Err()
}

// serveHeld serves h behind s's stream and unary interceptors over
// bufconn and returns a client.
func serveHeld(t *testing.T, s *Set, h heldRenderers) leaseholdv1.RendererServiceClient {
	t.Helper()
	srv := grpc.NewServer(grpc.ChainStreamInterceptor(s.StreamServerInterceptor()), grpc.ChainUnaryInterceptor(s.UnaryServerInterceptor()))
	leaseholdv1.RegisterRendererServiceServer(srv, h)
	lis := bufconn.Listen(1 << 20)
	go srv.Serve(lis)
	conn, err := grpc.NewClient("passthrough:///bufnet", grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		srv.Stop()
	})
	return leaseholdv1.NewRendererServiceClient(conn)
}

// openHeld opens a heartbeat stream as token and waits for its first
// answer: the stream is held from then on.
func openHeld(t *testing.T, c leaseholdv1.RendererServiceClient, token string) leaseholdv1.RendererService_HeartbeatClient {
	t.Helper()
	ctx := metadata.AppendToOutgoingContext(t.Context(), "authorization", "Bearer "+token)
	stream, err := c.Heartbeat(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil {
		t.Fatalf("the stream's first answer: %v", err)
	}
	return stream
}

// TestReplaceEndsStreams checks that replacing the principals ends the
// streams in progress whose token is gone (UNAUTHENTICATED) or whose new
// principal may no longer hold them (PERMISSION_DENIED), and leaves the
// others open.
func TestReplaceEndsStreams(t *testing.T) {
	t.Parallel()
	const renderToken, otherToken = "render-token-0123456789", "other-token-0123456789"
	renderer := Principal{Name: "pool", Roles: []Role{RoleRenderer}, RendererIDs: []string{"r-1"}}
	other := Principal{Name: "other", Roles: []Role{RoleRenderer}, RendererIDs: []string{"r-2"}}

	t.Run("A stream whose token was removed ends UNAUTHENTICATED, another goes on", func(t *testing.T) {
		t.Parallel()
		s := NewSet(map[string]Principal{renderToken: renderer, otherToken: other})
		c := serveHeld(t, s, heldRenderers{})
		gone, kept := openHeld(t, c, renderToken), openHeld(t, c, otherToken)
		if n := s.Replace(NewSet(map[string]Principal{otherToken: other})); n != 1 {
			t.Errorf("Replace ended %d streams, want 1", n)
		}
		_, err := gone.Recv()
		wantError(t, err, "UNAUTHENTICATED")
		if code := status.Code(err); code != codes.Unauthenticated {
			t.Errorf("the removed token's stream ended %v, want UNAUTHENTICATED", code)
		}
		// The other stream is still held: a second Replace ends nothing
		// more, and it ends only when the test stops the server.
		if n := s.Replace(NewSet(map[string]Principal{otherToken: other})); n != 0 {
			t.Errorf("a second Replace ended %d streams, want none", n)
		}
		_ = kept
	})

	t.Run("A stream whose principal lost a role it had ends PERMISSION_DENIED", func(t *testing.T) {
		t.Parallel()
		s := NewSet(map[string]Principal{renderToken: renderer})
		c := serveHeld(t, s, heldRenderers{})
		held := openHeld(t, c, renderToken)
		s.Replace(NewSet(map[string]Principal{renderToken: {Name: "pool", Roles: []Role{RoleSubmitter}, Team: "alpha"}}))
		_, err := held.Recv()
		if code := status.Code(err); code != codes.PermissionDenied {
			t.Errorf("stream ended %v, want PERMISSION_DENIED", err)
		}
		wantError(t, err, "PERMISSION_DENIED")
	})

	t.Run("A stream's own rule decides what else ends it", func(t *testing.T) {
		t.Parallel()
		s := NewSet(map[string]Principal{renderToken: renderer})
		rule := func(p Principal) error {
			if !p.MayUseRendererID("r-1") {
				return PermissionDenied("no longer r-1")
			}
			return nil
		}
		c := serveHeld(t, s, heldRenderers{rule: rule})
		held := openHeld(t, c, renderToken)
		// Same roles, another id: the rule, not the roles, ends it.
		narrowed := renderer
		narrowed.RendererIDs = []string{"r-9"}
		if n := s.Replace(NewSet(map[string]Principal{renderToken: narrowed})); n != 1 {
			t.Errorf("Replace ended %d streams, want 1", n)
		}
		if _, err := held.Recv(); status.Code(err) != codes.PermissionDenied || status.Convert(err).Message() != "no longer r-1" {
			t.Errorf("stream ended %v, want the rule's PERMISSION_DENIED", err)
		}
	})

	t.Run("A rule set after a reload is judged at once", func(t *testing.T) {
		t.Parallel()
		s := NewSet(map[string]Principal{renderToken: renderer})
		authed, err := s.AuthFunc(metadata.NewIncomingContext(t.Context(), metadata.Pairs("authorization", "Bearer "+renderToken)))
		if err != nil {
			t.Fatal(err)
		}
		ctx, release, _ := s.hold(authed)
		defer release()
		s.Replace(NewSet(map[string]Principal{renderToken: {Name: "pool", Roles: []Role{RoleRenderer}, RendererIDs: []string{"r-9"}}}))
		if ctx.Err() != nil {
			t.Fatalf("the stream ended before its rule was set: %v", context.Cause(ctx))
		}
		HoldWhile(ctx, func(p Principal) error {
			if !p.MayUseRendererID("r-1") {
				return PermissionDenied("no longer r-1")
			}
			return nil
		})
		if ctx.Err() == nil {
			t.Errorf("a rule the principals in force refuse left the stream open")
		}
	})
}

// TestReplaceEndsLongPolls checks that replacing the principals ends an
// Acquire long poll in progress as it ends a stream: UNAUTHENTICATED when
// its token is gone, the rule's refusal when its principal may no longer
// hold it.
func TestReplaceEndsLongPolls(t *testing.T) {
	t.Parallel()
	const renderToken, otherToken = "render-token-0123456789", "other-token-0123456789"
	renderer := Principal{Name: "pool", Roles: []Role{RoleRenderer}, RendererIDs: []string{"r-1"}}
	other := Principal{Name: "other", Roles: []Role{RoleRenderer}, RendererIDs: []string{"r-2"}}
	asToken := func(token string) context.Context {
		return metadata.AppendToOutgoingContext(t.Context(), "authorization", "Bearer "+token)
	}
	// poll starts an Acquire as token and returns its outcome once the
	// handler waits.
	poll := func(c leaseholdv1.RendererServiceClient, h heldRenderers, token string) <-chan error {
		done := make(chan error, 1)
		go func() {
			_, err := c.Acquire(asToken(token), &leaseholdv1.AcquireRequest{})
			done <- err
		}()
		<-h.polling
		return done
	}

	t.Run("A long poll whose token was removed ends UNAUTHENTICATED", func(t *testing.T) {
		t.Parallel()
		s := NewSet(map[string]Principal{renderToken: renderer, otherToken: other})
		h := heldRenderers{polling: make(chan struct{})}
		c := serveHeld(t, s, h)
		done := poll(c, h, renderToken)
		if n := s.Replace(NewSet(map[string]Principal{otherToken: other})); n != 1 {
			t.Fatalf("Replace ended %d calls, want the long poll", n)
		}
		err := <-done
		if code := status.Code(err); code != codes.Unauthenticated {
			t.Errorf("the long poll ended %v, want UNAUTHENTICATED", err)
		}
		wantError(t, err, "UNAUTHENTICATED")
	})

	t.Run("A long poll whose rule the new principal fails ends with its refusal", func(t *testing.T) {
		t.Parallel()
		s := NewSet(map[string]Principal{renderToken: renderer})
		h := heldRenderers{polling: make(chan struct{}), rule: func(p Principal) error {
			if !p.MayUseRendererID("r-1") {
				return PermissionDenied("no longer r-1")
			}
			return nil
		}}
		c := serveHeld(t, s, h)
		done := poll(c, h, renderToken)
		narrowed := renderer
		narrowed.RendererIDs = []string{"r-9"}
		if n := s.Replace(NewSet(map[string]Principal{renderToken: narrowed})); n != 1 {
			t.Fatalf("Replace ended %d calls, want 1", n)
		}
		err := <-done
		if status.Code(err) != codes.PermissionDenied || status.Convert(err).Message() != "no longer r-1" {
			t.Errorf("the long poll ended %v, want the rule's PERMISSION_DENIED", err)
		}
		wantError(t, err, "PERMISSION_DENIED")
	})
}
