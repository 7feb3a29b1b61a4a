package sim

import (
	"errors"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/engine"
	"github.com/leasehold/leasehold/coordinator/internal/jobs"
)

// Renderer odds during the faulty phase.
const (
	// pIgnoreRevocation: a renderer keeps working on a revoked lease and
	// completes it late.
	pIgnoreRevocation = 0.2
	// pLateAnyway: a renderer whose lease was lost completes it anyway.
	pLateAnyway = 0.3
)

// principal is the credential every simulated renderer authenticates with.
const principal = "render-pool"

// lease is a lease a renderer holds.
type lease struct {
	job, token uint64
	doc        jobs.Document
}

func (l *lease) ref() engine.LeaseRef { return engine.LeaseRef{Job: l.job, Token: l.token} }

// renderer is a renderer pod on the session path: one process after
// another (instance), each opening sessions one after the other, renders
// what it is granted, heartbeats, completes with the preview inline,
// acknowledges revocations and, now and then, pauses, crashes, drains, or
// sends what it should not (replays, late and stale completions, other
// renderers' tokens).
type renderer struct {
	w        *world
	id       string
	capacity int
	// instance counts its processes; alive is false between them.
	instance int
	alive    bool
	draining bool
	// pausedTo is when a pause (a stopped process) ends; what arrives
	// meanwhile waits in deferred.
	pausedTo time.Duration
	deferred []func()

	// st is the current stream; ready once welcomed on it.
	st    *stream
	ready bool

	leases []*lease
	// credits are slots freed since the last credits sent.
	credits int
	// out holds the items of the next message.
	out      engine.SessionInput
	flushSet bool
	// inflight are completions sent and not answered: sent again on the
	// next session. past are completions answered, kept to send again.
	inflight []engine.CompleteRequest
	past     []engine.CompleteRequest
	// lost are leases it held and lost (expired, revoked, taken back), kept
	// to complete late.
	lost []*lease
}

func newRenderer(w *world, id string, capacity int) *renderer {
	return &renderer{w: w, id: id, capacity: capacity}
}

// start starts a new process, which connects at once.
func (r *renderer) start() {
	r.instance++
	r.alive, r.draining = true, false
	r.leases, r.inflight, r.past, r.lost, r.deferred = nil, nil, nil, nil, nil
	r.out, r.credits, r.pausedTo = engine.SessionInput{}, 0, 0
	r.connect()
	inst := r.instance
	r.w.after(r.w.between(0, leaseTTL/3), func() { r.heartbeat(inst) })
	r.w.after(r.w.between(leaseTTL, 16*leaseTTL), func() { r.misbehave(inst) })
	r.w.after(r.w.between(0, 2*leaseTTL), func() { r.mischief(inst) })
}

// connect opens a session, saying which leases it holds and how many
// slots are free.
func (r *renderer) connect() {
	w := r.w
	st := &stream{r: r}
	r.st, r.ready = st, false
	var holding []engine.LeaseRef
	for _, l := range r.leases {
		holding = append(holding, l.ref())
	}
	credits := 0
	if !r.draining {
		credits = max(r.capacity-len(r.leases), 0)
	}
	r.credits = 0
	open := engine.SessionOpen{Renderer: engine.Renderer{ID: r.id, Principal: principal}, Instance: r.instanceID(),
		Capacity: r.capacity, Holding: holding}
	w.dial(st, func(c *coordinator) { c.openSession(st, open, credits) })
}

func (r *renderer) instanceID() string { return "i-" + strconv.Itoa(r.instance) }

// paused defers fn while the process is stopped and reports whether it did.
func (r *renderer) paused(fn func()) bool {
	if r.w.now < r.pausedTo {
		r.deferred = append(r.deferred, fn)
		return true
	}
	return false
}

// welcomed is the coordinator's answer to the open: the leases it still
// holds. Completions not answered on the last session are sent again.
func (r *renderer) welcomed(st *stream, holding []engine.LeaseStatus) {
	if r.paused(func() { r.welcomed(st, holding) }) || st != r.st || !r.alive {
		return
	}
	r.ready = true
	for _, s := range holding {
		if !s.Held {
			r.drop(s.Job, s.Token)
		}
	}
	r.out.Completions = append(r.inflight, r.out.Completions...)
	r.inflight = nil
	r.flushSoon()
}

