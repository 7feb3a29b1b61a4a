package renderer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
)

// Reasons the worker acts on.
const (
	reasonSessionReplaced = "SESSION_REPLACED"
	reasonHandedBack      = "HANDED_BACK"
	reasonNotLeader       = "NOT_LEADER"
)

// errNoWelcome reports a session whose first response carried no welcome.
var errNoWelcome = errors.New("renderer: the first session response carries no welcome")

// sessionStream is the renderer's end of a Session.
type sessionStream = grpc.BidiStreamingClient[leaseholdv1.SessionRequest, leaseholdv1.SessionResponse]

// session is the state of one welcomed Session. Its fields are guarded by
// Worker.mu, except interval, which never changes.
type session struct {
	// interval is the heartbeat interval.
	interval time.Duration
	// inflight holds the completions sent and not yet answered, in the
	// order they were sent: the order of the answers.
	inflight []*completion
	// drainSent is set once draining=true went out on this session.
	drainSent bool
	// handedBack holds the hand-backs sent on this session; those not yet
	// answered when it ends are sent again on the next one.
	handedBack []*leaseholdv1.LeaseRef
}

// sessionLoop opens sessions one after the other until the worker closes
// its stream (it then returns nil) or the coordinator refuses this renderer
// for good (it then returns the refusal). It runs on its own goroutine.
//
// ALREADY_EXISTS (RENDERER_ID_IN_USE: another process holds a session under
// this id) is logged as an error and retried with a backoff of 1 s up to
// 30 s, without end: the usual cause is this pod's previous process, whose
// session the coordinator has not yet seen die, and that resolves itself;
// a genuine duplicate shows in the error log and in /readyz staying 503.
// ABORTED SESSION_REPLACED (a newer session of this same process took over)
// is reopened at once. So is UNAVAILABLE NOT_LEADER, the end of a session
// whose coordinator stopped leading its cluster: the new session waits
// for the channel to find the new leader, and holds the same leases. A
// NOT_LEADER again before any welcome waits a short backoff, from 10 ms
// doubling up to Config.BackoffMax: the channel may not have heard yet
// that the replica it chose stopped leading, and a single address naming
// a follower must not make the worker spin.
func (w *Worker) sessionLoop() error {
	bo := w.newBackoff()
	inUse := &backoff{min: idInUseBackoffMin, max: idInUseBackoffMax}
	// notLeader counts the NOT_LEADER answers since the last welcome, and
	// leader paces those after the first.
	notLeader := 0
	leader := &backoff{min: notLeaderBackoffMin, max: max(w.cfg.BackoffMax, notLeaderBackoffMin)}
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			w.metrics.reconnects.Inc()
		}
		welcomed, err := w.runSession()
		if w.closing.Err() != nil {
			return nil
		}
		if welcomed {
			bo.reset()
			inUse.reset()
			leader.reset()
			notLeader = 0
		}
		code, reason := status.Code(err), reasonOf(err)
		var d time.Duration
		switch {
		case permanent(code):
			w.log.Error("session refused", "err", err, "reason", reason)
			return fmt.Errorf("renderer: session refused: %w", err)
		case code == codes.AlreadyExists:
			d = inUse.next()
			w.log.Error("renderer id in use", "id", w.cfg.ID, "err", err, "retry_in", d)
		case code == codes.Aborted && reason == reasonSessionReplaced:
			w.log.Warn("session replaced", "err", err)
		case code == codes.Unavailable && reason == reasonNotLeader:
			if notLeader > 0 {
				d = leader.next()
			}
			notLeader++
			w.log.Warn("coordinator not the leader", "err", err, "leader", leaderAddr(err), "retry_in", d)
		default:
			d = bo.next()
			w.log.Warn("session ended", "err", err, "retry_in", d)
		}
		if !sleepCtx(w.closing, d) {
			return nil
		}
	}
}

// permanent reports whether a session refused with code must not be retried.
func permanent(code codes.Code) bool {
	switch code {
	case codes.Unauthenticated, codes.PermissionDenied, codes.InvalidArgument, codes.Unimplemented:
		return true
	}
	return false
}

