package engine

import (
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	"github.com/leasehold/leasehold/coordinator/internal/store"
	"github.com/leasehold/leasehold/coordinator/internal/watch"
)

// stepped opens a store and an engine over the bundle's directory, not
// started, and a stepper over it; both are closed when the test ends.
func (b *testBundle) stepped(t *testing.T) *Stepper {
	t.Helper()
	st, err := store.Open(filepath.Join(b.dir, "leasehold.db"))
	if err != nil {
		t.Fatalf("store.Open: %v", err)
	}
	cfg := b.cfg
	cfg.Store = st
	e, err := New(cfg)
	if err != nil {
		st.Close()
		t.Fatalf("New: %v", err)
	}
	b.e, b.st = e, st
	t.Cleanup(b.close)
	s, err := NewStepper(e)
	if err != nil {
		t.Fatalf("NewStepper: %v", err)
	}
	return s
}

// step runs one group of up to n queued commands and fails the test on an
// error.
func step(t *testing.T, s *Stepper, n int) []watch.JobEvent {
	t.Helper()
	evs, err := s.Step(n)
	if err != nil {
		t.Fatalf("Step(%d): %v", n, err)
	}
	if err := s.CheckIndexes(nil, nil); err != nil {
		t.Fatalf("after Step(%d): %v", n, err)
	}
	return evs
}