// pushed takes grants and revocations from the session.
func (r *renderer) pushed(st *stream, grants []engine.Grant, revoked []engine.LeaseStatus) {
	if r.paused(func() { r.pushed(st, grants, revoked) }) || st != r.st || !r.alive {
		return
	}
	w := r.w
	for _, g := range grants {
		w.check.grantSeen(r.id, g)
		l := &lease{job: g.Job.ID, token: g.Job.Lease.Token, doc: g.Job.Doc}
		if r.draining {
			r.out.HandBacks = append(r.out.HandBacks, l.ref())
			continue
		}
		r.leases = append(r.leases, l)
		if w.chance(0.9) {
			r.out.Received = append(r.out.Received, l.ref())
		}
		inst := r.instance
		w.after(renderTime(w), func() { r.finish(inst, l) })
	}
	for _, s := range revoked {
		if i := r.held(s.Job, s.Token); i >= 0 && !w.faulty(pIgnoreRevocation) {
			r.remember(r.leases[i])
			r.leases = slices.Delete(r.leases, i, i+1)
			r.credits++
		}
		r.out.Acks = append(r.out.Acks, engine.LeaseRef{Job: s.Job, Token: s.Token})
	}
	r.flushSoon()
}

// renderTime draws how long a render takes: mostly short, sometimes past
// the lease TTL, which heartbeats must keep alive.
func renderTime(w *world) time.Duration {
	if w.chance(0.01) {
		return w.between(leaseTTL/3, 3*leaseTTL)
	}
	return w.between(time.Millisecond, 20*time.Millisecond)
}

// finish completes l once rendered: success with the preview inline, or a
// failure its document calls for.
func (r *renderer) finish(inst int, l *lease) {
	if !r.alive || inst != r.instance || r.paused(func() { r.finish(inst, l) }) {
		return
	}
	i := slices.Index(r.leases, l)
	if i < 0 && !r.w.faulty(pLateAnyway) {
		return // the lease was lost: the work is dropped
	}
	if i >= 0 {
		r.leases = slices.Delete(r.leases, i, i+1)
		r.credits++
	}
	r.out.Completions = append(r.out.Completions, completion(r.w, l, r.id))
	r.flushSoon()
}

// completion is the outcome of rendering l: documents named invalid fail
// permanently, flaky ones mostly transiently, a few others transiently.
func completion(w *world, l *lease, renderer string) engine.CompleteRequest {
	req := engine.CompleteRequest{Job: l.job, Completion: jobs.Completion{Token: l.token, Renderer: renderer}}
	switch {
	case strings.Contains(l.doc.Name, "invalid"):
		req.Class, req.Message = jobs.ClassInvalidDocument, "not a document"
	case strings.Contains(l.doc.Name, "flaky") && w.chance(0.6), w.chance(0.03):
		req.Class, req.Message = jobs.ClassTransient, "renderer hiccup"
	default:
		content, digest := preview(l.job, l.token, renderer)
		req.Success, req.Digest = true, digest
		req.Preview = &jobs.Preview{Digest: digest, ContentType: "image/png", Content: content}
	}
	return req
}

// held returns the index of the lease (job, token) among those held, or -1.
func (r *renderer) held(job, token uint64) int {
	return slices.IndexFunc(r.leases, func(l *lease) bool { return l.job == job && l.token == token })
}

// drop forgets a lease the coordinator says is no longer held.
func (r *renderer) drop(job, token uint64) {
	if i := r.held(job, token); i >= 0 {
		r.remember(r.leases[i])
		r.leases = slices.Delete(r.leases, i, i+1)
		r.credits++
	}
}

// remember keeps a lost lease, to complete it late.
func (r *renderer) remember(l *lease) {
	r.lost = append(r.lost, l)
	if len(r.lost) > 32 {
		r.lost = slices.Delete(r.lost, 0, 16)
	}
}

func (r *renderer) flushSoon() {
	if r.flushSet {
		return
	}
	r.flushSet = true
	r.w.after(r.w.between(time.Millisecond, 4*time.Millisecond), r.flush)
}

