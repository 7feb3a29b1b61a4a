package renderer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/leasehold/leasehold/client/reason"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"github.com/leasehold/leasehold/internal/leaderdial"
)

// Reasons the worker acts on.
const (
	reasonSessionReplaced = string(reason.SessionReplaced)
	reasonHandedBack      = string(reason.HandedBack)
	reasonNotLeader       = string(reason.NotLeader)
)

// errNoWelcome reports a session whose first response carried no welcome.
var errNoWelcome = errors.New("renderer: the first session response carries no welcome")

// sessionStream is the renderer's end of a Session.
type sessionStream = grpc.BidiStreamingClient[leaseholdv1.SessionRequest, leaseholdv1.SessionResponse]

// session is the loop's view of one Session, from its opening to its end.
// Its goroutines get only its context and out.
type session struct {
	// cancel cuts the stream; its goroutines then end.
	cancel context.CancelFunc
	// out hands the sender the next request. It holds one at most: the
	// loop writes to it only while the sender is idle (busy is false).
	// Closing it half-closes the stream.
	out chan *leaseholdv1.SessionRequest
	// holding is how many leases the hello listed, for the log.
	holding int

	// welcomed is set once the welcome has been applied.
	welcomed bool
	// interval is the heartbeat interval; heartbeat fires at it, and sets
	// heartbeatDue, which the next request clears.
	interval     time.Duration
	heartbeat    *time.Timer
	heartbeatDue bool
	// silenceAfter is how long the coordinator may send nothing (three of
	// the keepalive intervals its welcome named; 0 for a coordinator that
	// sends no keepalives); silence fires then, unless a response came
	// meanwhile. silent is set once it fired: the session is being ended.
	silenceAfter time.Duration
	silence      *time.Timer
	silenceDue   time.Time
	silent       bool
	// busy is set while the sender holds a request not yet sent.
	busy bool
	// broken is set once a send failed; the session is ending.
	broken bool
	// closeWanted asks for the half-close once nothing is pending; closed
	// is set once out is closed.
	closeWanted, closed bool
	// drainSent is set once draining=true went out on this session.
	drainSent bool
}

// sent reports one request the sender sent, or failed to send.
type sent struct {
	req *leaseholdv1.SessionRequest
	err error
}

// ended reports the end of a session: whether it was welcomed, and the
// error that ended it (nil when the worker half-closed it).
type ended struct {
	welcomed bool
	err      error
}

// connect opens a session: the hello is built now, from the leases in
// progress, and a goroutine of the session's own opens the stream.
func (l *loop) connect() {
	if l.opened > 0 {
		l.w.metrics.reconnects.Inc()
	}
	l.opened++
	hello := l.hello()
	ctx, cancel := context.WithCancel(context.Background())
	l.sess = &session{
		cancel:    cancel,
		out:       make(chan *leaseholdv1.SessionRequest, 1),
		holding:   len(hello.GetHello().GetHolding()),
		drainSent: hello.GetDraining(),
	}
	go l.w.runSession(ctx, l.client, l.record, hello, l.sess.out)
}

// hello builds a session's first request: the hello with the leases in
// progress, and as credits the free slots (none while draining). Credits
// freed earlier belong to the previous session and are dropped.
func (l *loop) hello() *leaseholdv1.SessionRequest {
	l.credits = 0
	req := &leaseholdv1.SessionRequest{
		Hello: &leaseholdv1.SessionHello{
			RendererId:      l.w.cfg.ID,
			InstanceId:      l.w.cfg.InstanceID,
			Capacity:        uint32(l.w.cfg.Capacity),
			MaxMessageBytes: uint32(l.w.cfg.MaxReceiveBytes),
			Holding:         l.working(),
		},
		Draining: l.draining,
	}
	if !l.draining {
		req.Credits = uint32(l.w.cfg.Capacity - len(l.leases))
	}
	return req
}

