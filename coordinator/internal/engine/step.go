package engine

import (
	"errors"
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	"github.com/leasehold/leasehold/coordinator/internal/store"
	"github.com/leasehold/leasehold/coordinator/internal/watch"
)

// ErrEngineStarted is returned by NewStepper for an engine whose writer
// goroutine was started: one engine has one writer.
var ErrEngineStarted = errors.New("engine: the writer goroutine is started; a stepper needs an engine that is not")

// Stepper drives an engine's writer from the caller's goroutine, one group
// at a time, so that a simulator can choose every interleaving the writer
// may see from a seed. Commands are queued without blocking, each stamped
// with Config.Now and Config.Mono when queued, as a blocking call stamps
// it when sent. Step runs the first queued commands as one group through
// the writer's own runGroup: the same evaluate methods, the same timers,
// commit and publish, and the same answers, only on the caller's goroutine
// and with the group's end chosen by the caller instead of by what happens
// to be queued.
//
// A Stepper owns its engine's writer: the engine was never started, and
// Start does nothing once a stepper exists. The engine's blocking commands
// (Submit, Receive, ...) would wait for ever and must not be called; its reads
// (Job, ListJobs, ...) work as usual. A Stepper is not safe for concurrent
// use: between steps the caller's goroutine is the writer, and the methods
// that inspect the writer's state rely on it.
//
// A new Stepper leads, as a started single node does. Demote and Promote
// end and begin writer terms as the engine's own do (see Engine.Promote),
// for a simulator playing a replicated coordinator: a group whose commit
// lost leadership ends the term by itself, and a stepper whose engine does
// not lead answers every command ErrNotLeader at once.
type Stepper struct {
	e     *Engine
	queue []*request
	// raced are commands sent to a term that ended before the writer
	// read them (DemoteRacing): their callers were told NOT_LEADER, and
	// the next term must refuse them (term admission). admitted counts
	// those a later term took all the same.
	raced    []*request
	admitted int
	// wall and mono are the clock readings of the last group.
	wall time.Time
	mono time.Duration
}

// NewStepper returns a stepper over e, which must not have been started.
func NewStepper(e *Engine) (*Stepper, error) {
	if e.started.Load() {
		return nil, ErrEngineStarted
	}
	e.startOnce.Do(func() {}) // Start must not start a second writer.
	e.lifecycle.Lock()
	e.term.Store(steppedTerm())
	e.lifecycle.Unlock()
	return &Stepper{e: e, wall: e.now(), mono: e.clockMono}, nil
}

// steppedTerm is a writer term without a writer goroutine: a Stepper's
// caller is its writer, and between steps that writer has returned.
func steppedTerm() *term {
	t := newTerm()
	close(t.doneC)
	return t
}

// Promote begins a writer term, as Engine.Promote does: the in-memory
// state is rebuilt from the store, every live lease gets a full TTL plus
// extend, and nothing is stamped before wallFloor.
func (s *Stepper) Promote(extend time.Duration, wallFloor time.Time) error {
	e := s.e
	if err := e.promote(extend, wallFloor, func() { e.term.Store(steppedTerm()) }); err != nil {
		return err
	}
	s.wall, s.mono = e.now(), e.clockMono
	return nil
}

// Demote ends the writer term, as Engine.Demote does: the queued commands
// are answered ErrNotLeader, every session ends with ErrNotLeader, and the
// in-memory state is dropped. It is safe to call at any time.
func (s *Stepper) Demote() { s.DemoteRacing(nil) }

// DemoteRacing is Demote, where each queued command for which raced
// reports true was also sent on by its caller as the term ended: its
// caller is told NOT_LEADER (as Engine's callers are when the term they
// sent to ends), and the command reaches the writer later all the same,
// as one sent into the writer's channel after the term drained it. The
// next term must refuse it (term admission, as the writer goroutine
// admits what it reads); Admitted counts those it took.
func (s *Stepper) DemoteRacing(raced func() bool) {
	s.e.Demote()
	why := s.e.notLeader()
	for _, r := range s.queue {
		r.done <- why
		if raced != nil && raced() {
			late := *r
			late.done = make(chan error, 1)
			s.raced = append(s.raced, &late)
		}
	}
	s.queue = nil
}

// Admitted returns how many commands sent to an ended term a later term
// took (DemoteRacing): each was answered NOT_LEADER and applied.
func (s *Stepper) Admitted() int { return s.admitted }

