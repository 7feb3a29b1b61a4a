// Package testclock is a clock a test sets by hand: Now returns the time
// it was given and only Advance moves it, with a monotonic reading (Mono)
// that moves with it. It is safe for concurrent use, so that the code
// under test may read it from its own goroutines.
package testclock

import (
	"sync"
	"time"
)

// Clock is a hand-set clock.
type Clock struct {
	mu   sync.Mutex
	now  time.Time
	mono time.Duration
}

// New returns a clock that reads t until advanced, its monotonic reading
// at 0.
func New(t time.Time) *Clock { return &Clock{now: t} }

// NewMono returns a clock that reads t and the monotonic reading mono
// until advanced.
func NewMono(t time.Time, mono time.Duration) *Clock { return &Clock{now: t, mono: mono} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Mono returns the clock's monotonic reading.
func (c *Clock) Mono() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.mono
}

// Advance moves the clock, and its monotonic reading, d forward.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	c.mono += d
}

// StepWall moves the wall clock alone, as an NTP step or an operator
// does; the monotonic reading stays.
func (c *Clock) StepWall(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}
