package dispatch

import (
	"fmt"
	"math"
	"slices"
)

// Defaults for the zero values of [Config].
const (
	// DefaultWeight is the weight of a team that Config.Weights does not list
	// when Config.DefaultWeight is zero.
	DefaultWeight = 1
	// DefaultMaxShare is the share of live capacity one team may hold while
	// another team waits when Config.MaxShare is zero.
	DefaultMaxShare = 0.75
)

// Config configures a [Scheduler]. The zero value is valid: every team has
// weight 1 and a team may hold three quarters of the live capacity while
// another team waits.
type Config struct {
	// Weights maps a team to its weight in the rotation: over a long run with
	// every team backlogged and no cap engaged, teams get leases in proportion to
	// their weights. Teams missing from the map get DefaultWeight. Weights must
	// be positive.
	Weights map[string]int
	// DefaultWeight is the weight of teams missing from Weights; zero means
	// [DefaultWeight]. It must not be negative.
	DefaultWeight int
	// MaxShare is the share of live renderer capacity one team may hold in
	// leases while another team has ready work waiting; zero means
	// [DefaultMaxShare], and 1 or more disables the cap. It must not be negative.
	MaxShare float64
	// FIFO turns fairness off: jobs are handed out in global push order across
	// all teams, with no rotation and no cap. It is the baseline fair dispatch
	// is measured against.
	FIFO bool
}

// Scheduler holds every team's ready queue and leases in flight and chooses
// the next job to lease. It is not safe for concurrent use: the coordinator's
// single writer goroutine owns it.
//
// A team is known to the Scheduler while it has ready jobs or leases in
// flight; once it has neither, its state is dropped, so the state grows with
// the active teams, not with every team ever seen.
type Scheduler struct {
	weights       map[string]int
	defaultWeight int
	maxShare      float64
	fifo          bool

	teams map[string]*team
	ready int
	seq   uint64
	// index locates every queued job of every team.
	index jobIndex

	// cur is the team holding the turn in the rotation, which links the teams
	// with ready work in a ring; nil when no team has ready work. remaining is
	// how many more jobs cur may take in its current turn. Used unless fifo.
	cur       *team
	remaining int

	// heads is a min-heap of the teams with ready work, ordered by the push
	// sequence of their oldest ready job. Used when fifo.
	heads []*team
}

// team is the state of one team the Scheduler knows.
type team struct {
	name     string
	weight   int
	inFlight int
	q        queue
	// next and prev link the team into the rotation ring while it has ready
	// work (fair mode).
	next, prev *team
	// heapIdx is the team's index in Scheduler.heads while it has ready work
	// (FIFO mode).
	heapIdx int
	// ref and gen name the team in the job index.
	ref, gen uint32
}

// New returns an empty Scheduler. It panics if cfg holds a negative or NaN
// share or a weight below one, which are programming errors.
func New(cfg Config) *Scheduler {
	s := &Scheduler{
		weights:       make(map[string]int, len(cfg.Weights)),
		defaultWeight: cfg.DefaultWeight,
		maxShare:      cfg.MaxShare,
		fifo:          cfg.FIFO,
		teams:         make(map[string]*team),
	}
	if s.defaultWeight == 0 {
		s.defaultWeight = DefaultWeight
	}
	if s.defaultWeight < 0 {
		panic(fmt.Sprintf("dispatch: Config.DefaultWeight must not be negative, got %d", cfg.DefaultWeight))
	}
	if s.maxShare == 0 {
		s.maxShare = DefaultMaxShare
	}
	if s.maxShare < 0 || math.IsNaN(s.maxShare) {
		panic(fmt.Sprintf("dispatch: Config.MaxShare must be a non-negative share, got %v", cfg.MaxShare))
	}
	for name, w := range cfg.Weights {
		if w < 1 {
			panic(fmt.Sprintf("dispatch: Config.Weights[%q] must be at least 1, got %d", name, w))
		}
		s.weights[name] = w
	}
	return s
}

// Push appends job to the tail of team's ready queue (first in, first out
// within a team). A job is queued at most once: pushing a job that is already
// queued, for any team, changes nothing, and the job keeps its place.
func (s *Scheduler) Push(team string, job uint64) {
	t := s.lookup(team)
	if !t.q.push(&s.index, t, job, s.seq+1) {
		s.forgetIfIdle(t)
		return
	}
	s.seq++
	s.ready++
	if t.q.len() == 1 {
		s.activate(t)
	}
}

