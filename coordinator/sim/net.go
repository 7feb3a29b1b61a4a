package sim

import (
	"errors"
	"time"
)

// errRefused is the end of a stream the coordinator was not there to take.
var errRefused = errors.New("connection refused")

// Network odds during the faulty phase. Without faults every message
// arrives, after a short delay.
const (
	// pLost is the chance that a message is lost: a unary request or its
	// answer never arrives; on a stream, the connection breaks.
	pLost = 0.004
	// pSlow is the chance that a message is held up for seconds, past
	// heartbeats and lease deadlines.
	pSlow = 0.003
)

// delay draws a one-way network delay.
func (w *world) delay() time.Duration {
	if w.faulty(pSlow) {
		return w.between(leaseTTL/4, 2*leaseTTL)
	}
	return w.between(20*time.Microsecond, time.Millisecond)
}

// rpc carries a unary call to the coordinator (in a cluster, to the node
// the caller's health checks say leads). serve runs at that node when the
// request arrives, unless it is lost or the node is down (the caller then
// hears nothing and times out); it answers through respond, which carries
// the answer back (or loses it) and runs it at the caller. A request that
// reaches a stopped (paused) process is served when it resumes.
func (w *world) rpc(serve func(c *coordinator, respond func(answer func()))) {
	if w.faulty(pLost) {
		return
	}
	c := w.target()
	w.after(w.delay(), func() {
		if !c.up {
			return
		}
		inc := c.incarnation
		c.alive(inc, func() {
			serve(c, func(answer func()) {
				if c.incarnation != inc || w.faulty(pLost) {
					return
				}
				w.after(w.delay(), answer)
			})
		})
	})
}

// stream is one renderer session: a connection that delivers its messages
// in order each way, until it breaks.
type stream struct {
	r *renderer
	// node is the coordinator node the stream was dialled to, and
	// incarnation the process of it the stream reached.
	node        *coordinator
	incarnation int
	// srv is the coordinator's end, once the session is open.
	srv *serverSession
	// up and down are the arrival times of the last message each way:
	// a stream never reorders.
	up, down time.Duration
	// broken is set once the connection is gone.
	broken bool
}

// dial opens s to the node a client would pick (target): fn runs there
// when the connection arrives, unless it is lost on the way; a node that
// is down refuses it.
func (w *world) dial(s *stream, fn func(c *coordinator)) {
	c := w.target()
	s.node = c
	if w.faulty(pLost) {
		w.breakStream(s)
		return
	}
	s.up = w.now + w.delay()
	w.after(s.up-w.now, func() {
		switch {
		case s.broken:
		case !c.up:
			s.broken = true
			w.after(w.delay(), func() { s.r.streamEnded(s, errRefused) })
		default:
			c.alive(c.incarnation, func() {
				if !s.broken {
					fn(c)
				}
			})
		}
	})
}

// toCoord sends on s toward the coordinator; fn runs at the coordinator on
// arrival, unless the stream broke by then or breaks on the way.
func (w *world) toCoord(s *stream, fn func()) {
	if s.broken {
		return
	}
	if w.faulty(pLost) {
		w.breakStream(s)
		return
	}
	s.up = max(s.up, w.now+w.delay())
	w.after(s.up-w.now, func() {
		if c := s.node; !s.broken && c.up && c.incarnation == s.incarnation {
			c.alive(c.incarnation, func() {
				if !s.broken {
					fn()
				}
			})
		}
	})
}

// toRenderer sends on s toward its renderer; fn runs there on arrival,
// unless the stream broke by then or breaks on the way.
func (w *world) toRenderer(s *stream, fn func()) {
	if s.broken {
		return
	}
	if w.faulty(pLost) {
		w.breakStream(s)
		return
	}
	s.down = max(s.down, w.now+w.delay())
	w.after(s.down-w.now, func() {
		if !s.broken {
			fn()
		}
	})
}

// endStream delivers the end of s to its renderer, in order after what the
// coordinator sent before: the coordinator ended the session.
func (w *world) endStream(s *stream, why error) {
	if s.broken {
		return
	}
	s.down = max(s.down, w.now+w.delay())
	w.after(s.down-w.now, func() {
		s.broken = true
		s.r.streamEnded(s, why)
	})
}

// breakStream breaks s: its renderer notices soon; the coordinator notices
// later (keepalive), and closes the session without a hand-back.
func (w *world) breakStream(s *stream) {
	if s.broken {
		return
	}
	s.broken = true
	w.after(w.between(time.Millisecond, leaseTTL/10), func() { s.r.streamEnded(s, errBroken) })
	w.after(w.between(leaseTTL/100, keepalive), func() { s.node.streamGone(s) })
}
