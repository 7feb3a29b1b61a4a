package engine

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/leasehold/leasehold/coordinator/internal/jobs"
)

// replayFixture is a store holding one job in each end state, for replay
// tests: team alpha has two exhausted failures, a document the renderer
// found invalid (a permanent failure), a format the coordinator knows is
// unsupported (failed at submission), a success and a cancellation; team
// beta has one exhausted failure.
type replayFixture struct {
	*testBundle
	alpha, beta jobs.Batch
	// id maps a document name to its job id.
	id map[string]uint64
	// maxToken is the largest token granted while building the fixture.
	maxToken uint64
}

func newReplayFixture(t *testing.T, mutate ...func(*Config)) *replayFixture {
	t.Helper()
	ctx := context.Background()
	f := &replayFixture{testBundle: setup(t, append([]func(*Config){func(c *Config) { c.Retry.MaxAttempts = 1 }}, mutate...)...), id: make(map[string]uint64)}
	f.alpha = f.submit(t, "alpha", "fixture-a", "f1.pdf", "f2.pdf", "perm.docm", "ok.pdf", "cancel.pdf", "bad.pdf")
	f.beta = f.submit(t, "beta", "fixture-b", "bf.pdf")
	for _, j := range f.allJobs(t) {
		f.id[j.Doc.Name] = j.ID
	}
	for _, g := range f.acquire(t, "r-1", 10) {
		tok := g.Job.Lease.Token
		f.maxToken = max(f.maxToken, tok)
		var err error
		switch g.Job.Doc.Name {
		case "ok.pdf":
			_, err = complete(ctx, f.e, success(g.Job.ID, tok, "r-1", "d"))
		case "cancel.pdf":
			_, err = f.e.Cancel(ctx, CancelRequest{Job: g.Job.ID, Principal: "alice"})
		case "bad.pdf":
			_, err = complete(ctx, f.e, failure(g.Job.ID, tok, "r-1", jobs.ClassInvalidDocument, "broken xref table"))
		default:
			_, err = complete(ctx, f.e, failure(g.Job.ID, tok, "r-1", jobs.ClassTransient, "renderer crashed"))
		}
		if err != nil {
			t.Fatalf("building the fixture: %s: %v", g.Job.Doc.Name, err)
		}
	}
	want := map[string]jobs.Phase{"f1.pdf": jobs.PhaseFailed, "f2.pdf": jobs.PhaseFailed, "perm.docm": jobs.PhaseFailed,
		"ok.pdf": jobs.PhaseSucceeded, "cancel.pdf": jobs.PhaseCancelled, "bf.pdf": jobs.PhaseFailed, "bad.pdf": jobs.PhaseFailed}
	for name, phase := range want {
		if j := f.job(t, f.id[name]); j.Phase != phase {
			t.Fatalf("fixture: %s is %v, want %v", name, j.Phase, phase)
		}
	}
	return f
}

func encodeReplay(r ReplayResult) []byte {
	return fmt.Appendf(nil, "requeued=%d skipped=%d out_of_scope=%d", r.Requeued, r.Skipped, r.OutOfScope)
}

func alphaOnly(team string) bool { return team == "alpha" }

// items summarises replay items as name -> skip reason ("" when re-queued).
func (f *replayFixture) items(res ReplayResult) map[string]string {
	names := make(map[uint64]string)
	for n, id := range f.id {
		names[id] = n
	}
	out := make(map[string]string)
	for _, it := range res.Items {
		name, ok := names[it.ID]
		if !ok {
			name = fmt.Sprintf("#%d", it.ID)
		}
		if it.Requeue {
			out[name] = ""
		} else {
			out[name] = it.SkipReason
		}
	}
	return out
}

