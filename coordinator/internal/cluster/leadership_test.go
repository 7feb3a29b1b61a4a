package cluster

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/hashicorp/raft"
)

// fakeRaft is consensus as the leadership sees it (Raft), driven by the
// test: it says who leads, delivers leadership notifications on an
// unbuffered channel, so that a send completes only once the leadership
// reads it, and holds every barrier until the test releases it.
type fakeRaft struct {
	mu      sync.Mutex
	leading bool
	// barrier, when set, holds barriers until it is closed; barrierErr
	// is what they then return.
	barrier    chan struct{}
	barrierErr error
	barriers   int
	// verifyErr is what a quorum round answers (VerifyLeader).
	verifyErr error

	leaderC   chan bool
	observedC chan struct{}
	muted     bool
	handOffs  int
}

func newFakeRaft() *fakeRaft {
	return &fakeRaft{leaderC: make(chan bool), observedC: make(chan struct{}, 1)}
}

func (r *fakeRaft) setLeading(leading bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.leading = leading
}

func (r *fakeRaft) Apply([]byte, time.Duration) (any, error) { return nil, raft.ErrNotLeader }

func (r *fakeRaft) Barrier(time.Duration) error {
	r.mu.Lock()
	r.barriers++
	hold, err := r.barrier, r.barrierErr
	r.mu.Unlock()
	if hold != nil {
		<-hold
	}
	return err
}

func (r *fakeRaft) VerifyLeader(context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.verifyErr
}

func (r *fakeRaft) IsLeader() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.leading
}

func (r *fakeRaft) Leader() (string, string) {
	if r.IsLeader() {
		return "n1", "n1:7070"
	}
	return "", ""
}

func (r *fakeRaft) Mute(on bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.muted = on
}

func (r *fakeRaft) HandOff() (string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.handOffs++
	return "n2", nil
}

func (r *fakeRaft) isMuted() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.muted
}

func (r *fakeRaft) Term() uint64                    { return 1 }
func (r *fakeRaft) LeaderChanges() <-chan bool      { return r.leaderC }
func (r *fakeRaft) LeaderObserved() <-chan struct{} { return r.observedC }

func (r *fakeRaft) barrierCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.barriers
}

// fakeEngine counts promotions and demotions; lose ends its term as a
// commit that lost leadership does.
type fakeEngine struct {
	mu                sync.Mutex
	lostC             chan struct{}
	promoted, demoted int
	log               []string
	// hold, when set, holds Promote until it is closed.
	hold chan struct{}
	// busySince is when the group the writer waits on began; zero while
	// it waits for work.
	busySince time.Time
}

func (e *fakeEngine) Busy() time.Duration {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.busySince.IsZero() {
		return 0
	}
	return time.Since(e.busySince)
}

// setBusy starts (or ends) a group whose commit does not return.
func (e *fakeEngine) setBusy(busy bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.busySince = time.Time{}
	if busy {
		e.busySince = time.Now()
	}
}

func (e *fakeEngine) Promote(time.Duration, time.Time) error {
	e.mu.Lock()
	hold := e.hold
	e.mu.Unlock()
	if hold != nil {
		<-hold
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.promoted++
	e.lostC = make(chan struct{})
	e.log = append(e.log, "promote")
	return nil
}

func (e *fakeEngine) Demote() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.demoted++
	e.lostC = nil
	e.log = append(e.log, "demote")
}

func (e *fakeEngine) Leading() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.lostC != nil
}

func (e *fakeEngine) Lost() <-chan struct{} {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.lostC
}

func (e *fakeEngine) Announce(context.Context, string, string) error { return nil }

func (e *fakeEngine) lose() {
	e.mu.Lock()
	defer e.mu.Unlock()
	close(e.lostC)
}

func (e *fakeEngine) seen() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.log)
}

func (e *fakeEngine) counts() (promoted, demoted int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.promoted, e.demoted
}

// fakeHealth records the Leader entry.
type fakeHealth struct {
	mu      sync.Mutex
	leading bool
}

