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

// demotedEngine ends the writer's term just after the session's grants
// were published: its Close answers NOT_LEADER, as a leader that lost its
// leadership during a long poll does.
type demotedEngine struct {
	Engine
}

func (e demotedEngine) Close(ctx context.Context, c *engine.Conn, undelivered []engine.LeaseRef) ([]engine.Grant, error) {
	if _, err := e.Engine.Close(ctx, c, undelivered); err != nil {
		return nil, err
	}
	return nil, engine.ErrNotLeader
}

func TestAcquireDeliversGrantsCommittedBeforeLeadershipEnded(t *testing.T) {
	t.Parallel()
	b := setup(t, func(o *options) {
		o.wrap = func(e Engine) Engine { return demotedEngine{e} }
	})
	jobID := b.submit(t, alpha, "alpha", "req", doc("a.pdf")).GetJobIds()[0]

	resp, err := b.rend.Acquire(as(t, renderer), &leaseholdv1.AcquireRequest{RendererId: "r-1", MaxLeases: 1, Capacity: 1})
	if err != nil {
		t.Fatalf("Acquire whose grant was committed before the term ended: %v; want the grant (NOT_LEADER says nothing was applied)", err)
	}
	if len(resp.GetLeases()) != 1 || resp.GetLeases()[0].GetJobId() != jobID {
		t.Fatalf("Acquire leases = %v, want one of %s", resp.GetLeases(), jobID)
	}
	job, err := b.jobs.GetJob(as(t, alpha), &leaseholdv1.GetJobRequest{JobId: jobID})
	if err != nil {
		t.Fatal(err)
	}
	got, want := job.GetJob().GetLease(), resp.GetLeases()[0].GetLease()
	if job.GetJob().GetPhase() != leaseholdv1.Phase_PHASE_LEASED || got.GetToken() != want.GetToken() || got.GetRendererId() != "r-1" {
		t.Fatalf("job after the delivered grant = %v lease %v, want LEASED under token %d to r-1", job.GetJob().GetPhase(), got, want.GetToken())
	}
}
