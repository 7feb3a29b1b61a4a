package sim

import (
	"errors"
	"fmt"
	"slices"
	"strconv"

	"github.com/leasehold/leasehold/coordinator/internal/engine"
	"github.com/leasehold/leasehold/coordinator/internal/jobs"
)

// unaryRenderer is a renderer on the unary path: Acquire, Heartbeat and
// Complete calls, each of which the network may lose either way. It
// crashes now and then.
type unaryRenderer struct {
	w        *world
	id       string
	capacity int
	instance int
	alive    bool
	leases   []*lease
}

func newUnaryRenderer(w *world, id string, capacity int) *unaryRenderer {
	return &unaryRenderer{w: w, id: id, capacity: capacity}
}

func (u *unaryRenderer) who() engine.Renderer { return engine.Renderer{ID: u.id, Principal: principal} }

func (u *unaryRenderer) start() {
	u.instance++
	u.alive, u.leases = true, nil
	inst := u.instance
	u.poll(inst)
	u.w.after(u.w.between(0, leaseTTL/3), func() { u.heartbeat(inst) })
	u.w.after(u.w.between(2*leaseTTL, 20*leaseTTL), func() { u.crash(inst) })
}

// poll asks for as many leases as it has free slots, now and then.
func (u *unaryRenderer) poll(inst int) {
	w := u.w
	if !u.alive || inst != u.instance {
		return
	}
	w.after(w.between(leaseTTL/100, leaseTTL/10), func() { u.poll(inst) })
	free := u.capacity - len(u.leases)
	if free <= 0 {
		return
	}
	open := engine.SessionOpen{Renderer: u.who(), Capacity: u.capacity, Credits: free}
	w.rpc(func(c *coordinator, respond func(func())) {
		c.acquire(open, func(grants []engine.Grant, err error) {
			respond(func() { u.acquired(inst, grants, err) })
		})
	})
}

func (u *unaryRenderer) acquired(inst int, grants []engine.Grant, err error) {
	if !u.alive || inst != u.instance || err != nil {
		return
	}
	for _, g := range grants {
		u.w.check.grantSeen(u.id, g)
		l := &lease{job: g.Job.ID, token: g.Job.Lease.Token, doc: g.Job.Doc}
		u.leases = append(u.leases, l)
		u.w.after(renderTime(u.w), func() { u.finish(inst, l) })
	}
}

func (u *unaryRenderer) heartbeat(inst int) {
	w := u.w
	if !u.alive || inst != u.instance {
		return
	}
	w.after(w.between(leaseTTL/4, leaseTTL/3), func() { u.heartbeat(inst) })
	if len(u.leases) == 0 {
		return
	}
	// A heartbeat outside any session: the message a unary heartbeat
	// stream's session would carry.
	in := engine.SessionInput{Renderer: u.who(), Capacity: u.capacity}
	for _, l := range u.leases {
		in.Heartbeats = append(in.Heartbeats, l.ref())
	}
	w.rpc(func(c *coordinator, respond func(func())) {
		p := c.s.Receive(nil, in)
		c.queued(kindOther)
		await(c, p, func(res engine.SessionResult, err error) {
			if err == nil {
				w.check.leaseStatuses(u.id, "heartbeat", res.Heartbeats)
			}
			respond(func() {
				if !u.alive || inst != u.instance || err != nil {
					return
				}
				for _, s := range res.Heartbeats {
					if !s.Held {
						u.leases = slices.DeleteFunc(u.leases, func(l *lease) bool { return l.job == s.Job && l.token == s.Token })
					}
				}
			})
		})
	})
}

// finish completes l with a unary call, sent again until answered (a
// repeat is a replay) or three times.
func (u *unaryRenderer) finish(inst int, l *lease) {
	if !u.alive || inst != u.instance {
		return
	}
	i := slices.Index(u.leases, l)
	if i < 0 {
		return
	}
	u.leases = slices.Delete(u.leases, i, i+1)
	u.complete(inst, completion(u.w, l, u.id), 3)
}

func (u *unaryRenderer) complete(inst int, req engine.CompleteRequest, tries int) {
	w := u.w
	answered := false
	w.rpc(func(c *coordinator, respond func(func())) {
		p := c.s.Receive(nil, engine.SessionInput{Renderer: u.who(), Completions: []engine.CompleteRequest{req}})
		c.queued(kindOther)
		await(c, p, func(out engine.SessionResult, err error) {
			var res engine.CompleteResult
			if err == nil {
				res = out.Completions[0]
				err = res.Err
			}
			w.check.completed(req, res, err)
			respond(func() { answered = true })
		})
	})
	if tries > 1 {
		w.after(leaseTTL/4, func() {
			if !answered && u.alive && inst == u.instance {
				u.complete(inst, req, tries-1)
			}
		})
	}
}