func (h *fakeHealth) SetLeading(leading bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.leading = leading
}

func (h *fakeHealth) SetLeaderKnown(bool) {}

func (h *fakeHealth) isLeading() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.leading
}

type fakeState struct{}

func (fakeState) Applied() uint64                   { return 0 }
func (fakeState) WallFloor() time.Time              { return time.Time{} }
func (fakeState) AnnouncedLeader() (string, string) { return "", "" }
func (fakeState) Lead()                             {}
func (fakeState) Follow()                           {}

// following starts a leadership over r that follows with a fake engine
// and health; it stops following when the test ends.
func following(t *testing.T, r *fakeRaft) (*fakeEngine, *fakeHealth) {
	l := &leadership{raft: r, state: fakeState{}, log: slog.New(slog.DiscardHandler), id: "n1", advertise: "n1:7070",
		extend: time.Second, repromote: 500 * time.Millisecond, stuckAfter: time.Second}
	eng, health := &fakeEngine{}, &fakeHealth{}
	l.follow(eng, health)
	t.Cleanup(l.stopFollowing)
	return eng, health
}

// leading has r tell the leadership that this node leads, and waits for
// what follows.
func leading(r *fakeRaft) {
	r.setLeading(true)
	notify(r, true)
	synctest.Wait()
}

// notify delivers a leadership notification, and reports whether the
// leadership was there to read it: raft's own send blocks until it is.
func notify(r *fakeRaft, leading bool) bool {
	synctest.Wait()
	select {
	case r.leaderC <- leading:
		return true
	default:
		return false
	}
}

func TestLeadership(t *testing.T) {
	t.Run("RaftsNotificationsAreReadWhileTheBarrierWaits", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			r := newFakeRaft()
			hold := make(chan struct{})
			r.barrier, r.barrierErr = hold, raft.ErrLeadershipLost
			eng, health := following(t, r)
			r.setLeading(true)
			if !notify(r, true) {
				t.Fatal("the leadership did not read raft's first notification")
			}
			synctest.Wait()
			if r.barrierCount() != 1 {
				t.Fatalf("%d barriers, want the promotion's one", r.barrierCount())
			}
			// raft steps down, and back up, with the barrier still waiting:
			// each notification is read at once.
			r.setLeading(false)
			if !notify(r, false) {
				t.Fatal("raft blocked on its notification of a lost leadership while the barrier waited")
			}
			synctest.Wait()
			if promoted, demoted := eng.counts(); promoted != 0 || demoted != 2 {
				t.Errorf("promoted %d, demoted %d; want 0 and 2 (at start and at the loss)", promoted, demoted)
			}
			r.setLeading(true)
			if !notify(r, true) {
				t.Fatal("raft blocked on its notification of a new leadership")
			}
			close(hold)
			r.mu.Lock()
			r.barrier, r.barrierErr = nil, nil
			r.mu.Unlock()
			synctest.Wait()
			if promoted, _ := eng.counts(); promoted != 1 || !health.isLeading() {
				t.Errorf("promoted %d, Leader health %v; want the second leadership promoted once and SERVING", promoted, health.isLeading())
			}
		})
	})

	t.Run("LosingLeadershipWaitsForTheLeadersWorkBeforeDemoting", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			r := newFakeRaft()
			eng, health := following(t, r)
			hold := make(chan struct{})
			eng.hold = hold
			leading(r) // the promotion is held in the engine
			r.setLeading(false)
			if !notify(r, false) {
				t.Fatal("a lost leadership was not read")
			}
			synctest.Wait()
			if got, want := eng.seen(), []string{"demote"}; !slices.Equal(got, want) {
				t.Fatalf("engine saw %v while the promotion ran, want %v: demoted before the leader's work ended", got, want)
			}
			close(hold)
			synctest.Wait()
			if got, want := eng.seen(), []string{"demote", "promote", "demote"}; !slices.Equal(got, want) {
				t.Errorf("engine saw %v, want %v", got, want)
			}
			if health.isLeading() {
				t.Error("the Leader entry is SERVING after the leadership was lost")
			}
		})
	})

	t.Run("AWriterThatLostItsTermIsPromotedAgainWhileRaftLeads", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			r := newFakeRaft()
			eng, health := following(t, r)
			leading(r)
			eng.lose()
			synctest.Wait()
			if promoted, demoted := eng.counts(); promoted != 2 || demoted != 2 {
				t.Errorf("promoted %d, demoted %d; want 2 and 2 (a demotion and a promotion after the loss)", promoted, demoted)
			}
			if !health.isLeading() {
				t.Error("the Leader entry is NOT_SERVING after the writer was promoted again")
			}
		})
	})

	t.Run("AFailedPromotionIsTriedAgainAfterAnElectionTimeout", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			r := newFakeRaft()
			r.barrierErr = raft.ErrLeadershipTransferInProgress
			eng, _ := following(t, r)
			leading(r)
			start := time.Now()
			r.mu.Lock()
			r.barrierErr = nil
			r.mu.Unlock()
			time.Sleep(499 * time.Millisecond) // the fake clock of the bubble
			synctest.Wait()
			if promoted, _ := eng.counts(); promoted != 0 {
				t.Fatalf("promoted %d times before an election timeout passed", promoted)
			}
			time.Sleep(time.Millisecond)
			synctest.Wait()
			if promoted, _ := eng.counts(); promoted != 1 || r.barrierCount() != 2 {
				t.Errorf("after %v: promoted %d times with %d barriers, want once with 2", time.Since(start), promoted, r.barrierCount())
			}
		})
	})

	t.Run("NoPromotionOnceRaftHasSteppedDown", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			r := newFakeRaft()
			eng, _ := following(t, r)
			notify(r, true) // raft stepped down before the leadership read it
			synctest.Wait()
			if promoted, _ := eng.counts(); promoted != 0 || r.barrierCount() != 0 {
				t.Errorf("promoted %d times with %d barriers, want none", promoted, r.barrierCount())
			}
			if !notify(r, false) {
				t.Fatal("the notification that follows was not read")
			}
		})
	})
}

