// Package testclock is a clock a test sets by hand: Now returns the time
// it was given and only Advance moves it. It is safe for concurrent use,
// so that the code under test may read it from its own goroutines.
package testclock

import (
	"sync"
	"time"
)

// Clock is a hand-set clock.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// New returns a clock that reads t until advanced.
func New(t time.Time) *Clock { return &Clock{now: t} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock d forward.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}
