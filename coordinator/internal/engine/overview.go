package engine

import (
	"cmp"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	"github.com/leasehold/leasehold/coordinator/internal/store"
)

// The overview is the live picture of the coordinator that consoles and
// `leasehold top` show: per-team counts, queue depth, leases in flight and
// the head of each ready queue, per-minute figures of the last hour, and
// the renderers with their leases. The writer builds it from its own
// incremental state (the counts it keeps per team, the dispatch queues,
// its lease index), never by scanning the store, and publishes it as an
// immutable value behind an atomic pointer: readers never touch the
// writer's state and never wait for it.

// RingMinutes is how many minutes of per-minute figures the writer keeps
// for each team.
const RingMinutes = 60

// DefaultOverviewEvery is how often at most the writer publishes the
// overview while commands keep coming; see Config.OverviewEvery.
const DefaultOverviewEvery = 100 * time.Millisecond

// Overview is one published picture. It is shared by every reader and must
// not be modified.
type Overview struct {
	// Seq numbers the publications of this engine, from 1.
	Seq uint64
	// At is the writer's wall clock when it was published.
	At time.Time
	// ReadAt is the engine's wall clock when Engine.Overview returned it:
	// ages and rate windows are measured to it.
	ReadAt       time.Time
	Dispatch     jobs.DispatchState
	LiveCapacity int
	// Teams are every team that ever had a job, by name.
	Teams []TeamStats
	// Renderers are the renderers the writer knows (connected, recently
	// seen, or holding a lease), by id.
	Renderers []RendererStats
}

// TeamStats are one team's figures.
type TeamStats struct {
	Team string
	// Counts are the team's stored jobs per phase.
	Counts jobs.Counts
	// Depth is the number of ready (QUEUED) jobs in its dispatch queue;
	// InFlight the leases it holds.
	Depth    int
	InFlight int
	// Head is the job at the front of its ready queue, 0 when it is empty;
	// OldestQueuedAt is when that job was queued (set by Engine.Overview).
	Head           uint64
	OldestQueuedAt time.Time
	// Minutes are the last RingMinutes minutes, oldest first, the last one
	// being the minute of Overview.At.
	Minutes []MinuteStats
}

// MinuteStats are one team's figures for one minute of the wall clock.
type MinuteStats struct {
	Start time.Time
	// Succeeded, Failed and Cancelled count the jobs that reached each
	// terminal phase in the minute.
	Succeeded, Failed, Cancelled int
	// Depth is the ready queue's depth at the last sample in the minute, or
	// carried over from the minute before when the queue did not move.
	Depth int
}

// RendererStats are one renderer's figures.
type RendererStats struct {
	ID string
	// Capacity is the slots it last declared.
	Capacity int
	// Connected reports a live session or heartbeat stream; Draining that
	// it announced a drain and takes no more work.
	Connected bool
	Draining  bool
	// LastSeen is the last time it spoke: a session message (heartbeats,
	// completions), a heartbeat stream message or an Acquire. Zero when it
	// has not spoken since the coordinator started.
	LastSeen time.Time
	// Leases are the live leases it holds, by job id.
	Leases []LeaseStats
}

// LeaseStats is one live lease.
type LeaseStats struct {
	Job      uint64
	Team     string
	Token    uint64
	Deadline time.Time
}

// minuteSlot is one team's figures for one minute; minute is the Unix
// minute it holds, and a slot holding an older minute than asked is empty.
type minuteSlot struct {
	minute                       int64
	succeeded, failed, cancelled int
	depth                        int
	sampled                      bool
}

// minuteRing is a team's last RingMinutes minutes, indexed by Unix minute
// modulo RingMinutes. It is owned by the writer.
type minuteRing [RingMinutes]minuteSlot

func unixMinute(t time.Time) int64 { return t.Unix() / 60 }

// slot returns the slot of minute, cleared if it held an older one.
func (r *minuteRing) slot(minute int64) *minuteSlot {
	s := &r[((minute%RingMinutes)+RingMinutes)%RingMinutes]
	if s.minute != minute {
		*s = minuteSlot{minute: minute}
	}
	return s
}

// finished counts a job that reached terminal phase p at now.
func (r *minuteRing) finished(now time.Time, p jobs.Phase) {
	s := r.slot(unixMinute(now))
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
	s := r.slot(unixMinute(now))
	s.depth, s.sampled = depth, true
}

