package cluster

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/mutation"

	"github.com/leasehold/leasehold/coordinator/internal/engine"
)

// Engine is what the leadership needs of the writer (*engine.Engine).
type Engine interface {
	// Promote makes the engine the leader's writer over what the store
	// holds, giving every live lease extend on top of its TTL and
	// stamping nothing before wallFloor; Demote ends its writer term.
	Promote(extend time.Duration, wallFloor time.Time) error
	Demote()
	// Leading reports whether a writer term runs; Lost is closed when the
	// current one ended by itself, because a commit lost leadership.
	Leading() bool
	Lost() <-chan struct{}
	// Busy is how long the writer has been on its current group, waiting
	// for its commit; 0 while it waits for work.
	Busy() time.Duration
	// Announce records through the writer that this node (id, at the gRPC
	// address addr) leads.
	Announce(ctx context.Context, id, addr string) error
}

var _ Engine = (*engine.Engine)(nil)

// Health is where the leadership reports to the health service.
type Health interface {
	// SetLeading reports that this node's writer leads (the Leader entry
	// SERVING), or no longer does.
	SetLeading(leading bool)
	// SetLeaderKnown reports whether this node knows a leader: a node
	// that is part of a cluster with a leader serves.
	SetLeaderKnown(known bool)
}

// appliedState is what the leadership reads of this node's applied log
// (the FSM).
type appliedState interface {
	// Applied is the index of the last entry applied; WallFloor the
	// largest group wall clock applied.
	Applied() uint64
	WallFloor() time.Time
	// AnnouncedLeader is the leader last announced in the log (Announce).
	AnnouncedLeader() (id, addr string)
	// Lead commits what the state machine holds uncommitted and keeps
	// nothing uncommitted until Follow: the writer's own write
	// transaction must find the store's free.
	Lead()
	Follow()
}

// leadership promotes and demotes the writer as raft's leadership comes
// and goes. One goroutine reads raft's notifications (follow), which
// raft blocks on, so it never waits for raft itself: when this node
// gains leadership it starts the leader's work on a goroutine of its own,
// one per leadership (lead), with a stop channel, as Nomad's leaderLoop
// does; when it loses it, it closes the channel, waits for that goroutine
// and demotes the writer.
type leadership struct {
	raft   Raft
	state  appliedState
	eng    Engine
	health Health
	log    *slog.Logger
	// id is this node's; advertise its gRPC address, announced when it
	// leads.
	id, advertise string
	// extend is the lease extension of a promotion.
	extend time.Duration
	// repromote is how long a leader whose writer is down waits before
	// it tries again to promote it (an election timeout).
	repromote time.Duration
	// stuckAfter is how long the writer may wait for one group's commit
	// before this node, leading, steps down (watchCommits); 0 never.
	stuckAfter time.Duration
	metrics    *Metrics

	done     chan struct{}
	stopOnce sync.Once
	followed sync.WaitGroup
}

// handOverTimeout bounds the leadership transfer of a leader that stops.
const handOverTimeout = 3 * time.Second

// errStopped ends a wait of the leader's work when its leadership ends.
var errStopped = errors.New("leadership ended")

// follow starts following raft's leadership with eng and health.
func (l *leadership) follow(eng Engine, health Health) {
	l.eng, l.health, l.done = eng, health, make(chan struct{})
	l.eng.Demote() // a follower until raft says otherwise
	l.setLeaderKnown()
	l.followed.Add(1)
	go l.run()
}

// stopFollowing stops the follow goroutine and waits for it (and for
// the leader's work, if it runs). It is safe to call twice.
func (l *leadership) stopFollowing() {
	if l.done == nil {
		return
	}
	l.stopOnce.Do(func() { close(l.done) })
	l.followed.Wait()
}

// run reads raft's leadership notifications and the leader observations
// until stopFollowing: it starts the leader's work when this node gains
// leadership, and when it loses it, ends that work, then demotes the
// writer.
func (l *leadership) run() {
	defer l.followed.Done()
	var work *leaderWork
	defer func() { work.end() }()
	for {
		select {
		case <-l.done:
			return
		case leading := <-l.raft.LeaderChanges():
			if leading {
				if work == nil {
					work = l.startLeading()
				}
				continue
			}
			work.end()
			work = nil
			l.demote()
		case <-l.raft.LeaderObserved():
			l.setLeaderKnown()
		}
	}
}

// leaderWork is the leader's goroutine of one leadership (lead).
type leaderWork struct {
	stop, done chan struct{}
}