func (u *unaryRenderer) crash(inst int) {
	w := u.w
	if !u.alive || inst != u.instance {
		return
	}
	if !w.faults {
		return
	}
	w.tracef("unary renderer %s/%d crashes holding %d leases", u.id, u.instance, len(u.leases))
	u.alive = false
	w.after(w.between(leaseTTL/20, leaseTTL), u.start)
}

// submitter is an internal service submitting batches for its team. A
// batch is sent again, with the same request id, until answered; now and
// then an answered one is sent again, or its request id reused for other
// documents.
type submitter struct {
	w    *world
	team string
	name string
	n    int
	// open are the submissions not yet answered.
	open []*submission
	// done are answered ones, kept to send again.
	done []*submission
}

type submission struct {
	req   engine.SubmitRequest
	batch uint64
	// reuse marks a request that reuses an answered request id for other
	// documents: it must be refused.
	reuse bool
}

func newSubmitter(w *world, team string, i int) *submitter {
	return &submitter{w: w, team: team, name: "s" + strconv.Itoa(i)}
}

func (s *submitter) start() { s.tick() }

func (s *submitter) tick() {
	w := s.w
	if !w.faults {
		return
	}
	w.after(w.between(leaseTTL/50, leaseTTL/10), s.tick)
	switch {
	case len(s.done) > 0 && w.chance(0.02):
		// A retry of an answered request: the same batch again.
		s.send(s.done[w.pick(len(s.done))])
	case len(s.done) > 0 && w.chance(0.01):
		prev := s.done[w.pick(len(s.done))]
		// The same request id for other documents: one more than before.
		req := prev.req
		req.Docs = append(slices.Clip(req.Docs), jobs.DocInput{Document: jobs.Document{Name: "extra.pdf", SourceURI: "s3://uploads/extra"}})
		s.send(&submission{req: req, reuse: true})
	default:
		s.n++
		sub := &submission{req: s.batch(s.name + "-" + strconv.Itoa(s.n))}
		s.open = append(s.open, sub)
		s.send(sub)
	}
}

// batch draws a batch of documents: mostly renderable, some invalid (a
// permanent failure), flaky (transient ones), or of a format the
// coordinator refuses to render.
func (s *submitter) batch(requestID string) engine.SubmitRequest {
	w := s.w
	n := 1 + w.pick(60)
	if w.chance(0.2) {
		n = 1 + w.pick(3)
	}
	req := engine.SubmitRequest{Team: s.team, RequestID: requestID}
	for i := range n {
		name := fmt.Sprintf("doc-%d", i)
		switch x := w.rng.Float64(); {
		case x < 0.03:
			name += "-invalid.pdf"
		case x < 0.08:
			name += "-flaky.pdf"
		case x < 0.1:
			name += ".docm"
		default:
			name += ".pdf"
		}
		d := jobs.DocInput{Document: jobs.Document{Name: name, ContentType: "application/pdf"}}
		if w.chance(0.5) {
			d.Content = []byte("%PDF-1.7 " + requestID + " " + name)
		} else {
			d.SourceURI = "s3://uploads/" + requestID + "/" + name
			d.SizeBytes = 1000
		}
		req.Docs = append(req.Docs, d)
	}
	if w.chance(0.2) {
		req.Policy.MaxAttempts = uint32(1 + w.pick(6))
	}
	return req
}

// send submits sub, and again after a timeout until it is answered.
func (s *submitter) send(sub *submission) {
	w := s.w
	w.rpc(func(c *coordinator, respond func(func())) {
		p := c.s.Submit(sub.req)
		c.queued(kindOther)
		await(c, p, func(res engine.SubmitResult, err error) {
			w.check.submitted(sub, res, err)
			respond(func() { s.answered(sub, res, err) })
		})
	})
	if slices.Contains(s.open, sub) {
		w.after(w.between(leaseTTL/10, leaseTTL/3), func() {
			if slices.Contains(s.open, sub) {
				s.send(sub)
			}
		})
	}
}

func (s *submitter) answered(sub *submission, res engine.SubmitResult, err error) {
	if sub.reuse || !slices.Contains(s.open, sub) {
		return
	}
	switch {
	case errors.Is(err, jobs.ErrTeamQueueFull):
		s.open = slices.DeleteFunc(s.open, func(o *submission) bool { return o == sub })
		return // refused whole: nothing was stored
	case err != nil:
		return // sent again after the timeout
	}
	sub.batch = res.Batch.Batch.ID
	s.open = slices.DeleteFunc(s.open, func(o *submission) bool { return o == sub })
	s.done = append(s.done, sub)
	if len(s.done) > 32 {
		s.done = slices.Delete(s.done, 0, 1)
	}
}