// series returns the RingMinutes minutes up to the minute of now, oldest
// first. A minute without a depth sample carries the depth of the minute
// before it (the queue did not move, or nothing was published); depth is
// the depth now, for the last minute.
func (r *minuteRing) series(now time.Time, depth int) []MinuteStats {
	last := unixMinute(now)
	out := make([]MinuteStats, RingMinutes)
	carry := 0
	for i := range out {
		m := last - RingMinutes + 1 + int64(i)
		ms := MinuteStats{Start: time.Unix(m*60, 0).In(now.Location())}
		if s := r[((m%RingMinutes)+RingMinutes)%RingMinutes]; s.minute == m {
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

// rollMinutes returns ms moved on by gap minutes in which nothing finished
// and the ready queue stayed at depth.
func rollMinutes(ms []MinuteStats, gap int64, depth int) []MinuteStats {
	if len(ms) == 0 {
		return ms
	}
	last := ms[len(ms)-1].Start
	out := make([]MinuteStats, 0, len(ms))
	if gap < int64(len(ms)) {
		out = append(out, ms[gap:]...)
	}
	for i := int64(len(out)); i < int64(len(ms)); i++ {
		out = append(out, MinuteStats{Start: last.Add(time.Duration(gap-int64(len(ms))+1+i) * time.Minute), Depth: depth})
	}
	return out
}

// overviewPub is where the writer publishes the overview.
type overviewPub struct {
	snap atomic.Pointer[Overview]
	// mu guards changed, which is closed and replaced at every publication.
	mu      sync.Mutex
	changed chan struct{}

	// Owned by the writer.
	seq uint64
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
// RingMinutes + renderers + live leases).
func (e *Engine) publishOverview(wall time.Time, mono time.Duration) {
	e.ov.seq++
	o := &Overview{Seq: e.ov.seq, At: wall, Dispatch: e.dispatchSt, LiveCapacity: e.liveCapacity(mono)}
	teams := make(map[string]bool, len(e.teamCounts))
	for t := range e.teamCounts {
		teams[t] = true
	}
	for _, t := range e.sched.Teams() {
		teams[t] = true
	}
	for t := range teams {
		ts := TeamStats{Team: t, Depth: e.sched.Depth(t), InFlight: e.sched.InFlight(t)}
		if c := e.teamCounts[t]; c != nil {
			ts.Counts = *c
		}
		ts.Head, _ = e.sched.Head(t)
		r := e.ring(t)
		r.sample(wall, ts.Depth)
		ts.Minutes = r.series(wall, ts.Depth)
		o.Teams = append(o.Teams, ts)
	}
	slices.SortFunc(o.Teams, func(a, b TeamStats) int { return cmp.Compare(a.Team, b.Team) })

	at := func(d time.Duration) time.Time { return wall.Add(d - mono) }
	byID := make(map[string]*RendererStats, len(e.renderers))
	get := func(id string) *RendererStats {
		rs := byID[id]
		if rs == nil {
			rs = &RendererStats{ID: id}
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
		rs.Leases = append(rs.Leases, LeaseStats{Job: job, Team: le.team, Token: le.token, Deadline: le.shown})
	}
	for _, rs := range byID {
		slices.SortFunc(rs.Leases, func(a, b LeaseStats) int { return cmp.Compare(a.Job, b.Job) })
		o.Renderers = append(o.Renderers, *rs)
	}
	slices.SortFunc(o.Renderers, func(a, b RendererStats) int { return cmp.Compare(a.ID, b.ID) })

	e.ov.snap.Store(o)
	e.ov.last, e.ov.dirty = time.Now(), false
	e.ov.mu.Lock()
	if e.ov.changed != nil {
		close(e.ov.changed)
	}
	e.ov.changed = make(chan struct{})
	e.ov.mu.Unlock()
}

// Overview returns the last overview the writer published, with each
// team's OldestQueuedAt read from the store (one read transaction, one
// record per team with queued work), and a channel that is closed when the
// writer publishes the next one. It may be called from any goroutine and
// never waits for the writer. The overview is at most Config.OverviewEvery
// older than the last commit.
func (e *Engine) Overview() (Overview, <-chan struct{}, error) {
	e.ov.mu.Lock()
	snap, changed := e.ov.snap.Load(), e.ov.changed
	e.ov.mu.Unlock()
	o := *snap
	o.ReadAt = e.cfg.Now()
	o.Teams = slices.Clone(snap.Teams)
	// Minutes that passed since the publication saw nothing finish and the
	// queues stay as they were: nothing was committed meanwhile.
	if gap := unixMinute(o.ReadAt) - unixMinute(o.At); gap > 0 {
		for i := range o.Teams {
			o.Teams[i].Minutes = rollMinutes(o.Teams[i].Minutes, gap, o.Teams[i].Depth)
		}
	}
	err := e.st.View(func(tx *store.Tx) error {
		for i := range o.Teams {
			if o.Teams[i].Head == 0 {
				continue
			}
			j, found, err := tx.Job(o.Teams[i].Head)
			if err != nil {
				return err
			}
			// A head leased since the publication still tells when the
			// oldest work of that moment was queued.
			if found {
				o.Teams[i].OldestQueuedAt = j.EnqueuedAt
			}
		}
		return nil
	})
	return o, changed, err
}
