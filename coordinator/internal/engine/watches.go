package engine

import "github.com/leasehold/leasehold/coordinator/internal/watch"

// WatchBatch subscribes to a batch's committed events (see watch.Hub.Watch):
// the batch must exist. Subscribe first, then read the batch's state, so
// that nothing committed in between is missed.
func (e *Engine) WatchBatch(batch uint64) (*watch.Watch, error) {
	if _, err := e.Batch(batch); err != nil {
		return nil, err
	}
	return e.hub.Watch(batch), nil
}
