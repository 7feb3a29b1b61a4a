package dispatch

import "fmt"

// checkInvariants returns an error describing the first broken internal
// invariant of s, or nil. It walks every structure, so only tests call it.
func (s *Scheduler) checkInvariants() error {
	ix := &s.index
	ready := 0
	active := map[*team]bool{}
	for name, t := range s.teams {
		if t.name != name {
			return fmt.Errorf("team %q is filed under %q", t.name, name)
		}
		if t.q.len() == 0 && t.inFlight == 0 {
			return fmt.Errorf("team %q has nothing ready or in flight but is still known", name)
		}
		if int(t.ref) >= len(ix.teams) || ix.teams[t.ref] != t || ix.gens[t.ref] != t.gen {
			return fmt.Errorf("team %q is not registered under its ref %d", name, t.ref)
		}
		live, dead := 0, 0
		for i := t.q.head; i < len(t.q.buf); i++ {
			e := t.q.buf[i]
			if e.seq == 0 {
				dead++
				continue
			}
			live++
			owner, pos, ok := ix.get(e.job)
			if !ok || owner != t || pos != t.q.base+uint64(i) {
				return fmt.Errorf("index has job %d of team %q at (%v, %d, %v), want position %d",
					e.job, name, owner, pos, ok, t.q.base+uint64(i))
			}
		}
		if live != t.q.live || dead != t.q.dead {
			return fmt.Errorf("team %q counts %d live and %d dead jobs, its buffer holds %d and %d",
				name, t.q.live, t.q.dead, live, dead)
		}
		if live > 0 && t.q.buf[t.q.head].seq == 0 {
			return fmt.Errorf("team %q has a tombstone at its head", name)
		}
		ready += live
		if live > 0 {
			active[t] = true
		}
	}
	if ready != s.ready || ready != ix.live {
		return fmt.Errorf("queues hold %d jobs, Ready() says %d, the index %d", ready, s.ready, ix.live)
	}

	inWin := 0
	for k := range uint64(len(ix.win)) {
		id := ix.lo + k
		if ix.owner(*ix.slot(id)) != nil {
			inWin++
			if _, ok := ix.far[id]; ok {
				return fmt.Errorf("job %d is both in the window and in far", id)
			}
		}
	}
	if inWin != ix.inWin {
		return fmt.Errorf("the window holds %d live jobs, inWin says %d", inWin, ix.inWin)
	}
	for job, sl := range ix.far {
		if ix.owner(sl) == nil {
			return fmt.Errorf("far holds job %d, which is not queued", job)
		}
	}
	if ix.inWin+len(ix.far) != ix.live {
		return fmt.Errorf("window %d + far %d != live %d", ix.inWin, len(ix.far), ix.live)
	}

	if s.fifo {
		if len(s.heads) != len(active) {
			return fmt.Errorf("the heap holds %d teams, %d have ready work", len(s.heads), len(active))
		}
		for i, t := range s.heads {
			if t.heapIdx != i || !active[t] {
				return fmt.Errorf("heap entry %d is team %q with heapIdx %d", i, t.name, t.heapIdx)
			}
			if i > 0 && s.heapLess(i, (i-1)/2) {
				return fmt.Errorf("heap entry %d is older than its parent", i)
			}
		}
		return nil
	}
	ring := 0
	if s.cur != nil {
		for t := s.cur; ; t = t.next {
			if !active[t] || t.next.prev != t {
				return fmt.Errorf("rotation holds team %q, which has no ready work or a broken link", t.name)
			}
			ring++
			if t.next == s.cur || ring > len(active) {
				break
			}
		}
		if s.remaining < 0 || s.remaining > s.cur.weight {
			return fmt.Errorf("the turn of team %q has %d jobs left, weight %d", s.cur.name, s.remaining, s.cur.weight)
		}
	}
	if ring != len(active) {
		return fmt.Errorf("rotation holds %d teams, %d have ready work", ring, len(active))
	}
	return nil
}