// startLeading starts the leader's work of a new leadership: its
// promotions (lead) and the watch over its commits (watchCommits).
func (l *leadership) startLeading() *leaderWork {
	w := &leaderWork{stop: make(chan struct{}), done: make(chan struct{})}
	var wg sync.WaitGroup
	wg.Go(func() { l.lead(w.stop) })
	wg.Go(func() { l.watchCommits(w.stop) })
	go func() {
		wg.Wait()
		close(w.done)
	}()
	return w
}

// end stops the leader's work and waits for it; w may be nil.
func (w *leaderWork) end() {
	if w != nil {
		close(w.stop)
		<-w.done
	}
}

// lead is the leader's work for one leadership, until stop: it promotes
// the writer, and promotes it again whenever the writer stepped down by
// itself while raft still says this node leads (a commit lost leadership
// in a term raft kept). A promotion that fails while raft says this node
// leads (its barrier refused during a leadership transfer, which may then
// fail and leave this node the leader, with no change for raft to tell)
// is tried again after an election timeout.
func (l *leadership) lead(stop <-chan struct{}) {
	for {
		if !l.raft.IsLeader() {
			// raft has stepped down: its notification, and stop, follow.
			<-stop
			return
		}
		if !l.promote(stop) {
			t := time.NewTimer(l.repromote)
			select {
			case <-stop:
				t.Stop()
				return
			case <-t.C:
			}
			continue
		}
		select {
		case <-stop:
			return
		case <-l.eng.Lost():
			l.demote()
		}
	}
}

// watchCommits steps this node down when, leading, its writer has waited
// for one group's commit for longer than stuckAfter: a frozen disk under
// its store or its raft log, a log that stores nothing. Either is the same
// failure: the group's commit is the raft log's append and fsync here, a
// quorum's, and the apply to the store here.
//
// raft cannot be asked to step down: its own leader loop may be the thing
// blocked (in the log's append), so neither a leadership transfer nor its
// leader lease check runs, while its heartbeats, sent from goroutines of
// their own, keep the followers from electing another leader. So the node
// reports its Leader health entry NOT_SERVING at once (clients and
// renderers leave it), mutes itself (every request raft sends to a peer
// fails unsent, so that it commits nothing more and its heartbeats stop),
// and hands off: it tells the follower most up to date with its log to
// stand for election at once (HandOff). Should that fail, the followers
// elect a leader after their heartbeat timeout all the same. raft here,
// once it runs again, finds that no follower answered within its leader
// lease (or hears of the later term) and steps down, and its writer's
// commands are answered NOT_LEADER or OUTCOME_UNKNOWN. The node is heard
// again once raft no longer leads here. Nothing it acknowledged
// is lost: it acknowledges only what a quorum committed, and a muted node
// commits nothing more.
func (l *leadership) watchCommits(stop <-chan struct{}) {
	if l.stuckAfter <= 0 {
		return
	}
	tick := time.NewTicker(max(l.stuckAfter/10, time.Millisecond))
	defer tick.Stop()
	muted := false
	defer func() {
		if muted {
			l.unmute()
		}
	}()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		switch busy := l.eng.Busy(); {
		case muted && !l.raft.IsLeader():
			l.unmute()
			muted = false
		case !muted && busy > l.stuckAfter && l.raft.IsLeader():
			l.health.SetLeading(false)
			l.raft.Mute(true)
			muted = true
			l.metrics.observeStuck()
			to, err := l.raft.HandOff()
			l.log.Error("leader cannot commit: stepping down", "waited", busy.Round(time.Millisecond),
				"bound", l.stuckAfter, "node", l.id, "term", l.raft.Term(), "handed_to", to, "hand_off_err", err)
		}
	}
}

// unmute lets the node speak to its peers again, once it no longer leads.
func (l *leadership) unmute() {
	l.raft.Mute(false)
	l.log.Info("stepped down after it could not commit; heard by its peers again", "node", l.id)
}

