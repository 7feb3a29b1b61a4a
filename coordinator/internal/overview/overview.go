package overview

import (
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

// UnixMinute is the Unix minute of t.
func UnixMinute(t time.Time) int64 { return t.Unix() / 60 }

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

// Feed is where the writer publishes the overview and readers take it: an
// immutable value behind an atomic pointer, and a channel closed at each
// publication, so that readers never wait for the writer.
type Feed struct {
	st   *store.Store
	now  func() time.Time
	snap atomic.Pointer[Overview]
	// mu guards changed, which is closed and replaced at every publication.
	mu      sync.Mutex
	changed chan struct{}
}

// NewFeed returns an empty feed over st (read for the queues' oldest
// jobs); now is the readers' clock.
func NewFeed(st *store.Store, now func() time.Time) *Feed {
	return &Feed{st: st, now: now, changed: make(chan struct{})}
}

// Publish makes o the overview readers get and wakes those waiting. Only
// the writer calls it; o must not be modified afterwards.
func (f *Feed) Publish(o *Overview) {
	f.snap.Store(o)
	f.mu.Lock()
	close(f.changed)
	f.changed = make(chan struct{})
	f.mu.Unlock()
}

// Overview returns the last overview the writer published, with each
// team's OldestQueuedAt read from the store (one read transaction, one
// record per team with queued work), and a channel that is closed when the
// writer publishes the next one. It may be called from any goroutine and
// never waits for the writer. The overview is at most Config.OverviewEvery
// older than the last commit.
func (f *Feed) Overview() (Overview, <-chan struct{}, error) {
	f.mu.Lock()
	snap, changed := f.snap.Load(), f.changed
	f.mu.Unlock()
	o := *snap
	o.ReadAt = f.now()
	o.Teams = slices.Clone(snap.Teams)
	// Minutes that passed since the publication saw nothing finish and the
	// queues stay as they were: nothing was committed meanwhile.
	if gap := UnixMinute(o.ReadAt) - UnixMinute(o.At); gap > 0 {
		for i := range o.Teams {
			o.Teams[i].Minutes = rollMinutes(o.Teams[i].Minutes, gap, o.Teams[i].Depth)
		}
	}
	err := f.st.View(func(tx *store.Tx) error {
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
