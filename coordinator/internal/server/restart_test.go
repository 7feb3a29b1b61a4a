package server

import (
	"testing"
	"time"

	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"google.golang.org/grpc/codes"
)

// TestLeasesSurviveARestart restarts the coordinator while two renderers
// hold leases, one over a session and one over the unary calls, and lets
// the wall clock pass the deadlines recorded before the restart: both
// reconnect within the fresh TTL the restart gives and finish their work.
func TestLeasesSurviveARestart(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.submit(t, alpha, "alpha", "r", doc("a.pdf"), doc("b.pdf"))
	sc := b.openSession(t, hello("r-s", "i-1", 1), 1)
	sc.untilGrants(1)
	held := sc.grants[0]
	unary := b.acquire(t, 1)[0]

	b.clock.Advance(10 * time.Second)
	b.restart(t)
	if err := sc.end(); err == nil {
		t.Fatalf("the session outlived the coordinator")
	}
	b.clock.Advance(10 * time.Second) // past the deadlines granted before the restart

	t.Run("A session that lists its leases in hello keeps them", func(t *testing.T) {
		h := hello("r-s", "i-1", 1)
		h.Holding = []*leaseholdv1.LeaseRef{ref(held)}
		again := b.openSession(t, h, 0)
		if got := again.welcome.GetHolding(); len(got) != 1 || got[0].GetState() != leaseholdv1.LeaseState_LEASE_STATE_HELD {
			t.Fatalf("welcome.holding = %v, want the lease HELD", got)
		}
		r := again.call(&leaseholdv1.SessionRequest{Completions: []*leaseholdv1.SessionCompletion{inline(held, []byte("png"))}}).GetResults()[0]
		if codes.Code(r.GetCode()) != codes.OK || r.GetPhase() != leaseholdv1.Phase_PHASE_SUCCEEDED {
			t.Errorf("completion after the restart = %v, want OK SUCCEEDED", r)
		}
	})
	t.Run("A unary renderer uploads and completes under its lease", func(t *testing.T) {
		resp := b.succeed(t, unary, []byte("png"))
		if resp.GetJob().GetPhase() != leaseholdv1.Phase_PHASE_SUCCEEDED || resp.GetJob().GetAttempt() != 1 {
			t.Errorf("job = %v attempt %d, want SUCCEEDED on attempt 1", resp.GetJob().GetPhase(), resp.GetJob().GetAttempt())
		}
	})
}
