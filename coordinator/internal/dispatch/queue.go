package dispatch

// entry is one slot of a team's ready queue.
type entry struct {
	// job is the queued job's id.
	job uint64
	// seq is the scheduler-wide push sequence of this slot, starting at 1. Zero
	// marks a job that was removed after it was queued (a tombstone).
	seq uint64
}

// Tuning of the queue's housekeeping. Below these sizes the garbage is left in
// place: reclaiming it would cost more than it saves.
const (
	// minGarbage is how many popped slots or tombstones a queue tolerates before
	// it reclaims them.
	minGarbage = 32
	// minShrink is the capacity (in slots) below which buffers and indexes are
	// never reallocated to give memory back.
	minShrink = 1024
)

// queue is one team's first-in, first-out ready queue with cheap removal from
// the middle.
//
// Jobs sit in buf[head:] in push order. The scheduler's jobIndex maps every
// queued job to its absolute position: buf[i] is at position base+i, and base
// only grows, so sliding the buffer down to reclaim popped slots never
// rewrites the index, and every position below base+head has been handed out.
// Remove turns the job's slot into a tombstone, and the queue keeps buf[head]
// live whenever it is not empty, so the head is read without a lookup.
//
// Memory is bounded by the live jobs, not by the history: popped slots are
// reclaimed once they are half the buffer, tombstones once they outnumber the
// live jobs, and the buffer is reallocated smaller after the queue has shrunk
// to a quarter of its capacity.
type queue struct {
	buf  []entry
	head int
	base uint64
	live int
	dead int
}

// len returns the number of queued (live) jobs.
func (q *queue) len() int { return q.live }

// front returns the oldest queued job. The queue must not be empty.
func (q *queue) front() entry { return q.buf[q.head] }

// push appends job with push sequence seq for t, whose queue q is, and
// reports true, unless job is queued already (for any team), in which case it
// changes nothing and reports false.
func (q *queue) push(ix *jobIndex, t *team, job, seq uint64) bool {
	if len(q.buf) == cap(q.buf) && q.head >= len(q.buf)/4 {
		// Reuse the popped slots rather than grow past them.
		q.slide()
	}
	if !ix.add(t, job, q.base+uint64(len(q.buf))) {
		return false
	}
	q.buf = append(q.buf, entry{job: job, seq: seq})
	q.live++
	return true
}

// pop removes and returns the oldest queued job. The queue must not be empty.
func (q *queue) pop(ix *jobIndex) entry {
	e := q.buf[q.head]
	q.head++
	q.live--
	ix.popped(e.job)
	q.skipDead()
	q.tidy(ix)
	return e
}

// remove takes the job at buf[i] out of the queue.
func (q *queue) remove(ix *jobIndex, i int) {
	ix.delete(q.buf[i].job)
	q.buf[i].seq = 0
	q.live--
	if i == q.head {
		q.head++
		q.skipDead()
	} else {
		q.dead++
	}
	q.tidy(ix)
}

// skipDead advances head past tombstones so that buf[head] is live or the
// buffer is exhausted.
func (q *queue) skipDead() {
	for q.head < len(q.buf) && q.buf[q.head].seq == 0 {
		q.head++
		q.dead--
	}
}

// tidy reclaims popped slots and tombstones once they are worth reclaiming.
// Every reclaim costs at most about twice the garbage it removes, and that
// garbage was made by as many earlier pops and removes, so the cost is O(1)
// amortized.
func (q *queue) tidy(ix *jobIndex) {
	switch {
	case q.live == 0:
		q.base += uint64(len(q.buf))
		q.head, q.dead = 0, 0
		if cap(q.buf) > minShrink {
			q.buf = nil
		} else {
			q.buf = q.buf[:0]
		}
	case q.dead > minGarbage && q.dead > q.live:
		q.compact(ix)
	case q.head > minGarbage && q.head >= len(q.buf)/2:
		q.slide()
	}
}

// slide moves the unpopped slots to the start of the buffer. Positions are
// absolute, so the index stays valid.
func (q *queue) slide() {
	rest := q.buf[q.head:]
	dst := q.buf
	if cap(q.buf) > minShrink && cap(q.buf) > 4*len(rest) {
		dst = make([]entry, 0, 2*len(rest))
	}
	n := copy(dst[:cap(dst)], rest)
	q.buf = dst[:n]
	q.base += uint64(q.head)
	q.head = 0
}

// compact drops the tombstones and gives the live jobs new positions.
func (q *queue) compact(ix *jobIndex) {
	dst := q.buf[:0]
	if cap(q.buf) > minShrink && cap(q.buf) > 4*q.live {
		dst = make([]entry, 0, 2*q.live)
	}
	// The new positions lie past all old ones, so a stale position can never
	// name a slot of the compacted buffer.
	base := q.base + uint64(len(q.buf))
	for _, e := range q.buf[q.head:] {
		if e.seq == 0 {
			continue
		}
		ix.move(e.job, base+uint64(len(dst)))
		dst = append(dst, e)
	}
	q.buf = dst
	q.base = base
	q.head, q.dead = 0, 0
}
