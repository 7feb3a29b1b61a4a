package sim

import (
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/cluster"
	"github.com/leasehold/leasehold/coordinator/internal/cluster/shadow"
	"github.com/leasehold/leasehold/coordinator/internal/engine"
	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	"github.com/leasehold/leasehold/coordinator/internal/server"
	"github.com/leasehold/leasehold/coordinator/internal/store"
	"github.com/leasehold/leasehold/coordinator/internal/watch"
)

// Coordinator odds per writer group during the faulty phase.
const (
	// pCrashQueued: the process dies with commands queued, before the
	// group's commit: none of them is applied or answered.
	pCrashQueued = 0.0008
	// pCrashCommitted: the process dies after a commit, before the group's
	// answers and grants leave it.
	pCrashCommitted = 0.0008
	// pStorageFault: a write of the group fails, so its commit fails and
	// the writer fail-stops; the process is restarted.
	pStorageFault = 0.0008
)

// The simulation's time scale. The lease TTL is short, and everything that
// races with it (renders, pauses, network delays, backoffs, restarts) is
// drawn as a share of it, so that expiries, retries and exhaustion happen
// every few thousand steps.
const (
	leaseTTL = time.Second
	// keepalive is how long the coordinator takes to notice a connection
	// that died without a word.
	keepalive   = 2 * leaseTTL
	maxAttempts = 4
	maxGroup    = 128
)

// errBroken is the end of a stream whose connection broke.
var errBroken = errors.New("connection broken")

// coordinator is the coordinator process around the real writer: it owns
// the bbolt file, the engine and its stepper, plays the part of the gRPC
// handlers (queue a command when a request arrives, send its answer when
// it is answered, push grants and revocations to sessions after each
// commit), and crashes and restarts.
type coordinator struct {
	w    *world
	path string
	// name is the node's name in a cluster ("n1", ...), "" for the single
	// node.
	name string
	up   bool
	// incarnation counts processes; messages and timers of an earlier one
	// are dropped.
	incarnation int
	// monoBase maps simulated time onto this process's monotonic clock.
	monoBase time.Duration

	st *store.Store
	e  *engine.Engine
	s  *engine.Stepper
	// shadow and shadowSt replicate every group (Config.Shadow).
	shadow   *shadow.Shadow
	shadowSt *store.Store
	shadowed int

	// waiting are the handlers waiting for an answer, in the order their
	// commands were queued; kinds are the queued commands' kinds.
	waiting  []waiter
	kinds    []cmdKind
	sessions []*serverSession

	groupSet bool
	// timerAt is when the next timer group is set for, timerGen which one.
	timerAt  time.Duration
	timerGen int
	timerSet bool

	// faultAt arms a storage fault: the faultAt-th write of the next group
	// fails. writes counts the group's writes.
	faultAt, writes int

	// A cluster node's raft side and process state (cluster.go); unused by
	// the single node.
	peer
}

// cmdKind is what a queued command is, as far as the checker cares.
type cmdKind uint8

const (
	kindOther cmdKind = iota
	kindPause
)

// waiter is a handler waiting for its command's answer.
type waiter struct {
	done func() bool
	then func()
}

// serverSession is the coordinator's end of a renderer session.
type serverSession struct {
	st    *stream
	conn  *engine.Conn
	ended bool
}

func newCoordinator(w *world) *coordinator {
	return &coordinator{w: w, path: filepath.Join(w.cfg.Dir, "leasehold.db")}
}

// tracef traces what happens at this node, named in a cluster.
func (c *coordinator) tracef(format string, args ...any) {
	if c.name != "" {
		format = c.name + " " + format
	}
	c.w.tracef(format, args...)
}

