package server

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/leasehold/leasehold/coordinator/internal/engine"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
)

// lostLeadership is an Engine whose session commands, once armed, fail
// as a writer's do when its leadership is lost with a group proposed.
type lostLeadership struct {
	Engine
	armed atomic.Bool
}

func (l *lostLeadership) Receive(ctx context.Context, conn *engine.Conn, in engine.SessionInput) (engine.SessionResult, error) {
	if l.armed.Load() {
		return engine.SessionResult{}, fmt.Errorf("%w: leadership lost while committing log", engine.ErrOutcomeUnknown)
	}
	return l.Engine.Receive(ctx, conn, in)
}

// TestSessionEndsNotLeaderWhenLeadershipIsLost ensures a renderer
// session whose command was proposed when this node lost its leadership
// ends with UNAVAILABLE NOT_LEADER, not OUTCOME_UNKNOWN: the renderer
// sends what went unanswered again on its next session, and NOT_LEADER
// has it open that session on the new leader at once instead of after a
// backoff.
func TestSessionEndsNotLeaderWhenLeadershipIsLost(t *testing.T) {
	t.Parallel()
	ll := &lostLeadership{}
	b := setup(t, func(o *options) { o.wrap = func(e Engine) Engine { ll.Engine = e; return ll } })
	sc := b.openSession(t, hello("r1", "i1", 4), 4)
	ll.armed.Store(true)
	sc.send(&leaseholdv1.SessionRequest{Credits: 1})
	var err error
	for err == nil {
		_, err = sc.recv()
	}
	st := status.Convert(err)
	if st.Code() != codes.Unavailable || reasonOf(st) != reasonNotLeader {
		t.Errorf("the session ended with %v, want UNAVAILABLE NOT_LEADER", err)
	}
}