// lose ends term t after a group whose commit lost leadership, as the
// writer goroutine does (Engine.lose), and answers the queued commands
// ErrNotLeader.
func (s *Stepper) lose(t *term) {
	e := s.e
	e.lifecycle.Lock()
	if e.term.CompareAndSwap(t, nil) {
		e.lose(t)
	}
	e.lifecycle.Unlock()
	s.drain(e.notLeader())
}

// Pending is a command queued with a Stepper. Its answer is set by the
// step whose group applied it (or by the step whose commit failed).
type Pending[R any] struct {
	r        *request
	get      func() (R, error)
	answered bool
	res      R
	err      error
}

// Done reports whether the command has been answered.
func (p *Pending[R]) Done() bool {
	if !p.answered {
		select {
		case err := <-p.r.done:
			p.answered = true
			if err != nil {
				p.err = err
			} else {
				p.res, p.err = p.get()
			}
		default:
		}
	}
	return p.answered
}

// Result returns the command's answer, as the engine's blocking method
// returns it. It is valid once Done reports true; before, it returns the
// zero result and ErrNotAnswered.
func (p *Pending[R]) Result() (R, error) {
	if !p.Done() {
		var zero R
		return zero, ErrNotAnswered
	}
	return p.res, p.err
}

// ErrNotAnswered is Pending.Result's error before the command was applied.
var ErrNotAnswered = errors.New("engine: the command has not been applied yet")

// answered returns a Pending answered at once with err: a command refused
// before it reaches the writer, as the blocking method refuses it.
func answered[R any](err error) *Pending[R] {
	return &Pending[R]{answered: true, err: err}
}

// enqueue queues c, stamped with the engine's clocks, and returns its
// pending answer.
func enqueue[R any](s *Stepper, c command, get func() (R, error)) *Pending[R] {
	e := s.e
	r := &request{cmd: c, done: make(chan error, 1), wall: e.now(), mono: e.cfg.Mono(), term: e.term.Load()}
	switch {
	case !e.serving.Load():
		r.done <- e.stoppedErr()
	case e.term.Load() == nil:
		r.done <- e.idleErr()
	default:
		s.queue = append(s.queue, r)
	}
	return &Pending[R]{r: r, get: get}
}

// queueCall queues a command whose answer is its result, as call returns it.
func queueCall[R any](s *Stepper, c interface {
	command
	result() R
}) *Pending[R] {
	return enqueue(s, c, func() (R, error) { return c.result(), nil })
}

// Queued returns how many commands wait for a step.
func (s *Stepper) Queued() int { return len(s.queue) }

// Step runs up to n queued commands, first in first out, as one group at
// the engine's current clock readings: the group is bounded by
// Config.MaxGroup and Config.MaxGroupBytes as the writer goroutine bounds
// it, and n = 0 runs an empty group, which expires the leases and
// re-queues the retries that are due, as the writer's timer does. It
// returns the events the group committed, in commit order.
//
// An error means the group did not commit: the engine has fail-stopped, as
// the writer goroutine does, and the group's commands and every command
// still queued are answered with the reason (ErrStorageFailed). A commit
// that lost leadership (ErrNotLeader, ErrOutcomeUnknown) ends the term
// instead, as the writer goroutine's does: the group's commands are
// answered with the error, those still queued ErrNotLeader, and the events
// the group evaluated are returned with it; they are committed if the
// group's entry is, which only the caller's consensus knows. A stepper
// that does not lead runs nothing and answers what is queued ErrNotLeader.
func (s *Stepper) Step(n int) ([]watch.JobEvent, error) {
	e := s.e
	if !e.serving.Load() {
		s.drain(e.stoppedErr())
		return nil, e.stoppedErr()
	}
	t := e.term.Load()
	if t == nil {
		err := e.idleErr()
		s.drain(err)
		return nil, err
	}
	// Commands sent to an ended term reach the writer first, as they came
	// first into its channel; the term admits only its own.
	var late []*request
	for _, r := range s.raced {
		if t.admit(r) {
			late = append(late, r)
			s.admitted++
		}
	}
	s.raced = nil
	n = min(n, len(s.queue))
	take, bytes := 0, 0
	for take < n && take < e.cfg.MaxGroup && (take == 0 || bytes < e.cfg.MaxGroupBytes) {
		bytes += s.queue[take].cmd.size()
		take++
	}
	s.wall, s.mono = e.now(), e.cfg.Mono()
	// The observer is applied last, after the group's other commands and
	// at the group's own clock reading, so it changes nothing the group
	// does; it keeps the group, whose events are complete once runGroup
	// returns.
	obs := &observeCmd{}
	batch := append(append(late, s.queue[:take]...), &request{cmd: obs, done: make(chan error, 1), wall: s.wall, mono: s.mono})
	s.queue = append(s.queue[:0:0], s.queue[take:]...)
	if err := e.runGroup(batch, s.wall, s.mono); err != nil {
		if t.lost(err) {
			s.lose(t)
			if obs.g == nil {
				return nil, err
			}
			return obs.g.events, err
		}
		s.drain(e.stoppedErr())
		return nil, err
	}
	// Commands a full group left are the next ones to run.
	if len(e.carry) > 0 {
		s.queue = append(e.carry, s.queue...)
		e.carry = nil
	}
	s.mono = max(s.mono, e.clockMono)
	return obs.g.events, nil
}

