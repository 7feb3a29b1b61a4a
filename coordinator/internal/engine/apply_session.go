package engine

import (
	"container/heap"
	"context"
	"errors"

	"github.com/leasehold/leasehold/coordinator/internal/jobs"
)

// OpenSession registers a renderer session. A live session of the same
// renderer id and instance is replaced (it ends with ErrReplaced, and the
// grants it never took move to the new one); any other live session or
// heartbeat stream of the id is refused with ErrRendererInUse, so two
// processes are never both served under one id. The leases in
// Holding are heartbeated at once and answered in order.
func (e *Engine) OpenSession(ctx context.Context, req SessionOpen) (*Conn, []LeaseStatus, error) {
	c := &openCmd{kind: ConnSession, req: req}
	err := e.do(ctx, c)
	return c.conn, c.holding, err
}

// OpenStream registers a unary client's heartbeat stream: its capacity
// counts as live until CloseConn, and revocations of its leases are
// published to it. A newer heartbeat stream of the same id replaces an
// older one; a live session of the id refuses it (ErrRendererInUse).
func (e *Engine) OpenStream(ctx context.Context, r Renderer, capacity int) (*Conn, error) {
	c := &openCmd{kind: ConnHeartbeat, req: SessionOpen{Renderer: r, Capacity: capacity}}
	err := e.do(ctx, c)
	return c.conn, err
}

type openCmd struct {
	base
	kind    ConnKind
	req     SessionOpen
	conn    *Conn
	holding []LeaseStatus
}

func (c *openCmd) apply(g *group) error {
	e := g.e
	r := c.req.Renderer
	var moved []Grant
	if old := e.conns.sessions[r.ID]; old != nil {
		sameProcess := c.kind == ConnSession && old.kind == ConnSession && old.instance == c.req.Instance && c.req.Instance != ""
		// A heartbeat stream carries no instance id: the newer one replaces
		// the older (which is most likely a dead connection not yet noticed).
		if !sameProcess && (c.kind != ConnHeartbeat || old.kind != ConnHeartbeat) {
			c.err = ErrRendererInUse
			return nil
		}
		moved = g.endConn(old, ErrReplaced)
		e.renderers[r.ID].conns--
	}
	conn := &Conn{kind: c.kind, renderer: r, instance: c.req.Instance}
	e.conns.add(conn)
	rs := e.seen(r, c.req.Capacity, g.mono)
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
	g.work = true
	c.conn = conn
	return nil
}

// CloseConn ends a session, heartbeat stream or waiter. The leases in
// undelivered (grants whose message could not be sent) are handed back
// uncounted; the grants still in its outbox are handed back too when
// releaseLeftovers is set, and otherwise returned (a waiter answers with
// them). A renderer's leases outlive its session until their deadlines,
// so a renderer that reconnects in time keeps them.
func (e *Engine) CloseConn(ctx context.Context, conn *Conn, undelivered []LeaseRef, releaseLeftovers bool) ([]Grant, error) {
	return call(ctx, e, &closeCmd{conn: conn, undelivered: undelivered, releaseLeftovers: releaseLeftovers})
}

type closeCmd struct {
	base
	conn             *Conn
	undelivered      []LeaseRef
	releaseLeftovers bool
	left             []Grant
}

func (c *closeCmd) result() []Grant { return c.left }

func (c *closeCmd) apply(g *group) error {
	e := g.e
	refs := c.undelivered
	if _, live := e.conns.byID[c.conn.id]; live {
		left := g.endConn(c.conn, ErrStopped)
		if c.conn.kind != ConnWaiter {
			if rs := e.renderers[c.conn.renderer.ID]; rs != nil {
				rs.conns = max(rs.conns-1, 0)
				if rs.conns == 0 {
					delete(e.renderers, c.conn.renderer.ID)
				}
			}
			g.work = true
		}
		if c.releaseLeftovers {
			for _, gr := range left {
				refs = append(refs, LeaseRef{Job: gr.Job.ID, Token: gr.Job.Lease.Token})
			}
		} else {
			c.left = left
		}
	}
	for _, ref := range refs {
		if err := e.release(g, c.conn.renderer.ID, ref, jobs.ReleaseUndelivered); err != nil {
			return err
		}
	}
	return nil
}