// runSession runs one Session until it breaks or the worker closes it, and
// reports whether the coordinator welcomed it. A receive goroutine applies
// the responses; this goroutine sends.
func (w *Worker) runSession() (welcomed bool, err error) {
	// The stream's context is not w.closing: a welcomed session is
	// half-closed first and cut only after closeGrace (see sendLoop).
	sctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stopAbort := context.AfterFunc(w.closing, cancel)
	defer stopAbort()
	stream, err := w.client.Session(sctx, grpc.WaitForReady(true))
	if err != nil {
		return false, err
	}
	hello := w.helloRequest()
	if err := stream.Send(hello); err != nil {
		if errors.Is(err, io.EOF) {
			_, err = stream.Recv() // the status that ended the stream
		}
		return false, err
	}
	resp, err := stream.Recv()
	if err != nil {
		return false, err
	}
	if resp.GetWelcome() == nil {
		return false, errNoWelcome
	}
	if !stopAbort() {
		return false, w.closing.Err()
	}
	s := w.startSession(resp.GetWelcome(), hello.GetDraining(), len(hello.GetHello().GetHolding()))
	defer w.endSession(s)
	w.apply(s, resp)

	recvDone := make(chan struct{})
	var recvErr error
	go func() {
		defer close(recvDone)
		for {
			resp, err := stream.Recv()
			if err != nil {
				recvErr = err
				return
			}
			w.apply(s, resp)
		}
	}()
	defer func() {
		cancel()
		<-recvDone
	}()
	return true, w.sendLoop(stream, s, recvDone, func() error { return recvErr })
}

// helloRequest builds a session's first request: the hello with the leases
// in progress, and as credits the free slots (none while draining). Credits
// freed earlier belong to the previous session and are dropped.
func (w *Worker) helloRequest() *leaseholdv1.SessionRequest {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.credits = 0
	req := &leaseholdv1.SessionRequest{
		Hello: &leaseholdv1.SessionHello{
			RendererId:      w.cfg.ID,
			InstanceId:      w.cfg.InstanceID,
			Capacity:        uint32(w.cfg.Capacity),
			MaxMessageBytes: uint32(w.cfg.MaxReceiveBytes),
			Holding:         w.workingLocked(),
		},
		Draining: w.draining,
	}
	if !w.draining {
		req.Credits = uint32(w.cfg.Capacity - len(w.leases))
	}
	return req
}

// startSession records a welcomed session, applies its limits and stops the
// leases the welcome says are lost.
func (w *Worker) startSession(wel *leaseholdv1.SessionWelcome, drainSent bool, holding int) *session {
	interval := w.cfg.HeartbeatInterval
	if interval <= 0 {
		interval = wel.GetHeartbeatInterval().AsDuration()
	}
	if interval <= 0 {
		interval = DefaultHeartbeatInterval
	}
	budget := w.cfg.MaxRequestBytes
	if m := int(wel.GetMaxMessageBytes()); m > 0 && m < budget {
		budget = m
	}
	s := &session{interval: interval, drainSent: drainSent}
	w.mu.Lock()
	w.sess = s
	w.budget = budget
	w.inlineLimit = max(0, min(int(wel.GetMaxInlineArtifactBytes()), budget-inlineHeadroom))
	inline := w.inlineLimit
	w.mu.Unlock()
	w.metrics.connected.Set(1)
	w.log.Info("session started", "instance", w.cfg.InstanceID, "heartbeat_interval", interval,
		"lease_ttl", wel.GetLeaseTtl().AsDuration(), "max_inline_bytes", inline, "max_request_bytes", budget,
		"holding", holding)
	for _, st := range wel.GetHolding() {
		if st.GetState() == leaseholdv1.LeaseState_LEASE_STATE_LOST {
			w.lose(st, false)
		}
	}
	return s
}

// endSession forgets a session that ended: its unanswered completions and
// hand-backs go back to be sent on the next one.
func (w *Worker) endSession(s *session) {
	w.mu.Lock()
	w.outbox = append(slices.Clone(s.inflight), w.outbox...)
	s.inflight = nil
	for _, r := range s.handedBack {
		if w.awaiting[keyOf(r)] {
			w.handBacks = append(w.handBacks, r)
		}
	}
	w.sess = nil
	w.mu.Unlock()
	w.metrics.connected.Set(0)
	signal(w.changed)
}