func TestStepper(t *testing.T) {
	t.Parallel()

	t.Run("StepAppliesTheQueuedCommandsItIsGivenInOrder", func(t *testing.T) {
		t.Parallel()
		b := newBundle(t.TempDir())
		s := b.stepped(t)
		sub := s.Submit(SubmitRequest{Team: "alpha", RequestID: "r1", Docs: docs("a.pdf")})
		acq := stepAcquire(s, acquireRequest{Renderer: rend("r-1"), Max: 1, Capacity: 1})
		if s.Queued() != 2 || sub.Done() || acq.Done() {
			t.Fatalf("queued %d, answered %v %v; want 2 queued, none answered", s.Queued(), sub.Done(), acq.Done())
		}
		if _, err := acq.Result(); !errors.Is(err, ErrNotAnswered) {
			t.Errorf("Result before the step = %v, want ErrNotAnswered", err)
		}
		evs := step(t, s, 1)
		if !sub.Done() || acq.Done() || s.Queued() != 1 {
			t.Fatalf("after one command: answered %v %v, queued %d", sub.Done(), acq.Done(), s.Queued())
		}
		if len(evs) != 1 || evs[0].Event.Kind != jobs.EventSubmitted {
			t.Errorf("events of the submit's group = %+v, want one SUBMITTED", evs)
		}
		res, err := sub.Result()
		if err != nil || res.Batch.Batch.Count != 1 {
			t.Fatalf("Submit = %+v, %v", res, err)
		}
		evs = step(t, s, 5)
		got, err := acq.Result()
		if err != nil || len(got.Grants) != 1 || len(evs) != 1 || evs[0].Event.Kind != jobs.EventLeased {
			t.Fatalf("Acquire = %+v, %v with events %+v; want one grant, one LEASED", got, err, evs)
		}
	})

	t.Run("AnEmptyStepExpiresWhatIsDue", func(t *testing.T) {
		t.Parallel()
		b := newBundle(t.TempDir())
		s := b.stepped(t)
		s.Submit(SubmitRequest{Team: "alpha", RequestID: "r1", Docs: docs("a.pdf")})
		stepAcquire(s, acquireRequest{Renderer: rend("r-1"), Max: 1, Capacity: 1})
		step(t, s, 2)
		due, ok := s.NextTimer()
		if !ok || due != b.clock.Mono()+b.cfg.LeaseTTL {
			t.Fatalf("NextTimer = %v, %v; want the lease deadline %v", due, ok, b.clock.Mono()+b.cfg.LeaseTTL)
		}
		b.clock.Advance(b.cfg.LeaseTTL)
		evs := step(t, s, 0)
		if len(evs) == 0 || evs[0].Event.Kind != jobs.EventLeaseExpired {
			t.Fatalf("events of an empty step past the deadline = %+v, want LEASE_EXPIRED first", evs)
		}
	})

	t.Run("ACommandThatWaitedIsJudgedAtTheWritersClockOnBothClocks", func(t *testing.T) {
		t.Parallel()
		b := newBundle(t.TempDir())
		s := b.stepped(t)
		s.Submit(SubmitRequest{Team: "alpha", RequestID: "r1", Docs: docs("a.pdf")})
		acq := stepAcquire(s, acquireRequest{Renderer: rend("r-1"), Max: 1, Capacity: 1})
		step(t, s, 2)
		res, _ := acq.Result()
		g := res.Grants[0].Job
		// The failure is sent now, and applied after a group judged 3 s
		// later: its retry time on the wall clock must be the one armed on
		// the monotonic clock (CheckIndexes in step compares them).
		fail := stepComplete(s, failure(g.ID, g.Lease.Token, "r-1", jobs.ClassTransient, "hiccup"))
		b.clock.Advance(3 * time.Second)
		step(t, s, 0)
		evs := step(t, s, 1)
		if _, err := fail.Result(); err != nil {
			t.Fatalf("Complete: %v", err)
		}
		if want := b.clock.Now(); len(evs) == 0 || !evs[0].Event.At.Equal(want) {
			t.Errorf("events %+v; want the failure recorded at the writer's clock %v", evs, want)
		}
	})

	t.Run("ReleaseHandsAnUndeliveredGrantBackToItsQueue", func(t *testing.T) {
		t.Parallel()
		b := newBundle(t.TempDir())
		s := b.stepped(t)
		s.Submit(SubmitRequest{Team: "alpha", RequestID: "r1", Docs: docs("a.pdf")})
		acq := stepAcquire(s, acquireRequest{Renderer: rend("r-1"), Max: 1, Capacity: 1})
		step(t, s, 2)
		res, err := acq.Result()
		if err != nil || len(res.Grants) != 1 {
			t.Fatalf("Acquire = %+v, %v; want one grant", res, err)
		}
		rel := stepRelease(s, "r-1", refs(res.Grants))
		evs := step(t, s, 1)
		if _, err := rel.Result(); err != nil {
			t.Fatalf("Release: %v", err)
		}
		if len(evs) != 1 || evs[0].Event.Kind != jobs.EventRequeued || evs[0].Event.Reason != jobs.ReleaseUndelivered {
			t.Fatalf("events of the release = %+v, want one REQUEUED %s", evs, jobs.ReleaseUndelivered)
		}
		if j := b.job(t, res.Grants[0].Job.ID); j.Phase != jobs.PhaseQueued || j.Attempt != 0 {
			t.Errorf("job after the release = %s attempt %d, want QUEUED, attempt 0", j.Phase, j.Attempt)
		}
	})

	t.Run("ALeaseTheStoreDisagreesWithFreesItsTeamsSlotWhenDue", func(t *testing.T) {
		t.Parallel()
		b := newBundle(t.TempDir())
		s := b.stepped(t)
		s.Submit(SubmitRequest{Team: "alpha", RequestID: "r1", Docs: docs("a.pdf")})
		stepAcquire(s, acquireRequest{Renderer: rend("r-1"), Max: 1, Capacity: 1})
		step(t, s, 2)
		if n := b.e.sched.InFlight("alpha"); n != 1 {
			t.Fatalf("alpha has %d leases in flight, want 1", n)
		}
		// The record stops being LEASED behind the writer's back: when the
		// lease falls due, Expire refuses it.
		err := b.st.Update(func(tx *store.Tx) error {
			j, _, err := tx.Job(1)
			if err != nil {
				return err
			}
			j.Phase = jobs.PhaseQueued
			return tx.PutJob(j)
		})
		if err != nil {
			t.Fatal(err)
		}
		b.clock.Advance(b.cfg.LeaseTTL)
		if _, err := s.Step(0); err != nil {
			t.Fatal(err)
		}
		if _, leased := b.e.leases[1]; leased {
			t.Errorf("job 1 is still in the lease index")
		}
		if n := b.e.sched.InFlight("alpha"); n != 0 {
			t.Errorf("alpha has %d leases in flight after its only lease left the index, want 0", n)
		}
	})

	t.Run("AFailedCommitAnswersEveryQueuedCommand", func(t *testing.T) {
		t.Parallel()
		b := newBundle(t.TempDir())
		st, err := store.Open(filepath.Join(b.dir, "leasehold.db"), store.WithFault(func(string) error { return store.ErrInjected }))
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		cfg := b.cfg
		cfg.Store = st
		e, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer e.Stop()
		s, err := NewStepper(e)
		if err != nil {
			t.Fatal(err)
		}
		first := s.Submit(SubmitRequest{Team: "alpha", RequestID: "r1", Docs: docs("a.pdf")})
		second := s.Submit(SubmitRequest{Team: "alpha", RequestID: "r2", Docs: docs("b.pdf")})
		if _, err := s.Step(1); !errors.Is(err, store.ErrInjected) {
			t.Fatalf("Step = %v, want the injected fault", err)
		}
		for _, p := range []*Pending[SubmitResult]{first, second} {
			if _, err := p.Result(); !errors.Is(err, ErrStorageFailed) {
				t.Errorf("answer after a failed commit = %v, want ErrStorageFailed", err)
			}
		}
		if _, err := s.Step(0); !errors.Is(err, ErrStorageFailed) {
			t.Errorf("a step after a failed commit = %v, want ErrStorageFailed", err)
		}
	})

	t.Run("AStartedEngineHasNoStepper", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		if _, err := NewStepper(b.e); !errors.Is(err, ErrEngineStarted) {
			t.Errorf("NewStepper of a started engine = %v, want ErrEngineStarted", err)
		}
	})
}
