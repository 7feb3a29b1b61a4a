package server

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// teamFixture names one team's objects in the matrix's world: a batch of
// three jobs, one SUCCEEDED with a preview, one FAILED permanently, one
// LEASED to r-1 (with one stale completion recorded).
type teamFixture struct {
	team                      string
	batch                     string
	succeeded, failed, leased string
	token                     uint64
}

// nowhere names objects that do not exist.
var nowhere = teamFixture{team: "nowhere", batch: "b-999", succeeded: "j-997", failed: "j-998", leased: "j-999", token: 1}

// matrixWorld builds the world every matrix case starts from, served to
// the development principals and a backup principal.
func matrixWorld(t *testing.T) (*testBundle, map[string]teamFixture) {
	t.Helper()
	b := setup(t, withBackupPrincipal)
	world := map[string]teamFixture{}
	for _, team := range []string{"alpha", "beta"} {
		owner := map[string]string{"alpha": alpha, "beta": beta}[team]
		batch := b.submit(t, owner, team, "world", doc(team+"-1.pdf"), doc(team+"-2.pdf"), doc(team+"-3.pdf"))
		ids := batch.GetJobIds()
		world[team] = teamFixture{team: team, batch: batch.GetId(), succeeded: ids[0], failed: ids[1], leased: ids[2]}
	}
	grants := map[string]*leaseholdv1.Grant{}
	for _, g := range b.acquire(t, 6) {
		grants[g.GetJobId()] = g
	}
	if len(grants) != 6 {
		t.Fatalf("granted %d leases, want 6", len(grants))
	}
	for team, f := range world {
		ctx := as(t, renderer)
		s := grants[f.succeeded]
		if _, err := b.rend.Complete(ctx, &leaseholdv1.CompleteRequest{JobId: s.GetJobId(), Token: s.GetLease().GetToken(), RendererId: "r-1",
			Outcome: &leaseholdv1.CompleteRequest_Success{Success: &leaseholdv1.CompleteSuccess{Content: []byte("png of " + team), ContentType: "image/png"}}}); err != nil {
			t.Fatal(err)
		}
		if _, err := b.rend.Complete(ctx, failure(grants[f.failed], leaseholdv1.FailureClass_FAILURE_CLASS_INVALID_DOCUMENT)); err != nil {
			t.Fatal(err)
		}
		stale := failure(grants[f.leased], leaseholdv1.FailureClass_FAILURE_CLASS_TRANSIENT)
		stale.Token += 100
		if _, err := b.rend.Complete(ctx, stale); status.Code(err) != codes.Aborted {
			t.Fatalf("stale completion: %v, want ABORTED", err)
		}
		f.token = grants[f.leased].GetLease().GetToken()
		world[team] = f
	}
	return b, world
}

// matrixCaller is one kind of caller.
type matrixCaller struct {
	name, token string
	// sees reports whether the caller may see team's jobs; submits whether
	// it submits for team.
	sees, submits func(team string) bool
	operator      bool
	allScope      bool
	renderer      bool
	backup        bool
}

var matrixCallers = []matrixCaller{
	{name: "no token", sees: never, submits: never},
	{name: "alpha submitter", token: alpha, sees: only("alpha"), submits: only("alpha")},
	{name: "beta submitter", token: beta, sees: only("beta"), submits: only("beta")},
	{name: "renderer", token: renderer, sees: never, submits: never, renderer: true},
	{name: "operator of every team", token: operator, sees: always, submits: never, operator: true, allScope: true},
	{name: "operator of alpha", token: opAlpha, sees: only("alpha"), submits: never, operator: true},
	{name: "backup", token: backupToken, sees: never, submits: never, backup: true},
}

func never(string) bool  { return false }
func always(string) bool { return true }
func only(team string) func(string) bool {
	return func(t string) bool { return t == team }
}

// outcome is what a matrix case expects.
type outcome struct {
	code   codes.Code
	reason string
	// audited: the refusal adds one DENIED audit record.
	audited bool
}

var allowed = outcome{code: codes.OK}

func refused(code codes.Code, reason string) outcome { return outcome{code: code, reason: reason} }

var permissionDenied = refused(codes.PermissionDenied, reasonPermissionDenied)