// welcome starts a welcomed session: its limits, its heartbeat, the leases
// the welcome says are lost, and whatever else the first response carries.
func (l *loop) welcome(resp *leaseholdv1.SessionResponse) {
	if l.phase >= phaseClosing {
		return // cut before its welcome: it is ending
	}
	s, wel, cfg := l.sess, resp.GetWelcome(), &l.w.cfg
	s.interval = cfg.HeartbeatInterval
	if s.interval <= 0 {
		s.interval = wel.GetHeartbeatInterval().AsDuration()
	}
	if s.interval <= 0 {
		s.interval = DefaultHeartbeatInterval
	}
	l.budget = cfg.MaxRequestBytes
	if m := int(wel.GetMaxMessageBytes()); m > 0 && m < l.budget {
		l.budget = m
	}
	l.inlineLimit = max(0, min(int(wel.GetMaxInlineArtifactBytes()), l.budget-inlineHeadroom))
	l.presigned = wel.GetPresignedUploads()
	s.welcomed = true
	s.heartbeat = time.NewTimer(s.interval)
	if k := wel.GetKeepaliveInterval().AsDuration(); k > 0 {
		s.silenceAfter = silentKeepalives * k
		s.silence = time.NewTimer(s.silenceAfter)
		s.silenceDue = time.Now().Add(s.silenceAfter)
	}
	l.w.connected.Store(true)
	l.w.metrics.connected.Set(1)
	l.w.log.Info("session started", "instance", cfg.InstanceID, "heartbeat_interval", s.interval,
		"lease_ttl", wel.GetLeaseTtl().AsDuration(), "max_inline_bytes", l.inlineLimit, "max_request_bytes", l.budget,
		"holding", s.holding)
	for _, st := range wel.GetHolding() {
		if st.GetState() == leaseholdv1.LeaseState_LEASE_STATE_LOST {
			l.lose(st, false)
		}
	}
	l.handle(resp)
}

// silentKeepalives is how many keepalive intervals of silence make the
// worker leave a coordinator: with the coordinator's keepalive at a third
// of the heartbeat interval, a heartbeat interval (5 s by default), well
// past an election, so that a coordinator merely slow is not left.
const silentKeepalives = 3

// heard notes that the coordinator sent something: its silence starts
// again.
func (l *loop) heard() {
	if s := l.sess; s != nil && s.silence != nil && !s.silent {
		s.silence.Reset(s.silenceAfter)
		s.silenceDue = time.Now().Add(s.silenceAfter)
	}
}

// silenceC returns the channel of the session's silence timer, nil while
// none runs.
func (l *loop) silenceC() <-chan time.Time {
	if l.sess == nil || l.sess.silent {
		return nil
	}
	return timerC(l.sess.silence)
}

// silenced ends a session whose coordinator sent nothing, not even a
// keepalive, for silenceAfter: it is stalled (a frozen process, a path
// that stopped carrying its messages), and the next session goes wherever
// the leader is then, holding the leases.
func (l *loop) silenced() {
	s := l.sess
	if late := time.Since(s.silenceDue); late > s.silenceAfter/2 {
		// The timer fired far behind its time: this process was the one
		// stopped, and what the coordinator sent meanwhile waits to be
		// read. The coordinator gets the whole bound again.
		s.silence.Reset(s.silenceAfter)
		s.silenceDue = time.Now().Add(s.silenceAfter)
		return
	}
	s.silent = true
	l.w.log.Warn("coordinator silent", "silent_for", s.silenceAfter, "holding", len(l.working()))
	s.cancel()
}

// heartbeatC returns the channel of the session's heartbeat timer, nil
// while no session is welcomed.
func (l *loop) heartbeatC() <-chan time.Time {
	if l.sess == nil {
		return nil
	}
	return timerC(l.sess.heartbeat)
}

// sendPending hands the sender the next request when it is idle and
// anything is pending, and half-closes a session that is to close once
// nothing is.
func (l *loop) sendPending() {
	s := l.sess
	if s == nil || !s.welcomed || s.busy || s.broken || s.closed {
		return
	}
	if req := l.nextRequest(s); req != nil {
		s.busy = true
		s.out <- req
		return
	}
	if s.closeWanted {
		close(s.out)
		s.closed = true
	}
}

