package engine

import (
	"sync"
	"sync/atomic"
)

// watchBuffer is how many events a watcher may fall behind before it is
// ended as too slow.
const watchBuffer = 4096

// revocationBuffer is how many revocations a renderer's stream may have
// pending; beyond it the renderer learns on its next heartbeat instead.
const revocationBuffer = 1024

// hub fans committed events out to batch watchers and revocations out to
// renderers' heartbeat streams. The writer publishes only after commit.
type hub struct {
	mu      sync.Mutex
	closed  bool
	watches map[uint64]map[*Watch]struct{}
	revs    map[string]map[chan LeaseStatus]struct{}
}

func (h *hub) init() {
	h.watches = make(map[uint64]map[*Watch]struct{})
	h.revs = make(map[string]map[chan LeaseStatus]struct{})
}

// Watch is a subscription to a batch's committed job events.
type Watch struct {
	// C delivers events in commit order. It is closed when the watch is
	// closed, falls too far behind, or the engine stops.
	C        <-chan JobEvent
	c        chan JobEvent
	h        *hub
	batch    uint64
	overflow atomic.Bool
}

// WatchBatch subscribes to a batch's events. Subscribe first, then read the
// batch's current state, so that nothing committed in between is missed.
func (e *Engine) WatchBatch(batch uint64) (*Watch, error) {
	if _, err := e.Batch(batch); err != nil {
		return nil, err
	}
	c := make(chan JobEvent, watchBuffer)
	w := &Watch{C: c, c: c, h: &e.hub, batch: batch}
	h := &e.hub
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		close(c)
		return w, nil
	}
	if h.watches[batch] == nil {
		h.watches[batch] = make(map[*Watch]struct{})
	}
	h.watches[batch][w] = struct{}{}
	return w, nil
}

// Overflowed reports whether the watch ended because it fell behind.
func (w *Watch) Overflowed() bool { return w.overflow.Load() }

// Close ends the watch. It is safe to call more than once.
func (w *Watch) Close() {
	w.h.mu.Lock()
	defer w.h.mu.Unlock()
	w.h.removeLocked(w)
}

func (h *hub) removeLocked(w *Watch) {
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
	close(w.c)
}

func (h *hub) publishJob(ev JobEvent) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for w := range h.watches[ev.Job.BatchID] {
		select {
		case w.c <- ev:
		default:
			w.overflow.Store(true)
			h.removeLocked(w)
		}
	}
}

// SubscribeRevocations returns a channel of revocations (cancellations) of
// leases held by renderer, and a function that ends the subscription.
func (e *Engine) SubscribeRevocations(renderer string) (<-chan LeaseStatus, func()) {
	h := &e.hub
	c := make(chan LeaseStatus, revocationBuffer)
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		close(c)
		return c, func() {}
	}
	if h.revs[renderer] == nil {
		h.revs[renderer] = make(map[chan LeaseStatus]struct{})
	}
	h.revs[renderer][c] = struct{}{}
	return c, func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		if set, ok := h.revs[renderer]; ok {
			if _, ok := set[c]; ok {
				delete(set, c)
				close(c)
				if len(set) == 0 {
					delete(h.revs, renderer)
				}
			}
		}
	}
}

func (h *hub) publishRevocations(renderer string, list []LeaseStatus) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for c := range h.revs[renderer] {
		for _, s := range list {
			select {
			case c <- s:
			default:
			}
		}
	}
}

// closeAll ends every subscription (engine stop).
func (h *hub) closeAll() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return
	}
	h.closed = true
	for _, set := range h.watches {
		for w := range set {
			close(w.c)
		}
	}
	for _, set := range h.revs {
		for c := range set {
			close(c)
		}
	}
	h.watches, h.revs = nil, nil
}