// matrixRPC is one RPC of the matrix.
type matrixRPC struct {
	name string
	// perTeam: the call targets one team's objects.
	perTeam bool
	// echoesTeam: the request itself names the team, so a refusal may too.
	echoesTeam bool
	call       func(ctx context.Context, t *testing.T, b *testBundle, f teamFixture) error
	want       func(c matrixCaller, team string) outcome
}

// byRole is the outcome of an RPC that needs only a role.
func byRole(may func(matrixCaller) bool) func(matrixCaller, string) outcome {
	return func(c matrixCaller, _ string) outcome {
		switch {
		case c.token == "":
			return refused(codes.Unauthenticated, reasonUnauthenticated)
		case may(c):
			return allowed
		}
		return permissionDenied
	}
}

// visible is the outcome of an RPC on what the caller may see, answering
// what it may not as a nonexistent id.
func visible(notFound string) func(matrixCaller, string) outcome {
	return func(c matrixCaller, team string) outcome {
		switch {
		case c.token == "":
			return refused(codes.Unauthenticated, reasonUnauthenticated)
		case c.sees(team):
			return allowed
		}
		return refused(codes.NotFound, notFound)
	}
}

// overCapacity is the outcome of a renderer message naming more leases
// than its capacity: refused INVALID_ARGUMENT TOO_MANY_LEASE_REFS to a
// renderer, and to anyone else as the role requires.
func overCapacity(c matrixCaller, team string) outcome {
	if o := byRole(func(c matrixCaller) bool { return c.renderer })(c, team); o.code != codes.OK {
		return o
	}
	return refused(codes.InvalidArgument, reasonTooManyLeaseRefs)
}

// cancelling is visible, with an operator's out-of-scope refusal audited.
func cancelling(notFound string) func(matrixCaller, string) outcome {
	return func(c matrixCaller, team string) outcome {
		o := visible(notFound)(c, team)
		o.audited = o.code == codes.NotFound && c.operator
		return o
	}
}

