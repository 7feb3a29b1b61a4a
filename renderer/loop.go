package renderer

import (
	"cmp"
	"context"
	"os"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/codes"

	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
)

// phase is how far the loop is on its way from work to returning.
type phase int

const (
	// phaseWorking takes work and reopens a broken session.
	phaseWorking phase = iota
	// phaseDraining follows Run's context: no new work, and the renders in
	// flight may finish until the drain timeout or EndDrain.
	phaseDraining
	// phaseAnswering follows the hand-back of what was left: the loop
	// waits up to answerWait for the answers.
	phaseAnswering
	// phaseClosing half-closes the session and reopens none.
	phaseClosing
	// phaseStopping has cancelled the work: the loop returns once every
	// lease's goroutine and the session have ended.
	phaseStopping
)

// loop is the state of a running Worker. It is touched only by the loop's
// goroutine (Run's); the goroutines it starts get what they need as
// arguments and report on the Worker's channels.
type loop struct {
	w      *Worker
	client leaseholdv1.RendererServiceClient
	// record is the record file, nil when none; the session's receiver
	// writes to it.
	record *os.File

	// workCtx is the parent of every lease's context. It outlives Run's
	// context, so that a drain lets renders finish, and is cancelled when
	// the loop stops.
	workCtx    context.Context
	cancelWork context.CancelFunc

	// leases holds every lease whose goroutine is still running, including
	// lost and handed-back ones that are winding down: each occupies a
	// slot.
	leases map[leaseKey]*lease
	// outbox holds the completions and hand-backs until they are answered.
	outbox outbox
	// storeWaits are the completions answered ARTIFACT_STORE_UNAVAILABLE,
	// to be sent again once due (storeretry.go); storeTimer fires at the
	// earliest.
	storeWaits map[leaseKey]*storeWait
	storeTimer *time.Timer
	// credits counts the slots freed since the last request of the session.
	credits uint32
	// received and cancelAcks wait for the next request.
	received, cancelAcks []*leaseholdv1.LeaseRef
	// sess is the current session, opening or welcomed; nil while none is.
	sess *session
	// draining is set once Run's context is done; it is never cleared.
	draining bool
	// dispatchPaused is the last dispatch_paused the coordinator sent.
	dispatchPaused bool
	// inlineLimit is the largest preview sent inline, and budget the largest
	// request, both from the latest welcome.
	inlineLimit, budget int
	// presigned says larger previews go straight to the coordinator's
	// artifact store (PrepareUpload), not through UploadArtifact.
	presigned bool

	// opened counts the sessions opened.
	opened int
	// bo paces reopening after a session breaks, inUse after
	// RENDERER_ID_IN_USE, and leader after a NOT_LEADER that follows
	// another with no welcome between; notLeader counts those.
	bo, inUse, leader *backoff
	notLeader         int
	// redial fires when the next session is to be opened; nil while a
	// session is open or opening.
	redial *time.Timer

	phase phase
	// deadline ends the drain's wait in phaseDraining and the wait for
	// answers in phaseAnswering.
	deadline *time.Timer
	// err is what Run returns: the refusal that ended the work, or nil.
	err error
}

func newLoop(ctx context.Context, w *Worker, client leaseholdv1.RendererServiceClient, record *os.File) *loop {
	workCtx, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	return &loop{
		w:          w,
		client:     client,
		record:     record,
		workCtx:    workCtx,
		cancelWork: cancelWork,
		leases:     make(map[leaseKey]*lease),
		outbox:     outbox{sent: make(map[leaseKey]*outgoing)},
		budget:     w.cfg.MaxRequestBytes,
		bo:         w.newBackoff(),
		inUse:      &backoff{min: idInUseBackoffMin, max: idInUseBackoffMax},
		leader:     &backoff{min: notLeaderBackoffMin, max: max(w.cfg.BackoffMax, notLeaderBackoffMin)},
	}
}

