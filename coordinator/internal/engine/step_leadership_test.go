package engine

import (
	"errors"
	"testing"
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	"github.com/leasehold/leasehold/coordinator/internal/store"
)

// TestStepperLeadership drives writer terms from a Stepper, as the
// simulator's cluster mode does: a commit that loses leadership ends the
// term by itself, Demote ends it from outside, and Promote begins another
// over what the store holds.
func TestStepperLeadership(t *testing.T) {
	t.Parallel()

	steppedLosing := func(t *testing.T) (*testBundle, *Stepper, *losingCommitter) {
		t.Helper()
		b := newBundle(t.TempDir())
		lc := &losingCommitter{}
		b.cfg.Committer = lc
		return b, b.stepped(t), lc
	}

	t.Run("ACommitWhoseOutcomeIsUnknownEndsTheTermWithTheEvaluatedEvents", func(t *testing.T) {
		t.Parallel()
		b, s, lc := steppedLosing(t)
		s.Submit(SubmitRequest{Team: "alpha", RequestID: "r1", Docs: docs("a.pdf")})
		open := s.Open(SessionOpen{Renderer: rend("r-1"), Instance: "i-1", Capacity: 1, Credits: 1})
		step(t, s, 2)
		o, err := open.Result()
		if err != nil {
			t.Fatal(err)
		}
		if gs, _, _ := take(o.Conn); len(gs) != 1 {
			t.Fatalf("granted %d, want 1", len(gs))
		}
		if !b.e.Leading() {
			t.Fatal("a new stepper does not lead")
		}

		lc.arm(ErrOutcomeUnknown)
		lost := b.e.Lost()
		sub := s.Submit(SubmitRequest{Team: "alpha", RequestID: "r2", Docs: docs("b.pdf")})
		behind := s.Submit(SubmitRequest{Team: "alpha", RequestID: "r3", Docs: docs("c.pdf")})
		evs, err := s.Step(1)
		if !errors.Is(err, ErrOutcomeUnknown) {
			t.Fatalf("Step = %v, want ErrOutcomeUnknown", err)
		}
		if len(evs) != 1 || evs[0].Event.Kind != jobs.EventSubmitted {
			t.Errorf("events returned with the lost group = %+v, want its one SUBMITTED", evs)
		}
		if _, err := sub.Result(); !errors.Is(err, ErrOutcomeUnknown) {
			t.Errorf("the lost group's submit = %v, want ErrOutcomeUnknown", err)
		}
		if _, err := behind.Result(); !errors.Is(err, ErrNotLeader) {
			t.Errorf("a submit queued behind the lost group = %v, want ErrNotLeader", err)
		}
		waitClosed(t, lost, "Lost")
		if b.e.Leading() {
			t.Error("still leading after a lost commit")
		}
		if _, _, ended := take(o.Conn); !errors.Is(ended, ErrNotLeader) {
			t.Errorf("the session after the term ended: %v, want ErrNotLeader", ended)
		}
		late := s.Submit(SubmitRequest{Team: "alpha", RequestID: "r4", Docs: docs("d.pdf")})
		if !late.Done() {
			t.Fatal("a command to a stepper that does not lead was queued")
		}
		if _, err := late.Result(); !errors.Is(err, ErrNotLeader) {
			t.Errorf("a command to a stepper that does not lead = %v, want ErrNotLeader", err)
		}
		if _, err := s.Step(0); !errors.Is(err, ErrNotLeader) {
			t.Errorf("a step without a term = %v, want ErrNotLeader", err)
		}

		// Promoted again: the store's state, not the lost group's, and the
		// lease live with its TTL and the extension.
		lc.lose.Store(nil)
		const extend = 5 * time.Second
		if err := s.Promote(extend, time.Time{}); err != nil {
			t.Fatalf("Promote: %v", err)
		}
		if err := s.CheckIndexes(nil, nil); err != nil {
			t.Fatalf("after Promote: %v", err)
		}
		if _, err := b.e.Batch(2); !errors.Is(err, jobs.ErrNotFound) {
			t.Errorf("the lost group's batch: %v, want it absent", err)
		}
		b.clock.Advance(b.cfg.LeaseTTL + extend/2)
		if evs := step(t, s, 0); len(evs) != 0 {
			t.Fatalf("past the TTL, within the extension: events %+v, want none", evs)
		}
		b.clock.Advance(extend)
		// Not heard from since the promotion: re-queued uncounted.
		if evs := step(t, s, 0); len(evs) == 0 || evs[0].Event.Kind != jobs.EventRequeued || evs[0].Event.Reason != jobs.ReleaseNeverHeard {
			t.Fatalf("past the TTL and the extension: events %+v, want REQUEUED %s", evs, jobs.ReleaseNeverHeard)
		}
	})

	t.Run("DemoteAnswersWhatIsQueuedNotLeader", func(t *testing.T) {
		t.Parallel()
		b := newBundle(t.TempDir())
		s := b.stepped(t)
		sub := s.Submit(SubmitRequest{Team: "alpha", RequestID: "r1", Docs: docs("a.pdf")})
		s.Demote()
		if _, err := sub.Result(); !errors.Is(err, ErrNotLeader) {
			t.Errorf("a command queued at the demotion = %v, want ErrNotLeader", err)
		}
		if s.Queued() != 0 || b.e.Leading() {
			t.Errorf("after Demote: %d queued, leading %v; want none, false", s.Queued(), b.e.Leading())
		}
		if err := s.Promote(0, time.Time{}); err != nil {
			t.Fatal(err)
		}
		if err := s.Promote(0, time.Time{}); err == nil {
			t.Error("Promote while a term runs: no error")
		}
		again := s.Submit(SubmitRequest{Team: "alpha", RequestID: "r1", Docs: docs("a.pdf")})
		step(t, s, 1)
		if res, err := again.Result(); err != nil || res.Replayed {
			t.Errorf("the submit after promotion = %+v, %v; want it applied afresh", res, err)
		}
	})

	t.Run("AnAnnouncedLeaderIsStored", func(t *testing.T) {
		t.Parallel()
		b := newBundle(t.TempDir())
		s := b.stepped(t)
		p := s.Announce("n2", "10.0.0.2:7500")
		step(t, s, 1)
		if _, err := p.Result(); err != nil {
			t.Fatal(err)
		}
		var id, addr string
		if err := b.st.View(func(tx *store.Tx) error { id, addr = tx.Leader(); return nil }); err != nil {
			t.Fatal(err)
		}
		if id != "n2" || addr != "10.0.0.2:7500" {
			t.Errorf("announced leader %q %q, want n2 10.0.0.2:7500", id, addr)
		}
	})

	t.Run("APromotedStepperStampsNothingBeforeTheWallFloor", func(t *testing.T) {
		t.Parallel()
		b := newBundle(t.TempDir())
		s := b.stepped(t)
		s.Demote()
		floor := b.clock.Now().Add(time.Hour)
		if err := s.Promote(0, floor); err != nil {
			t.Fatal(err)
		}
		s.Submit(SubmitRequest{Team: "alpha", RequestID: "r1", Docs: docs("a.pdf")})
		evs := step(t, s, 1)
		if len(evs) != 1 || !evs[0].Event.At.After(floor) {
			t.Fatalf("events %+v after a promotion with the floor %v; want one stamped after it", evs, floor)
		}
		if j := b.job(t, 1); !j.CreatedAt.After(floor) {
			t.Errorf("a job created after a promotion with the floor %v was stamped %v", floor, j.CreatedAt)
		}
	})
}
