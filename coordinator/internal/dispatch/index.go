package dispatch

import (
	"math"
	"math/bits"
)

// jobIndex maps every queued job to its team and its position in the team's
// queue, so that Remove finds a job deep in a queue at once and Push can tell
// whether a job is queued already.
//
// It is built for the ids the coordinator hands out, which come from a
// counter: the live ids lie mostly in a window of recent ids, and new ids
// arrive at its top. The window is a ring of slots indexed by the id itself,
// covering ids [lo, lo+len(win)) and sliding up as new ids arrive, so pushing
// a job writes next to the previous push and seldom misses the processor cache
// however large the backlog is. Popping the head of a queue does not touch the
// index at all: the popped job's slot simply goes stale, because a slot counts
// as live only while its team is still the same team (same ref and
// generation) and the team's head has not yet passed the slot's position, and
// both facts are read from the team, not from the slot's cold cache line.
// Stale slots are overwritten as the window slides over them.
//
// Jobs whose ids fall outside the window (an old job queued again, an id far
// ahead, a job the window slid past while it waited) are kept in an ordinary
// map, which is empty in the common case; those jobs are removed from it
// eagerly. The window doubles when the jobs in it fill half of it and shrinks
// when they fill a sixteenth, and sliding is paid for by pushes (each push
// buys two ids of sliding), so every operation is O(1) amortized and memory
// stays proportional to the jobs queued now. Ids that follow no order at all
// end up in the map and cost what a map costs.
type jobIndex struct {
	// lo is the lowest id the window covers; win[id&(len(win)-1)] is id's slot.
	lo  uint64
	win []winSlot
	// far holds the queued jobs whose slots are not in the window. Its entries
	// are always live. farPeak is its largest size since it was allocated: Go
	// maps do not give memory back, so a map far larger than its contents is
	// rebuilt.
	far     map[uint64]winSlot
	farPeak int
	// live counts the queued jobs, inWin those of them recorded in the window.
	live, inWin int
	// top is one past the highest id recorded in the window since it was
	// anchored.
	top uint64
	// credit is how many ids the window may still slide over.
	credit int

	// teams maps a ref to the team registered under it, nil for a free ref.
	teams []*team
	// gens is the generation of each ref, bumped whenever the ref is reused, so
	// that slots left by a forgotten team never look live for the next one.
	gens []uint32
	free []uint32
}

// winSlot records where a queued job is.
type winSlot struct {
	// pos is the job's position in its team's queue plus one; zero marks an
	// empty slot.
	pos uint64
	// ref and gen name the team the job was queued for.
	ref, gen uint32
}

const (
	// minWindow is the smallest window allocated, in slots.
	minWindow = 64
	// slideCredit is how many ids of sliding each push pays for.
	slideCredit = 2
)

// register gives t a ref and generation of its own.
func (ix *jobIndex) register(t *team) {
	if n := len(ix.free); n > 0 {
		r := ix.free[n-1]
		ix.free = ix.free[:n-1]
		ix.gens[r]++
		t.ref, t.gen = r, ix.gens[r]
	} else {
		t.ref, t.gen = uint32(len(ix.teams)), 0
		ix.teams = append(ix.teams, nil)
		ix.gens = append(ix.gens, 0)
	}
	ix.teams[t.ref] = t
}

// unregister releases t's ref, which must have no queued jobs. Slots t left
// behind are stale from now on.
func (ix *jobIndex) unregister(t *team) {
	ix.teams[t.ref] = nil
	if ix.gens[t.ref] < math.MaxUint32 {
		ix.free = append(ix.free, t.ref)
	} // Otherwise the ref is retired: its generation cannot be bumped again.
}

// owner returns the team whose queued job s records, or nil if s is empty or
// stale.
func (ix *jobIndex) owner(s winSlot) *team {
	if s.pos == 0 {
		return nil
	}
	t := ix.teams[s.ref]
	if t == nil || t.gen != s.gen || s.pos-1 < t.q.base+uint64(t.q.head) {
		return nil
	}
	return t
}

// inWindow reports whether the window covers job.
func (ix *jobIndex) inWindow(job uint64) bool {
	return job-ix.lo < uint64(len(ix.win))
}

// slot returns job's slot in the window, which must cover job.
func (ix *jobIndex) slot(job uint64) *winSlot {
	return &ix.win[job&uint64(len(ix.win)-1)]
}

// get returns the team that job is queued for and its position there.
func (ix *jobIndex) get(job uint64) (*team, uint64, bool) {
	if ix.inWindow(job) {
		s := *ix.slot(job)
		if t := ix.owner(s); t != nil {
			return t, s.pos - 1, true
		}
	}
	if s, ok := ix.far[job]; ok {
		return ix.teams[s.ref], s.pos - 1, true
	}
	return nil, 0, false
}

