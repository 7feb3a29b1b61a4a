// Package ratelog lets events of a kind be logged at most once per
// interval, and tells the line it lets through how many of that kind it
// held back since the last: a flood of refused connections costs a
// counter increment each and a line per interval, and that line still
// names one source of the flood.
package ratelog

import (
	"sync"
	"time"
)

// Limiter decides, per kind, which events are logged. Kinds are a small
// set the caller names (a listener and a cause), never what a remote
// party chooses, which would grow the limiter without bound. It is safe
// for concurrent use.
type Limiter struct {
	every time.Duration
	now   func() time.Time
	mu    sync.Mutex
	kinds map[string]*kind
}

// kind is when a kind was last logged and how many of it were held back
// since.
type kind struct {
	last time.Time
	held int
}

// New returns a limiter that lets one event of each kind through per
// every; now is its clock (nil: time.Now).
func New(every time.Duration, now func() time.Time) *Limiter {
	if now == nil {
		now = time.Now
	}
	return &Limiter{every: every, now: now, kinds: map[string]*kind{}}
}

// Allow reports whether an event of kind k may be logged now: the first
// of k, or the first once every has passed since the last let through.
// When it may, held is how many events of k it held back in between.
func (l *Limiter) Allow(k string) (ok bool, held int) {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.kinds[k]
	if s == nil {
		s = &kind{}
		l.kinds[k] = s
	} else if now.Sub(s.last) < l.every {
		s.held++
		return false, 0
	}
	held, s.last, s.held = s.held, now, 0
	return true, held
}