var matrixRPCs = []matrixRPC{
	{name: "GetJob", perTeam: true, want: visible(reasonJobNotFound),
		call: func(ctx context.Context, t *testing.T, b *testBundle, f teamFixture) error {
			_, err := b.jobs.GetJob(ctx, &leaseholdv1.GetJobRequest{JobId: f.leased})
			return err
		}},
	{name: "ListJobs by team", perTeam: true, echoesTeam: true,
		want: func(c matrixCaller, team string) outcome {
			o := visible("")(c, team)
			if o.code == codes.NotFound {
				return permissionDenied
			}
			return o
		},
		call: func(ctx context.Context, t *testing.T, b *testBundle, f teamFixture) error {
			_, err := b.jobs.ListJobs(ctx, &leaseholdv1.ListJobsRequest{Team: f.team})
			return err
		}},
	{name: "ListJobs by batch", perTeam: true, want: visible(reasonBatchNotFound),
		call: func(ctx context.Context, t *testing.T, b *testBundle, f teamFixture) error {
			_, err := b.jobs.ListJobs(ctx, &leaseholdv1.ListJobsRequest{BatchId: f.batch})
			return err
		}},
	{name: "GetBatch", perTeam: true, want: visible(reasonBatchNotFound),
		call: func(ctx context.Context, t *testing.T, b *testBundle, f teamFixture) error {
			_, err := b.jobs.GetBatch(ctx, &leaseholdv1.GetBatchRequest{BatchId: f.batch})
			return err
		}},
	{name: "WatchBatch", perTeam: true, want: visible(reasonBatchNotFound),
		call: func(ctx context.Context, t *testing.T, b *testBundle, f teamFixture) error {
			stream, err := b.jobs.WatchBatch(ctx, &leaseholdv1.WatchBatchRequest{BatchId: f.batch})
			if err != nil {
				return err
			}
			_, err = stream.Recv()
			return err
		}},
	{name: "CancelJob", perTeam: true, want: cancelling(reasonJobNotFound),
		call: func(ctx context.Context, t *testing.T, b *testBundle, f teamFixture) error {
			_, err := b.jobs.CancelJob(ctx, &leaseholdv1.CancelJobRequest{JobId: f.leased, Reason: "matrix"})
			return err
		}},
	{name: "CancelBatch", perTeam: true, want: cancelling(reasonBatchNotFound),
		call: func(ctx context.Context, t *testing.T, b *testBundle, f teamFixture) error {
			_, err := b.jobs.CancelBatch(ctx, &leaseholdv1.CancelBatchRequest{BatchId: f.batch, Reason: "matrix"})
			return err
		}},
	{name: "GetArtifact", perTeam: true,
		want: func(c matrixCaller, team string) outcome {
			switch {
			case c.token == "":
				return refused(codes.Unauthenticated, reasonUnauthenticated)
			case c.submits(team):
				return allowed
			case c.token == alpha || c.token == beta:
				return refused(codes.NotFound, reasonJobNotFound)
			}
			return permissionDenied // only submitters read previews
		},
		call: func(ctx context.Context, t *testing.T, b *testBundle, f teamFixture) error {
			stream, err := b.jobs.GetArtifact(ctx, &leaseholdv1.GetArtifactRequest{JobId: f.succeeded})
			if err != nil {
				return err
			}
			_, err = stream.Recv()
			return err
		}},
	{name: "SubmitBatch", perTeam: true, echoesTeam: true,
		want: func(c matrixCaller, team string) outcome {
			return byRole(func(c matrixCaller) bool { return c.submits(team) })(c, team)
		},
		call: func(ctx context.Context, t *testing.T, b *testBundle, f teamFixture) error {
			_, err := b.jobs.SubmitBatch(ctx, &leaseholdv1.SubmitBatchRequest{Team: f.team, RequestId: "matrix", Documents: []*leaseholdv1.Document{doc("m.pdf")}})
			return err
		}},
	{name: "ReplayJobs", perTeam: true, want: byRole(func(c matrixCaller) bool { return c.operator }),
		call: func(ctx context.Context, t *testing.T, b *testBundle, f teamFixture) error {
			_, err := b.ops.ReplayJobs(ctx, &leaseholdv1.ReplayJobsRequest{JobIds: []string{f.failed}, IncludePermanent: true, RequestId: "matrix", Reason: "matrix"})
			return err
		}},
	{name: "ListRejectedCompletions", perTeam: true, want: byRole(func(c matrixCaller) bool { return c.operator }),
		call: func(ctx context.Context, t *testing.T, b *testBundle, f teamFixture) error {
			_, err := b.ops.ListRejectedCompletions(ctx, &leaseholdv1.ListRejectedCompletionsRequest{JobId: f.leased})
			return err
		}},
	{name: "GetAudit", want: byRole(func(c matrixCaller) bool { return c.operator }),
		call: func(ctx context.Context, t *testing.T, b *testBundle, f teamFixture) error {
			_, err := b.ops.GetAudit(ctx, &leaseholdv1.GetAuditRequest{})
			return err
		}},
	{name: "PauseDispatch", want: byRole(func(c matrixCaller) bool { return c.allScope }),
		call: func(ctx context.Context, t *testing.T, b *testBundle, f teamFixture) error {
			_, err := b.ops.PauseDispatch(ctx, &leaseholdv1.PauseDispatchRequest{Reason: "matrix"})
			return err
		}},
	{name: "ResumeDispatch", want: byRole(func(c matrixCaller) bool { return c.allScope }),
		call: func(ctx context.Context, t *testing.T, b *testBundle, f teamFixture) error {
			_, err := b.ops.ResumeDispatch(ctx, &leaseholdv1.ResumeDispatchRequest{Reason: "matrix"})
			return err
		}},
	{name: "Backup", want: byRole(func(c matrixCaller) bool { return c.backup }),
		call: func(ctx context.Context, t *testing.T, b *testBundle, f teamFixture) error {
			_, _, err := readBackup(ctx, b)
			return err
		}},
	{name: "Acquire", want: byRole(func(c matrixCaller) bool { return c.renderer }),
		call: func(ctx context.Context, t *testing.T, b *testBundle, f teamFixture) error {
			_, err := b.rend.Acquire(ctx, &leaseholdv1.AcquireRequest{RendererId: "r-1", MaxLeases: 1})
			return err
		}},
	{name: "Session", want: byRole(func(c matrixCaller) bool { return c.renderer }),
		call: func(ctx context.Context, t *testing.T, b *testBundle, f teamFixture) error {
			stream, err := b.rend.Session(ctx)
			if err != nil {
				return err
			}
			// A Send the server refused fails with io.EOF; Recv has the status.
			_ = stream.Send(&leaseholdv1.SessionRequest{Hello: hello("r-9", "i-1", 1)})
			_, err = stream.Recv()
			return err
		}},
	{name: "Heartbeat", perTeam: true, want: byRole(func(c matrixCaller) bool { return c.renderer }),
		call: func(ctx context.Context, t *testing.T, b *testBundle, f teamFixture) error {
			stream, err := b.rend.Heartbeat(ctx)
			if err != nil {
				return err
			}
			_ = stream.Send(&leaseholdv1.HeartbeatRequest{RendererId: "r-1", Leases: []*leaseholdv1.LeaseRef{{JobId: f.leased, Token: f.token}}})
			_, err = stream.Recv()
			return err
		}},
	{name: "UploadArtifact", perTeam: true, want: byRole(func(c matrixCaller) bool { return c.renderer }),
		call: func(ctx context.Context, t *testing.T, b *testBundle, f teamFixture) error {
			stream, err := b.rend.UploadArtifact(ctx)
			if err != nil {
				return err
			}
			for _, m := range []*leaseholdv1.UploadArtifactRequest{
				uploadMeta(&leaseholdv1.Grant{JobId: f.leased}, f.token, "r-1"), chunk([]byte("png")),
			} {
				if err := stream.Send(m); err != nil {
					break
				}
			}
			_, err = stream.CloseAndRecv()
			return err
		}},
	// A renderer message naming more leases than the renderer's capacity is
	// refused whole, whoever's leases they are, and changes nothing.
	{name: "Session holding more leases than its capacity", perTeam: true, want: overCapacity,
		call: func(ctx context.Context, t *testing.T, b *testBundle, f teamFixture) error {
			stream, err := b.rend.Session(ctx)
			if err != nil {
				return err
			}
			h := hello("r-1", "i-9", 1)
			h.Holding = []*leaseholdv1.LeaseRef{{JobId: f.leased, Token: f.token}, {JobId: f.leased, Token: f.token}}
			_ = stream.Send(&leaseholdv1.SessionRequest{Hello: h})
			_, err = stream.Recv()
			return err
		}},
	{name: "Heartbeat naming more leases than its capacity", perTeam: true, want: overCapacity,
		call: func(ctx context.Context, t *testing.T, b *testBundle, f teamFixture) error {
			stream, err := b.rend.Heartbeat(ctx)
			if err != nil {
				return err
			}
			ref := &leaseholdv1.LeaseRef{JobId: f.leased, Token: f.token}
			_ = stream.Send(&leaseholdv1.HeartbeatRequest{RendererId: "r-1", Capacity: 1, Leases: []*leaseholdv1.LeaseRef{ref, ref}})
			_, err = stream.Recv()
			return err
		}},
	{name: "Complete", perTeam: true, want: byRole(func(c matrixCaller) bool { return c.renderer }),
		call: func(ctx context.Context, t *testing.T, b *testBundle, f teamFixture) error {
			_, err := b.rend.Complete(ctx, &leaseholdv1.CompleteRequest{JobId: f.leased, Token: f.token, RendererId: "r-1",
				Outcome: &leaseholdv1.CompleteRequest_Success{Success: &leaseholdv1.CompleteSuccess{Content: []byte("png"), ContentType: "image/png"}}})
			return err
		}},
}