// flush sends what is queued as one message, with the freed slots as
// credits (none while draining). A message names at most the renderer's
// capacity of leases in each list, as the coordinator requires
// (engine.ErrTooManyLeaseRefs): what is queued beyond goes in the next.
func (r *renderer) flush() {
	r.flushSet = false
	if !r.alive || r.st == nil || !r.ready || r.paused(r.flushSoon) {
		return
	}
	in := r.out
	r.out = engine.SessionInput{}
	in.Received, r.out.Received = spill(in.Received, r.capacity)
	in.Heartbeats, r.out.Heartbeats = spill(in.Heartbeats, r.capacity)
	in.Completions, r.out.Completions = spill(in.Completions, r.capacity)
	in.HandBacks, r.out.HandBacks = spill(in.HandBacks, r.capacity)
	in.Acks, r.out.Acks = spill(in.Acks, r.capacity)
	if len(r.out.Received)+len(r.out.Heartbeats)+len(r.out.Completions)+len(r.out.HandBacks)+len(r.out.Acks) > 0 {
		r.flushSoon()
	}
	if !r.draining {
		in.Credits, r.credits = r.credits, 0
	}
	if in.Credits == 0 && !in.Draining && len(in.Received)+len(in.Heartbeats)+len(in.Completions)+len(in.HandBacks)+len(in.Acks) == 0 {
		return
	}
	r.inflight = append(r.inflight, in.Completions...)
	st, c := r.st, r.st.node
	r.w.toCoord(st, func() {
		if st.srv != nil && !st.srv.ended {
			c.send(st.srv, in)
		}
	})
}

// spill splits list after its first n items.
func spill[T any](list []T, n int) (now, later []T) {
	if len(list) <= n {
		return list, nil
	}
	return list[:n:n], slices.Clone(list[n:])
}

// answered takes the coordinator's answers to one message.
func (r *renderer) answered(st *stream, in engine.SessionInput, res engine.SessionResult) {
	if r.paused(func() { r.answered(st, in, res) }) || st != r.st || !r.alive {
		return
	}
	for i, req := range in.Completions {
		if k := slices.IndexFunc(r.inflight, func(c engine.CompleteRequest) bool { return c.Job == req.Job && c.Token == req.Token }); k >= 0 {
			r.inflight = slices.Delete(r.inflight, k, k+1)
		}
		if res.Completions[i].Err == nil {
			r.past = append(r.past, req)
			if len(r.past) > 64 {
				r.past = slices.Delete(r.past, 0, 1)
			}
		}
	}
	for _, s := range res.Heartbeats {
		if !s.Held {
			r.drop(s.Job, s.Token)
		}
	}
	if r.credits > 0 {
		r.flushSoon()
	}
}

// streamEnded is the end of a session: replaced, refused, broken or
// stopped. The renderer opens another, at once when replaced, after a
// backoff otherwise.
func (r *renderer) streamEnded(st *stream, why error) {
	if r.paused(func() { r.streamEnded(st, why) }) || st != r.st || !r.alive {
		return
	}
	r.st, r.ready = nil, false
	r.out.Received, r.out.Heartbeats, r.out.Credits = nil, nil, 0
	w := r.w
	d := w.between(leaseTTL/100, leaseTTL/5)
	switch {
	case errors.Is(why, engine.ErrReplaced):
		d = w.between(0, 10*time.Millisecond)
	case errors.Is(why, engine.ErrRendererInUse):
		d = w.between(leaseTTL/10, leaseTTL/2)
	case errors.Is(why, engine.ErrNotLeader):
		// Not the leader (any more): the renderer looks for the one that
		// leads at once.
		d = w.between(leaseTTL/200, leaseTTL/20)
	}
	inst := r.instance
	w.after(d, func() {
		if r.alive && r.instance == inst && r.st == nil {
			r.connect()
		}
	})
}

// heartbeat extends every lease held, every third of the TTL.
func (r *renderer) heartbeat(inst int) {
	if !r.alive || inst != r.instance {
		return
	}
	r.w.after(r.w.between(leaseTTL/4, leaseTTL/3), func() { r.heartbeat(inst) })
	if r.w.now < r.pausedTo || !r.ready || len(r.leases) == 0 {
		return
	}
	for _, l := range r.leases {
		r.out.Heartbeats = append(r.out.Heartbeats, l.ref())
	}
	r.flushSoon()
}

