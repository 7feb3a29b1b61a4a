package server

import (
	"fmt"
	"testing"

	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
)

// TestCancelAuthorizationMatrix cancels, as every kind of caller, a job of
// the caller's own team and one of another team, both while queued and while
// running, and checks the answer and that a refused cancel changes nothing.
func TestCancelAuthorizationMatrix(t *testing.T) {
	t.Parallel()
	callers := []struct {
		name, token string
		// may reports whether the caller may cancel a job of team.
		may func(team string) bool
		// code and reason are the refusal for callers that may not: a job
		// the caller may not see is answered as one that does not exist.
		code   codes.Code
		reason string
	}{
		{"no token", "", func(string) bool { return false }, codes.Unauthenticated, reasonUnauthenticated},
		{"alpha submitter", alpha, func(team string) bool { return team == "alpha" }, codes.NotFound, reasonJobNotFound},
		{"beta submitter", beta, func(team string) bool { return team == "beta" }, codes.NotFound, reasonJobNotFound},
		{"renderer", renderer, func(string) bool { return false }, codes.NotFound, reasonJobNotFound},
		{"operator of every team", operator, func(string) bool { return true }, codes.NotFound, reasonJobNotFound},
		{"operator of alpha only", opAlpha, func(team string) bool { return team == "alpha" }, codes.NotFound, reasonJobNotFound},
	}
	for _, running := range []bool{false, true} {
		for _, team := range []string{"alpha", "beta"} {
			for _, c := range callers {
				state := "queued"
				if running {
					state = "running"
				}
				t.Run(fmt.Sprintf("%s cancels a %s %s job", c.name, state, team), func(t *testing.T) {
					t.Parallel()
					b := setup(t)
					owner := map[string]string{"alpha": alpha, "beta": beta}[team]
					jobID := b.submit(t, owner, team, "req", doc("a.pdf")).GetJobIds()[0]
					if running && len(b.acquire(t, 1)) != 1 {
						t.Fatal("no lease granted")
					}
					before, err := b.jobs.GetJob(as(t, operator), &leaseholdv1.GetJobRequest{JobId: jobID})
					if err != nil {
						t.Fatal(err)
					}
					resp, err := b.jobs.CancelJob(as(t, c.token), &leaseholdv1.CancelJobRequest{JobId: jobID, Reason: "matrix"})
					after, gerr := b.jobs.GetJob(as(t, operator), &leaseholdv1.GetJobRequest{JobId: jobID})
					if gerr != nil {
						t.Fatal(gerr)
					}
					if !c.may(team) {
						wantError(t, err, c.code, c.reason)
						if !proto.Equal(before.GetJob(), after.GetJob()) {
							t.Fatalf("a refused cancel changed the job:\nbefore %v\nafter  %v", before.GetJob(), after.GetJob())
						}
						return
					}
					if err != nil {
						t.Fatalf("CancelJob: %v, want OK", err)
					}
					if after.GetJob().GetPhase() != leaseholdv1.Phase_PHASE_CANCELLED {
						t.Fatalf("phase after cancel = %v, want CANCELLED", after.GetJob().GetPhase())
					}
					wantFrom := leaseholdv1.Phase_PHASE_QUEUED
					if running {
						wantFrom = leaseholdv1.Phase_PHASE_LEASED
						if resp.GetRunningRendererId() != "r-1" {
							t.Errorf("running_renderer_id = %q, want r-1", resp.GetRunningRendererId())
						}
					}
					if got := after.GetJob().GetCancellation().GetFromPhase(); got != wantFrom {
						t.Errorf("cancellation.from_phase = %v, want %v", got, wantFrom)
					}
				})
			}
		}
	}
}
