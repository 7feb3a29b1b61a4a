package engine

import (
	"container/heap"
	"context"
	"errors"

	"github.com/leasehold/leasehold/client/reason"
	"github.com/leasehold/leasehold/coordinator/internal/jobs"
)

// Open registers a renderer session: the one way a renderer is served,
// whether it speaks the Session stream or the unary RPCs (their handlers
// open a session per Acquire and per Heartbeat stream). A session takes
// grants up to its credit (SessionOpen.Credits, then Receive's Credits),
// within its byte budget when it has one, and is told of revocations of
// its renderer's leases; the leases in Holding are heartbeated at once and
// answered in order.
//
// One renderer process holds one id: a session of the same renderer id
// and instance replaces a live one (which ends with ErrReplaced, its
// grants never taken moving to the new one), and a session of another
// instance is refused with ErrRendererInUse. A unary client names no
// instance: its sessions live side by side (a poll per Acquire, its
// heartbeat stream), are refused while a renderer process holds the id,
// and refuse one likewise; a newer heartbeat stream (a session with
// neither instance nor credit) replaces an older one, which is most
// likely a dead connection not yet noticed.
//
// An opening whose Holding names more leases than MaxLeaseRefs allows is
// refused with ErrTooManyLeaseRefs, and changes nothing.
func (e *Engine) Open(ctx context.Context, req SessionOpen) (*Conn, []LeaseStatus, error) {
	c := &openCmd{req: req}
	err := e.do(ctx, c)
	return c.conn, c.holding, err
}

type openCmd struct {
	base
	req     SessionOpen
	conn    *Conn
	holding []LeaseStatus
}

func (c *openCmd) text() error {
	if err := c.req.Renderer.text(); err != nil {
		return err
	}
	return checkText("instance_id", c.req.Instance)
}

func (c *openCmd) evaluate(g *group) error {
	e := g.e
	r := c.req.Renderer
	conn := &Conn{renderer: r, instance: c.req.Instance, credit: min(c.req.Credits, maxCredit), budget: -1,
		maxRefs: MaxLeaseRefs(c.req.Capacity, r)}
	if len(c.req.Holding) > conn.maxRefs {
		c.err = ErrTooManyLeaseRefs
		return nil
	}
	conn.poll = conn.instance == "" && conn.credit > 0
	var replaced *Conn
	for _, old := range e.conns.byRenderer[r.ID] {
		switch {
		case conn.instance != "" && old.instance == conn.instance, conn.stream() && old.stream():
			replaced = old
		case conn.instance != "" || old.instance != "":
			c.err = ErrRendererInUse
			return nil
		}
	}
	var moved []Grant
	rs := e.seen(r, c.req.Capacity, g.mono)
	if replaced != nil {
		moved = g.endConn(replaced, ErrReplaced)
		rs.conns--
	}
	if c.req.MaxBytes > 0 {
		conn.budget = c.req.MaxBytes
	}
	e.conns.add(conn)
	rs.conns++
	rs.draining = false
	for _, gr := range moved {
		g.deliver(conn, gr)
	}
	for _, ref := range c.req.Holding {
		st, err := e.heartbeatOne(g, r.ID, ref)
		if err != nil {
			return err
		}
		c.holding = append(c.holding, st)
	}
	// A session opened with credit (a unary Acquire) is granted to at once,
	// in its place in the group, so that the commands after it see its
	// leases; what is left of its credit is served at the end of each
	// group as work arrives, like any session's.
	if conn.credit > 0 && !e.dispatchSt.Paused {
		live := e.liveCapacity(g.mono)
		for {
			ok, err := e.grantOne(g, conn, live)
			if err != nil {
				return err
			}
			if !ok {
				break
			}
		}
	}
	if conn.credit > 0 {
		e.conns.want(conn)
	}
	g.work = true
	c.conn = conn
	return nil
}

// Close ends a session. The leases in undelivered (grants the handler
// took and could not send) are handed back uncounted; the grants the
// session never took are returned, for the handler to deliver (a unary
// Acquire answers with them) or to hand back with Receive's Undelivered.
// A renderer's leases outlive its sessions until their deadlines, so a
// renderer that reconnects in time keeps them. Its capacity leaves live
// capacity with its last session, unless that was a unary Acquire's poll:
// a unary client between polls counts until it has been silent for
// Config.RendererTimeout.
func (e *Engine) Close(ctx context.Context, conn *Conn, undelivered []LeaseRef) ([]Grant, error) {
	return call(ctx, e, &closeCmd{conn: conn, undelivered: undelivered})
}

