package server

import (
	"strconv"
	"strings"
	"testing"
	"time"

	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"google.golang.org/grpc/codes"
)

// counter reads the counter name for reason.
func (b *testBundle) counter(t *testing.T, name, reason string) float64 {
	t.Helper()
	mfs, err := b.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "reason" && l.GetValue() == reason {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// acquireAs leases up to n jobs to renderer id.
func (b *testBundle) acquireAs(t *testing.T, id string, n uint32) []*leaseholdv1.Grant {
	t.Helper()
	resp, err := b.rend.Acquire(as(t, renderer), &leaseholdv1.AcquireRequest{RendererId: id, MaxLeases: n, Capacity: 8})
	if err != nil {
		t.Fatalf("Acquire as %s: %v", id, err)
	}
	return resp.GetLeases()
}

// successOf is a success completion of (job, token) by r-1 naming digest.
func successOf(job string, token uint64, digest string) *leaseholdv1.CompleteRequest {
	return &leaseholdv1.CompleteRequest{JobId: job, Token: token, RendererId: "r-1",
		Outcome: &leaseholdv1.CompleteRequest_Success{Success: &leaseholdv1.CompleteSuccess{ArtifactDigest: digest}}}
}

// TestRefusalsToStrangersTellNothing checks that a renderer refused on a job
// it never held a lease of learns nothing of the job's state on any path,
// while one that held an earlier lease still gets the current token and
// phase; and that refusals past a job's cap record nothing.
func TestRefusalsToStrangersTellNothing(t *testing.T) {
	t.Parallel()

	t.Run("Every fenced call on a job the renderer never held answers ABORTED NOT_LEASE_HOLDER without its state", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.submit(t, beta, "beta", "leased", doc("held-by-r2.pdf"))
		held := b.acquireAs(t, "r-2", 1)[0]
		queued := b.submit(t, beta, "beta", "queued", doc("never-leased.pdf")).GetJobIds()[0]
		type probe struct {
			job   string
			token uint64
		}
		for _, p := range []probe{{held.GetJobId(), held.GetLease().GetToken()}, {held.GetJobId(), 0}, {held.GetJobId(), 1 << 40}, {queued, 1}} {
			_, err := b.rend.Complete(as(t, renderer), successOf(p.job, p.token, sha([]byte("x"))))
			if meta := wantError(t, err, codes.Aborted, "NOT_LEASE_HOLDER"); len(meta) != 0 {
				t.Errorf("Complete of %s token %d by a stranger: metadata %v, want none", p.job, p.token, meta)
			}
			if strings.Contains(err.Error(), "token ") || strings.Contains(err.Error(), "phase") {
				t.Errorf("Complete of %s token %d by a stranger says %q", p.job, p.token, err)
			}

			_, err = b.sendUpload(t, renderer, uploadMeta(&leaseholdv1.Grant{JobId: p.job}, p.token, "r-1"), chunk([]byte("x")))
			if meta := wantError(t, err, codes.Aborted, "NOT_LEASE_HOLDER"); len(meta) != 0 {
				t.Errorf("UploadArtifact for %s token %d by a stranger: metadata %v, want none", p.job, p.token, meta)
			}
		}

		hb, err := b.rend.Heartbeat(as(t, renderer))
		if err != nil {
			t.Fatal(err)
		}
		if err := hb.Send(&leaseholdv1.HeartbeatRequest{RendererId: "r-1", Capacity: 1, Leases: []*leaseholdv1.LeaseRef{ref(held)}}); err != nil {
			t.Fatal(err)
		}
		m, err := hb.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if st := m.GetLeases()[0]; st.GetReason() != "NOT_LEASE_HOLDER" || st.GetCurrentToken() != 0 || st.GetCurrentPhase() != leaseholdv1.Phase_PHASE_UNSPECIFIED {
			t.Errorf("Heartbeat stream answer to a stranger = %v, want LOST NOT_LEASE_HOLDER without phase or token", st)
		}
		if err := hb.CloseSend(); err != nil {
			t.Fatal(err)
		}
		for {
			if _, err := hb.Recv(); err != nil {
				break // the stream ended, so the session below may use r-1
			}
		}

		sc := b.openSession(t, hello("r-1", "i-1", 2), 0)
		resp := sc.call(&leaseholdv1.SessionRequest{
			Completions: []*leaseholdv1.SessionCompletion{failed(held, held.GetLease().GetToken(), leaseholdv1.FailureClass_FAILURE_CLASS_TRANSIENT)},
			Heartbeats:  []*leaseholdv1.LeaseRef{ref(held), {JobId: queued, Token: 1}},
		})
		r := resp.GetResults()[0]
		if codes.Code(r.GetCode()) != codes.Aborted || r.GetReason() != "NOT_LEASE_HOLDER" || r.GetPhase() != leaseholdv1.Phase_PHASE_UNSPECIFIED || r.GetCurrentToken() != 0 {
			t.Errorf("session completion by a stranger = %v, want ABORTED NOT_LEASE_HOLDER without phase or token", r)
		}
		for _, st := range resp.GetLeases() {
			if st.GetState() != leaseholdv1.LeaseState_LEASE_STATE_LOST || st.GetReason() != "NOT_LEASE_HOLDER" || st.GetCurrentToken() != 0 || st.GetCurrentPhase() != leaseholdv1.Phase_PHASE_UNSPECIFIED {
				t.Errorf("session heartbeat by a stranger = %v, want LOST NOT_LEASE_HOLDER without phase or token", st)
			}
		}

		// The holder's lease is untouched; operators see what was refused,
		// with the job's state.
		if j := b.getJob(t, held.GetJobId()); j.GetPhase() != leaseholdv1.Phase_PHASE_LEASED || j.GetLease().GetRendererId() != "r-2" {
			t.Errorf("the held job after the strangers = %v by %q", j.GetPhase(), j.GetLease().GetRendererId())
		}
		for _, rej := range b.rejections(t) {
			if rej.GetJobId() == held.GetJobId() && rej.GetCurrentToken() != held.GetLease().GetToken() {
				t.Errorf("listed rejection %v names current token %d, want %d", rej, rej.GetCurrentToken(), held.GetLease().GetToken())
			}
		}
	})

	t.Run("A renderer that held an earlier lease of the job is told its current token and phase", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		first := b.leaseOne(t)
		b.clock.Advance(16 * time.Second) // past the TTL
		if err := b.eng.Tick(t.Context()); err != nil {
			t.Fatal(err)
		}
		b.clock.Advance(11 * time.Second) // past the longest backoff
		if err := b.eng.Tick(t.Context()); err != nil {
			t.Fatal(err)
		}
		second := b.acquireAs(t, "r-2", 1)[0]
		if second.GetJobId() != first.GetJobId() {
			t.Fatalf("second grant = %s, want %s", second.GetJobId(), first.GetJobId())
		}
		for _, token := range []uint64{first.GetLease().GetToken(), second.GetLease().GetToken()} {
			_, err := b.rend.Complete(as(t, renderer), successOf(first.GetJobId(), token, sha([]byte("x"))))
			c, info := errorInfo(err)
			meta := info.GetMetadata()
			if c != codes.Aborted || meta["current_token"] != fmtToken(second) || meta["current_phase"] != "PHASE_LEASED" {
				t.Errorf("Complete with token %d by the earlier holder = %v %v, want ABORTED naming token %s LEASED", token, c, meta, fmtToken(second))
			}
		}
	})

	t.Run("Refusals past a job's 32 recorded in a cycle, and repeats, record nothing and are counted", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		g := b.leaseOne(t)
		live := g.GetLease().GetToken()
		calls := 0
		for _, token := range append(tokenRange(live+1, live+40), tokenRange(live+33, live+40)...) {
			_, err := b.rend.Complete(as(t, renderer), successOf(g.GetJobId(), token, sha([]byte("x"))))
			wantError(t, err, codes.Aborted, "STALE_LEASE")
			calls++
		}
		if calls != 48 {
			t.Fatalf("sent %d, want 48", calls)
		}
		j := b.getJob(t, g.GetJobId())
		if n := len(b.rejections(t)); n != 32 || j.GetRejectedCompletions() != 32 || b.rejectedMetric(t, "STALE_LEASE") != 32 {
			t.Errorf("after 48 refusals: listed %d, job count %d, metric %v; want 32 each", n, j.GetRejectedCompletions(), b.rejectedMetric(t, "STALE_LEASE"))
		}
		if got := b.counter(t, "leasehold_rejected_completions_unrecorded_total", "STALE_LEASE"); got != 16 {
			t.Errorf("unrecorded refusals counted %v, want 16", got)
		}
		if j.GetPhase() != leaseholdv1.Phase_PHASE_LEASED || j.GetLease().GetToken() != live {
			t.Errorf("job after the refusals = %v token %d, want LEASED %d", j.GetPhase(), j.GetLease().GetToken(), live)
		}
	})
}

func tokenRange(from, to uint64) []uint64 {
	var ts []uint64
	for tok := from; tok <= to; tok++ {
		ts = append(ts, tok)
	}
	return ts
}

func fmtToken(g *leaseholdv1.Grant) string { return strconv.FormatUint(g.GetLease().GetToken(), 10) }