// nextRequest takes what is pending into one request under the byte
// budget, or returns nil when nothing is. What is left waits for the next
// request, which follows as soon as this one is sent.
func (l *loop) nextRequest(s *session) *leaseholdv1.SessionRequest {
	req := &leaseholdv1.SessionRequest{}
	z := &sizer{budget: l.budget, items: l.w.cfg.Capacity}
	if l.draining && !s.drainSent {
		req.Draining, s.drainSent = true, true
		z.used += 2
	}
	if !l.draining && l.credits > 0 {
		req.Credits, l.credits = l.credits, 0
		z.used += 1 + protowire.SizeVarint(uint64(req.Credits))
	}
	req.CancelAcks, l.cancelAcks = z.takeRefs(l.cancelAcks)
	req.Received, l.received = z.takeRefs(l.received)
	if s.heartbeatDue {
		req.Heartbeats, _ = z.takeRefs(l.working())
		s.heartbeatDue = false
	}
	l.outbox.take(z, req)
	if proto.Size(req) == 0 {
		return nil
	}
	return req
}

// sentDone applies the sender's report. The acknowledgements of a request
// that could not be sent wait for the next session; its completions and
// hand-backs are in the outbox, which sends them again when the session
// ends.
func (l *loop) sentDone(r sent) {
	s := l.sess
	s.busy = false
	if r.err != nil {
		s.broken = true
		l.cancelAcks = append(slices.Clone(r.req.GetCancelAcks()), l.cancelAcks...)
		l.received = append(slices.Clone(r.req.GetReceived()), l.received...)
		return
	}
	for _, a := range r.req.GetCancelAcks() {
		l.w.log.Info("cancel acknowledged", "job", a.GetJobId(), "token", a.GetToken())
	}
}

// sessionEnded forgets a session that ended, sends its unanswered
// completions and hand-backs again on the next one, and opens the next
// one when it is due; or, when the coordinator refused this renderer for
// good, stops.
//
// ALREADY_EXISTS (RENDERER_ID_IN_USE: another process holds a session under
// this id) is logged as an error and retried with a backoff of 1 s up to
// 30 s, without end: the usual cause is this pod's previous process, whose
// session the coordinator has not yet seen die, and that resolves itself;
// a genuine duplicate shows in the error log and in /readyz staying 503.
// ABORTED SESSION_REPLACED (a newer session of this same process took over)
// is reopened at once, and so is a session the worker ended itself because
// its coordinator fell silent, or that ended because the connection's
// leader discovery left the replica it was on (leaderdial.ErrLeaderMoved). So is UNAVAILABLE NOT_LEADER, the end of a session
// whose coordinator stopped leading its cluster: the new session waits
// for the channel to find the new leader, and holds the same leases. A
// NOT_LEADER again before any welcome waits a short backoff, from 10 ms
// doubling up to Config.BackoffMax: the channel may not have heard yet
// that the replica it chose stopped leading, and a single address naming
// a follower must not make the worker spin.
func (l *loop) sessionEnded(e ended) {
	s := l.sess
	l.sess = nil
	s.cancel()
	if s.welcomed {
		s.heartbeat.Stop()
		stopTimer(s.silence)
		l.outbox.resend()
		l.w.connected.Store(false)
		l.w.metrics.connected.Set(0)
	}
	if l.phase >= phaseClosing {
		if l.phase == phaseClosing {
			l.stop()
		}
		return
	}
	if e.welcomed {
		l.bo.reset()
		l.inUse.reset()
		l.leader.reset()
		l.notLeader = 0
	}
	log, err := l.w.log, e.err
	code, reason := status.Code(err), reasonOf(err)
	var d time.Duration
	switch {
	case permanent(code):
		log.Error("session refused", "err", err, "reason", reason)
		l.err = fmt.Errorf("renderer: session refused: %w", err)
		l.stop()
		return
	case code == codes.AlreadyExists:
		d = l.inUse.next()
		log.Error("renderer id in use", "id", l.w.cfg.ID, "err", err, "retry_in", d)
	case s.silent:
		// Logged when it fell silent; the next session waits for a leader.
	case errors.Is(err, leaderdial.ErrLeaderMoved):
		log.Warn("leader moved", "err", err)
	case code == codes.Aborted && reason == reasonSessionReplaced:
		log.Warn("session replaced", "err", err)
	case code == codes.Unavailable && reason == reasonNotLeader:
		if l.notLeader > 0 {
			d = l.leader.next()
		}
		l.notLeader++
		log.Warn("coordinator not the leader", "err", err, "leader", leaderAddr(err), "retry_in", d)
	default:
		d = l.bo.next()
		log.Warn("session ended", "err", err, "retry_in", d)
	}
	if d <= 0 {
		l.connect()
		return
	}
	l.redial = time.NewTimer(d)
}