// settled reports whether every submission was answered.
func (s *submitter) settled() bool { return len(s.open) == 0 }

// operator cancels jobs and batches, replays failed jobs and pauses and
// resumes dispatch.
type operator struct {
	w *world
	n int
	// want is the dispatch state the operator asks for; acked is set once
	// an answer says it is so.
	want, acked bool
}

func newOperator(w *world) *operator { return &operator{w: w, acked: true} }

func (o *operator) start() { o.tick() }

func (o *operator) tick() {
	w := o.w
	if !w.faults {
		return
	}
	w.after(w.between(leaseTTL/50, leaseTTL/2), o.tick)
	switch x := w.rng.Float64(); {
	case x < 0.2:
		// A running job: the cancel races its completion.
		if g, ok := w.check.recentGrant(""); ok {
			o.cancel(engine.CancelRequest{Job: g.job, Principal: "ops", Reason: "not needed", Operator: true})
		}
	case x < 0.4:
		if id, ok := w.check.anyJob(); ok {
			o.cancel(engine.CancelRequest{Job: id, Principal: "ops", Reason: "not needed", Operator: true})
		}
	case x < 0.48:
		if b, ok := w.check.anyBatch(); ok {
			o.cancel(engine.CancelRequest{Batch: b, Principal: "ops", Reason: "batch not needed", Operator: true})
		}
	case x < 0.9:
		o.replay()
	case !o.want:
		o.setPaused(true)
		w.after(w.between(leaseTTL/2, 5*leaseTTL), func() { o.setPaused(false) })
	}
}

func (o *operator) cancel(req engine.CancelRequest) {
	w := o.w
	w.rpc(func(c *coordinator, respond func(func())) {
		p := c.s.Cancel(req)
		c.queued(kindOther)
		await(c, p, func(res engine.CancelResult, err error) { w.check.cancelled(req, res, err) })
	})
}

// replay re-queues some failed jobs (or a batch's), sent again with the
// same request id until answered.
func (o *operator) replay() {
	w := o.w
	o.n++
	req := engine.ReplayRequest{Principal: "ops", RequestID: "replay-" + strconv.Itoa(o.n), Reason: "rerun",
		DryRun: w.chance(0.2), IncludePermanent: w.chance(0.3)}
	if b, ok := w.check.anyBatch(); ok && w.chance(0.3) {
		req.Batch = b
	} else {
		req.JobIDs = w.check.failedJobs(1 + w.pick(5))
		if len(req.JobIDs) == 0 {
			return
		}
	}
	o.sendReplay(req, 3)
}

func (o *operator) sendReplay(req engine.ReplayRequest, tries int) {
	w := o.w
	answered := false
	w.rpc(func(c *coordinator, respond func(func())) {
		p := c.s.Replay(req)
		c.queued(kindOther)
		await(c, p, func(res engine.ReplayResult, err error) {
			if err != nil && !errors.Is(err, jobs.ErrNotFound) && !errors.Is(err, engine.ErrStorageFailed) && !w.leadershipErr(err) {
				w.failf("replay %s: %v", req.RequestID, err)
			}
			respond(func() { answered = true })
		})
	})
	if tries > 1 {
		w.after(leaseTTL/4, func() {
			if !answered {
				o.sendReplay(req, tries-1)
			}
		})
	}
}

// setPaused asks for the dispatch state, again until answered while it is
// still what the operator wants.
func (o *operator) setPaused(paused bool) {
	w := o.w
	o.want, o.acked = paused, false
	w.rpc(func(c *coordinator, respond func(func())) {
		p := c.s.SetPaused(paused, "ops", "rollout")
		c.queued(kindPause)
		await(c, p, func(st jobs.DispatchState, err error) {
			respond(func() {
				if err == nil && o.want == paused && st.Paused == paused {
					o.acked = true
				}
			})
		})
	})
	w.after(leaseTTL/4, func() {
		if o.want == paused && !o.acked {
			o.setPaused(paused)
		}
	})
}

// quiesce resumes dispatch for the quiescent phase, and keeps it resumed:
// a pause delayed in the network may still arrive, and the operator, who
// sees the dispatch state in health, resumes again.
func (o *operator) quiesce() {
	w := o.w
	if o.want || !o.acked || w.dispatchPaused() {
		o.setPaused(false)
	}
	w.after(leaseTTL/4, o.quiesce)
}

// pauseWanted reports whether dispatch may still be paused.
func (o *operator) pauseWanted() bool {
	return o.want || !o.acked || o.w.dispatchPaused()
}
