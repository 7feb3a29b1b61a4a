package engine

import (
	"context"
	"errors"
	"sync"
)

// WatchLimit is how many committed events a watcher may fall behind before
// it is ended as too slow.
const WatchLimit = 4096

// ErrSlowWatcher ends a watch that fell more than WatchLimit events behind.
var ErrSlowWatcher = errors.New("watcher fell too far behind")

// hub fans committed events out to batch watchers. The writer publishes
// only after commit.
type hub struct {
	mu      sync.Mutex
	closed  bool
	watches map[uint64]map[*Watch]struct{}
}

func (h *hub) init() {
	h.watches = make(map[uint64]map[*Watch]struct{})
}

// Watch is a subscription to a batch's committed job events. Its buffer
// grows with what is pending and starts empty, so an idle watch costs a few
// hundred bytes however many are open.
type Watch struct {
	h     *hub
	batch uint64

	mu      sync.Mutex
	pending []JobEvent
	err     error // set when the watch ended
	ready   chan struct{}
}

// WatchBatch subscribes to a batch's events. Subscribe first, then read the
// batch's current state, so that nothing committed in between is missed.
func (e *Engine) WatchBatch(batch uint64) (*Watch, error) {
	if _, err := e.Batch(batch); err != nil {
		return nil, err
	}
	w := &Watch{h: &e.hub, batch: batch, ready: make(chan struct{}, 1)}
	h := &e.hub
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		w.end(ErrStopped)
		return w, nil
	}
	if h.watches[batch] == nil {
		h.watches[batch] = make(map[*Watch]struct{})
	}
	h.watches[batch][w] = struct{}{}
	return w, nil
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
	w.h.removeLocked(w)
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
	w.end(ErrStopped)
}

func (h *hub) publishJob(ev JobEvent) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for w := range h.watches[ev.Batch] {
		if !w.push(ev) {
			w.end(ErrSlowWatcher)
			h.removeLocked(w)
		}
	}
}

// endAll ends every subscription with why (the writer's term ended); new
// ones may follow.
func (h *hub) endAll(why error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, set := range h.watches {
		for w := range set {
			w.end(why)
		}
	}
	clear(h.watches)
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
			w.end(ErrStopped)
		}
	}
	h.watches = nil
}