// TestAuthorizationMatrix calls every RPC as every kind of caller on each
// team's objects. A refusal has its code and reason, changes nothing (but
// the documented DENIED audit record), names no team the caller may not
// see, and a NOT_FOUND is the answer a nonexistent id gets.
func TestAuthorizationMatrix(t *testing.T) {
	t.Parallel()
	for _, rpc := range matrixRPCs {
		teams := []string{"alpha"}
		if rpc.perTeam {
			teams = append(teams, "beta")
		}
		for _, team := range teams {
			for _, c := range matrixCallers {
				want := rpc.want(c, team)
				verdict := "is allowed"
				if want.code != codes.OK {
					verdict = fmt.Sprintf("is refused %v %s", want.code, want.reason)
				}
				name := fmt.Sprintf("%s as %s %s", rpc.name, c.name, verdict)
				if rpc.perTeam {
					name = fmt.Sprintf("%s on %s as %s %s", rpc.name, team, c.name, verdict)
				}
				t.Run(name, func(t *testing.T) {
					t.Parallel()
					b, world := matrixWorld(t)
					before := b.snapshot(t)
					err := rpc.call(as(t, c.token), t, b, world[team])
					if want.code == codes.OK {
						if err != nil {
							t.Fatalf("got %v, want OK", err)
						}
						checkAllowed(t, b, rpc.name, c, world[team], before)
						return
					}
					wantError(t, err, want.code, want.reason)
					after := b.snapshot(t)
					changed := after
					if want.audited {
						changed = withoutDeniedAudit(t, before, after, team)
					}
					if diff := cmpDiff(before, changed); diff != "" {
						t.Errorf("the refusal changed the state (-before +after):\n%s", diff)
					}
					if !rpc.echoesTeam {
						for _, other := range []string{"alpha", "beta"} {
							if !c.sees(other) && reveals(err, other) {
								t.Errorf("the refusal names team %s: %v", other, status.Convert(err).Proto())
							}
						}
					}
					if want.code == codes.NotFound {
						nx := rpc.call(as(t, c.token), t, b, nowhere)
						if diff := cmpDiff(normalized(nx, nowhere), normalized(err, world[team])); diff != "" {
							t.Errorf("NOT_FOUND differs from a nonexistent id's answer (-nonexistent +hidden):\n%s", diff)
						}
						if diff := cmpDiff(after, b.snapshot(t)); diff != "" {
							t.Errorf("the nonexistent id's refusal changed the state:\n%s", diff)
						}
					}
				})
			}
		}
	}
}

