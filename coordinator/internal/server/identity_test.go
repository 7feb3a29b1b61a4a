package server

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/auth"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"google.golang.org/grpc/codes"
)

// heartbeat opens a Heartbeat stream, sends req and returns the answer.
func (b *testBundle) heartbeat(t *testing.T, token string, req *leaseholdv1.HeartbeatRequest) *leaseholdv1.HeartbeatResponse {
	t.Helper()
	ctx, cancel := context.WithCancel(as(t, token))
	defer cancel()
	stream, err := b.rend.Heartbeat(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(req); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatalf("Heartbeat: %v", err)
	}
	if err := stream.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != io.EOF {
		t.Fatalf("Heartbeat stream ended with %v, want a clean end", err)
	}
	return resp
}

// TestRendererIdentity checks that fenced calls must come from the lease
// holder and that renderer ids are bound to the credential.
func TestRendererIdentity(t *testing.T) {
	t.Parallel()

	t.Run("A completion under another renderer's id is ABORTED NOT_LEASE_HOLDER, without the job's state, and recorded", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		g := b.leaseOne(t) // held by r-1
		req := failure(g, leaseholdv1.FailureClass_FAILURE_CLASS_TRANSIENT)
		req.RendererId = "r-2"
		_, err := b.rend.Complete(as(t, renderer), req)
		if meta := wantError(t, err, codes.Aborted, "NOT_LEASE_HOLDER"); len(meta) != 0 {
			t.Errorf("metadata %v to a renderer that never held a lease of the job, want none", meta)
		}
		j := b.getJob(t, g.GetJobId())
		if j.GetPhase() != leaseholdv1.Phase_PHASE_LEASED || j.GetLease().GetRendererId() != "r-1" || j.GetRejectedCompletions() != 1 {
			t.Errorf("job = %v held by %q, %d rejected; want LEASED by r-1 with 1 rejected", j.GetPhase(), j.GetLease().GetRendererId(), j.GetRejectedCompletions())
		}
		if ev := lastEvent(j); ev.GetKind() != leaseholdv1.EventKind_EVENT_KIND_COMPLETION_REJECTED || ev.GetReason() != "NOT_LEASE_HOLDER" || ev.GetRendererId() != "r-2" {
			t.Errorf("last event = %v, want COMPLETION_REJECTED NOT_LEASE_HOLDER by r-2", ev)
		}
		rej, err := b.ops.ListRejectedCompletions(as(t, operator), &leaseholdv1.ListRejectedCompletionsRequest{RendererId: "r-2"})
		if err != nil {
			t.Fatal(err)
		}
		if len(rej.GetRejections()) != 1 || rej.GetRejections()[0].GetReason() != "NOT_LEASE_HOLDER" {
			t.Errorf("rejections of r-2 = %v, want one NOT_LEASE_HOLDER", rej.GetRejections())
		}
		// The holder still completes.
		if _, err := b.rend.Complete(as(t, renderer), failure(g, leaseholdv1.FailureClass_FAILURE_CLASS_INVALID_DOCUMENT)); err != nil {
			t.Errorf("the holder's completion after the refusal: %v", err)
		}
	})

	t.Run("A session completion of another renderer's lease is refused NOT_LEASE_HOLDER", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		g := b.leaseOne(t)
		sc := b.openSession(t, hello("r-2", "i-1", 1), 0)
		resp := sc.call(&leaseholdv1.SessionRequest{Completions: []*leaseholdv1.SessionCompletion{inline(g, []byte("png"))}})
		if r := resp.GetResults()[0]; codes.Code(r.GetCode()) != codes.Aborted || r.GetReason() != "NOT_LEASE_HOLDER" {
			t.Fatalf("result = %v, want ABORTED NOT_LEASE_HOLDER", r)
		}
		if j := b.getJob(t, g.GetJobId()); j.GetPhase() != leaseholdv1.Phase_PHASE_LEASED || j.GetRejectedCompletions() != 1 {
			t.Errorf("job = %v with %d rejected, want LEASED with 1", j.GetPhase(), j.GetRejectedCompletions())
		}
	})

	t.Run("A heartbeat under another renderer's id is LOST NOT_LEASE_HOLDER and extends nothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		g := b.leaseOne(t)
		before := b.getJob(t, g.GetJobId()).GetLease().GetDeadline().AsTime()
		b.clock.Advance(5 * time.Second)
		resp := b.heartbeat(t, renderer, &leaseholdv1.HeartbeatRequest{RendererId: "r-2", Leases: []*leaseholdv1.LeaseRef{ref(g)}})
		if st := resp.GetLeases()[0]; st.GetState() != leaseholdv1.LeaseState_LEASE_STATE_LOST || st.GetReason() != "NOT_LEASE_HOLDER" {
			t.Fatalf("heartbeat = %v, want LOST NOT_LEASE_HOLDER", st)
		}
		if after := b.getJob(t, g.GetJobId()).GetLease().GetDeadline().AsTime(); !after.Equal(before) {
			t.Errorf("deadline moved from %v to %v on another renderer's heartbeat", before, after)
		}
		sc := b.openSession(t, hello("r-3", "i-1", 1), 0)
		if st := sc.call(&leaseholdv1.SessionRequest{Heartbeats: []*leaseholdv1.LeaseRef{ref(g)}}).GetLeases()[0]; st.GetReason() != "NOT_LEASE_HOLDER" {
			t.Errorf("session heartbeat = %v, want LOST NOT_LEASE_HOLDER", st)
		}
	})

	t.Run("A hand-back under another renderer's id is LOST NOT_LEASE_HOLDER and the lease stays", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		g := b.leaseOne(t)
		resp := b.heartbeat(t, renderer, &leaseholdv1.HeartbeatRequest{RendererId: "r-2", HandBacks: []*leaseholdv1.LeaseRef{ref(g)}})
		if st := resp.GetLeases()[0]; st.GetState() != leaseholdv1.LeaseState_LEASE_STATE_LOST || st.GetReason() != "NOT_LEASE_HOLDER" {
			t.Fatalf("hand-back = %v, want LOST NOT_LEASE_HOLDER", st)
		}
		if j := b.getJob(t, g.GetJobId()); j.GetPhase() != leaseholdv1.Phase_PHASE_LEASED || j.GetLease().GetToken() != g.GetLease().GetToken() {
			t.Errorf("job after another renderer's hand-back = %v token %d, want LEASED under %d", j.GetPhase(), j.GetLease().GetToken(), g.GetLease().GetToken())
		}
		// The holder's own hand-back works.
		resp = b.heartbeat(t, renderer, &leaseholdv1.HeartbeatRequest{RendererId: "r-1", HandBacks: []*leaseholdv1.LeaseRef{ref(g)}})
		if st := resp.GetLeases()[0]; st.GetReason() != "HANDED_BACK" {
			t.Errorf("the holder's hand-back = %v, want HANDED_BACK", st)
		}
		if ev := lastEvent(b.getJob(t, g.GetJobId())); ev.GetKind() != leaseholdv1.EventKind_EVENT_KIND_REQUEUED || ev.GetReason() != "HANDED_BACK" {
			t.Errorf("last event = %v, want REQUEUED HANDED_BACK", ev)
		}
	})

	t.Run("A cancel acknowledgement under another renderer's id is not recorded", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		g := b.leaseOne(t)
		if _, err := b.jobs.CancelJob(as(t, alpha), &leaseholdv1.CancelJobRequest{JobId: g.GetJobId()}); err != nil {
			t.Fatal(err)
		}
		b.heartbeat(t, renderer, &leaseholdv1.HeartbeatRequest{RendererId: "r-2", CancelAcks: []*leaseholdv1.LeaseRef{ref(g)}})
		if c := b.getJob(t, g.GetJobId()).GetCancellation(); c.GetAcknowledged() {
			t.Fatalf("another renderer's ack was recorded: %v", c)
		}
		b.heartbeat(t, renderer, &leaseholdv1.HeartbeatRequest{RendererId: "r-1", CancelAcks: []*leaseholdv1.LeaseRef{ref(g)}})
		if c := b.getJob(t, g.GetJobId()).GetCancellation(); !c.GetAcknowledged() {
			t.Errorf("the holder's ack was not recorded: %v", c)
		}
	})

	t.Run("An upload under another renderer's id is ABORTED NOT_LEASE_HOLDER", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		g := b.leaseOne(t)
		_, err := b.sendUpload(t, renderer, uploadMeta(g, g.GetLease().GetToken(), "r-2"), chunk([]byte("png")))
		wantError(t, err, codes.Aborted, "NOT_LEASE_HOLDER")
	})

	t.Run("A credential bound to some ids is refused every other id", func(t *testing.T) {
		t.Parallel()
		const pool = "pool-a-secret"
		b := setup(t, func(o *options) {
			o.principals = auth.NewSet(map[string]auth.Principal{
				alpha: {Name: "dev-alpha", Team: "alpha", Roles: []auth.Role{auth.RoleSubmitter}},
				pool:  {Name: "pool-a", Roles: []auth.Role{auth.RoleRenderer}, RendererIDs: []string{"solo-acquire", "solo-heartbeat", "solo-session"}, RendererIDPrefix: "pool-a-"},
			})
		})
		g := &leaseholdv1.Grant{JobId: "j-1", Lease: &leaseholdv1.Lease{Token: 1}}
		calls := map[string]func(id string) error{
			"Acquire": func(id string) error {
				_, err := b.rend.Acquire(as(t, pool), &leaseholdv1.AcquireRequest{RendererId: id, MaxLeases: 1})
				return err
			},
			"Heartbeat": func(id string) error {
				stream, err := b.rend.Heartbeat(as(t, pool))
				if err != nil {
					return err
				}
				if err := stream.Send(&leaseholdv1.HeartbeatRequest{RendererId: id}); err != nil {
					return err
				}
				_, err = stream.Recv()
				stream.CloseSend()
				return err
			},
			"Session": func(id string) error {
				sc := b.startSession(t, pool, &leaseholdv1.SessionRequest{Hello: hello(id, "i-1", 1)})
				_, err := sc.recv()
				sc.cancel()
				return err
			},
			"Complete": func(id string) error {
				req := failure(g, leaseholdv1.FailureClass_FAILURE_CLASS_TRANSIENT)
				req.RendererId = id
				_, err := b.rend.Complete(as(t, pool), req)
				return err
			},
			"UploadArtifact": func(id string) error {
				_, err := b.sendUpload(t, pool, uploadMeta(g, 1, id), chunk([]byte("png")))
				return err
			},
		}
		for name, call := range calls {
			for _, id := range []string{"pool-b-1", "solo-2", "pool-a"} {
				wantError(t, call(id), codes.PermissionDenied, reasonRendererNotAllowed)
			}
			if name == "Acquire" || name == "Heartbeat" || name == "Session" {
				// An id of its own per call: a call's session may still be
				// closing when the next opens, and an id is one process's
				// at a time.
				for _, id := range []string{"solo-" + strings.ToLower(name), "pool-a-" + strings.ToLower(name)} {
					if err := call(id); err != nil {
						t.Errorf("%s as allowed id %s: %v", name, id, err)
					}
				}
			}
		}
	})
}

// sendUpload runs one UploadArtifact as token with msgs.
func (b *testBundle) sendUpload(t *testing.T, token string, msgs ...*leaseholdv1.UploadArtifactRequest) (*leaseholdv1.UploadArtifactResponse, error) {
	t.Helper()
	stream, err := b.rend.UploadArtifact(as(t, token))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range msgs {
		if err := stream.Send(m); err != nil {
			break // the server ended the stream; CloseAndRecv has its status
		}
	}
	return stream.CloseAndRecv()
}

func uploadMeta(g *leaseholdv1.Grant, token uint64, rendererID string) *leaseholdv1.UploadArtifactRequest {
	return &leaseholdv1.UploadArtifactRequest{Part: &leaseholdv1.UploadArtifactRequest_Metadata{Metadata: &leaseholdv1.ArtifactMetadata{
		JobId: g.GetJobId(), Token: token, RendererId: rendererID, ContentType: "image/png"}}}
}

func chunk(data []byte) *leaseholdv1.UploadArtifactRequest {
	return &leaseholdv1.UploadArtifactRequest{Part: &leaseholdv1.UploadArtifactRequest_Chunk{Chunk: data}}
}