// Send applies one message of a renderer session in one writer command:
// receipts, heartbeats, completions, hand-backs, cancel acknowledgements
// and credits, in that order. Each item is answered on its own; a refused
// completion does not stop the others. Grants the new credits allow are
// made at the end of the same group and published to the session's
// outbox. It fails with ErrReplaced when the session was replaced or
// closed.
func (e *Engine) Send(ctx context.Context, conn *Conn, in SessionInput) (SessionResult, error) {
	return call(ctx, e, &sessionCmd{conn: conn, in: in})
}

type sessionCmd struct {
	base
	conn *Conn
	in   SessionInput
	res  SessionResult
}

func (c *sessionCmd) result() SessionResult { return c.res }

func (c *sessionCmd) size() int {
	n := 0
	for _, cr := range c.in.Completions {
		if cr.Preview != nil {
			n += len(cr.Preview.Content)
		}
	}
	return n
}

func (c *sessionCmd) apply(g *group) error {
	e := g.e
	conn := c.conn
	if _, live := e.conns.byID[conn.id]; !live {
		c.err = ErrReplaced
		return nil
	}
	renderer := conn.renderer.ID
	e.seen(conn.renderer, 0, g.mono)
	for _, ref := range c.in.Received {
		if le := e.leases[ref.Job]; le != nil && le.token == ref.Token && le.renderer == renderer {
			le.heard = true
		}
	}
	for _, ref := range c.in.Heartbeats {
		st, err := e.heartbeatOne(g, renderer, ref)
		if err != nil {
			return err
		}
		c.res.Heartbeats = append(c.res.Heartbeats, st)
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

// Heartbeat applies one message of a unary client's heartbeat stream:
// deadline extensions, cancel acknowledgements and hand-backs, through the
// same item functions as a session.
func (e *Engine) Heartbeat(ctx context.Context, req HeartbeatRequest) (HeartbeatResult, error) {
	return call(ctx, e, &heartbeatCmd{req: req})
}

type heartbeatCmd struct {
	base
	req HeartbeatRequest
	res HeartbeatResult
}

func (c *heartbeatCmd) result() HeartbeatResult { return c.res }

func (c *heartbeatCmd) apply(g *group) error {
	e := g.e
	renderer := c.req.Renderer.ID
	e.seen(c.req.Renderer, c.req.Capacity, g.mono)
	for _, ref := range c.req.Leases {
		st, err := e.heartbeatOne(g, renderer, ref)
		if err != nil {
			return err
		}
		c.res.Leases = append(c.res.Leases, st)
	}
	for _, ref := range c.req.Acks {
		if err := e.ackOne(g, renderer, ref); err != nil {
			return err
		}
	}
	for _, ref := range c.req.HandBacks {
		st, err := e.handBackOne(g, renderer, ref)
		if err != nil {
			return err
		}
		c.res.HandBacks = append(c.res.HandBacks, st)
	}
	return nil
}

// heartbeatOne extends one lease held by renderer, through the fencing
// predicate, and persists the new deadline.
func (e *Engine) heartbeatOne(g *group, renderer string, ref LeaseRef) (LeaseStatus, error) {
	j, found, err := g.load(ref.Job)
	if err != nil {
		return LeaseStatus{}, err
	}
	if !found {
		return LeaseStatus{Job: ref.Job, Token: ref.Token, Reason: "JOB_NOT_FOUND"}, nil
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
		return LeaseStatus{Job: ref.Job, Token: ref.Token, Reason: "JOB_NOT_FOUND"}, nil
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

// IsConnEnd reports whether err ends a renderer connection for a reason of
// the writer's own (replaced, stopped).
func IsConnEnd(err error) bool {
	return errors.Is(err, ErrReplaced) || errors.Is(err, ErrStopped)
}