// reveals reports whether err's status (message, ErrorInfo, details)
// carries team.
func reveals(err error, team string) bool {
	data, merr := proto.Marshal(status.Convert(err).Proto())
	return merr != nil || bytes.Contains(data, []byte(team))
}

// normalized is err's status as text with f's ids replaced by
// placeholders, so that the answers for two ids compare equal.
func normalized(err error, f teamFixture) string {
	s := fmt.Sprint(status.Convert(err).Proto())
	for _, r := range []struct{ id, as string }{{f.batch, "<batch>"}, {f.succeeded, "<succeeded>"}, {f.failed, "<failed>"}, {f.leased, "<leased>"}} {
		s = strings.ReplaceAll(s, r.id, r.as)
	}
	return s
}

// withoutDeniedAudit returns after without the one DENIED audit record an
// operator's out-of-scope cancel adds, failing unless it is there.
func withoutDeniedAudit(t *testing.T, before, after state, team string) state {
	t.Helper()
	if len(after.Audit) != len(before.Audit)+1 {
		t.Fatalf("audit records %d -> %d, want one DENIED record more", len(before.Audit), len(after.Audit))
	}
	rec := after.Audit[0] // newest first
	for _, want := range []string{jobs.AuditDenied, "dev-operator-alpha", team} {
		if !strings.Contains(rec, want) {
			t.Errorf("newest audit record %s lacks %q", rec, want)
		}
	}
	after.Audit = slices.Clone(after.Audit[1:])
	if len(after.Audit) == 0 {
		after.Audit = nil
	}
	return after
}

// checkAllowed checks what an allowed call that needs more than OK did.
func checkAllowed(t *testing.T, b *testBundle, rpc string, c matrixCaller, f teamFixture, before state) {
	t.Helper()
	switch rpc {
	case "ReplayJobs":
		j := b.getJob(t, f.failed)
		if c.sees(f.team) {
			if j.GetPhase() != leaseholdv1.Phase_PHASE_QUEUED {
				t.Errorf("replayed job = %v, want QUEUED", j.GetPhase())
			}
			return
		}
		// Out of scope: counted, never touched.
		after := b.snapshot(t)
		if before.Jobs[f.failed] != after.Jobs[f.failed] {
			t.Errorf("an out-of-scope replay changed job %s", f.failed)
		}
	case "ListRejectedCompletions":
		resp, err := b.ops.ListRejectedCompletions(as(t, c.token), &leaseholdv1.ListRejectedCompletionsRequest{JobId: f.leased})
		if err != nil {
			t.Fatal(err)
		}
		want := 0
		if c.sees(f.team) {
			want = 1
		}
		if got := len(resp.GetRejections()); got != want {
			t.Errorf("rejections of %s listed = %d, want %d", f.leased, got, want)
		}
	case "GetAudit":
		resp, err := b.ops.GetAudit(as(t, c.token), &leaseholdv1.GetAuditRequest{})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range resp.GetRecords() {
			for _, team := range r.GetTeams() {
				if !c.sees(team) {
					t.Errorf("%s sees an audit record of team %s", c.name, team)
				}
			}
		}
	}
}