// start opens the store and the engine over what earlier processes
// committed, and runs the writer's first group at once, as its timer does.
// A cluster node starts as a follower instead: it leads once the oracle
// elects it (promote).
func (c *coordinator) start() {
	w := c.w
	opts := []store.Option{store.WithFault(c.fault)}
	if !w.cfg.Sync {
		opts = append(opts, store.WithoutSync())
	}
	st, err := store.Open(c.path, opts...)
	if err != nil {
		w.failf("reopening the store: %v", err)
	}
	c.incarnation++
	c.monoBase = time.Duration(w.rng.Int64N(int64(time.Hour))) - w.now
	var committer engine.Committer
	if w.cfg.Shadow {
		c.openShadow(st)
		committer = c.shadow
	}
	if w.raft != nil {
		fsm, err := cluster.NewFSM(st)
		if err != nil {
			st.Close()
			w.failf("%s: the state machine: %v", c.name, err)
		}
		fsm.Fatal = func(err error) { w.failf("%s: the state machine stops the node: %v", c.name, err) }
		// A follower's batch stays open across raft's calls; the
		// consensus commits it where a follower's timer would fire
		// (applyOn), and a crash loses it.
		fsm.HoldBatchesUntilFlush(func() bool { return c.raftLeader })
		c.fsm = fsm
		committer = cluster.NewCommitter(nodeRaft{c}, fsm, 0)
	}
	e, err := engine.New(engine.Config{
		Committer:     committer,
		Store:         st,
		Now:           w.wall,
		Mono:          func() time.Duration { return w.now + c.monoBase },
		LeaseTTL:      leaseTTL,
		Retry:         jobs.RetryPolicy{MaxAttempts: maxAttempts, BackoffBase: leaseTTL / 50, BackoffCap: leaseTTL / 2},
		RunningCancel: true,
		MaxGroup:      maxGroup,
		Seed:          w.rng.Uint64() | 1,
	})
	if err != nil {
		st.Close()
		w.failf("restarting the engine: %v", err)
	}
	s, err := engine.NewStepper(e)
	if err != nil {
		w.failf("stepper: %v", err)
	}
	c.st, c.e, c.s, c.up = st, e, s, true
	c.timerSet, c.groupSet = false, false
	if w.raft != nil {
		c.steps = cluster.NewSteps(nodeRaft{c}, c.fsm, steppedEngine{c}, health{c}, c.name, c.name+":7500", failoverExtend)
		c.consistency, _ = server.Consistency(c.steps, slog.New(slog.DiscardHandler))
		s.Demote()
		c.tracef("up (process %d), following", c.incarnation)
		w.raft.started(c)
		return
	}
	w.tracef("coordinator %d up", c.incarnation)
	c.group()
	w.check.restarted(c)
}

// openShadow opens the shadow store beside the coordinator's and a shadow
// committer onto it. The shadow starts equal to the store (both new) and
// stays equal across crashes: a group is applied to it only once
// committed, and every crash point of the run is before the commit or
// after the apply.
func (c *coordinator) openShadow(st *store.Store) {
	w := c.w
	sst, err := store.Open(filepath.Join(w.cfg.Dir, "shadow.db"), store.WithoutSync())
	if err != nil {
		w.failf("opening the shadow store: %v", err)
	}
	sh, err := shadow.New(st, sst)
	if err != nil {
		sst.Close()
		w.failf("after a restart: %v", err)
	}
	c.shadow, c.shadowSt = sh, sst
}

// closeShadow closes the shadow store, counting what it replicated.
func (c *coordinator) closeShadow() {
	if c.shadow != nil {
		w := c.w
		w.res.Shadowed += c.shadow.Groups()
		c.shadowSt.Close()
		c.shadow, c.shadowSt = nil, nil
	}
}

// shutdown closes the store at the end of a run.
func (c *coordinator) shutdown() {
	if c.up {
		c.e.Stop()
		if c.fsm != nil {
			c.fsm.Flush()
		}
		c.st.Close()
		c.closeShadow()
		c.up = false
	}
}

// crash kills the process: what was committed stays in the file, nothing
// else survives. Its renderers' connections break; it restarts later.
func (c *coordinator) crash(why string) {
	w := c.w
	if c.name != "" {
		c.tracef("crashes (process %d): %s", c.incarnation, why)
	} else {
		w.tracef("coordinator %d crashes: %s", c.incarnation, why)
	}
	w.res.Restarts++
	c.e.Stop()
	if c.fsm != nil {
		if lost := c.applied - c.fsm.Applied(); c.applied > c.fsm.Applied() {
			w.res.BatchesLost++
			w.res.BatchEntriesLost += int(lost)
		}
		if err := c.fsm.Abandon(); err != nil {
			w.failf("%s: rolling back the open batch: %v", c.name, err)
		}
	}
	if err := c.st.Close(); err != nil {
		w.failf("closing the store: %v", err)
	}
	c.closeShadow()
	c.up = false
	c.waiting, c.kinds, c.sessions = nil, nil, nil
	if w.raft != nil {
		w.raft.down(c)
	}
	for _, r := range w.renderers {
		if r.st != nil && r.st.node == c && r.st.incarnation == c.incarnation && !r.st.broken {
			s := r.st
			s.broken = true
			w.after(w.between(time.Millisecond, leaseTTL/4), func() { r.streamEnded(s, errBroken) })
		}
	}
	w.after(w.between(leaseTTL/50, leaseTTL), c.start)
}

// fault is the store's write hook: it fails the armed write.
func (c *coordinator) fault(string) error {
	if c.faultAt == 0 {
		return nil
	}
	c.writes++
	if c.writes == c.faultAt {
		return store.ErrInjected
	}
	return nil
}

