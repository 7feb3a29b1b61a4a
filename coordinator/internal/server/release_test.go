package server

import (
	"context"
	"testing"

	"github.com/leasehold/leasehold/coordinator/internal/auth"
	"github.com/leasehold/leasehold/coordinator/internal/engine"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"google.golang.org/grpc/codes"
)

// cancellingEngine ends the caller's context just after the writer granted
// its leases: the moment a renderer goes away in the middle of a long poll.
type cancellingEngine struct {
	Engine
	cancel context.CancelFunc
}

func (e *cancellingEngine) Open(ctx context.Context, req engine.SessionOpen) (*engine.Conn, []engine.LeaseStatus, error) {
	conn, holding, err := e.Engine.Open(ctx, req)
	e.cancel()
	return conn, holding, err
}

func TestAcquireHandsBackUndeliveredLeases(t *testing.T) {
	t.Parallel()
	ce := &cancellingEngine{}
	b := setup(t, func(o *options) {
		o.wrap = func(e Engine) Engine { ce.Engine = e; return ce }
	})
	jobID := b.submit(t, alpha, "alpha", "req", doc("a.pdf")).GetJobIds()[0]

	p, _ := auth.DevPrincipals().Lookup(renderer)
	ctx, cancel := context.WithCancel(auth.NewContext(context.Background(), p))
	ce.cancel = cancel
	_, err := b.services.Renderers.Acquire(ctx, &leaseholdv1.AcquireRequest{RendererId: "r-gone", MaxLeases: 1, Capacity: 1})
	if got := codeOf(err); got != codes.Canceled {
		t.Fatalf("Acquire whose caller left: code %v (%v), want Canceled", got, err)
	}

	job, err := b.jobs.GetJob(as(t, alpha), &leaseholdv1.GetJobRequest{JobId: jobID})
	if err != nil {
		t.Fatal(err)
	}
	j := job.GetJob()
	if j.GetPhase() != leaseholdv1.Phase_PHASE_QUEUED || j.GetAttempt() != 0 {
		t.Fatalf("job after an undelivered grant = %v attempt %d, want QUEUED attempt 0", j.GetPhase(), j.GetAttempt())
	}
	last := j.GetEvents()[len(j.GetEvents())-1]
	if last.GetKind() != leaseholdv1.EventKind_EVENT_KIND_REQUEUED || last.GetReason() != "LEASE_UNDELIVERED" {
		t.Fatalf("last event = %v %s, want REQUEUED LEASE_UNDELIVERED", last.GetKind(), last.GetReason())
	}

	// The next renderer gets the job with a larger token, as attempt 1.
	ce.cancel = func() {}
	g := b.acquire(t, 1)
	if len(g) != 1 || g[0].GetJobId() != jobID || g[0].GetLease().GetAttempt() != 1 || g[0].GetLease().GetToken() <= last.GetToken() {
		t.Fatalf("grant after the hand-back = %v, want %s attempt 1 with a token above %d", g, jobID, last.GetToken())
	}
}