// misbehave, during the faulty phase, crashes, pauses or drains the
// renderer now and then.
func (r *renderer) misbehave(inst int) {
	w := r.w
	if !w.faults || !r.alive || inst != r.instance {
		return
	}
	w.after(w.between(leaseTTL, 16*leaseTTL), func() { r.misbehave(inst) })
	if w.now < r.pausedTo {
		return
	}
	switch x := w.rng.Float64(); {
	case x < 0.4:
		r.crash()
	case x < 0.8:
		r.pause(w.between(leaseTTL/10, 3*leaseTTL))
	default:
		r.drain()
	}
}

// mischief, during the faulty phase, sends now and then what a renderer
// should not: a completion it sent before, a late completion of a lease it
// lost, another renderer's token.
func (r *renderer) mischief(inst int) {
	w := r.w
	if !w.faults || !r.alive || inst != r.instance {
		return
	}
	w.after(w.between(0, 2*leaseTTL), func() { r.mischief(inst) })
	switch x := w.rng.Float64(); {
	case x < 0.3:
		r.resend()
	case x < 0.6:
		r.late()
	default:
		r.impostor()
	}
}

// late completes a lease it lost, as a worker that paused past its lease
// and resumed does.
func (r *renderer) late() {
	if len(r.lost) == 0 {
		return
	}
	r.out.Completions = append(r.out.Completions, completion(r.w, r.lost[r.w.pick(len(r.lost))], r.id))
	r.flushSoon()
}

// crash kills the process: its leases are neither completed nor handed
// back, and its connection dies without a word. A new process starts later.
func (r *renderer) crash() {
	w := r.w
	w.tracef("renderer %s/%d crashes holding %d leases", r.id, r.instance, len(r.leases))
	r.alive = false
	if r.st != nil {
		w.breakStream(r.st)
		r.st = nil
	}
	w.after(w.between(leaseTTL/20, leaseTTL), r.start)
}

// pause stops the process for d: no heartbeats, no messages, its work
// due meanwhile completes when it resumes, late. A pause past the
// coordinator's keepalive loses the connection.
func (r *renderer) pause(d time.Duration) {
	w := r.w
	w.tracef("renderer %s/%d pauses for %v", r.id, r.instance, d)
	r.pausedTo = w.now + d
	if st := r.st; st != nil && d > keepalive {
		w.after(keepalive, func() { w.breakStream(st) })
	}
	inst := r.instance
	w.after(d, func() {
		if inst != r.instance {
			return
		}
		fns := r.deferred
		r.deferred = nil
		for _, fn := range fns {
			fn()
		}
		r.flushSoon()
	})
}

// drain is a rolling deploy: the process hands back what it holds, closes
// its session, exits, and a new one starts.
func (r *renderer) drain() {
	w := r.w
	if !r.ready {
		return
	}
	w.tracef("renderer %s/%d drains %d leases", r.id, r.instance, len(r.leases))
	r.draining = true
	r.out.Draining = true
	for _, l := range r.leases {
		r.out.HandBacks = append(r.out.HandBacks, l.ref())
	}
	r.leases = nil
	r.flush()
	inst := r.instance
	w.after(w.between(leaseTTL/50, leaseTTL/5), func() {
		if !r.alive || inst != r.instance {
			return
		}
		if st := r.st; st != nil {
			w.toCoord(st, func() { st.node.closeSession(st) })
		}
		r.st, r.alive = nil, false
		w.after(w.between(leaseTTL/100, leaseTTL/3), r.start)
	})
}

// resend sends again a completion already answered, as a renderer that
// never saw the answer does: the same outcome is a replay, applied once.
func (r *renderer) resend() {
	if len(r.past) == 0 {
		return
	}
	r.out.Completions = append(r.out.Completions, r.past[r.w.pick(len(r.past))])
	r.flushSoon()
}

// impostor sends a completion or a heartbeat under another renderer's
// recent lease: the fencing check must refuse it and change nothing.
func (r *renderer) impostor() {
	g, ok := r.w.check.recentGrant(r.id)
	if !ok {
		return
	}
	l := &lease{job: g.job, token: g.token}
	if r.w.chance(0.5) {
		r.out.Heartbeats = append(r.out.Heartbeats, l.ref())
	} else {
		r.out.Completions = append(r.out.Completions, completion(r.w, l, r.id))
	}
	r.flushSoon()
}