// sendLoop is a session's sender: it sends what is pending whenever woken,
// heartbeats at the session's interval, and half-closes the stream when the
// worker closes it. It returns the error that ended the session.
func (w *Worker) sendLoop(stream sessionStream, s *session, recvDone <-chan struct{}, recvErr func() error) error {
	ended := func(err error) error {
		if errors.Is(err, io.EOF) {
			// The stream is gone; the receive side has the status.
			<-recvDone
			return cmp.Or(recvErr(), err)
		}
		return err
	}
	hb := time.NewTimer(s.interval)
	defer hb.Stop()
	heartbeat := false
	for {
		if err := w.flush(stream, s, heartbeat); err != nil {
			return ended(err)
		}
		heartbeat = false
		select {
		case <-recvDone:
			return cmp.Or(recvErr(), io.EOF)
		case <-w.wake:
		case <-hb.C:
			heartbeat = true
			hb.Reset(s.interval)
		case <-w.closing.Done():
			if err := w.flush(stream, s, false); err != nil {
				return ended(err)
			}
			if err := stream.CloseSend(); err != nil {
				return err
			}
			grace := time.NewTimer(closeGrace)
			defer grace.Stop()
			select {
			case <-recvDone:
			case <-grace.C:
			}
			return nil
		}
	}
}

// flush sends everything pending, in as many requests as the byte budget
// needs; with heartbeat set, the first request heartbeats the leases in
// progress.
func (w *Worker) flush(stream sessionStream, s *session, heartbeat bool) error {
	for {
		req, more := w.nextRequest(s, heartbeat)
		heartbeat = false
		if req == nil {
			return nil
		}
		if err := stream.Send(req); err != nil {
			w.requeue(req)
			return err
		}
		for _, a := range req.GetCancelAcks() {
			w.log.Info("cancel acknowledged", "job", a.GetJobId(), "token", a.GetToken())
		}
		if !more {
			return nil
		}
	}
}

// nextRequest takes what is pending into one request under the byte budget
// and reports whether anything is left for another. It returns nil when
// nothing is pending. Sent completions move to s.inflight.
func (w *Worker) nextRequest(s *session, heartbeat bool) (*leaseholdv1.SessionRequest, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	req := &leaseholdv1.SessionRequest{}
	z := &sizer{budget: w.budget}
	if w.draining && !s.drainSent {
		req.Draining, s.drainSent = true, true
		z.used += 2
	}
	if !w.draining && w.credits > 0 {
		req.Credits, w.credits = w.credits, 0
		z.used += 1 + protowire.SizeVarint(uint64(req.Credits))
	}
	req.CancelAcks, w.cancelAcks = z.takeRefs(w.cancelAcks)
	req.HandBacks, w.handBacks = z.takeRefs(w.handBacks)
	s.handedBack = append(s.handedBack, req.HandBacks...)
	req.Received, w.received = z.takeRefs(w.received)
	if heartbeat {
		req.Heartbeats, _ = z.takeRefs(w.workingLocked())
	}
	for len(w.outbox) > 0 && z.take(w.outbox[0].msg) {
		c := w.outbox[0]
		w.outbox = w.outbox[1:]
		req.Completions = append(req.Completions, c.msg)
		s.inflight = append(s.inflight, c)
	}
	if len(w.outbox) == 0 {
		w.outbox = nil
	}
	if proto.Size(req) == 0 {
		return nil, false
	}
	more := len(w.cancelAcks) > 0 || len(w.handBacks) > 0 || len(w.received) > 0 || len(w.outbox) > 0
	return req, more
}

// requeue puts back the acknowledgements of a request that could not be
// sent. Its completions and hand-backs are already recorded on the session,
// which sends them again when it ends.
func (w *Worker) requeue(req *leaseholdv1.SessionRequest) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.cancelAcks = append(slices.Clone(req.GetCancelAcks()), w.cancelAcks...)
	w.received = append(slices.Clone(req.GetReceived()), w.received...)
}

// workingLocked returns the leases being worked on, sorted: not lost, not
// handed back and not in a simulated stall. They are the ones heartbeated
// and listed in hello.holding. w.mu must be held.
func (w *Worker) workingLocked() []*leaseholdv1.LeaseRef {
	refs := make([]*leaseholdv1.LeaseRef, 0, len(w.leases))
	for k, l := range w.leases {
		if !l.lost && !l.paused && !l.handedBack {
			refs = append(refs, k.ref())
		}
	}
	slices.SortFunc(refs, func(a, b *leaseholdv1.LeaseRef) int {
		return cmp.Or(strings.Compare(a.GetJobId(), b.GetJobId()), cmp.Compare(a.GetToken(), b.GetToken()))
	})
	return refs
}