// promote makes the engine the writer once every entry of earlier terms
// is applied, then tells clients (the Leader health entry) and followers
// (the announced leader). It reports whether the writer leads.
func (l *leadership) promote(stop <-chan struct{}) bool {
	start := time.Now()
	if err := l.barrier(stop); err != nil {
		if !errors.Is(err, errStopped) {
			l.log.Warn("leadership gained, but the barrier failed; waiting for the next change", "err", err)
		}
		return false
	}
	l.state.Lead()
	extend := l.extend
	if mutation.On(mutation.PromoteNoExtend) {
		extend = 0
	}
	if err := l.eng.Promote(extend, l.state.WallFloor()); err != nil {
		l.log.Error("promoting the writer", "err", err)
		return false
	}
	l.health.SetLeading(true)
	l.setLeaderKnown()
	l.log.Info("leading", "node", l.id, "term", l.raft.Term(), "took", time.Since(start))
	ctx, cancel := context.WithTimeout(context.Background(), DefaultBarrierTimeout)
	defer cancel()
	if err := until(stop, func() error { return l.eng.Announce(ctx, l.id, l.advertise) }); err != nil {
		if !errors.Is(err, errStopped) {
			l.log.Warn("announcing this node as the leader", "err", err)
		}
	}
	return true
}

// barrier waits, until stop, for every entry committed before this
// leadership to be applied to the store.
func (l *leadership) barrier(stop <-chan struct{}) error {
	if mutation.On(mutation.PromoteNoBarrier) {
		return nil
	}
	return until(stop, func() error { return l.raft.Barrier(DefaultBarrierTimeout) })
}

// demote stops the writer: new calls find the leader elsewhere first.
func (l *leadership) demote() {
	l.health.SetLeading(false)
	l.eng.Demote()
	l.state.Follow()
	l.setLeaderKnown()
}

// setLeaderKnown reports whether this node knows a leader.
func (l *leadership) setLeaderKnown() {
	id, _ := l.raft.Leader()
	l.health.SetLeaderKnown(id != "")
}

// until runs f, and returns its error, or errStopped as soon as stop is
// closed: the leader's work never waits on raft past its leadership. f
// then finishes on its own, when raft answers it; a future left in raft's
// buffered apply channel at its shutdown is never answered, and f's
// goroutine then ends with the process. With
// stop nil (Steps: a stand-in for raft that answers at once) f runs on
// the caller's goroutine.
func until(stop <-chan struct{}, f func() error) error {
	if stop == nil {
		return f()
	}
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		return err
	case <-stop:
		return errStopped
	}
}

// leaderHint names the leader for NOT_LEADER answers: raft's view of who
// leads, with the gRPC address the leader announced (or the peers list's).
func (l *leadership) leaderHint() (id, addr string) {
	id, addr = l.raft.Leader()
	if id == "" {
		return "", ""
	}
	if aid, aaddr := l.state.AnnouncedLeader(); aid == id && aaddr != "" {
		addr = aaddr
	}
	return id, addr
}

// notLeader is engine's not-leader error naming the leader this node
// knows, with cause.
func (l *leadership) notLeader(cause error) error {
	id, addr := l.leaderHint()
	return engine.NotLeader(id, addr, cause)
}

// verify confirms that this node's writer leads and that raft still leads
// a quorum.
func (l *leadership) verify(ctx context.Context) error {
	if !l.eng.Leading() {
		return l.notLeader(nil)
	}
	if mutation.On(mutation.VerifyWriterState) || (mutation.On(mutation.VerifyRaftState) && l.raft.IsLeader()) {
		return nil
	}
	if err := l.raft.VerifyLeader(ctx); err != nil {
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			return err
		}
		return l.notLeader(err)
	}
	return nil
}

// VerifyLeader implements server.Leadership: this node's writer leads and
// raft confirmed with a quorum that it still leads, or an error naming
// the leader this node knows.
func (r *Replica) VerifyLeader(ctx context.Context) error { return r.lead.verify(ctx) }

// Applied implements server.Leadership.
func (r *Replica) Applied() uint64 { return r.fsm.Applied() }

// LeaderHint names the leader for NOT_LEADER answers
// (engine.Config.LeaderHint): raft's view of who leads, with the gRPC
// address the leader announced (or the peers list's).
func (r *Replica) LeaderHint() (id, addr string) { return r.lead.leaderHint() }

// HandOver gives leadership to another voter before a leader stops, so
// that a planned stop (a rolling restart, a pod's SIGTERM) costs the
// cluster a transfer, not an election after a heartbeat timeout.
func (r *Replica) HandOver() {
	if !r.node.IsLeader() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), handOverTimeout)
	defer cancel()
	switch err := wait(ctx, r.node.Raft.LeadershipTransfer()); {
	case errors.Is(err, context.DeadlineExceeded):
		r.log.Warn("handing leadership over before stopping: timed out", "after", handOverTimeout)
	case err != nil:
		r.log.Warn("handing leadership over before stopping", "err", err)
	default:
		r.log.Info("handed leadership over before stopping")
	}
}