// add records job as queued for t at pos and reports true, unless job is
// queued already (for any team), in which case it changes nothing and
// reports false.
func (ix *jobIndex) add(t *team, job, pos uint64) bool {
	if ix.win == nil {
		ix.win = make([]winSlot, minWindow)
		ix.lo, ix.top, ix.credit = job, job, 0
	} else if ix.live == 0 {
		// Nothing is live, so the window may start afresh at job.
		ix.lo, ix.top = job, job
	} else if d := job - ix.lo; job >= ix.lo && d >= uint64(len(ix.win)) {
		if need := d - uint64(len(ix.win)) + 1; need <= uint64(ix.credit) {
			ix.slide(need)
		}
	}
	if _, ok := ix.far[job]; ok {
		return false
	}
	s := winSlot{pos: pos + 1, ref: t.ref, gen: t.gen}
	if ix.inWindow(job) {
		w := ix.slot(job)
		if ix.owner(*w) != nil {
			return false
		}
		*w = s
		ix.inWin++
		ix.top = max(ix.top, job+1)
	} else {
		ix.putFar(job, s)
	}
	ix.live++
	ix.credit = min(ix.credit+slideCredit, 2*len(ix.win))
	if ix.inWin*2 > len(ix.win) {
		ix.resize(2*len(ix.win), ix.lo)
	}
	return true
}

// move records a new position for job, which must be queued.
func (ix *jobIndex) move(job, pos uint64) {
	if ix.inWindow(job) {
		if w := ix.slot(job); ix.owner(*w) != nil {
			w.pos = pos + 1
			return
		}
	}
	s := ix.far[job]
	s.pos = pos + 1
	ix.far[job] = s
}

// popped records that job, queued, was handed out. A slot in the window goes
// stale by itself, because the team's head has moved past its position; only
// a job kept in far needs removing.
func (ix *jobIndex) popped(job uint64) {
	// A queued job not in far is in the window.
	if len(ix.far) == 0 || !ix.deleteFar(job) {
		ix.inWin--
	}
	ix.live--
	ix.maybeShrink()
}

// delete removes job, which must be queued.
func (ix *jobIndex) delete(job uint64) {
	if ix.inWindow(job) {
		if w := ix.slot(job); ix.owner(*w) != nil {
			*w = winSlot{}
			ix.inWin--
			ix.live--
			ix.maybeShrink()
			return
		}
	}
	ix.deleteFar(job)
	ix.live--
	ix.maybeShrink()
}

// putFar records s for job in far.
func (ix *jobIndex) putFar(job uint64, s winSlot) {
	if ix.far == nil {
		ix.far = make(map[uint64]winSlot)
	}
	ix.far[job] = s
	ix.farPeak = max(ix.farPeak, len(ix.far))
}

// deleteFar removes job from far and reports whether it was there. It gives
// far's memory back once far has shrunk to a quarter of its peak.
func (ix *jobIndex) deleteFar(job uint64) bool {
	n := len(ix.far)
	delete(ix.far, job)
	if len(ix.far) == n {
		return false
	}
	switch n := len(ix.far); {
	case n == 0:
		ix.far, ix.farPeak = nil, 0
	case n*4 < ix.farPeak && ix.farPeak > minShrink:
		far := make(map[uint64]winSlot, n)
		for job, s := range ix.far {
			far[job] = s
		}
		ix.far, ix.farPeak = far, n
	}
	return true
}

// slide moves the window up by n ids, n at most its length, moving the live
// jobs it leaves behind to far.
func (ix *jobIndex) slide(n uint64) {
	for range n {
		w := ix.slot(ix.lo)
		if ix.owner(*w) != nil {
			ix.putFar(ix.lo, *w)
			ix.inWin--
		}
		*w = winSlot{}
		ix.lo++
	}
	ix.credit -= int(n)
}

// maybeShrink gives memory back once the jobs in the window fill a sixteenth
// of it.
func (ix *jobIndex) maybeShrink() {
	n := len(ix.win)
	if n <= minWindow || ix.inWin*16 >= n {
		return
	}
	size := max(minWindow, 1<<bits.Len(uint(4*ix.inWin)))
	// Keep the ids just below the top, where new ids arrive, and as much room
	// again above it.
	lo := ix.lo
	if ix.top-lo > uint64(size/2) {
		lo = ix.top - uint64(size/2)
	}
	ix.resize(size, lo)
}

// resize moves the window to size slots covering [lo, lo+size), moving the
// live jobs the new window does not cover to far. The window has grown to
// twice the live jobs or shrunk to a quarter, so the O(window) cost is paid
// for by the pushes or pops since the last resize.
func (ix *jobIndex) resize(size int, lo uint64) {
	old, oldLo := ix.win, ix.lo
	ix.win, ix.lo = make([]winSlot, size), lo
	ix.inWin = 0
	mask := uint64(len(old) - 1)
	for k := range uint64(len(old)) {
		id := oldLo + k
		s := old[id&mask]
		if ix.owner(s) == nil {
			continue
		}
		if ix.inWindow(id) {
			*ix.slot(id) = s
			ix.inWin++
		} else {
			ix.putFar(id, s)
		}
	}
	ix.credit = min(ix.credit, 2*size)
}