// permanent reports whether a session refused with code must not be retried.
func permanent(code codes.Code) bool {
	switch code {
	case codes.Unauthenticated, codes.PermissionDenied, codes.InvalidArgument, codes.Unimplemented:
		return true
	}
	return false
}

// runSession is a session's goroutine: it runs one Session until it breaks
// or the loop closes it, and reports its end on w.ended. It sends the
// requests the loop hands it on out, and a receive goroutine of its own
// passes every response to the loop.
func (w *Worker) runSession(ctx context.Context, client leaseholdv1.RendererServiceClient, record *os.File,
	hello *leaseholdv1.SessionRequest, out <-chan *leaseholdv1.SessionRequest) {
	welcomed, err := w.session(ctx, client, record, hello, out)
	w.ended <- ended{welcomed: welcomed, err: err}
}

// session does the work of runSession and reports whether the coordinator
// welcomed the session, and the error that ended it.
func (w *Worker) session(ctx context.Context, client leaseholdv1.RendererServiceClient, record *os.File,
	hello *leaseholdv1.SessionRequest, out <-chan *leaseholdv1.SessionRequest) (welcomed bool, err error) {
	// The stream is cut only when the session is over, so that a half-close
	// lets the coordinator answer what it was sent (see sendLoop).
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := client.Session(ctx, grpc.WaitForReady(true))
	if err != nil {
		return false, err
	}
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
	w.recordGrants(record, resp)
	w.welcomed <- resp

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
			w.recordGrants(record, resp)
			w.responses <- resp
		}
	}()
	defer func() {
		cancel()
		<-recvDone
	}()
	return true, w.sendLoop(stream, out, recvDone, func() error { return recvErr })
}

// sendLoop is a session's sender: it sends each request the loop hands it
// and reports it on w.sent, and half-closes the stream when the loop
// closes out. It returns the error that ended the session: recvErr, once
// recvDone is closed, is the receiver's.
func (w *Worker) sendLoop(stream sessionStream, out <-chan *leaseholdv1.SessionRequest, recvDone <-chan struct{}, recvErr func() error) error {
	for {
		select {
		case <-recvDone:
			return cmp.Or(recvErr(), io.EOF)
		case req, ok := <-out:
			if !ok {
				return halfClose(stream, recvDone)
			}
			err := stream.Send(req)
			if errors.Is(err, io.EOF) {
				// The stream is gone; the receive side has the status.
				<-recvDone
				err = cmp.Or(recvErr(), err)
			}
			w.sent <- sent{req: req, err: err}
			if err != nil {
				return err
			}
		}
	}
}

// halfClose ends the requests of a session and lets the coordinator answer
// for up to closeGrace.
func halfClose(stream sessionStream, recvDone <-chan struct{}) error {
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

// recordGrants appends the grants of resp to the record file, if any, as
// they arrive. A failed write is logged and does not stop the work.
func (w *Worker) recordGrants(record *os.File, resp *leaseholdv1.SessionResponse) {
	if record == nil {
		return
	}
	for _, g := range resp.GetGrants() {
		key := leaseKey{jobID: g.GetJobId(), token: g.GetLease().GetToken()}
		if _, err := fmt.Fprintf(record, "%s %d\n", key.jobID, key.token); err != nil {
			w.log.Error("recording grant", "job", key.jobID, "token", key.token, "err", err)
		}
	}
}