// sizer adds up the encoded size of a request's repeated fields against a
// budget.
type sizer struct{ used, budget int }

// take counts m as one more element of a repeated field and reports whether
// it fits. The first element always fits, so that a request makes progress.
func (z *sizer) take(m proto.Message) bool {
	n := 1 + protowire.SizeBytes(proto.Size(m))
	if z.used > 0 && z.used+n > z.budget {
		return false
	}
	z.used += n
	return true
}

// takeRefs splits refs into those that fit and the rest.
func (z *sizer) takeRefs(refs []*leaseholdv1.LeaseRef) (taken, rest []*leaseholdv1.LeaseRef) {
	i := 0
	for i < len(refs) && z.take(refs[i]) {
		i++
	}
	if i == len(refs) {
		return refs, nil
	}
	return refs[:i:i], refs[i:]
}

// apply applies one response. It runs on the session's receive goroutine
// (or, for the welcome, on the sender's before it starts) and never waits
// for a render.
func (w *Worker) apply(s *session, resp *leaseholdv1.SessionResponse) {
	for _, g := range resp.GetGrants() {
		w.grant(g)
	}
	for _, r := range resp.GetResults() {
		w.result(s, r)
	}
	for _, st := range resp.GetLeases() {
		w.leaseStatus(st)
	}
	for _, st := range resp.GetRevoked() {
		w.lose(st, true)
	}
	w.mu.Lock()
	paused := resp.GetDispatchPaused()
	changed := paused != w.dispatchPaused
	w.dispatchPaused = paused
	w.mu.Unlock()
	if changed {
		w.log.Info("dispatch paused", "paused", paused)
	}
	signal(w.wake)
}

// grant takes one lease: it records it, acknowledges its receipt and starts
// its render, or hands it back at once while draining or when it would
// exceed the capacity.
func (w *Worker) grant(g *leaseholdv1.Grant) {
	key := leaseKey{jobID: g.GetJobId(), token: g.GetLease().GetToken()}
	w.recordGrant(key)
	w.mu.Lock()
	w.received = append(w.received, key.ref())
	if _, dup := w.leases[key]; dup {
		w.mu.Unlock()
		w.log.Warn("duplicate grant ignored", "job", key.jobID, "token", key.token)
		return
	}
	if w.draining {
		w.handBackLocked(key)
		w.mu.Unlock()
		w.log.Info("lease handed back", "job", key.jobID, "token", key.token, "why", "draining")
		return
	}
	if len(w.leases) >= w.cfg.Capacity {
		// The coordinator grants at most the credits it was given, so this
		// is its bug or ours; either way the slot is not there.
		w.handBackLocked(key)
		w.mu.Unlock()
		w.log.Warn("lease handed back", "job", key.jobID, "token", key.token, "why", "over capacity")
		return
	}
	ctx, cancel := context.WithCancelCause(w.leaseContext(g))
	l := &lease{key: key, grant: g, ctx: ctx, cancel: cancel}
	w.leases[key] = l
	w.metrics.leasesHeld.Set(float64(len(w.leases)))
	w.wg.Add(1)
	w.mu.Unlock()
	w.log.Debug("lease acquired", "job", key.jobID, "token", key.token, "attempt", g.GetLease().GetAttempt(), "team", g.GetTeam())
	go w.work(l)
}

// handBackLocked queues a hand-back and awaits its answer. w.mu must be held.
func (w *Worker) handBackLocked(key leaseKey) {
	w.handBacks = append(w.handBacks, key.ref())
	w.awaiting[key] = true
	w.metrics.handBacks.Inc()
}

// handBackAll hands back every lease still in progress and stops its work.
// It returns how many it handed back.
func (w *Worker) handBackAll() int {
	w.mu.Lock()
	var stop []*lease
	for _, l := range w.leases {
		if l.lost || l.handedBack {
			continue
		}
		l.handedBack = true
		w.handBackLocked(l.key)
		stop = append(stop, l)
	}
	w.mu.Unlock()
	for _, l := range stop {
		w.log.Info("lease handed back", "job", l.key.jobID, "token", l.key.token, "why", "drain timeout")
		l.cancel(errHandedBack)
	}
	signal(w.wake)
	return len(stop)
}