// queued records a command the handlers queued, and makes sure a group
// will run soon. A command the writer answered at once (a cluster node
// that does not lead) is not queued.
func (c *coordinator) queued(kind cmdKind) {
	if len(c.kinds) >= c.s.Queued() {
		return
	}
	c.kinds = append(c.kinds, kind)
	c.soon()
}

// soon sets a group to run shortly, unless one is set: the writer takes
// what is queued when it is next free.
func (c *coordinator) soon() {
	if c.groupSet {
		return
	}
	c.groupSet = true
	inc := c.incarnation
	c.w.after(c.w.between(5*time.Millisecond, 25*time.Millisecond), func() {
		c.alive(inc, func() {
			c.groupSet = false
			c.group()
		})
	})
}

// await runs then once p is answered, after the group that answers it.
func await[R any](c *coordinator, p *engine.Pending[R], then func(R, error)) {
	if p.Done() {
		then(p.Result())
		return
	}
	c.waiting = append(c.waiting, waiter{done: p.Done, then: func() { then(p.Result()) }})
}

// group runs one writer group of a random number of the queued commands,
// checks every invariant, and then answers and pushes what it committed.
// A cluster node runs groups only while its writer leads.
func (c *coordinator) group() {
	w := c.w
	if w.raft != nil && !c.e.Leading() {
		return
	}
	queued := c.s.Queued()
	if queued > 0 && w.faulty(pCrashQueued) {
		c.crash(fmt.Sprintf("with %d commands queued", queued))
		return
	}
	n := queued
	switch r := w.rng.Float64(); {
	case queued <= 1 || r < 0.7:
	case r < 0.8:
		n = 1
	default:
		n = 1 + w.pick(queued)
	}
	if w.faulty(pStorageFault) {
		c.faultAt, c.writes = 1+w.pick(12), 0
	}
	pausedBefore := c.e.DispatchState().Paused
	evs, err := c.s.Step(n)
	if k := c.s.Admitted(); k > 0 {
		w.failf("%s: a writer term took %d commands sent to an earlier one, whose callers were told NOT_LEADER", c.name, k)
	}
	taken := queued - c.s.Queued()
	pauseIn := false
	for _, k := range c.kinds[:taken] {
		pauseIn = pauseIn || k == kindPause
	}
	c.kinds = c.kinds[taken:]
	armed := c.faultAt != 0 && c.writes >= c.faultAt
	c.faultAt = 0
	if w.raft != nil && w.leadershipErr(err) {
		c.lostLeadership(taken, evs, err)
		return
	}
	if err != nil {
		if !armed || !errors.Is(err, store.ErrInjected) {
			w.failf("a group failed without an injected fault: %v", err)
		}
		w.res.StorageFaults++
		c.tracef("group of %d fails on an injected write fault: %v", taken, err)
		w.check.failStopped(c)
		c.answer()
		c.crash("fail-stop after a failed commit")
		return
	}
	w.res.Groups++
	if c.shadow != nil {
		if err := c.shadow.Err(); err != nil {
			w.failf("write-set replication: %v", err)
		}
	}
	if w.cfg.Trace != nil {
		c.tracef("group of %d commits %d events (%016x)", taken, len(evs), eventsDigest(evs))
	}
	if w.raft != nil {
		w.raft.stepped(c, evs, nil)
	}
	w.check.group(c, evs, pausedBefore && c.e.DispatchState().Paused && !pauseIn)
	if w.faulty(pCrashCommitted) {
		c.crash("after a commit, before its answers")
		return
	}
	c.answer()
	c.push()
	c.setTimer()
	if c.s.Queued() > 0 {
		c.soon()
	}
}

// answer runs the handlers whose commands were answered, in queue order.
func (c *coordinator) answer() {
	ws := c.waiting
	c.waiting = nil
	var still []waiter
	for _, wt := range ws {
		if wt.done() {
			wt.then()
		} else {
			still = append(still, wt)
		}
	}
	c.waiting = append(still, c.waiting...)
}

// push sends every session what the writer published to it: grants,
// revocations, and its end.
func (c *coordinator) push() {
	w := c.w
	live := c.sessions[:0]
	for _, ss := range c.sessions {
		grants, revoked, ended := ss.conn.Outbox.Take()
		if len(grants) > 0 || len(revoked) > 0 {
			st := ss.st
			w.toRenderer(st, func() { st.r.pushed(st, grants, revoked) })
		}
		if ended != nil {
			ss.ended = true
			w.endStream(ss.st, ended)
			continue
		}
		live = append(live, ss)
	}
	clear(c.sessions[len(live):])
	c.sessions = live
}