// Remove takes job out of team's ready queue, as when the job is cancelled,
// and reports whether it was queued there. It returns false for a job that
// was never pushed for team, was removed already, or was already handed out by
// Next. It costs O(1) amortized however deep the job sits in the queue.
func (s *Scheduler) Remove(team string, job uint64) bool {
	t := s.teams[team]
	if t == nil || t.q.len() == 0 {
		return false
	}
	owner, pos, queued := s.index.get(job)
	if !queued || owner != t {
		return false
	}
	oldHead := t.q.front().seq
	t.q.remove(&s.index, int(pos-t.q.base))
	s.ready--
	switch {
	case t.q.len() == 0:
		s.deactivate(t)
		s.forgetIfIdle(t)
	case s.fifo && t.q.front().seq != oldHead:
		s.heapFix(t.heapIdx)
	}
	return true
}

// Next picks the next job to lease given the live renderer capacity, takes it
// out of its team's queue, counts it as in flight for that team and returns
// it. ok is false when no team has ready work.
//
// In fair mode the teams with ready work take turns in a fixed rotation, each
// taking up to its weight in jobs per turn. A team whose leases in flight have
// reached Cap(liveCapacity) is passed over while some other team with ready
// work is under the cap; when every such team is at the cap, the rotation goes
// on regardless. In FIFO mode the oldest ready job over all teams is taken.
func (s *Scheduler) Next(liveCapacity int) (team string, job uint64, ok bool) {
	if s.ready == 0 {
		return "", 0, false
	}
	t, e := s.take(liveCapacity)
	return t.name, e.job, true
}

// take does the work of Next once some team is known to have ready work.
func (s *Scheduler) take(liveCapacity int) (*team, entry) {
	var t *team
	if s.fifo {
		t = s.heads[0]
	} else {
		t = s.choose(s.Cap(liveCapacity))
	}
	e := t.q.pop(&s.index)
	s.ready--
	t.inFlight++
	switch {
	case t.q.len() == 0:
		s.deactivate(t)
	case s.fifo:
		s.heapFix(0)
	}
	return t, e
}

// choose returns the team whose job Next hands out and advances the rotation.
// It looks at the teams in rotation order, starting with the current turn if
// it is not used up, and takes the first one under capLimit. If there is
// none, every team with ready work is at the cap, and the rotation goes on as
// if there were no cap. A team passed over loses the rest of its turn.
// At least one team must have ready work.
func (s *Scheduler) choose(capLimit int) *team {
	c := s.cur
	if s.remaining > 0 && c.inFlight < capLimit {
		s.remaining--
		return c
	}
	for t := c.next; ; t = t.next {
		if t.inFlight < capLimit {
			s.cur, s.remaining = t, t.weight-1
			return t
		}
		if t == c {
			break
		}
	}
	if s.remaining > 0 {
		s.remaining--
		return c
	}
	t := c.next
	s.cur, s.remaining = t, t.weight-1
	return t
}

// Release records that one of team's leases ended: it completed, expired or
// was cancelled. Releasing a team with no lease in flight changes nothing.
func (s *Scheduler) Release(team string) {
	t := s.teams[team]
	if t == nil || t.inFlight == 0 {
		return
	}
	t.inFlight--
	s.forgetIfIdle(t)
}

// Acquired counts a lease of team that exists without having come from Next,
// as when the writer rebuilds its state from storage after a restart.
func (s *Scheduler) Acquired(team string) {
	s.lookup(team).inFlight++
}

// Depth returns the number of team's ready jobs.
func (s *Scheduler) Depth(team string) int {
	if t := s.teams[team]; t != nil {
		return t.q.len()
	}
	return 0
}

// InFlight returns the number of team's leases in flight.
func (s *Scheduler) InFlight(team string) int {
	if t := s.teams[team]; t != nil {
		return t.inFlight
	}
	return 0
}

// Head returns the oldest job in team's ready queue, the one its next turn
// takes, and false when the queue is empty. It costs O(1): the queue keeps
// its head live.
func (s *Scheduler) Head(team string) (job uint64, ok bool) {
	t := s.teams[team]
	if t == nil || t.q.len() == 0 {
		return 0, false
	}
	return t.q.front().job, true
}