type closeCmd struct {
	base
	// Its session's renderer was checked when it opened.
	noText
	conn        *Conn
	undelivered []LeaseRef
	left        []Grant
}

func (c *closeCmd) result() []Grant { return c.left }

func (c *closeCmd) evaluate(g *group) error {
	e := g.e
	if _, live := e.conns.byID[c.conn.id]; live {
		c.left = g.endConn(c.conn, ErrStopped)
		if rs := e.renderers[c.conn.renderer.ID]; rs != nil {
			rs.conns = max(rs.conns-1, 0)
			if rs.conns == 0 && !c.conn.poll {
				delete(e.renderers, c.conn.renderer.ID)
			}
		}
		g.work = true
	}
	for _, ref := range c.undelivered {
		if err := e.release(g, c.conn.renderer.ID, ref, jobs.ReleaseUndelivered); err != nil {
			return err
		}
	}
	return nil
}

// Receive applies one message of a renderer session in one writer
// command: receipts, heartbeats, completions, hand-backs, cancel
// acknowledgements, undelivered grants and credits, in that order. Each
// item is answered on its own; a refused completion does not stop the
// others. Grants the new credits allow are made at the end of the same
// group and published to the session's outbox. It fails with ErrReplaced
// when the session was replaced or closed, and with ErrTooManyLeaseRefs,
// applying nothing, when a list of the message names more leases than
// MaxLeaseRefs allows the session (for in.Capacity when set, else for the
// capacity the session declared last).
//
// With conn nil the message belongs to no session: a unary Complete, or
// the hand-back of grants a unary reply could not carry. It is judged for
// in.Renderer, and carries no receipts, credits or draining.
func (e *Engine) Receive(ctx context.Context, conn *Conn, in SessionInput) (SessionResult, error) {
	return call(ctx, e, &receiveCmd{conn: conn, in: in})
}

type receiveCmd struct {
	base
	conn *Conn
	in   SessionInput
	res  SessionResult
}

func (c *receiveCmd) result() SessionResult { return c.res }

// text of a session message: a session's renderer was checked when the
// session opened (a message outside any session names its own, checked
// here), and each completion is checked on its own by completeOne, so
// that one bad completion is answered alone and the others apply.
func (c *receiveCmd) text() error {
	if c.conn == nil {
		return c.in.Renderer.text()
	}
	return nil
}

func (c *receiveCmd) size() int {
	n := 0
	for _, cr := range c.in.Completions {
		if cr.Preview != nil {
			n += len(cr.Preview.Content)
		}
	}
	return n
}

func (c *receiveCmd) evaluate(g *group) error {
	e := g.e
	conn, r := c.conn, c.in.Renderer
	if conn != nil {
		if _, live := e.conns.byID[conn.id]; !live {
			c.err = ErrReplaced
			return nil
		}
		limit := conn.maxRefs
		if c.in.Capacity > 0 {
			limit = MaxLeaseRefs(c.in.Capacity, conn.renderer)
		}
		if !c.in.Within(limit) {
			c.err = ErrTooManyLeaseRefs
			return nil
		}
		conn.maxRefs = limit
		r = conn.renderer
	}
	renderer := r.ID
	if conn != nil {
		e.seen(r, c.in.Capacity, g.mono)
		for _, ref := range c.in.Received {
			if le := e.leases[ref.Job]; le != nil && le.token == ref.Token && le.renderer == renderer {
				le.heard = true
			}
		}
	}
	for _, ref := range c.in.Heartbeats {
		st, err := e.heartbeatOne(g, renderer, ref)
		if err != nil {
			return err
		}
		c.res.Heartbeats = append(c.res.Heartbeats, st)
	}
	if len(c.in.Completions) > 0 {
		c.res.Completions = make([]CompleteResult, 0, len(c.in.Completions))
	}
	for _, req := range c.in.Completions {
		req.Renderer = renderer
		res, err := e.completeOne(g, req)
		if err != nil {
			return err
		}
		c.res.Completions = append(c.res.Completions, res)
	}
	for _, ref := range c.in.HandBacks {
		st, err := e.handBackOne(g, renderer, ref)
		if err != nil {
			return err
		}
		c.res.HandBacks = append(c.res.HandBacks, st)
	}
	for _, ref := range c.in.Acks {
		if err := e.ackOne(g, renderer, ref); err != nil {
			return err
		}
	}
	for _, ref := range c.in.Undelivered {
		if err := e.release(g, renderer, ref, jobs.ReleaseUndelivered); err != nil {
			return err
		}
	}
	if conn == nil {
		return nil
	}
	if c.in.Draining && !conn.draining {
		conn.draining = true
		if rs := e.renderers[renderer]; rs != nil {
			rs.draining = true
		}
		g.work = true
	}
	if c.in.Credits > 0 {
		conn.credit = min(conn.credit+c.in.Credits, maxCredit)
		e.conns.want(conn)
		g.credit = true
	}
	return nil
}

