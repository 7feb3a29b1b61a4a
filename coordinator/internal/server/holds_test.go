package server

import (
	"context"
	"testing"

	"github.com/leasehold/leasehold/coordinator/internal/auth"
	"github.com/leasehold/leasehold/coordinator/internal/engine"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"
)

// devPrincipalsWith returns the development principals with the ones
// named by token replaced.
func devPrincipalsWith(change map[string]auth.Principal) *auth.Set {
	all := map[string]auth.Principal{}
	dev := auth.DevPrincipals()
	for _, tok := range []string{alpha, beta, renderer, operator, opAlpha} {
		p, _ := dev.Lookup(tok)
		all[tok] = p
	}
	for tok, p := range change {
		all[tok] = p
	}
	return auth.NewSet(all)
}

// openedEngine says on opened that a renderer session was opened: an
// Acquire is in its long poll from then on.
type openedEngine struct {
	Engine
	opened chan struct{}
}

func (e *openedEngine) Open(ctx context.Context, req engine.SessionOpen) (*engine.Conn, []engine.LeaseStatus, error) {
	conn, holding, err := e.Engine.Open(ctx, req)
	e.opened <- struct{}{}
	return conn, holding, err
}

// TestReloadEndsStreams replaces the principals under streams and long
// polls in progress, as a reload of the principals file does: a call the
// new principal may no longer hold ends with the refusal its start would
// get now, and the rest of the coordinator goes on.
func TestReloadEndsStreams(t *testing.T) {
	t.Parallel()

	t.Run("An Acquire long poll whose renderer id is no longer allowed ends PERMISSION_DENIED RENDERER_ID_NOT_ALLOWED", func(t *testing.T) {
		t.Parallel()
		set := auth.DevPrincipals()
		oe := &openedEngine{opened: make(chan struct{})}
		b := setup(t, func(o *options) {
			o.principals = set
			o.wrap = func(e Engine) Engine { oe.Engine = e; return oe }
		})
		ctx := as(t, renderer)
		done := make(chan error, 1)
		go func() {
			_, err := b.rend.Acquire(ctx, &leaseholdv1.AcquireRequest{RendererId: "r-1", MaxLeases: 1, Capacity: 1, Wait: durationpb.New(MaxAcquireWait)})
			done <- err
		}()
		<-oe.opened
		set.Replace(devPrincipalsWith(map[string]auth.Principal{renderer: {Name: "dev-renderer", Roles: []auth.Role{auth.RoleRenderer},
			RendererIDs: []string{"r-9"}, MaxCapacity: auth.DefaultMaxCapacity}}))
		wantError(t, <-done, codes.PermissionDenied, reasonRendererNotAllowed)
	})

	t.Run("A session whose renderer id is no longer allowed ends PERMISSION_DENIED RENDERER_ID_NOT_ALLOWED; its lease lives on", func(t *testing.T) {
		t.Parallel()
		set := auth.DevPrincipals()
		b := setup(t, func(o *options) { o.principals = set })
		b.submit(t, alpha, "alpha", "r", doc("a.pdf"))
		sc := b.openSession(t, hello("r-1", "i-1", 1), 1)
		sc.untilGrants(1)
		set.Replace(devPrincipalsWith(map[string]auth.Principal{renderer: {Name: "dev-renderer", Roles: []auth.Role{auth.RoleRenderer},
			RendererIDs: []string{"r-9"}, MaxCapacity: auth.DefaultMaxCapacity}}))
		wantError(t, sc.end(), codes.PermissionDenied, reasonRendererNotAllowed)
		if j := b.getJob(t, sc.grants[0].GetJobId()); j.GetPhase() != leaseholdv1.Phase_PHASE_LEASED {
			t.Errorf("the session's job = %v, want still LEASED until its deadline", j.GetPhase())
		}
	})

	t.Run("A watch whose operator's scope no longer covers the team ends PERMISSION_DENIED", func(t *testing.T) {
		t.Parallel()
		set := auth.DevPrincipals()
		b := setup(t, func(o *options) { o.principals = set })
		batch := b.submit(t, alpha, "alpha", "r", doc("a.pdf"))
		w, err := b.jobs.WatchBatch(as(t, opAlpha), &leaseholdv1.WatchBatchRequest{BatchId: batch.GetId()})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Recv(); err != nil {
			t.Fatalf("the watch's snapshot: %v", err)
		}
		set.Replace(devPrincipalsWith(map[string]auth.Principal{opAlpha: {Name: "dev-operator-alpha", Roles: []auth.Role{auth.RoleOperator},
			Scope: []string{"beta"}}}))
		for err == nil {
			_, err = w.Recv()
		}
		wantError(t, err, codes.PermissionDenied, reasonPermissionDenied)
	})

	t.Run("A watch whose submitter's token was removed ends UNAUTHENTICATED; another's goes on", func(t *testing.T) {
		t.Parallel()
		set := auth.DevPrincipals()
		b := setup(t, func(o *options) { o.principals = set })
		batch := b.submit(t, alpha, "alpha", "r", doc("a.pdf"))
		watch := func(token string) leaseholdv1.JobService_WatchBatchClient {
			t.Helper()
			w, err := b.jobs.WatchBatch(as(t, token), &leaseholdv1.WatchBatchRequest{BatchId: batch.GetId()})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := w.Recv(); err != nil {
				t.Fatalf("the watch's snapshot: %v", err)
			}
			return w
		}
		gone, kept := watch(alpha), watch(operator)
		without := map[string]auth.Principal{}
		dev := auth.DevPrincipals()
		for _, tok := range []string{beta, renderer, operator, opAlpha} {
			without[tok], _ = dev.Lookup(tok)
		}
		set.Replace(auth.NewSet(without))
		var err error
		for err == nil {
			_, err = gone.Recv()
		}
		wantError(t, err, codes.Unauthenticated, reasonUnauthenticated)
		// The operator's watch follows the batch to its end.
		if _, err := b.jobs.CancelBatch(as(t, operator), &leaseholdv1.CancelBatchRequest{BatchId: batch.GetId(), Reason: "done"}); err != nil {
			t.Fatal(err)
		}
		for err = nil; err == nil; {
			_, err = kept.Recv()
		}
		if err.Error() != "EOF" {
			t.Errorf("the operator's watch ended %v, want OK at the batch's end", err)
		}
	})
}