// drain answers every queued command with err.
func (s *Stepper) drain(err error) {
	for _, r := range s.queue {
		r.done <- err
	}
	s.queue = nil
}

// observeCmd keeps the group it is applied in.
type observeCmd struct {
	base
	noText
	g *group
}

func (*observeCmd) observesGroup() {}

func (c *observeCmd) evaluate(g *group) error {
	c.g = g
	return nil
}

// NextTimer returns the earliest lease deadline or retry time the writer
// has armed, on the monotonic clock: when a group with nothing queued
// (Step(0)) has something to do. Entries are invalidated lazily, so the
// time may be earlier than any real deadline; a step then does nothing.
func (s *Stepper) NextTimer() (time.Duration, bool) { return s.e.nextTimer() }

// CheckIndexes returns how the writer's in-memory indexes disagree with the
// committed jobs after the last step (see Engine.indexProblems), joined, or
// nil. With ids nil it reads every job; otherwise only the jobs in ids, and
// totals against the counts kept in the store. visit, when set, is called
// with every job read, in the same read transaction.
func (s *Stepper) CheckIndexes(ids []uint64, visit func(*store.Tx, jobs.Job)) error {
	var problems []string
	err := s.e.st.View(func(tx *store.Tx) error {
		problems = s.e.indexProblems(tx, s.wall, s.mono, ids, visit)
		return nil
	})
	errs := []error{err}
	for _, p := range problems {
		errs = append(errs, errors.New(p))
	}
	return errors.Join(errs...)
}

// Submit queues a batch; see Engine.Submit. A batch over the limits is
// answered at once.
func (s *Stepper) Submit(req SubmitRequest) *Pending[SubmitResult] {
	c, err := s.e.newSubmitCmd(req)
	if err != nil {
		return answered[SubmitResult](err)
	}
	return queueCall(s, c)
}

// Cancel queues a cancel; see Engine.Cancel.
func (s *Stepper) Cancel(req CancelRequest) *Pending[CancelResult] {
	return queueCall(s, &cancelCmd{req: req})
}

// Replay queues an operator replay; see Engine.Replay.
func (s *Stepper) Replay(req ReplayRequest) *Pending[ReplayResult] {
	return queueCall(s, newReplayCmd(req))
}

// SetPaused queues the pause or resumption of dispatch; see
// Engine.SetPaused.
func (s *Stepper) SetPaused(paused bool, principal, reason string) *Pending[jobs.DispatchState] {
	return queueCall(s, &pauseCmd{paused: paused, principal: principal, reason: reason})
}

// Opened is an opened session: its connection and the answers for the
// leases it said it holds.
type Opened struct {
	Conn    *Conn
	Holding []LeaseStatus
}

// Open queues the opening of a renderer session; see Engine.Open.
func (s *Stepper) Open(req SessionOpen) *Pending[Opened] {
	c := &openCmd{req: req}
	return enqueue(s, c, func() (Opened, error) { return Opened{Conn: c.conn, Holding: c.holding}, nil })
}

// Receive queues one message of a renderer session, or one outside any
// session with conn nil; see Engine.Receive.
func (s *Stepper) Receive(conn *Conn, in SessionInput) *Pending[SessionResult] {
	return queueCall(s, &receiveCmd{conn: conn, in: in})
}

// Announce queues the record that this node leads; see Engine.Announce.
func (s *Stepper) Announce(id, addr string) *Pending[struct{}] {
	return enqueue(s, &announceCmd{id: id, addr: addr}, func() (struct{}, error) { return struct{}{}, nil })
}

// Close queues the end of a session; see Engine.Close.
func (s *Stepper) Close(conn *Conn, undelivered []LeaseRef) *Pending[[]Grant] {
	return queueCall(s, &closeCmd{conn: conn, undelivered: undelivered})
}
