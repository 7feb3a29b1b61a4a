package server

import (
	"testing"

	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"google.golang.org/grpc/codes"
)

// audit lists every audit record token may see.
func (b *testBundle) audit(t *testing.T, token string) []*leaseholdv1.AuditRecord {
	t.Helper()
	resp, err := b.ops.GetAudit(as(t, token), &leaseholdv1.GetAuditRequest{PageSize: 1000})
	if err != nil {
		t.Fatalf("GetAudit: %v", err)
	}
	return resp.GetRecords()
}

func TestAuditScope(t *testing.T) {
	t.Parallel()
	b := setup(t)
	alphaJobs := b.submit(t, alpha, "alpha", "a", doc("a.pdf"), doc("b.pdf")).GetJobIds()
	betaJobs := b.submit(t, beta, "beta", "b", doc("c.pdf"), doc("d.pdf")).GetJobIds()
	must := func(_ any, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(b.jobs.CancelJob(as(t, opAlpha), &leaseholdv1.CancelJobRequest{JobId: alphaJobs[0], Reason: "alpha cleanup"}))
	must(b.jobs.CancelJob(as(t, operator), &leaseholdv1.CancelJobRequest{JobId: betaJobs[0], Reason: "beta cleanup"}))
	_, err := b.jobs.CancelJob(as(t, opAlpha), &leaseholdv1.CancelJobRequest{JobId: betaJobs[1], Reason: "reaching out"})
	wantError(t, err, codes.NotFound, reasonJobNotFound)
	must(b.ops.PauseDispatch(as(t, operator), &leaseholdv1.PauseDispatchRequest{Reason: "rollout"}))
	must(b.ops.ResumeDispatch(as(t, operator), &leaseholdv1.ResumeDispatchRequest{Reason: "rollout done"}))
	// A replay touching both teams: fail one job of each permanently.
	for range 2 {
		g := b.acquire(t, 1)[0]
		must(b.rend.Complete(as(t, renderer), failure(g, leaseholdv1.FailureClass_FAILURE_CLASS_INVALID_DOCUMENT)))
	}
	must(b.ops.ReplayJobs(as(t, operator), &leaseholdv1.ReplayJobsRequest{JobIds: []string{alphaJobs[1], betaJobs[1]},
		IncludePermanent: true, RequestId: "both", Reason: "parser fixed"}))

	t.Run("The operator of every team sees every record", func(t *testing.T) {
		var got []string
		for _, r := range b.audit(t, operator) {
			got = append(got, r.GetAction())
		}
		want := []string{jobs.AuditReplay, jobs.AuditResume, jobs.AuditPause, jobs.AuditDenied, jobs.AuditCancelJob, jobs.AuditCancelJob}
		if diff := cmpDiff(want, got); diff != "" {
			t.Errorf("actions, newest first (-want +got):\n%s", diff)
		}
	})
	t.Run("The operator of alpha sees only records about alpha alone", func(t *testing.T) {
		got := b.audit(t, opAlpha)
		if len(got) != 1 {
			t.Fatalf("records = %v, want only the alpha cancel", got)
		}
		r := got[0]
		if r.GetAction() != jobs.AuditCancelJob || r.GetPrincipal() != "dev-operator-alpha" || len(r.GetTeams()) != 1 || r.GetTeams()[0] != "alpha" {
			t.Errorf("record = %v, want CANCEL_JOB of team alpha", r)
		}
		for _, r := range got {
			if contains(t, r, "beta") {
				t.Errorf("a record shown to the alpha operator mentions beta: %v", r)
			}
		}
	})
}

func TestReplayNeverQueuesAnUnsupportedFormat(t *testing.T) {
	t.Parallel()
	b := setup(t)
	batch := b.submit(t, alpha, "alpha", "r", &leaseholdv1.Document{Name: "m.docm", Content: []byte("macro")}, doc("b.pdf"))
	macro, pdf := batch.GetJobIds()[0], batch.GetJobIds()[1]
	g := b.acquire(t, 1)[0]
	if _, err := b.rend.Complete(as(t, renderer), failure(g, leaseholdv1.FailureClass_FAILURE_CLASS_UNSUPPORTED_FORMAT)); err != nil {
		t.Fatal(err)
	}
	items := func(resp *leaseholdv1.ReplayJobsResponse) map[string]string {
		out := map[string]string{}
		for _, it := range resp.GetItems() {
			out[it.GetJobId()] = it.GetAction().String() + " " + it.GetSkipReason()
		}
		return out
	}

	t.Run("Without include_permanent both are skipped as permanent failures", func(t *testing.T) {
		resp, err := b.ops.ReplayJobs(as(t, operator), &leaseholdv1.ReplayJobsRequest{BatchId: batch.GetId(), DryRun: true})
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]string{macro: "REPLAY_ACTION_SKIP PERMANENT_FAILURE", pdf: "REPLAY_ACTION_SKIP PERMANENT_FAILURE"}
		if diff := cmpDiff(want, items(resp)); diff != "" {
			t.Errorf("plan (-want +got):\n%s", diff)
		}
	})
	t.Run("With include_permanent the plan skips the known unsupported format", func(t *testing.T) {
		resp, err := b.ops.ReplayJobs(as(t, operator), &leaseholdv1.ReplayJobsRequest{BatchId: batch.GetId(), DryRun: true, IncludePermanent: true})
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]string{macro: "REPLAY_ACTION_SKIP UNSUPPORTED_FORMAT", pdf: "REPLAY_ACTION_REQUEUE "}
		if diff := cmpDiff(want, items(resp)); diff != "" {
			t.Errorf("plan (-want +got):\n%s", diff)
		}
	})
	t.Run("A real run with include_permanent leaves the unsupported document FAILED", func(t *testing.T) {
		resp, err := b.ops.ReplayJobs(as(t, operator), &leaseholdv1.ReplayJobsRequest{JobIds: []string{macro, pdf}, IncludePermanent: true,
			RequestId: "again", Reason: "renderer upgraded"})
		if err != nil {
			t.Fatal(err)
		}
		if resp.GetRequeued() != 1 || resp.GetSkipped() != 1 {
			t.Errorf("requeued %d skipped %d, want 1 and 1", resp.GetRequeued(), resp.GetSkipped())
		}
		if j := b.getJob(t, macro); j.GetPhase() != leaseholdv1.Phase_PHASE_FAILED || j.GetCycle() != 1 {
			t.Errorf("unsupported job = %v cycle %d, want FAILED cycle 1", j.GetPhase(), j.GetCycle())
		}
		if j := b.getJob(t, pdf); j.GetPhase() != leaseholdv1.Phase_PHASE_QUEUED {
			t.Errorf("pdf job = %v, want QUEUED", j.GetPhase())
		}
	})
}