// run is the loop: it opens the first session, then handles one report or
// timer at a time, and after each hands the sender the next request and
// moves the drain on. It returns once the work has stopped: after a drain,
// or after a refusal for good.
func (l *loop) run(ctx context.Context) error {
	defer l.cancelWork()
	l.connect()
	done := ctx.Done()
	for !l.finished() {
		var cut <-chan struct{}
		if l.phase == phaseDraining {
			cut = l.w.cut
		}
		select {
		case <-done:
			done = nil
			l.drain()
		case <-cut:
			l.endDrainWait()
		case <-timerC(l.deadline):
			l.deadline = nil
			l.deadlinePassed()
		case <-timerC(l.redial):
			l.redial = nil
			l.connect()
		case <-timerC(l.storeTimer):
			l.storeTimer = nil
			l.storeWaitsDue()
		case <-l.heartbeatC():
			l.sess.heartbeatDue = true
			l.sess.heartbeat.Reset(l.sess.interval)
		case <-l.silenceC():
			l.silenced()
		case r := <-l.w.rendered:
			l.renderDone(r)
		case u := <-l.w.uploaded:
			l.uploadDone(u)
		case key := <-l.w.paused:
			l.pause(key)
		case resp := <-l.w.welcomed:
			l.welcome(resp)
		case resp := <-l.w.responses:
			l.heard()
			l.handle(resp)
		case s := <-l.w.sent:
			l.sentDone(s)
		case e := <-l.w.ended:
			l.sessionEnded(e)
		}
		l.progress()
		l.sendPending()
	}
	return l.err
}

// finished reports whether the loop may return: the work is stopped and no
// goroutine it started is left.
func (l *loop) finished() bool {
	return l.phase == phaseStopping && l.sess == nil && len(l.leases) == 0
}

// timerC returns t's channel, or nil (which never fires) for no timer.
func timerC(t *time.Timer) <-chan time.Time {
	if t == nil {
		return nil
	}
	return t.C
}

// stopTimer stops t, if any, and returns nil to store in its place.
func stopTimer(t *time.Timer) *time.Timer {
	if t != nil {
		t.Stop()
	}
	return nil
}

// drain starts the drain once Run's context is done: no more work, the
// coordinator told at once, and the renders in flight given until
// Config.DrainTimeout.
func (l *loop) drain() {
	l.draining = true
	l.credits = 0
	l.w.draining.Store(true)
	l.w.metrics.draining.Set(1)
	if l.phase != phaseWorking {
		return // refused for good: the work is already stopping
	}
	l.w.log.Info("draining", "leases", len(l.leases), "timeout", l.w.cfg.DrainTimeout)
	l.phase = phaseDraining
	l.deadline = time.NewTimer(l.w.cfg.DrainTimeout)
}

// progress moves the drain on as far as it can go now: past its wait once
// no lease is left and everything is answered, and to closing once
// everything is answered after the hand-back.
func (l *loop) progress() {
	for {
		switch {
		case l.phase == phaseDraining && len(l.leases) == 0 && len(l.storeWaits) == 0 && l.outbox.empty():
			l.endDrainWait()
		case l.phase == phaseAnswering && l.outbox.empty():
			l.close()
		default:
			return
		}
	}
}

// deadlinePassed ends the wait the deadline bounds.
func (l *loop) deadlinePassed() {
	switch l.phase {
	case phaseDraining:
		l.endDrainWait()
	case phaseAnswering:
		l.close()
	}
}

// endDrainWait hands back every lease still in progress and waits up to
// answerWait for the answers.
func (l *loop) endDrainWait() {
	l.deadline = stopTimer(l.deadline)
	n := l.handBackAll() + l.handBackStoreWaits()
	l.w.log.Info("drain wait over", "handed_back", n)
	l.phase = phaseAnswering
	l.deadline = time.NewTimer(answerWait)
}

// close ends the session, and reopens none: a welcomed one is half-closed
// once what is pending has been sent (see sendLoop), one not yet welcomed
// is cut.
func (l *loop) close() {
	l.deadline = stopTimer(l.deadline)
	l.redial = stopTimer(l.redial)
	l.phase = phaseClosing
	switch s := l.sess; {
	case s == nil:
		l.stop()
	case s.welcomed:
		s.closeWanted = true
	default:
		s.cancel()
	}
}