// setTimer sets a group for the writer's earliest deadline, as the
// writer's own timer does.
func (c *coordinator) setTimer() {
	next, ok := c.s.NextTimer()
	if !ok {
		return
	}
	at := max(next-c.monoBase, c.w.now)
	if c.timerSet && c.timerAt <= at {
		return
	}
	c.timerSet, c.timerAt = true, at
	c.timerGen++
	gen, inc := c.timerGen, c.incarnation
	// A timer fires a little late, as a busy writer's does; it takes what
	// became due meanwhile in the same group.
	c.w.after(at-c.w.now+c.w.between(0, 20*time.Millisecond), func() {
		c.alive(inc, func() {
			if c.timerGen == gen {
				c.timerSet = false
				c.group()
			}
		})
	})
}

// openSession is the Session handler's start: open the session, welcome
// the renderer with the statuses of the leases it holds, and apply the
// credits of its first message.
func (c *coordinator) openSession(st *stream, open engine.SessionOpen, credits int) {
	st.incarnation = c.incarnation
	p := c.s.Open(open)
	c.queued(kindOther)
	await(c, p, func(o engine.Opened, err error) {
		if err != nil {
			c.w.endStream(st, err)
			return
		}
		c.w.check.leaseStatuses(st.r.id, "welcome", o.Holding)
		ss := &serverSession{st: st, conn: o.Conn}
		st.srv = ss
		c.sessions = append(c.sessions, ss)
		c.w.toRenderer(st, func() { st.r.welcomed(st, o.Holding) })
		if credits > 0 {
			c.send(ss, engine.SessionInput{Credits: credits})
		}
	})
}

// send applies one session message and sends its answers back in order.
func (c *coordinator) send(ss *serverSession, in engine.SessionInput) {
	p := c.s.Receive(ss.conn, in)
	c.queued(kindOther)
	await(c, p, func(res engine.SessionResult, err error) {
		if err != nil {
			if !engine.IsConnEnd(err) && !errors.Is(err, engine.ErrStorageFailed) && !c.w.leadershipErr(err) {
				c.w.failf("Receive: %v", err)
			}
			return // the session's end reaches the renderer from its outbox, or the crash
		}
		c.w.check.sessionAnswered(ss.st.r.id, in, res)
		st := ss.st
		c.w.toRenderer(st, func() { st.r.answered(st, in, res) })
	})
}

// closeSession ends a session its renderer closed: what it never took is
// handed back.
func (c *coordinator) closeSession(st *stream) {
	if st.srv == nil || st.srv.ended {
		return
	}
	st.srv.ended = true
	c.close(st.srv.conn, nil)
}

// close ends a session and hands back what it never took, as the
// handlers do.
func (c *coordinator) close(conn *engine.Conn, then func([]engine.Grant, error)) {
	p := c.s.Close(conn, nil)
	c.queued(kindOther)
	await(c, p, func(left []engine.Grant, err error) {
		if then != nil {
			then(left, err)
			return
		}
		c.handBack(left)
	})
}

// handBack re-queues grants that never reached their renderer.
func (c *coordinator) handBack(grants []engine.Grant) {
	if len(grants) == 0 {
		return
	}
	in := engine.SessionInput{Renderer: engine.Renderer{ID: grants[0].Job.Lease.Renderer, Principal: principal}}
	for _, g := range grants {
		in.Undelivered = append(in.Undelivered, engine.LeaseRef{Job: g.Job.ID, Token: g.Job.Lease.Token})
	}
	c.s.Receive(nil, in)
	c.queued(kindOther)
}

// acquire is the unary Acquire handler without a wait: open a session with
// credit, take what its group granted, close it, and answer with those and
// whatever the session took before it closed.
func (c *coordinator) acquire(open engine.SessionOpen, then func([]engine.Grant, error)) {
	p := c.s.Open(open)
	c.queued(kindOther)
	await(c, p, func(o engine.Opened, err error) {
		if err != nil {
			then(nil, err)
			return
		}
		grants, _, _ := o.Conn.Outbox.Take()
		c.close(o.Conn, func(left []engine.Grant, err error) { then(append(grants, left...), err) })
	})
}

// streamGone is the coordinator noticing a broken connection (keepalive):
// the session ends without a hand-back.
func (c *coordinator) streamGone(st *stream) {
	if c.up && c.incarnation == st.incarnation {
		c.alive(c.incarnation, func() { c.closeSession(st) })
	}
}

// eventsDigest sums up a group's events, every field of each, so that a trace of the run, and the
// same-seed test that compares two traces, sees every decision the writer
// made, not only how many.
func eventsDigest(evs []watch.JobEvent) uint64 {
	h := fnv.New64a()
	for _, e := range evs {
		ev := e.Event
		fmt.Fprintf(h, "%d/%d %d %d %d %d %q %d %q %q %q;", e.Job, ev.Seq, ev.At.UnixNano(), ev.Kind, ev.Phase, ev.Token,
			ev.Renderer, ev.Attempt, ev.Reason, ev.Message, ev.Principal)
	}
	return h.Sum64()
}
