package engine

import (
	"context"
)

// The unary RenderService calls, made over sessions as the server's
// handlers make them, so that the engine's tests can speak either
// protocol.

// acquireRequest is a unary Acquire.
type acquireRequest struct {
	Renderer Renderer
	Max      int
	Capacity int
	MaxBytes int
	Wait     bool
}

// acquireResult is its answer: the grants at once, or, with Wait and
// nothing granted, the session left open for later grants.
type acquireResult struct {
	Grants []Grant
	Paused bool
	Waiter *Conn
}

// acquire opens a session with Max credit, takes what the open's group
// granted and closes it; with Wait and nothing granted, it leaves the
// session open as a waiter for closeConn to end.
func acquire(ctx context.Context, e *Engine, req acquireRequest) (acquireResult, error) {
	conn, _, err := e.Open(ctx, SessionOpen{Renderer: req.Renderer, Capacity: req.Capacity, Credits: req.Max, MaxBytes: req.MaxBytes})
	if err != nil {
		return acquireResult{}, err
	}
	res := acquireResult{Paused: e.DispatchState().Paused}
	res.Grants, _, _ = conn.Outbox.Take()
	if len(res.Grants) == 0 && req.Wait {
		res.Waiter = conn
		return res, nil
	}
	left, err := e.Close(ctx, conn, nil)
	res.Grants = append(res.Grants, left...)
	return res, err
}

// closeConn ends a session; with handBack, the grants it never took are
// handed back instead of returned.
func closeConn(ctx context.Context, e *Engine, conn *Conn, undelivered []LeaseRef, handBack bool) ([]Grant, error) {
	left, err := e.Close(ctx, conn, undelivered)
	if err != nil || !handBack || len(left) == 0 {
		return left, err
	}
	_, err = e.Receive(ctx, nil, SessionInput{Renderer: conn.renderer, Undelivered: refs(left)})
	return nil, err
}

// openStream opens a unary client's heartbeat stream: a session with no
// credit and no instance.
func openStream(ctx context.Context, e *Engine, r Renderer, capacity int) (*Conn, error) {
	conn, _, err := e.Open(ctx, SessionOpen{Renderer: r, Capacity: capacity})
	return conn, err
}

// heartbeatRequest is one message of a unary heartbeat stream.
type heartbeatRequest struct {
	Renderer  Renderer
	Capacity  int
	Leases    []LeaseRef
	Acks      []LeaseRef
	HandBacks []LeaseRef
}

// heartbeatResult answers it: the leases, then the hand-backs, in order.
type heartbeatResult struct {
	Leases    []LeaseStatus
	HandBacks []LeaseStatus
}

// heartbeat applies a heartbeat-stream message outside a session.
func heartbeat(ctx context.Context, e *Engine, req heartbeatRequest) (heartbeatResult, error) {
	res, err := e.Receive(ctx, nil, SessionInput{Renderer: req.Renderer, Capacity: req.Capacity,
		Heartbeats: req.Leases, Acks: req.Acks, HandBacks: req.HandBacks})
	return heartbeatResult{Leases: res.Heartbeats, HandBacks: res.HandBacks}, err
}

// complete applies one unary completion: its refusal is the error.
func complete(ctx context.Context, e *Engine, req CompleteRequest) (CompleteResult, error) {
	res, err := e.Receive(ctx, nil, SessionInput{Renderer: Renderer{ID: req.Renderer}, Completions: []CompleteRequest{req}})
	if err != nil {
		return CompleteResult{}, err
	}
	return res.Completions[0], res.Completions[0].Err
}

// release hands back grants that never reached renderer.
func release(ctx context.Context, e *Engine, renderer string, leases []LeaseRef) error {
	_, err := e.Receive(ctx, nil, SessionInput{Renderer: Renderer{ID: renderer}, Undelivered: leases})
	return err
}

// The same calls queued with a Stepper. A stepped Acquire leaves its
// session open: a step cannot wait for the grants as a handler does.

// stepAcquire queues the opening of a session with Max credit; its answer
// is what the open's group granted.
func stepAcquire(s *Stepper, req acquireRequest) *Pending[acquireResult] {
	c := &openCmd{req: SessionOpen{Renderer: req.Renderer, Capacity: req.Capacity, Credits: req.Max, MaxBytes: req.MaxBytes}}
	return enqueue(s, c, func() (acquireResult, error) {
		gs, _, _ := c.conn.Outbox.Take()
		return acquireResult{Grants: gs, Paused: s.e.DispatchState().Paused}, nil
	})
}

// stepComplete queues one unary completion.
func stepComplete(s *Stepper, req CompleteRequest) *Pending[CompleteResult] {
	c := &receiveCmd{in: SessionInput{Renderer: Renderer{ID: req.Renderer}, Completions: []CompleteRequest{req}}}
	return enqueue(s, c, func() (CompleteResult, error) { return c.res.Completions[0], c.res.Completions[0].Err })
}

// stepRelease queues the hand-back of grants that never reached renderer.
func stepRelease(s *Stepper, renderer string, leases []LeaseRef) *Pending[SessionResult] {
	return s.Receive(nil, SessionInput{Renderer: Renderer{ID: renderer}, Undelivered: leases})
}