func TestReplay(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("DryRunChangesNothing", func(t *testing.T) {
		t.Parallel()
		f := newReplayFixture(t)
		jobsBefore, auditBefore := f.allJobs(t), f.allAudit(t)
		req := ReplayRequest{Principal: "ops", RequestID: "req-1", Reason: "try", DryRun: true, InScope: alphaOnly, Encode: encodeReplay,
			JobIDs: []uint64{f.id["f1.pdf"], f.id["f2.pdf"], f.id["perm.docm"], f.id["ok.pdf"], f.id["cancel.pdf"], f.id["bf.pdf"]}}
		res, err := f.e.Replay(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if !res.DryRun || res.Requeued != 2 || res.Skipped != 4 || res.OutOfScope != 0 || res.AuditID != 0 || res.Previous != nil {
			t.Errorf("dry run = %+v, want 2 would be re-queued, 4 skipped (the job out of scope as not found), no audit", res)
		}
		if diff := cmp.Diff(jobsBefore, f.allJobs(t)); diff != "" {
			t.Errorf("dry run changed jobs:\n%s", diff)
		}
		if diff := cmp.Diff(auditBefore, f.allAudit(t)); diff != "" {
			t.Errorf("dry run changed the audit trail:\n%s", diff)
		}
		if got := f.acquireAll(t, "r-2"); len(got) != 0 {
			t.Errorf("dry run made %v dispatchable", got)
		}

		// A dry run does not take the request id: the real run still works.
		req.DryRun = false
		res, err = f.e.Replay(ctx, req)
		if err != nil || res.Previous != nil || res.Requeued != 2 {
			t.Errorf("real run after a dry run with the same request id = %+v, %v; want 2 re-queued", res, err)
		}
	})

	t.Run("RealRunRequeuesOnlyFailedInScopeJobsAndAuditsOnce", func(t *testing.T) {
		t.Parallel()
		f := newReplayFixture(t)
		jobsBefore := make(map[uint64]jobs.Job)
		for _, j := range f.allJobs(t) {
			jobsBefore[j.ID] = j
		}
		f.clock.Advance(time.Minute)
		res, err := f.e.Replay(ctx, ReplayRequest{Principal: "ops", RequestID: "req-1", Reason: "renderer fleet fixed", InScope: alphaOnly, Encode: encodeReplay,
			JobIDs: []uint64{f.id["f1.pdf"], f.id["f2.pdf"], f.id["perm.docm"], f.id["ok.pdf"], f.id["cancel.pdf"], f.id["bf.pdf"], 9999}})
		if err != nil {
			t.Fatal(err)
		}
		// bf.pdf is beta's: out of scope, it is listed exactly as an id that
		// does not exist.
		wantItems := map[string]string{"f1.pdf": "", "f2.pdf": "", "perm.docm": "PERMANENT_FAILURE", "ok.pdf": "NOT_FAILED",
			"cancel.pdf": "NOT_FAILED", "bf.pdf": "JOB_NOT_FOUND", "#9999": "JOB_NOT_FOUND"}
		if diff := cmp.Diff(wantItems, f.items(res)); diff != "" {
			t.Errorf("items (-want +got):\n%s", diff)
		}
		if res.Requeued != 2 || res.Skipped != 5 || res.OutOfScope != 0 || res.Selected != 7 || res.Truncated || res.AuditID == 0 {
			t.Errorf("replay = requeued %d skipped %d out of scope %d selected %d truncated %v audit %d; want 2, 5, 0, 7, false, set",
				res.Requeued, res.Skipped, res.OutOfScope, res.Selected, res.Truncated, res.AuditID)
		}

		audit := f.allAudit(t)
		if len(audit) != 1 {
			t.Fatalf("audit = %+v, want one record", audit)
		}
		wantAudit := jobs.AuditRecord{ID: res.AuditID, At: f.clock.Now(), Principal: "ops", Action: jobs.AuditReplay, Reason: "renderer fleet fixed",
			RequestID: "req-1", JobIDs: []uint64{f.id["f1.pdf"], f.id["f2.pdf"]}, Skipped: 5, Response: encodeReplay(res), Teams: []string{"alpha"}}
		if diff := cmp.Diff(wantAudit, audit[0]); diff != "" {
			t.Errorf("audit (-want +got):\n%s", diff)
		}

		for _, name := range []string{"f1.pdf", "f2.pdf"} {
			j := f.job(t, f.id[name])
			if j.Phase != jobs.PhaseQueued || j.Cycle != 2 || j.Attempt != 0 || j.TerminalReason != jobs.ReasonUnspecified {
				t.Errorf("%s = %v cycle %d attempt %d reason %v; want QUEUED, cycle 2, attempt 0, no reason", name, j.Phase, j.Cycle, j.Attempt, j.TerminalReason)
			}
			if last := j.History[len(j.History)-1]; last.Kind != jobs.EventReplayed || last.Principal != "ops" {
				t.Errorf("%s last event = %+v, want REPLAYED by ops", name, last)
			}
		}
		for _, name := range []string{"perm.docm", "ok.pdf", "cancel.pdf", "bf.pdf"} {
			if diff := cmp.Diff(jobsBefore[f.id[name]], f.job(t, f.id[name])); diff != "" {
				t.Errorf("%s changed:\n%s", name, diff)
			}
		}

		grants := f.acquire(t, "r-2", 10)
		if len(grants) != 2 {
			t.Fatalf("grants after replay = %d, want the 2 replayed jobs", len(grants))
		}
		for _, g := range grants {
			if g.Job.ID != f.id["f1.pdf"] && g.Job.ID != f.id["f2.pdf"] {
				t.Errorf("granted job %d, which was not replayed", g.Job.ID)
			}
			if g.Job.Lease.Token <= f.maxToken || g.Job.Attempt != 1 || g.Job.Cycle != 2 {
				t.Errorf("job %d granted with token %d attempt %d cycle %d; want token > %d, attempt 1, cycle 2",
					g.Job.ID, g.Job.Lease.Token, g.Job.Attempt, g.Job.Cycle, f.maxToken)
			}
		}

		// The same request id again, even with other parameters, answers
		// the first call's result and does nothing.
		jobsMid, auditMid := f.allJobs(t), f.allAudit(t)
		again, err := f.e.Replay(ctx, ReplayRequest{Principal: "ops", RequestID: "req-1", Reason: "again", InScope: alphaOnly, Encode: encodeReplay,
			IncludePermanent: true, JobIDs: []uint64{f.id["f1.pdf"], f.id["perm.docm"]}})
		if err != nil {
			t.Fatal(err)
		}
		if string(again.Previous) != string(encodeReplay(res)) || again.AuditID != res.AuditID || again.Requeued != 0 || len(again.Items) != 0 {
			t.Errorf("repeated request = %+v, want the previous answer %q and nothing done", again, encodeReplay(res))
		}
		if diff := cmp.Diff(jobsMid, f.allJobs(t)); diff != "" {
			t.Errorf("repeated request changed jobs:\n%s", diff)
		}
		if diff := cmp.Diff(auditMid, f.allAudit(t)); diff != "" {
			t.Errorf("repeated request changed the audit trail:\n%s", diff)
		}
	})

	t.Run("PermanentFailuresNeedIncludePermanent", func(t *testing.T) {
		t.Parallel()
		f := newReplayFixture(t)
		id := f.id["bad.pdf"]
		res, err := f.e.Replay(ctx, ReplayRequest{Principal: "ops", RequestID: "req-1", InScope: alphaOnly, JobIDs: []uint64{id}})
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(map[string]string{"bad.pdf": "PERMANENT_FAILURE"}, f.items(res)); diff != "" || res.Requeued != 0 {
			t.Fatalf("replay without IncludePermanent requeued %d, items (-want +got):\n%s", res.Requeued, diff)
		}
		res, err = f.e.Replay(ctx, ReplayRequest{Principal: "ops", RequestID: "req-2", InScope: alphaOnly, JobIDs: []uint64{id}, IncludePermanent: true})
		if err != nil {
			t.Fatal(err)
		}
		if res.Requeued != 1 || res.Skipped != 0 {
			t.Fatalf("replay with IncludePermanent = %+v, want 1 re-queued", res)
		}
		if j := f.job(t, id); j.Phase != jobs.PhaseQueued || j.Cycle != 2 {
			t.Errorf("bad.pdf = %v cycle %d, want QUEUED cycle 2", j.Phase, j.Cycle)
		}
		if audit := f.allAudit(t); len(audit) != 2 || !audit[0].IncludePermanent {
			t.Errorf("audit = %+v, want the second of two records with IncludePermanent", audit)
		}
	})

	t.Run("AFormatKnownUnsupportedIsNeverQueuedAgain", func(t *testing.T) {
		t.Parallel()
		f := newReplayFixture(t)
		id := f.id["perm.docm"]
		before := f.job(t, id)
		res, err := f.e.Replay(ctx, ReplayRequest{Principal: "ops", RequestID: "req-1", JobIDs: []uint64{id}, IncludePermanent: true})
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(map[string]string{"perm.docm": "UNSUPPORTED_FORMAT"}, f.items(res)); diff != "" || res.Requeued != 0 {
			t.Errorf("replay of a known unsupported format requeued %d, items (-want +got):\n%s", res.Requeued, diff)
		}
		if diff := cmp.Diff(before, f.job(t, id)); diff != "" {
			t.Errorf("replay changed the job:\n%s", diff)
		}
	})

	t.Run("ReplayLimitCutsALargerSelection", func(t *testing.T) {
		t.Parallel()
		b := setup(t, func(c *Config) { c.Retry.MaxAttempts = 1; c.ReplayLimit = 2 })
		batch := b.submit(t, "alpha", "r1", "a.pdf", "b.pdf", "c.pdf")
		for _, g := range b.acquire(t, "r-1", 10) {
			if _, err := complete(ctx, b.e, failure(g.Job.ID, g.Job.Lease.Token, "r-1", jobs.ClassTransient, "crash")); err != nil {
				t.Fatal(err)
			}
		}
		for _, dry := range []bool{true, false} {
			res, err := b.e.Replay(ctx, ReplayRequest{Principal: "ops", RequestID: "limit", Batch: batch.ID, DryRun: dry})
			if err != nil {
				t.Fatal(err)
			}
			if res.Selected != 3 || res.Limit != 2 || !res.Truncated || res.Requeued != 2 || len(res.Items) != 2 {
				t.Errorf("dry run %v: replay = selected %d limit %d truncated %v requeued %d items %d; want 3, 2, true, 2, 2",
					dry, res.Selected, res.Limit, res.Truncated, res.Requeued, len(res.Items))
			}
		}
		phases := make(map[jobs.Phase]int)
		for _, j := range b.allJobs(t) {
			phases[j.Phase]++
		}
		if diff := cmp.Diff(map[jobs.Phase]int{jobs.PhaseQueued: 2, jobs.PhaseFailed: 1}, phases); diff != "" {
			t.Errorf("phases after a truncated replay (-want +got):\n%s", diff)
		}
	})

	t.Run("CancelledAndSucceededJobsAreNeverReplayed", func(t *testing.T) {
		t.Parallel()
		f := newReplayFixture(t)
		before := f.allJobs(t)
		for i, req := range []ReplayRequest{
			{Batch: f.alpha.ID, IncludePermanent: true},
			{JobIDs: []uint64{f.id["ok.pdf"], f.id["cancel.pdf"]}, IncludePermanent: true},
		} {
			req.Principal, req.RequestID = "ops", fmt.Sprintf("req-%d", i)
			if _, err := f.e.Replay(ctx, req); err != nil {
				t.Fatal(err)
			}
		}
		for _, j := range f.allJobs(t) {
			if j.Doc.Name != "ok.pdf" && j.Doc.Name != "cancel.pdf" {
				continue
			}
			for _, old := range before {
				if old.ID == j.ID {
					if diff := cmp.Diff(old, j); diff != "" {
						t.Errorf("%s changed by replay:\n%s", j.Doc.Name, diff)
					}
				}
			}
		}
		granted := f.acquireAll(t, "r-2")
		assertNotGranted(t, granted, f.id["ok.pdf"], f.id["cancel.pdf"])
		if len(granted) != 3 {
			t.Errorf("granted %v, want alpha's three failed jobs", granted)
		}
	})

	t.Run("BatchSelectionFiltersByTerminalReason", func(t *testing.T) {
		t.Parallel()
		f := newReplayFixture(t)
		res, err := f.e.Replay(ctx, ReplayRequest{Principal: "ops", RequestID: "by-reason", Batch: f.alpha.ID,
			TerminalReason: jobs.ReasonInvalidDocument, IncludePermanent: true})
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(map[string]string{"bad.pdf": ""}, f.items(res)); diff != "" {
			t.Errorf("items (-want +got):\n%s", diff)
		}
	})
}

func TestReplayIdempotencyAndBounds(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("ARequestIDOfAnotherPrincipalDoesNotAnswerWithItsReplay", func(t *testing.T) {
		t.Parallel()
		f := newReplayFixture(t)
		first, err := f.e.Replay(ctx, ReplayRequest{Principal: "ops-alpha", RequestID: "replay-1", Reason: "fixed", InScope: alphaOnly,
			Encode: encodeReplay, JobIDs: []uint64{f.id["f1.pdf"], f.id["f2.pdf"]}})
		if err != nil || first.Requeued != 2 {
			t.Fatalf("alpha's replay = %+v, %v; want 2 re-queued", first, err)
		}
		betaOnly := func(team string) bool { return team == "beta" }
		res, err := f.e.Replay(ctx, ReplayRequest{Principal: "ops-beta", RequestID: "replay-1", Reason: "fixed", InScope: betaOnly,
			Encode: encodeReplay, JobIDs: []uint64{f.id["bf.pdf"]}})
		if err != nil {
			// Refusing the reused request id is an acceptable answer.
			return
		}
		if res.Previous != nil || res.AuditID == first.AuditID {
			t.Errorf("ops-beta got ops-alpha's stored answer %q (audit %d), which lists jobs outside its scope", res.Previous, res.AuditID)
		}
		if p := f.job(t, f.id["bf.pdf"]).Phase; p != jobs.PhaseQueued {
			t.Errorf("beta's failed job = %v after its own replay, want QUEUED", p)
		}
	})

	t.Run("ABatchReplayReachesRetryableFailuresBehindPermanentOnes", func(t *testing.T) {
		t.Parallel()
		b := setup(t, func(c *Config) { c.Retry.MaxAttempts = 1; c.ReplayLimit = 2 })
		batch := b.submit(t, "alpha", "r1", "x.docm", "y.docm", "t.pdf")
		ids := batch.JobIDs()
		g := b.acquire(t, "r-1", 10)
		if len(g) != 1 || g[0].Job.ID != ids[2] {
			t.Fatalf("grants = %+v, want only t.pdf", g)
		}
		if _, err := complete(ctx, b.e, failure(ids[2], g[0].Job.Lease.Token, "r-1", jobs.ClassTransient, "crash")); err != nil {
			t.Fatal(err)
		}
		// Permanent failures are skipped, not touched, so they must not use
		// up the bound: otherwise no replay of this batch ever reaches t.pdf.
		for i := range 2 {
			res, err := b.e.Replay(ctx, ReplayRequest{Principal: "ops", RequestID: fmt.Sprintf("req-%d", i), Reason: "fixed", Batch: batch.ID})
			if err != nil {
				t.Fatal(err)
			}
			if res.Requeued == 1 {
				break
			}
			t.Logf("replay %d: requeued %d, skipped %d, truncated %v", i+1, res.Requeued, res.Skipped, res.Truncated)
		}
		if p := b.job(t, ids[2]).Phase; p != jobs.PhaseQueued {
			t.Errorf("t.pdf = %v after replaying its batch, want QUEUED", p)
		}
	})
}
