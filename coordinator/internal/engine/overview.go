package engine

import (
	"cmp"
	"slices"
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	"github.com/leasehold/leasehold/coordinator/internal/overview"
)

// DefaultOverviewEvery is how often at most the writer publishes the
// overview while commands keep coming; see Config.OverviewEvery.
const DefaultOverviewEvery = 100 * time.Millisecond

// minuteSlot is one team's figures for one minute; minute is the Unix
// minute it holds, and a slot holding an older minute than asked is empty.
type minuteSlot struct {
	minute                       int64
	succeeded, failed, cancelled int
	depth                        int
	sampled                      bool
}

// minuteRing is a team's last overview.RingMinutes minutes, indexed by Unix minute
// modulo overview.RingMinutes. It is owned by the writer.
type minuteRing [overview.RingMinutes]minuteSlot

// slot returns the slot of minute, cleared if it held an older one.
func (r *minuteRing) slot(minute int64) *minuteSlot {
	s := &r[((minute%overview.RingMinutes)+overview.RingMinutes)%overview.RingMinutes]
	if s.minute != minute {
		*s = minuteSlot{minute: minute}
	}
	return s
}

// finished counts a job that reached terminal phase p at now.
func (r *minuteRing) finished(now time.Time, p jobs.Phase) {
	s := r.slot(overview.UnixMinute(now))
	switch p {
	case jobs.PhaseSucceeded:
		s.succeeded++
	case jobs.PhaseFailed:
		s.failed++
	case jobs.PhaseCancelled:
		s.cancelled++
	}
}

// sample records the ready queue's depth at now.
func (r *minuteRing) sample(now time.Time, depth int) {
	s := r.slot(overview.UnixMinute(now))
	s.depth, s.sampled = depth, true
}

// series returns the overview.RingMinutes minutes up to the minute of now, oldest
// first. A minute without a depth sample carries the depth of the minute
// before it (the queue did not move, or nothing was published); depth is
// the depth now, for the last minute.
func (r *minuteRing) series(now time.Time, depth int) []overview.MinuteStats {
	last := overview.UnixMinute(now)
	out := make([]overview.MinuteStats, overview.RingMinutes)
	carry := 0
	for i := range out {
		m := last - overview.RingMinutes + 1 + int64(i)
		ms := overview.MinuteStats{Start: time.Unix(m*60, 0).In(now.Location())}
		if s := r[((m%overview.RingMinutes)+overview.RingMinutes)%overview.RingMinutes]; s.minute == m {
			ms.Succeeded, ms.Failed, ms.Cancelled = s.succeeded, s.failed, s.cancelled
			if s.sampled {
				carry = s.depth
			}
		}
		ms.Depth = carry
		out[i] = ms
	}
	out[len(out)-1].Depth = depth
	return out
}

// overviewPub is the writer's side of publishing the overview; it owns
// it.
type overviewPub struct {
	feed *overview.Feed
	seq  uint64
	// last is when the last overview was published (the process's clock:
	// publishing is bounded in real time, whatever clock the engine runs
	// on); dirty says something was applied since.
	last  time.Time
	dirty bool
}

// ring returns team's minute ring, creating it.
func (e *Engine) ring(team string) *minuteRing {
	r := e.rings[team]
	if r == nil {
		r = &minuteRing{}
		e.rings[team] = r
	}
	return r
}

// finished counts a job that just reached a terminal phase in its team's
// minute ring (the metrics count it from the group's tallies).
func (e *Engine) finished(j jobs.Job, now time.Time) {
	e.ring(j.Team).finished(now, j.Phase)
}

// maybePublishOverview publishes the overview after a group that applied
// something, at most once per Config.OverviewEvery; a group inside that
// interval leaves it dirty, and the writer's timer publishes it when the
// interval ends (resetTimer), so that it is never more than OverviewEvery
// behind what was committed. An operator's pause or resume (urgent) is
// published at once: an operator who resumed dispatch and then looks
// must not see it paused. Runs on the writer goroutine.
func (e *Engine) maybePublishOverview(changed, urgent bool, wall time.Time, mono time.Duration) {
	if changed {
		e.ov.dirty = true
	}
	if e.ov.dirty && (urgent || time.Since(e.ov.last) >= e.cfg.OverviewEvery) {
		e.publishOverview(wall, mono)
	}
}

// overviewDue returns how long until a dirty overview is due, or false
// when it is not dirty.
func (e *Engine) overviewDue() (time.Duration, bool) {
	if !e.ov.dirty {
		return 0, false
	}
	return e.cfg.OverviewEvery - time.Since(e.ov.last), true
}

// publishOverview builds the overview from the writer's state at wall
// (mono on the monotonic clock) and publishes it. It runs on the writer
// goroutine, or in New before the writer starts. It costs O(teams ×
// overview.RingMinutes + renderers + live leases).
func (e *Engine) publishOverview(wall time.Time, mono time.Duration) {
	e.ov.seq++
	o := &overview.Overview{Seq: e.ov.seq, At: wall, Dispatch: e.dispatchSt, LiveCapacity: e.liveCapacity(mono)}
	teams := make(map[string]bool, len(e.teamCounts))
	for t := range e.teamCounts {
		teams[t] = true
	}
	for _, t := range e.sched.Teams() {
		teams[t] = true
	}
	for t := range teams {
		ts := overview.TeamStats{Team: t, Depth: e.sched.Depth(t), InFlight: e.sched.InFlight(t)}
		if c := e.teamCounts[t]; c != nil {
			ts.Counts = *c
		}
		ts.Head, _ = e.sched.Head(t)
		r := e.ring(t)
		r.sample(wall, ts.Depth)
		ts.Minutes = r.series(wall, ts.Depth)
		o.Teams = append(o.Teams, ts)
	}
	slices.SortFunc(o.Teams, func(a, b overview.TeamStats) int { return cmp.Compare(a.Team, b.Team) })

	at := func(d time.Duration) time.Time { return wall.Add(d - mono) }
	byID := make(map[string]*overview.RendererStats, len(e.renderers))
	get := func(id string) *overview.RendererStats {
		rs := byID[id]
		if rs == nil {
			rs = &overview.RendererStats{ID: id}
			byID[id] = rs
		}
		return rs
	}
	for id, r := range e.renderers {
		rs := get(id)
		rs.Capacity, rs.Connected, rs.Draining, rs.LastSeen = r.capacity, r.conns > 0, r.draining, at(r.lastSeen)
	}
	for job, le := range e.leases {
		rs := get(le.renderer)
		rs.Leases = append(rs.Leases, overview.LeaseStats{Job: job, Team: le.team, Token: le.token, Deadline: le.shown})
	}
	for _, rs := range byID {
		slices.SortFunc(rs.Leases, func(a, b overview.LeaseStats) int { return cmp.Compare(a.Job, b.Job) })
		o.Renderers = append(o.Renderers, *rs)
	}
	slices.SortFunc(o.Renderers, func(a, b overview.RendererStats) int { return cmp.Compare(a.ID, b.ID) })

	e.ov.feed.Publish(o)
	e.ov.last, e.ov.dirty = time.Now(), false
}

// Overview returns the last overview the writer published (see
// overview.Feed.Overview); any goroutine may call it.
func (e *Engine) Overview() (overview.Overview, <-chan struct{}, error) { return e.ov.feed.Overview() }