// result applies the answer to the oldest completion in flight.
func (w *Worker) result(s *session, r *leaseholdv1.CompletionResult) {
	w.mu.Lock()
	if len(s.inflight) == 0 {
		w.mu.Unlock()
		w.log.Error("completion result without a completion", "job", r.GetJobId(), "token", r.GetToken())
		return
	}
	c := s.inflight[0]
	s.inflight = s.inflight[1:]
	w.mu.Unlock()
	defer signal(w.changed)
	endCompleted(c.span, c, r)
	if c.key.jobID != r.GetJobId() || c.key.token != r.GetToken() {
		w.log.Error("completion result out of order", "job", c.key.jobID, "token", c.key.token,
			"result_job", r.GetJobId(), "result_token", r.GetToken())
	}
	switch code := codes.Code(r.GetCode()); {
	case code == codes.OK:
		attrs := []any{"job", c.key.jobID, "token", c.key.token, "outcome", c.outcome,
			"phase", r.GetPhase(), "replayed", r.GetReplayed()}
		if f := c.msg.GetFailure(); f != nil {
			attrs = append(attrs, "class", f.GetClass())
		}
		w.log.Debug("completed", attrs...)
	case code == codes.Aborted:
		reason := cmp.Or(r.GetReason(), code.String())
		w.metrics.rejected.WithLabelValues(reason).Inc()
		w.log.Warn("completion rejected", "job", c.key.jobID, "token", c.key.token, "reason", reason)
	case c.uploadRefused != "":
		// Without its artifact the completion cannot succeed; the upload's
		// refusal was the fencing answer.
		w.metrics.rejected.WithLabelValues(c.uploadRefused).Inc()
		w.log.Warn("completion rejected", "job", c.key.jobID, "token", c.key.token, "reason", c.uploadRefused,
			"stage", "upload", "code", code, "message", r.GetMessage())
	default:
		w.log.Error("completion failed", "job", c.key.jobID, "token", c.key.token, "code", code,
			"reason", r.GetReason(), "message", r.GetMessage())
	}
}

// leaseStatus applies one answer to a heartbeat or a hand-back.
func (w *Worker) leaseStatus(st *leaseholdv1.LeaseStatus) {
	key := keyOf(st)
	w.mu.Lock()
	if w.awaiting[key] {
		delete(w.awaiting, key)
		w.mu.Unlock()
		w.log.Debug("hand-back answered", "job", key.jobID, "token", key.token, "reason", st.GetReason())
		signal(w.changed)
		return
	}
	w.mu.Unlock()
	if st.GetState() == leaseholdv1.LeaseState_LEASE_STATE_LOST && st.GetReason() != reasonHandedBack {
		w.lose(st, false)
	}
}

// lose stops the work of a lease the coordinator says is no longer ours:
// its render is cancelled, or its completion dropped if not yet sent. A
// revoked lease is acknowledged once its render has stopped, or at once when
// none is running.
func (w *Worker) lose(st *leaseholdv1.LeaseStatus, revoked bool) {
	key := keyOf(st)
	reason := cmp.Or(st.GetReason(), "UNKNOWN")
	w.mu.Lock()
	if l := w.leases[key]; l != nil {
		first := !l.lost
		l.lost = true
		l.revoked = l.revoked || revoked
		w.mu.Unlock()
		if first {
			w.log.Info("lease lost", "job", key.jobID, "token", key.token, "reason", reason)
			l.cancel(errLeaseLost)
		}
		return
	}
	i := slices.IndexFunc(w.outbox, func(c *completion) bool { return c.key == key })
	if i >= 0 {
		endDropped(w.outbox[i].span, errLeaseLost)
		w.outbox = slices.Delete(w.outbox, i, i+1)
	}
	if revoked {
		w.cancelAcks = append(w.cancelAcks, key.ref())
	}
	w.mu.Unlock()
	if i >= 0 {
		w.log.Info("lease lost", "job", key.jobID, "token", key.token, "reason", reason)
		signal(w.changed)
	} else {
		w.log.Debug("lost lease not running", "job", key.jobID, "token", key.token, "reason", reason, "revoked", revoked)
	}
	if revoked {
		signal(w.wake)
	}
}