// Ready returns the number of ready jobs over all teams.
func (s *Scheduler) Ready() int { return s.ready }

// Teams returns the teams with ready work or leases in flight, sorted.
func (s *Scheduler) Teams() []string {
	names := make([]string, 0, len(s.teams))
	for name := range s.teams {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}

// Cap returns how many leases one team may hold while another team with ready
// work waits: max(1, floor(MaxShare * liveCapacity)), with a liveCapacity of
// zero or less counted as 1. When the cap is disabled (MaxShare of 1 or more,
// or FIFO mode) it returns math.MaxInt.
func (s *Scheduler) Cap(liveCapacity int) int {
	if s.fifo || s.maxShare >= 1 {
		return math.MaxInt
	}
	liveCapacity = max(liveCapacity, 1)
	return max(1, int(math.Floor(s.maxShare*float64(liveCapacity))))
}

// lookup returns team's state, creating it if the team is not known.
func (s *Scheduler) lookup(name string) *team {
	t := s.teams[name]
	if t == nil {
		w, ok := s.weights[name]
		if !ok {
			w = s.defaultWeight
		}
		t = &team{name: name, weight: w, heapIdx: -1}
		s.index.register(t)
		s.teams[name] = t
	}
	return t
}

// forgetIfIdle drops t's state when it has neither ready work nor leases.
func (s *Scheduler) forgetIfIdle(t *team) {
	if t.q.len() == 0 && t.inFlight == 0 {
		delete(s.teams, t.name)
		s.index.unregister(t)
	}
}

// activate enters t, which has just got ready work, into the rotation or the
// heap. In the rotation a new team goes just before the team holding the
// turn, so it is served within one round; a team arriving when no other team
// has ready work takes the turn at once.
func (s *Scheduler) activate(t *team) {
	if s.fifo {
		t.heapIdx = len(s.heads)
		s.heads = append(s.heads, t)
		s.heapUp(t.heapIdx)
		return
	}
	if s.cur == nil {
		// The only team with ready work holds the turn from the start.
		t.next, t.prev = t, t
		s.cur, s.remaining = t, t.weight
		return
	}
	t.next, t.prev = s.cur, s.cur.prev
	t.prev.next = t
	s.cur.prev = t
}

// deactivate takes t, which has no ready work left, out of the rotation or the
// heap. If t held the turn, the turn passes to the next team.
func (s *Scheduler) deactivate(t *team) {
	if s.fifo {
		i, last := t.heapIdx, len(s.heads)-1
		s.heapSwap(i, last)
		s.heads[last] = nil
		s.heads = s.heads[:last]
		t.heapIdx = -1
		if i < last {
			s.heapFix(i)
		}
		return
	}
	if t.next == t {
		s.cur, s.remaining = nil, 0
	} else {
		if s.cur == t {
			// The previous team's turn is over, so the next pick starts t.next's.
			s.cur, s.remaining = t.prev, 0
		}
		t.prev.next, t.next.prev = t.next, t.prev
	}
	t.next, t.prev = nil, nil
}

// heapLess orders heads by the push sequence of each team's oldest ready job.
func (s *Scheduler) heapLess(i, j int) bool {
	return s.heads[i].q.front().seq < s.heads[j].q.front().seq
}

func (s *Scheduler) heapSwap(i, j int) {
	s.heads[i], s.heads[j] = s.heads[j], s.heads[i]
	s.heads[i].heapIdx = i
	s.heads[j].heapIdx = j
}

// heapFix restores the heap order after the key at i changed.
func (s *Scheduler) heapFix(i int) {
	if !s.heapDown(i) {
		s.heapUp(i)
	}
}

func (s *Scheduler) heapUp(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !s.heapLess(i, p) {
			return
		}
		s.heapSwap(i, p)
		i = p
	}
}

// heapDown moves the element at i down and reports whether it moved.
func (s *Scheduler) heapDown(i int) bool {
	start, n := i, len(s.heads)
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		m := l
		if r := l + 1; r < n && s.heapLess(r, l) {
			m = r
		}
		if !s.heapLess(m, i) {
			break
		}
		s.heapSwap(i, m)
		i = m
	}
	return i > start
}