// maxCredit bounds the credit one session can hold, whatever it claims.
const maxCredit = 4096

// heartbeatOne extends one lease held by renderer, through the fencing
// predicate, and persists the new deadline.
func (e *Engine) heartbeatOne(g *group, renderer string, ref LeaseRef) (LeaseStatus, error) {
	j, found, err := g.load(ref.Job)
	if err != nil {
		return LeaseStatus{}, err
	}
	if !found {
		return LeaseStatus{Job: ref.Job, Token: ref.Token, Reason: string(reason.JobNotFound)}, nil
	}
	next, ferr := j.Heartbeat(ref.Token, renderer, g.now, e.cfg.LeaseTTL)
	if ferr != nil {
		return lost(ref, ferr), nil
	}
	if err := g.save(j, next); err != nil {
		return LeaseStatus{}, err
	}
	if le := e.leases[j.ID]; le != nil {
		le.heard = true
		if d := g.monoOf(next.Lease.Deadline); d > le.deadline {
			le.deadline = d
			heap.Push(&e.leaseQ, timerItem{at: d, job: j.ID, token: le.token})
		}
	}
	deadline := next.Lease.Deadline
	if le := e.leases[j.ID]; le != nil {
		deadline = le.shown
	}
	return LeaseStatus{Job: ref.Job, Token: ref.Token, Held: true, Deadline: deadline,
		CurrentToken: next.Lease.Token, CurrentPhase: next.Phase}, nil
}

// handBackOne re-queues a lease its holder gives back, uncounted.
func (e *Engine) handBackOne(g *group, renderer string, ref LeaseRef) (LeaseStatus, error) {
	j, found, err := g.load(ref.Job)
	if err != nil {
		return LeaseStatus{}, err
	}
	if !found {
		return LeaseStatus{Job: ref.Job, Token: ref.Token, Reason: string(reason.JobNotFound)}, nil
	}
	next, ferr := j.HandBack(ref.Token, renderer, g.now, e.jitter())
	if ferr != nil {
		return lost(ref, ferr), nil
	}
	if err := g.save(j, next); err != nil {
		return LeaseStatus{}, err
	}
	e.endLease(g, j, next)
	return LeaseStatus{Job: ref.Job, Token: ref.Token, Reason: jobs.ReleaseHandedBack, CurrentToken: next.LastToken(), CurrentPhase: next.Phase}, nil
}

// ackOne records that renderer stopped the work of a revoked lease.
func (e *Engine) ackOne(g *group, renderer string, ref LeaseRef) error {
	j, found, err := g.load(ref.Job)
	if err != nil || !found {
		return err
	}
	if next, changed := j.AckCancel(ref.Token, renderer, g.now); changed {
		return g.save(j, next)
	}
	return nil
}

// lost answers a lease the fencing check refused with err, naming the
// job's current token and phase as the *jobs.FenceError does: not at all
// to a renderer that never held a lease of the job.
func lost(ref LeaseRef, err error) LeaseStatus {
	st := LeaseStatus{Job: ref.Job, Token: ref.Token, Reason: jobs.ReasonCode(err)}
	var fe *jobs.FenceError
	if errors.As(err, &fe) {
		st.CurrentToken, st.CurrentPhase = fe.CurrentToken, fe.CurrentPhase
	}
	return st
}

// IsConnEnd reports whether err ends a renderer session for a reason of
// the writer's own (replaced, stopped).
func IsConnEnd(err error) bool {
	return errors.Is(err, ErrReplaced) || errors.Is(err, ErrStopped)
}
