package engine

import (
	"sync"
	"time"
)

// Conn is a renderer session registered with the writer. The writer owns
// its fields; handlers read what it delivers through Outbox.
type Conn struct {
	id       uint64
	renderer Renderer
	// instance identifies the renderer process; "" for a unary client's
	// session (see Engine.Open).
	instance string
	// credit is how many more grants it may take.
	credit int
	// budget is what the grants it takes may still carry in bytes, when
	// bounded (SessionOpen.MaxBytes); -1 is unbounded. A Session stream
	// has no bound here: the server splits what it pushes into messages
	// within the renderer's stated limit.
	budget   int
	draining bool
	// poll marks a unary Acquire's session (no instance, credit at open).
	poll bool
	// maxRefs is the most leases one list of its messages may name
	// (MaxLeaseRefs of the capacity it declared last).
	maxRefs int

	// Outbox delivers what the writer publishes after each commit.
	Outbox *Outbox
}

// stream reports whether c is a unary client's heartbeat stream: a
// session with neither instance nor credit of its own.
func (c *Conn) stream() bool { return c.instance == "" && !c.poll }

// ID returns the connection's id, for the commands that name it.
func (c *Conn) ID() uint64 { return c.id }

// Outbox is what the writer hands one connection after a commit: grants,
// revocations, and the end of the connection. It is safe for concurrent
// use; the writer fills it and the handler drains it.
type Outbox struct {
	mu      sync.Mutex
	grants  []Grant
	revoked []LeaseStatus
	ended   error
	closed  bool
	// ready is signalled (without blocking) when something was added.
	ready chan struct{}
}

func newOutbox() *Outbox { return &Outbox{ready: make(chan struct{}, 1)} }

// Ready is signalled when the outbox has something to take.
func (o *Outbox) Ready() <-chan struct{} { return o.ready }

// Take returns and clears what the outbox holds: the grants, the
// revocations, and, once the writer ended the connection, why.
func (o *Outbox) Take() (grants []Grant, revoked []LeaseStatus, ended error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	grants, revoked = o.grants, o.revoked
	o.grants, o.revoked = nil, nil
	return grants, revoked, o.ended
}

func (o *Outbox) signal() {
	select {
	case o.ready <- struct{}{}:
	default:
	}
}

// pushGrants adds grants unless the outbox is closed. The writer publishes
// grants only to connections still registered at the commit (group.endConn
// takes back those made to a connection that ended in the group), so a
// closed outbox gets none.
func (o *Outbox) pushGrants(gs []Grant) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed {
		return
	}
	if len(o.grants) == 0 {
		// The writer hands over a group's grants and keeps no reference.
		o.grants = gs
	} else {
		o.grants = append(o.grants, gs...)
	}
	o.signal()
}

func (o *Outbox) pushRevoked(s []LeaseStatus) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed {
		return
	}
	o.revoked = append(o.revoked, s...)
	o.signal()
}

// end closes the outbox with why and returns the grants never taken.
func (o *Outbox) end(why error) []Grant {
	o.mu.Lock()
	defer o.mu.Unlock()
	left := o.grants
	o.grants = nil
	if !o.closed {
		o.closed = true
		o.ended = why
	}
	o.signal()
	return left
}

// connSet is the writer's registry of renderer sessions.
type connSet struct {
	next uint64
	byID map[uint64]*Conn
	// byRenderer lists each renderer id's live sessions: one of a renderer
	// process, or any number of a unary client's.
	byRenderer map[string][]*Conn
	// hungry are the connections with credit, in rotation order.
	hungry []*Conn
}

func newConnSet() connSet {
	return connSet{byID: make(map[uint64]*Conn), byRenderer: make(map[string][]*Conn)}
}

func (s *connSet) add(c *Conn) {
	s.next++
	c.id = s.next
	c.Outbox = newOutbox()
	s.byID[c.id] = c
	s.byRenderer[c.renderer.ID] = append(s.byRenderer[c.renderer.ID], c)
}

func (s *connSet) remove(c *Conn) {
	delete(s.byID, c.id)
	list := s.byRenderer[c.renderer.ID]
	for i, o := range list {
		if o == c {
			list = append(list[:i:i], list[i+1:]...)
			break
		}
	}
	if len(list) == 0 {
		delete(s.byRenderer, c.renderer.ID)
	} else {
		s.byRenderer[c.renderer.ID] = list
	}
}

// wanting returns the connections that may take grants now, rotated by
// one each call so that no connection is always served first.
func (s *connSet) wanting() []*Conn {
	out := s.hungry[:0]
	for _, c := range s.hungry {
		if _, live := s.byID[c.id]; live && c.credit > 0 && !c.draining {
			out = append(out, c)
		}
	}
	s.hungry = out
	if len(out) > 1 {
		first := out[0]
		copy(out, out[1:])
		out[len(out)-1] = first
	}
	return out
}

// want marks c as able to take grants.
func (s *connSet) want(c *Conn) {
	for _, h := range s.hungry {
		if h == c {
			return
		}
	}
	s.hungry = append(s.hungry, c)
}

// seen records that renderer is alive with the given capacity.
func (e *Engine) seen(r Renderer, capacity int, now time.Duration) *rendererState {
	rs := e.renderers[r.ID]
	if rs == nil {
		rs = &rendererState{}
		e.renderers[r.ID] = rs
	}
	rs.principal, rs.maxCapacity = r.Principal, r.MaxCapacity
	if capacity > 0 {
		rs.capacity = capacity
	}
	rs.lastSeen = now
	return rs
}

// liveCapacity sums the capacity of renderers that hold a session or
// polled recently, forgetting the rest. Each credential's
// renderers count together for at most its MaxCapacity, so one credential
// cannot inflate live capacity (and so the share cap) by declaring much.
func (e *Engine) liveCapacity(now time.Duration) int {
	perPrincipal := make(map[string]int, 4)
	limits := make(map[string]int, 4)
	for id, r := range e.renderers {
		if r.conns == 0 && now-r.lastSeen > e.cfg.RendererTimeout {
			delete(e.renderers, id)
			continue
		}
		if r.draining {
			continue
		}
		perPrincipal[r.principal] += max(r.capacity, 1)
		if r.maxCapacity > 0 {
			limits[r.principal] = r.maxCapacity
		}
	}
	total := 0
	for p, n := range perPrincipal {
		if l := limits[p]; l > 0 {
			n = min(n, l)
		}
		total += n
	}
	return total
}