// stop cancels the work of every lease; the loop returns once their
// goroutines have ended.
func (l *loop) stop() {
	l.phase = phaseStopping
	l.deadline = stopTimer(l.deadline)
	l.redial = stopTimer(l.redial)
	l.storeTimer = stopTimer(l.storeTimer)
	l.cancelWork()
}

// handle takes in one response of the session. It never waits for a render.
func (l *loop) handle(resp *leaseholdv1.SessionResponse) {
	for _, g := range resp.GetGrants() {
		l.grant(g)
	}
	for _, r := range resp.GetResults() {
		l.result(r)
	}
	for _, st := range resp.GetLeases() {
		l.leaseStatus(st)
	}
	for _, st := range resp.GetRevoked() {
		l.lose(st, true)
	}
	if paused := resp.GetDispatchPaused(); paused != l.dispatchPaused {
		l.dispatchPaused = paused
		l.w.log.Info("dispatch paused", "paused", paused)
	}
}

// result applies the answer to the completion of the lease it names.
func (l *loop) result(r *leaseholdv1.CompletionResult) {
	key := keyOf(r)
	c := l.outbox.answerCompletion(key)
	if c == nil {
		l.w.log.Error("completion result without a completion", "job", key.jobID, "token", key.token)
		return
	}
	endCompleted(c.span, c, r)
	log := l.w.log
	switch code := codes.Code(r.GetCode()); {
	case code == codes.OK:
		attrs := []any{"job", key.jobID, "token", key.token, "outcome", c.outcome,
			"phase", r.GetPhase(), "replayed", r.GetReplayed()}
		if f := c.msg.GetFailure(); f != nil {
			attrs = append(attrs, "class", f.GetClass())
		}
		log.Debug("completed", attrs...)
	case code == codes.Aborted:
		reason := cmp.Or(r.GetReason(), code.String())
		l.w.metrics.rejected.WithLabelValues(reason).Inc()
		log.Warn("completion rejected", "job", key.jobID, "token", key.token, "reason", reason)
	case code == codes.Unavailable && r.GetReason() == reasonStoreUnavailable && l.phase < phaseClosing:
		l.waitForStore(key, c)
	case c.uploadRefused != "":
		// Without its artifact the completion cannot succeed; the upload's
		// refusal was the fencing answer.
		l.w.metrics.rejected.WithLabelValues(c.uploadRefused).Inc()
		log.Warn("completion rejected", "job", key.jobID, "token", key.token, "reason", c.uploadRefused,
			"stage", "upload", "code", code, "message", r.GetMessage())
	default:
		log.Error("completion failed", "job", key.jobID, "token", key.token, "code", code,
			"reason", r.GetReason(), "message", r.GetMessage())
	}
}

// leaseStatus applies one answer to a heartbeat or a hand-back. A lease
// handed back is never answered HELD, so a HELD status of a lease whose
// hand-back is out answers an earlier heartbeat.
func (l *loop) leaseStatus(st *leaseholdv1.LeaseStatus) {
	key := keyOf(st)
	if st.GetState() != leaseholdv1.LeaseState_LEASE_STATE_HELD && l.outbox.answerHandBack(key) {
		l.w.log.Debug("hand-back answered", "job", key.jobID, "token", key.token, "reason", st.GetReason())
		return
	}
	if st.GetState() == leaseholdv1.LeaseState_LEASE_STATE_LOST && st.GetReason() != reasonHandedBack {
		l.lose(st, false)
	}
}

// working returns the leases being worked on, sorted: not lost, not handed
// back and not in a simulated stall, and those whose completion waits for
// the artifact store. They are the ones heartbeated and listed in
// hello.holding.
func (l *loop) working() []*leaseholdv1.LeaseRef {
	refs := make([]*leaseholdv1.LeaseRef, 0, len(l.leases)+len(l.storeWaits))
	for _, ls := range l.leases {
		if ls.ctx.Err() == nil && !ls.paused {
			refs = append(refs, ls.key.ref())
		}
	}
	for key := range l.storeWaits {
		refs = append(refs, key.ref())
	}
	slices.SortFunc(refs, func(a, b *leaseholdv1.LeaseRef) int {
		return cmp.Or(strings.Compare(a.GetJobId(), b.GetJobId()), cmp.Compare(a.GetToken(), b.GetToken()))
	})
	return refs
}