// TestLeaderThatCannotCommitStepsDown ensures a leader whose writer has
// waited for one group's commit for longer than the stuck bound reports
// its Leader entry NOT_SERVING, mutes itself to its peers and hands off to
// a follower (raft's own loop may be the one blocked), not before; and is
// heard again once raft no longer leads here.
func TestLeaderThatCannotCommitStepsDown(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		r := newFakeRaft()
		eng, health := following(t, r)
		leading(r)
		if !health.isLeading() {
			t.Fatal("the Leader entry is not SERVING after the promotion")
		}
		eng.setBusy(true)
		time.Sleep(900 * time.Millisecond)
		synctest.Wait()
		if !health.isLeading() || r.isMuted() {
			t.Fatalf("after a commit held 0.9 s (bound 1 s): Leader SERVING %v, muted %v; want SERVING and heard", health.isLeading(), r.isMuted())
		}
		time.Sleep(300 * time.Millisecond)
		synctest.Wait()
		if health.isLeading() || !r.isMuted() {
			t.Fatalf("after a commit held 1.2 s (bound 1 s): Leader SERVING %v, muted %v; want NOT_SERVING and muted", health.isLeading(), r.isMuted())
		}
		r.mu.Lock()
		handOffs := r.handOffs
		r.mu.Unlock()
		if handOffs != 1 {
			t.Errorf("%d hand-offs to a follower, want 1", handOffs)
		}
		// raft steps down once it runs again; its notification follows.
		r.setLeading(false)
		time.Sleep(200 * time.Millisecond)
		synctest.Wait()
		if r.isMuted() {
			t.Error("still muted once raft no longer leads here")
		}
		if !notify(r, false) {
			t.Fatal("the leadership did not read raft's notification")
		}
		eng.setBusy(false)
	})
}
