package server

import (
	"testing"
	"time"

	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
)

// TestMalformedLeaseReferences checks that a malformed lease reference
// beside valid ones is answered on its own, LOST INVALID_ID in its place,
// while the valid leases are extended and the stream stays open.
func TestMalformedLeaseReferences(t *testing.T) {
	t.Parallel()
	bad := []*leaseholdv1.LeaseRef{{JobId: "x", Token: 1}, {JobId: "j-", Token: 2}, {JobId: "7", Token: 3}}
	lostInvalid := func(st *leaseholdv1.LeaseStatus, want *leaseholdv1.LeaseRef) bool {
		return st.GetState() == leaseholdv1.LeaseState_LEASE_STATE_LOST && st.GetReason() == reasonInvalidID &&
			st.GetJobId() == want.GetJobId() && st.GetToken() == want.GetToken()
	}

	t.Run("On the Heartbeat stream, in order, and the valid lease lives on", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		g := b.leaseOne(t)
		stream, err := b.rend.Heartbeat(as(t, renderer))
		if err != nil {
			t.Fatal(err)
		}
		beat := func(req *leaseholdv1.HeartbeatRequest) *leaseholdv1.HeartbeatResponse {
			t.Helper()
			if err := stream.Send(req); err != nil {
				t.Fatal(err)
			}
			resp, err := stream.Recv()
			if err != nil {
				t.Fatalf("the stream ended: %v", err)
			}
			return resp
		}
		for range 2 {
			b.clock.Advance(10 * time.Second)
			resp := beat(&leaseholdv1.HeartbeatRequest{RendererId: "r-1", Capacity: 3,
				Leases: []*leaseholdv1.LeaseRef{bad[0], ref(g), bad[1]}, HandBacks: bad[2:], CancelAcks: bad[:1]})
			got := resp.GetLeases()
			if len(got) != 4 || !lostInvalid(got[0], bad[0]) || got[1].GetState() != leaseholdv1.LeaseState_LEASE_STATE_HELD ||
				got[1].GetJobId() != g.GetJobId() || !lostInvalid(got[2], bad[1]) || !lostInvalid(got[3], bad[2]) {
				t.Fatalf("answers = %v, want LOST INVALID_ID, HELD %s, LOST INVALID_ID, LOST INVALID_ID", got, g.GetJobId())
			}
		}
		// 20 s after the grant, past its TTL: only the heartbeats kept it.
		if err := b.eng.Tick(t.Context()); err != nil {
			t.Fatal(err)
		}
		if j := b.getJob(t, g.GetJobId()); j.GetPhase() != leaseholdv1.Phase_PHASE_LEASED || j.GetLease().GetToken() != g.GetLease().GetToken() {
			t.Errorf("job after the heartbeats = %v token %d, want LEASED %d", j.GetPhase(), j.GetLease().GetToken(), g.GetLease().GetToken())
		}
		if err := stream.CloseSend(); err != nil {
			t.Fatal(err)
		}
		if _, err := stream.Recv(); err == nil {
			t.Error("the stream goes on after its close")
		}
	})

	t.Run("On a Session, and the valid lease lives on", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		g := b.leaseOne(t)
		sc := b.openSession(t, hello("r-1", "i-1", 2), 0)
		for range 2 {
			b.clock.Advance(10 * time.Second)
			got := sc.call(&leaseholdv1.SessionRequest{Heartbeats: []*leaseholdv1.LeaseRef{bad[0], ref(g)}, HandBacks: bad[1:2],
				Received: bad[2:], CancelAcks: bad[:1]}).GetLeases()
			if len(got) != 3 || got[0].GetState() != leaseholdv1.LeaseState_LEASE_STATE_HELD || got[0].GetJobId() != g.GetJobId() ||
				!lostInvalid(got[1], bad[0]) || !lostInvalid(got[2], bad[1]) {
				t.Fatalf("answers = %v, want HELD %s, then LOST INVALID_ID for each malformed heartbeat and hand-back", got, g.GetJobId())
			}
		}
		if err := b.eng.Tick(t.Context()); err != nil {
			t.Fatal(err)
		}
		if j := b.getJob(t, g.GetJobId()); j.GetPhase() != leaseholdv1.Phase_PHASE_LEASED {
			t.Errorf("job after the heartbeats = %v, want LEASED", j.GetPhase())
		}
	})
}
