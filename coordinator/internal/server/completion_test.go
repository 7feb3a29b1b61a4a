package server

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
)

// rejectedMetric reads leasehold_rejected_completions_total for reason.
func (b *testBundle) rejectedMetric(t *testing.T, reason string) float64 {
	t.Helper()
	mfs, err := b.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "leasehold_rejected_completions_total" {
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

// TestCompletionReplays checks that a completion already applied answers
// OK replayed whenever it is resent, and that a refusal is counted once in
// the metric, the listing and the job alike.
func TestCompletionReplays(t *testing.T) {
	t.Parallel()

	t.Run("An earlier attempt's applied failure resent after a later success answers OK replayed and records nothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		first := b.leaseOne(t)
		attempt1 := failure(first, leaseholdv1.FailureClass_FAILURE_CLASS_TRANSIENT)
		if _, err := b.rend.Complete(as(t, renderer), attempt1); err != nil {
			t.Fatal(err)
		}
		b.clock.Advance(11 * time.Second)
		if err := b.eng.Tick(context.Background()); err != nil {
			t.Fatal(err)
		}
		second := b.acquire(t, 1)[0]
		b.succeed(t, second, []byte("png"))
		before := b.getJob(t, first.GetJobId())

		resp, err := b.rend.Complete(as(t, renderer), attempt1)
		if err != nil {
			t.Fatalf("resending attempt 1's failure: %v, want OK replayed", err)
		}
		if !resp.GetReplayed() || resp.GetJob().GetPhase() != leaseholdv1.Phase_PHASE_SUCCEEDED {
			t.Errorf("answer = replayed %v, %v; want replayed, SUCCEEDED", resp.GetReplayed(), resp.GetJob().GetPhase())
		}
		sc := b.openSession(t, hello("r-1", "i-1", 1), 0)
		r := sc.call(&leaseholdv1.SessionRequest{Completions: []*leaseholdv1.SessionCompletion{
			failed(first, first.GetLease().GetToken(), leaseholdv1.FailureClass_FAILURE_CLASS_TRANSIENT),
		}}).GetResults()[0]
		if codes.Code(r.GetCode()) != codes.OK || !r.GetReplayed() {
			t.Errorf("session resend = %v, want OK replayed", r)
		}
		if after := b.getJob(t, first.GetJobId()); !proto.Equal(before, after) {
			t.Errorf("a replayed completion changed the job:\nbefore %v\nafter  %v", before, after)
		}
		if got := b.rejections(t); len(got) != 0 {
			t.Errorf("rejections = %v, want none", got)
		}
		for _, reason := range []string{"STALE_LEASE", "OUTCOME_MISMATCH", "NOT_LEASE_HOLDER"} {
			if got := b.rejectedMetric(t, reason); got != 0 {
				t.Errorf("rejected metric %s = %v, want 0", reason, got)
			}
		}
	})

	t.Run("A refusal sent again is counted once by the metric, the listing and the job", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		g := b.leaseOne(t)
		stale := failure(g, leaseholdv1.FailureClass_FAILURE_CLASS_TRANSIENT)
		stale.Token += 7
		for range 3 {
			_, err := b.rend.Complete(as(t, renderer), stale)
			wantError(t, err, codes.Aborted, "STALE_LEASE")
		}
		sc := b.openSession(t, hello("r-1", "i-1", 1), 0)
		r := sc.call(&leaseholdv1.SessionRequest{Completions: []*leaseholdv1.SessionCompletion{
			failed(g, stale.GetToken(), leaseholdv1.FailureClass_FAILURE_CLASS_TRANSIENT),
		}}).GetResults()[0]
		if codes.Code(r.GetCode()) != codes.Aborted || r.GetReason() != "STALE_LEASE" {
			t.Errorf("session resend = %v, want ABORTED STALE_LEASE", r)
		}
		listed := b.rejections(t)
		job := b.getJob(t, g.GetJobId())
		metric := b.rejectedMetric(t, "STALE_LEASE")
		if len(listed) != 1 || job.GetRejectedCompletions() != 1 || metric != 1 {
			t.Errorf("listed %d, job count %d, metric %v; want 1 each", len(listed), job.GetRejectedCompletions(), metric)
		}
		var events int
		for _, ev := range job.GetEvents() {
			if ev.GetKind() == leaseholdv1.EventKind_EVENT_KIND_COMPLETION_REJECTED {
				events++
			}
		}
		if events != 1 {
			t.Errorf("COMPLETION_REJECTED events = %d, want 1", events)
		}
	})
}

// TestAcquireStaysUnderTheResponseLimit grants documents of 250,000 bytes
// and checks that the reply fits the caller's limit, the default one
// included.
func TestAcquireStaysUnderTheResponseLimit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var docs []*leaseholdv1.Document
	for i := range 20 {
		docs = append(docs, &leaseholdv1.Document{Name: fmt.Sprintf("d%02d.pdf", i), Content: bytes.Repeat([]byte{'x'}, 250_000)})
	}
	b.submit(t, alpha, "alpha", "r", docs...)

	granted := 0
	for _, limit := range []uint32{0, 1 << 20} {
		want := int(limit)
		if want == 0 {
			want = 4 << 20
		}
		resp, err := b.rend.Acquire(as(t, renderer), &leaseholdv1.AcquireRequest{RendererId: "r-1", MaxLeases: 20, Capacity: 20, MaxResponseBytes: limit})
		if err != nil {
			t.Fatalf("Acquire with max_response_bytes %d: %v", limit, err)
		}
		if n := proto.Size(resp); n > want {
			t.Errorf("max_response_bytes %d: reply of %d bytes, over %d", limit, n, want)
		}
		if len(resp.GetLeases()) == 0 || (granted == 0 && len(resp.GetLeases()) == 20) {
			t.Errorf("max_response_bytes %d: %d leases of %d ready; want some, and not all 20 in 4 MiB", limit, len(resp.GetLeases()), 20-granted)
		}
		granted += len(resp.GetLeases())
	}
	_, err := b.rend.Acquire(as(t, renderer), &leaseholdv1.AcquireRequest{RendererId: "r-1", MaxLeases: 1, MaxResponseBytes: 200_000})
	wantError(t, err, codes.InvalidArgument, reasonMessageLimit)
}
