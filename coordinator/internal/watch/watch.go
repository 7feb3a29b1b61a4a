package watch

import (
	"context"
	"errors"
	"sync"

	"github.com/leasehold/leasehold/coordinator/internal/jobs"
)

// JobEvent is a committed event of a job, as watchers see it; the event's
// Phase is the job's phase right after it.
type JobEvent struct {
	Job   uint64
	Batch uint64
	Event jobs.Event
}

// ErrClosed ends a watch its holder closed.
var ErrClosed = errors.New("watch closed")

// WatchLimit is how many committed events a watcher may fall behind before
// it is ended as too slow.
const WatchLimit = 4096

// ErrSlowWatcher ends a watch that fell more than WatchLimit events behind.
var ErrSlowWatcher = errors.New("watcher fell too far behind")

// Hub fans committed events out to batch watchers. The writer publishes,
// on its goroutine and only after commit; watches are opened, read and
// closed from any goroutine.
type Hub struct {
	mu       sync.Mutex
	closed   bool
	closeErr error
	watches  map[uint64]map[*Watch]struct{}
}

// NewHub returns an open hub.
func NewHub() *Hub { return &Hub{watches: make(map[uint64]map[*Watch]struct{})} }

// Watch is a subscription to a batch's committed job events. Its buffer
// grows with what is pending and starts empty, so an idle watch costs a few
// hundred bytes however many are open.
type Watch struct {
	h     *Hub
	batch uint64

	mu      sync.Mutex
	pending []JobEvent
	err     error // set when the watch ended
	ready   chan struct{}
}

// Watch subscribes to a batch's events. Subscribe first, then read the
// batch's current state, so that nothing committed in between is missed.
// On a closed hub the watch has ended already, with the hub's reason.
func (h *Hub) Watch(batch uint64) *Watch {
	w := &Watch{h: h, batch: batch, ready: make(chan struct{}, 1)}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		w.end(h.closeErr)
		return w
	}
	if h.watches[batch] == nil {
		h.watches[batch] = make(map[*Watch]struct{})
	}
	h.watches[batch][w] = struct{}{}
	return w
}

// Next waits for committed events and returns every one pending, in commit
// order. It returns the watch's end (ErrSlowWatcher, ErrStopped) once the
// pending events are taken, or ctx's error.
func (w *Watch) Next(ctx context.Context) ([]JobEvent, error) {
	for {
		w.mu.Lock()
		evs, err := w.pending, w.err
		w.pending = nil
		w.mu.Unlock()
		if len(evs) > 0 {
			return evs, nil
		}
		if err != nil {
			return nil, err
		}
		select {
		case <-w.ready:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// Close ends the watch. It is safe to call more than once.
func (w *Watch) Close() {
	w.h.mu.Lock()
	defer w.h.mu.Unlock()
	w.h.removeLocked(w, ErrClosed)
}

func (w *Watch) end(err error) {
	w.mu.Lock()
	if w.err == nil {
		w.err = err
	}
	w.mu.Unlock()
	select {
	case w.ready <- struct{}{}:
	default:
	}
}

// push queues ev, or ends the watch when it is too far behind.
func (w *Watch) push(ev JobEvent) bool {
	w.mu.Lock()
	if len(w.pending) >= WatchLimit {
		w.pending = nil
		w.mu.Unlock()
		return false
	}
	w.pending = append(w.pending, ev)
	w.mu.Unlock()
	select {
	case w.ready <- struct{}{}:
	default:
	}
	return true
}

func (h *Hub) removeLocked(w *Watch, why error) {
	set, ok := h.watches[w.batch]
	if !ok {
		return
	}
	if _, ok := set[w]; !ok {
		return
	}
	delete(set, w)
	if len(set) == 0 {
		delete(h.watches, w.batch)
	}
	w.end(why)
}

// Publish hands a committed event to its batch's watchers; one too far
// behind is ended with ErrSlowWatcher. Only the writer calls it.
func (h *Hub) Publish(ev JobEvent) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for w := range h.watches[ev.Batch] {
		if !w.push(ev) {
			h.removeLocked(w, ErrSlowWatcher)
		}
	}
}

// EndAll ends every subscription with why (the writer's term ended); new
// ones may follow.
func (h *Hub) EndAll(why error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, set := range h.watches {
		for w := range set {
			w.end(why)
		}
	}
	clear(h.watches)
}

// Close ends every subscription with why and refuses new ones (they end
// at once with why). It is safe to call more than once.
func (h *Hub) Close(why error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return
	}
	h.closed, h.closeErr = true, why
	for _, set := range h.watches {
		for w := range set {
			w.end(why)
		}
	}
	h.watches = nil
}
