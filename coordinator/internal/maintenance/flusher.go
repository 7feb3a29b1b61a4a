package maintenance

import (
	"cmp"
	"time"
)

// FlusherIntervalDefault is how often a Flusher flushes.
const FlusherIntervalDefault = time.Second

// Flusher calls Flush every Interval, and once more when it stops: the
// summaries of refusal logs that were rate-limited.
type Flusher struct {
	service
	flush    func()
	interval time.Duration
}

// NewFlusher returns a Flusher of flush every interval (0: the default).
func NewFlusher(flush func(), interval time.Duration) *Flusher {
	return &Flusher{service: newService(), flush: flush, interval: cmp.Or(interval, FlusherIntervalDefault)}
}

// Start starts the loop; calling it again does nothing.
func (f *Flusher) Start() {
	f.start(func(stopC <-chan struct{}) {
		t := time.NewTicker(f.interval)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				f.flush()
			case <-stopC:
				f.flush()
				return
			}
		}
	})
}

// Stop stops the loop, after a last flush, and waits for it.
func (f *Flusher) Stop() { f.stop() }
