package server

import (
	"context"
	"errors"
	"io"
	"sync/atomic"
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/auth"
	"github.com/leasehold/leasehold/coordinator/internal/engine"
	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// sessionQueue bounds the renderer messages received and not yet applied;
// past it the receiver stops reading, and gRPC's flow control holds the
// renderer back.
const sessionQueue = 256

// sessionStoreCalls bounds the requests of one session whose artifact
// store work (puts of inline previews, checks of stored objects) runs at
// once; past it the receiver waits. It bounds the preview bytes a session
// holds on their way to the store, and the calls it makes there.
const sessionStoreCalls = 8

// Session implements RendererService.Session.
//
// Three goroutines serve one session. The receiver reads requests and
// converts them. The applier takes everything received so far, merges it
// into one SessionInput (in order) and applies it as one writer command,
// so that however fast the renderer sends, it costs one command per
// commit. The handler's own goroutine sends: the answers in request order,
// the grants the writer published (document content read after the commit,
// packed under the renderer's message limit), revocations, and a keepalive
// whenever it has sent nothing for the keepalive interval. When the
// renderer closes its side, everything it sent is applied and answered, and
// the stream then ends with OK. When the session ends, grants taken but not
// sent, and grants never taken, are handed back without counting the
// attempt.
func (s *RendererServer) Session(stream leaseholdv1.RendererService_SessionServer) error {
	ctx := stream.Context()
	p, err := require(ctx, auth.RoleRenderer)
	if err != nil {
		return s.status(err)
	}
	first, err := stream.Recv()
	if err == io.EOF {
		return nil
	}
	if err != nil {
		return err
	}
	open, budget, err := s.hello(p, first)
	if err != nil {
		return s.status(err)
	}
	s.holdRenderer(ctx, open.Renderer.ID)
	maxRefs := engine.MaxLeaseRefs(open.Capacity, open.Renderer)
	if err := checkLeaseRefs(maxRefs, sessionLists(first)...); err != nil {
		return s.status(err)
	}
	conn, holding, err := s.e.Open(ctx, open)
	if err != nil {
		return s.streamEnd(err)
	}
	sess := &session{s: s, stream: stream, conn: conn, budget: budget, maxRefs: maxRefs, renderer: open.Renderer.ID, who: open.Renderer,
		storeCalls: make(chan struct{}, sessionStoreCalls)}
	defer sess.close()
	welcome := &leaseholdv1.SessionWelcome{
		HeartbeatInterval:      durationpb.New(s.e.HeartbeatInterval()),
		LeaseTtl:               durationpb.New(s.e.LeaseTTL()),
		MaxInlineArtifactBytes: uint32(s.maxInline),
		MaxMessageBytes:        uint32(s.maxMsg),
		MaxArtifactBytes:       uint32(s.maxBytes),
	}
	if s.previews.presigns() {
		// Larger previews go straight to the store: neither their bytes
		// nor a copy of them cross the coordinator.
		welcome.PresignedUploads = true
		welcome.MaxInlineArtifactBytes = uint32(min(s.maxInline, s.previews.StoreAbove))
	}
	if s.keepalives {
		sess.keepalive = keepaliveInterval(s.e.HeartbeatInterval())
		welcome.KeepaliveInterval = durationpb.New(sess.keepalive)
	}
	for _, st := range holding {
		welcome.Holding = append(welcome.Holding, leaseStatusToProto(st))
	}
	if err := stream.Send(&leaseholdv1.SessionResponse{Welcome: welcome, DispatchPaused: s.e.DispatchState().Paused}); err != nil {
		return s.streamEnd(err)
	}
	// The first message may carry work besides the hello.
	first.Hello = nil
	return sess.run(ctx, first)
}

// hello checks a session's opening message.
func (s *RendererServer) hello(p auth.Principal, m *leaseholdv1.SessionRequest) (engine.SessionOpen, int, error) {
	h := m.GetHello()
	if h == nil {
		return engine.SessionOpen{}, 0, invalidArg("hello", reasonMissingHello, "the first message of a session must carry hello")
	}
	r, err := rendererFor(p, h.GetRendererId())
	if err != nil {
		return engine.SessionOpen{}, 0, err
	}
	if !validID(h.GetInstanceId(), maxInstanceBytes) {
		return engine.SessionOpen{}, 0, invalidArg("hello.instance_id", reasonInvalidInstance, "instance_id must be 1 to %d bytes of [A-Za-z0-9._-]", maxInstanceBytes)
	}
	if h.GetCapacity() < 1 || h.GetCapacity() > maxCapacity {
		return engine.SessionOpen{}, 0, invalidArg("hello.capacity", reasonInvalidCapacity, "capacity must be 1 to %d", maxCapacity)
	}
	budget, err := s.replyBudget(h.GetMaxMessageBytes(), "hello.max_message_bytes")
	if err != nil {
		return engine.SessionOpen{}, 0, err
	}
	if err := checkLeaseRefs(engine.MaxLeaseRefs(int(h.GetCapacity()), r), refList{"hello.holding", len(h.GetHolding())}); err != nil {
		return engine.SessionOpen{}, 0, err
	}
	holding, err := leaseRefs(h.GetHolding(), "hello.holding")
	if err != nil {
		return engine.SessionOpen{}, 0, err
	}
	return engine.SessionOpen{Renderer: r, Instance: h.GetInstanceId(), Capacity: int(h.GetCapacity()), Holding: holding}, budget, nil
}

// session is one open Session stream.
type session struct {
	s        *RendererServer
	stream   leaseholdv1.RendererService_SessionServer
	conn     *engine.Conn
	renderer string
	// who is the renderer with its credential, for hand-backs after the
	// session closed.
	who    engine.Renderer
	budget int
	// maxRefs is the most leases one list of a message may name, and one
	// writer command of the session (engine.MaxLeaseRefs of its capacity).
	maxRefs int
	// pending are grants taken from the outbox and not yet sent; they are
	// handed back if the session ends first.
	pending []engine.Grant
	// halfClosed is set once the renderer closed its side: it is sent no
	// more grants.
	halfClosed atomic.Bool
	// keepalive is the most time between two messages to the renderer (0:
	// no keepalives, Config.SessionKeepalives): quiet, is sent a
	// keepalive when it runs out, and is reset by every send.
	keepalive time.Duration
	quiet     *time.Timer
	// storeCalls holds a token per request whose store work runs
	// (sessionStoreCalls).
	storeCalls chan struct{}
}

// timerC returns t's channel, or nil (which never fires) for no timer.
func timerC(t *time.Timer) <-chan time.Time {
	if t == nil {
		return nil
	}
	return t.C
}

// keepaliveInterval is how often a session hears from the coordinator at
// least: a third of the heartbeat interval, so that a renderer, which
// takes three missed keepalives for a stalled coordinator, leaves it after
// a heartbeat interval of silence (5 s by default): well past an election,
// and well within a lease.
func keepaliveInterval(heartbeat time.Duration) time.Duration {
	return max(heartbeat/3, minKeepalive)
}

// minKeepalive bounds how often a quiet session is sent a keepalive.
const minKeepalive = 100 * time.Millisecond

// forwarded is the writer's answer to one merged command.
type forwarded struct {
	resp *leaseholdv1.SessionResponse
	err  error
}

// slot is one completion of a request: applied by the writer (index into
// the input's Completions) or answered before it (invalid).
type slot struct {
	index   int
	invalid *leaseholdv1.CompletionResult
}

// item is one received request, converted.
type item struct {
	in    engine.SessionInput
	order []slot
	// invalid answers the request's malformed heartbeat and hand-back
	// references.
	invalid []*leaseholdv1.LeaseStatus
	// resolved, when not nil, is closed once the artifact store's part of
	// the completions is done (resolveLater); forward reads the item only
	// then. Requests that follow are received and resolved meanwhile, so
	// a session's calls to the store overlap and its completions reach the
	// writer together, in request order still.
	resolved chan struct{}
}

func (ss *session) run(ctx context.Context, first *leaseholdv1.SessionRequest) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	items := make(chan *item, sessionQueue)
	recvErr := make(chan error, 1)
	results := make(chan forwarded, 1)
	items <- ss.convert(ctx, first)
	go ss.receive(ctx, items, recvErr)
	go ss.forward(ctx, items, results)
	if ss.keepalive > 0 {
		ss.quiet = time.NewTimer(ss.keepalive)
		defer ss.quiet.Stop()
	}
	for {
		select {
		case <-timerC(ss.quiet):
			if err := ss.send(&leaseholdv1.SessionResponse{Keepalive: true}); err != nil {
				return err
			}
		case <-ss.s.closing:
			return ss.s.status(errShuttingDown)
		case <-ctx.Done():
			return ss.s.streamEnd(ctx.Err())
		case err := <-recvErr:
			return ss.s.streamEnd(err)
		case a, ok := <-results:
			if !ok {
				// The renderer closed its side and everything it sent
				// before has been applied and answered.
				return nil
			}
			if a.err != nil {
				return ss.s.streamEnd(leadershipEnd(a.err))
			}
			if err := ss.sendAnswers(a.resp); err != nil {
				return err
			}
		case <-ss.conn.Outbox.Ready():
			grants, revoked, ended := ss.conn.Outbox.Take()
			ss.pending = append(ss.pending, grants...)
			if err := ss.push(revoked); err != nil {
				return err
			}
			if ended != nil {
				return ss.s.status(ended)
			}
		}
	}
}

// leadershipEnd is the error a session ends with when one of its commands
// failed: NOT_LEADER when this node lost its leadership with the command
// proposed, as when it lost it between commands, although the command's
// outcome is unknown. A session is a stream, not a write: the renderer
// sends what went unanswered again on its next session, where every
// command is idempotent (completions by job and token, receipts and
// hand-backs by lease), and on NOT_LEADER it opens that session on the new
// leader at once, where OUTCOME_UNKNOWN would cost it a backoff. Any other
// error is returned as it is.
func leadershipEnd(err error) error {
	if !errors.Is(err, engine.ErrOutcomeUnknown) {
		return err
	}
	var known *engine.NotLeaderError
	if errors.As(err, &known) {
		return engine.NotLeader(known.LeaderID, known.LeaderAddr, nil)
	}
	return engine.NotLeader("", "", nil)
}

// receive reads requests until the stream ends, converting each. When the
// renderer closes its side, it closes items, so that what was received is
// still applied and answered before the session ends.
func (ss *session) receive(ctx context.Context, items chan<- *item, errC chan<- error) {
	for {
		m, err := ss.stream.Recv()
		if err == io.EOF {
			ss.halfClosed.Store(true)
			close(items)
			return
		}
		if err == nil && m.GetHello() != nil {
			err = invalidArg("hello", reasonMissingHello, "hello may be sent only in the first message")
		}
		if err == nil {
			err = checkLeaseRefs(ss.maxRefs, sessionLists(m)...)
		}
		if err != nil {
			errC <- err
			return
		}
		select {
		case items <- ss.convert(ctx, m):
		case <-ctx.Done():
			return
		}
	}
}

// forward merges the received requests into one writer command at a
// time and hands the answers, in request order, to the sender. A command
// takes what was received so far, up to the session's maxRefs leases in
// each list (a request that would take it past that waits for the next),
// so that one command of a session costs the writer at most that much
// however fast the renderer sends. A request is read only once the
// artifact store's part of it is done (ready). Once items is closed and
// drained it closes results.
func (ss *session) forward(ctx context.Context, items <-chan *item, results chan<- forwarded) {
	var carried *item
	for {
		var batch []*item
		if carried != nil {
			batch, carried = append(batch, carried), nil
		} else {
			select {
			case it, ok := <-items:
				if !ok {
					close(results)
					return
				}
				if !it.ready(ctx) {
					return
				}
				batch = append(batch, it)
			case <-ctx.Done():
				return
			}
		}
		refs := countRefs(batch[0].in)
	more:
		for len(batch) < sessionQueue {
			select {
			case it, ok := <-items:
				if !ok {
					break more
				}
				if !it.ready(ctx) {
					return
				}
				next := refs.plus(countRefs(it.in))
				if !next.within(ss.maxRefs) {
					carried = it
					break more
				}
				refs = next
				batch = append(batch, it)
			default:
				break more
			}
		}
		in, order, invalid := merge(batch)
		res, err := ss.s.e.Receive(ctx, ss.conn, in)
		a := forwarded{err: err}
		if err == nil {
			a.resp = ss.answers(in, order, res)
			a.resp.Leases = append(a.resp.Leases, invalid...)
		}
		select {
		case results <- a:
		case <-ctx.Done():
			return
		}
		if err != nil {
			return
		}
	}
}

// ready waits until the artifact store's part of the item is done, if it
// has one (resolveLater): until then a goroutine may still change it. It
// reports false when ctx ended first.
func (it *item) ready(ctx context.Context) bool {
	if it.resolved == nil {
		return true
	}
	select {
	case <-it.resolved:
		return true
	case <-ctx.Done():
		return false
	}
}

// refCount is how many leases each list of a session input names:
// receipts, heartbeats, completions, hand-backs, acknowledgements.
type refCount [5]int

// countRefs counts in's lists.
func countRefs(in engine.SessionInput) refCount {
	return refCount{len(in.Received), len(in.Heartbeats), len(in.Completions), len(in.HandBacks), len(in.Acks)}
}

// plus adds two counts list by list.
func (c refCount) plus(o refCount) refCount {
	for i := range c {
		c[i] += o[i]
	}
	return c
}

// within reports whether no list names more than n leases.
func (c refCount) within(n int) bool {
	for _, v := range c {
		if v > n {
			return false
		}
	}
	return true
}

// sessionLists are the lists of a SessionRequest that name leases, and
// its completions.
func sessionLists(m *leaseholdv1.SessionRequest) []refList {
	return []refList{{"heartbeats", len(m.GetHeartbeats())}, {"received", len(m.GetReceived())}, {"hand_backs", len(m.GetHandBacks())},
		{"cancel_acks", len(m.GetCancelAcks())}, {"completions", len(m.GetCompletions())}}
}

// merge joins requests into one input, keeping every list in order.
func merge(batch []*item) (engine.SessionInput, []slot, []*leaseholdv1.LeaseStatus) {
	var in engine.SessionInput
	var order []slot
	var invalid []*leaseholdv1.LeaseStatus
	for _, it := range batch {
		invalid = append(invalid, it.invalid...)
		in.Received = append(in.Received, it.in.Received...)
		in.Heartbeats = append(in.Heartbeats, it.in.Heartbeats...)
		in.HandBacks = append(in.HandBacks, it.in.HandBacks...)
		in.Acks = append(in.Acks, it.in.Acks...)
		in.Credits += it.in.Credits
		in.Draining = in.Draining || it.in.Draining
		for _, sl := range it.order {
			if sl.invalid == nil {
				c := it.in.Completions[sl.index]
				sl.index = len(in.Completions)
				in.Completions = append(in.Completions, c)
			}
			order = append(order, sl)
		}
	}
	return in, order, invalid
}

// answers builds the response to one applied command: every completion's
// result in request order, then the heartbeat and hand-back statuses.
func (ss *session) answers(in engine.SessionInput, order []slot, res engine.SessionResult) *leaseholdv1.SessionResponse {
	resp := &leaseholdv1.SessionResponse{}
	for _, sl := range order {
		if sl.invalid != nil {
			resp.Results = append(resp.Results, sl.invalid)
			continue
		}
		req, r := in.Completions[sl.index], res.Completions[sl.index]
		out := &leaseholdv1.CompletionResult{
			JobId:        JobID(req.Job),
			Token:        req.Token,
			Phase:        leaseholdv1.Phase(r.Job.Phase),
			CurrentToken: r.Job.LastToken(),
			Replayed:     r.Replayed,
		}
		if r.Err != nil {
			st := status.Convert(ss.s.status(notFound(r.Err, reasonJobNotFound, "job %s not found", JobID(req.Job))))
			out.Code, out.Reason, out.Message = int32(st.Code()), reasonOf(st), st.Message()
		}
		if jobs.NeverHeld(r.Err) {
			// The job's state is none of this renderer's business.
			out.Phase, out.CurrentToken = leaseholdv1.Phase_PHASE_UNSPECIFIED, 0
		}
		resp.Results = append(resp.Results, out)
	}
	for _, st := range append(res.Heartbeats, res.HandBacks...) {
		resp.Leases = append(resp.Leases, leaseStatusToProto(st))
	}
	return resp
}

// convert turns a request into an engine input. What the writer need not
// see is answered on its own and the rest applied: a malformed heartbeat or
// hand-back reference LOST INVALID_ID (after the writer's statuses), a
// malformed receipt or acknowledgement dropped (they have no answer), a
// completion with a bad id, a missing outcome or a preview over the limit
// in its place among the results.
func (ss *session) convert(ctx context.Context, m *leaseholdv1.SessionRequest) *item {
	it := &item{}
	heartbeats, handBacks := parseLeaseList(m.GetHeartbeats()), parseLeaseList(m.GetHandBacks())
	it.in.Received = parseLeaseList(m.GetReceived()).refs
	it.in.Heartbeats, it.in.HandBacks = heartbeats.refs, handBacks.refs
	it.in.Acks = parseLeaseList(m.GetCancelAcks()).refs
	it.invalid = append(heartbeats.invalidAnswers(), handBacks.invalidAnswers()...)
	it.in.Credits = int(min(m.GetCredits(), maxCapacity))
	it.in.Draining = m.GetDraining()
	for _, c := range m.GetCompletions() {
		req, err := ss.s.completion(c.GetJobId(), c.GetToken(), ss.renderer, c.GetSuccess(), c.GetFailure())
		if err != nil {
			st := status.Convert(ss.s.status(err))
			it.order = append(it.order, slot{invalid: &leaseholdv1.CompletionResult{JobId: c.GetJobId(), Token: c.GetToken(),
				Code: int32(st.Code()), Reason: reasonOf(st), Message: st.Message()}})
			continue
		}
		it.order = append(it.order, slot{index: len(it.in.Completions)})
		it.in.Completions = append(it.in.Completions, req)
	}
	ss.resolveLater(ctx, it)
	return it
}

// resolveLater does the artifact store's part of the item's completions (see
// core.resolve) on a goroutine of its own, closing it.resolved when done;
// an item with no such part is left ready.
func (ss *session) resolveLater(ctx context.Context, it *item) {
	if !ss.s.needsStore(it.in.Completions) {
		return
	}
	it.resolved = make(chan struct{})
	select {
	case ss.storeCalls <- struct{}{}:
	case <-ctx.Done():
		// The session is over: refuse what the store was to check, so
		// that nothing unchecked can reach the writer.
		it.refuse(ss.s.refuseStoreWork(it.in.Completions, ctx.Err()), ss.s.core)
		close(it.resolved)
		return
	}
	go func() {
		defer func() { <-ss.storeCalls }()
		defer close(it.resolved)
		if errs := ss.s.resolve(ctx, ss.s.e, it.in.Completions); errs != nil {
			it.refuse(errs, ss.s.core)
		}
	}()
}

// refuse answers in their places the completions the artifact store's
// part refused (errs by index in in.Completions), and keeps the rest.
func (it *item) refuse(errs []error, c *core) {
	kept := it.in.Completions[:0:0]
	for i, sl := range it.order {
		if sl.invalid != nil {
			continue
		}
		req := it.in.Completions[sl.index]
		if err := errs[sl.index]; err != nil {
			st := status.Convert(c.status(err))
			it.order[i] = slot{invalid: &leaseholdv1.CompletionResult{JobId: JobID(req.Job), Token: req.Token,
				Code: int32(st.Code()), Reason: reasonOf(st), Message: st.Message()}}
			continue
		}
		it.order[i].index = len(kept)
		kept = append(kept, req)
	}
	it.in.Completions = kept
}

// send sends one response, stamped with the dispatch switch, and puts
// off the next keepalive.
func (ss *session) send(resp *leaseholdv1.SessionResponse) error {
	resp.DispatchPaused = ss.s.e.DispatchState().Paused
	if err := ss.stream.Send(resp); err != nil {
		return ss.s.streamEnd(err)
	}
	if ss.quiet != nil {
		ss.quiet.Reset(ss.keepalive)
	}
	return nil
}

// sendAnswers sends the answers to one applied command, its results and
// then its lease statuses, in order, in as many messages as the renderer's
// limit needs: a request may carry more completions than one message can
// answer.
func (ss *session) sendAnswers(resp *leaseholdv1.SessionResponse) error {
	results, leases := resp.GetResults(), resp.GetLeases()
	for {
		msg := &leaseholdv1.SessionResponse{}
		size := 0
		for len(results) > 0 {
			n := proto.Size(results[0]) + 8
			if len(msg.Results) > 0 && size+n > ss.budget {
				break
			}
			msg.Results = append(msg.Results, results[0])
			size += n
			results = results[1:]
		}
		for len(results) == 0 && len(leases) > 0 {
			n := proto.Size(leases[0]) + 8
			if (len(msg.Results) > 0 || len(msg.Leases) > 0) && size+n > ss.budget {
				break
			}
			msg.Leases = append(msg.Leases, leases[0])
			size += n
			leases = leases[1:]
		}
		if err := ss.send(msg); err != nil {
			return err
		}
		if len(results) == 0 && len(leases) == 0 {
			return nil
		}
	}
}

// push sends the revocations and the pending grants, with their document
// content, in order, in messages under the renderer's limit.
func (ss *session) push(revoked []engine.LeaseStatus) error {
	// A renderer that closed its side can send no receipt or hand-back any
	// more: its grants stay pending and are handed back when the session
	// ends.
	grants := !ss.halfClosed.Load()
	if grants && len(ss.pending) > 0 {
		if err := ss.s.e.ReadContent(ss.pending); err != nil {
			return ss.s.status(err)
		}
	}
	for (grants && len(ss.pending) > 0) || len(revoked) > 0 {
		resp := &leaseholdv1.SessionResponse{}
		size := 0
		for len(revoked) > 0 {
			r := leaseStatusToProto(revoked[0])
			rs := proto.Size(r) + 8
			if len(resp.Revoked) > 0 && size+rs > ss.budget {
				break
			}
			resp.Revoked = append(resp.Revoked, r)
			size += rs
			revoked = revoked[1:]
		}
		n := 0
		for grants && len(revoked) == 0 && n < len(ss.pending) {
			g := grantToProto(ss.pending[n])
			gs := proto.Size(g) + 8
			if (n > 0 || len(resp.Revoked) > 0) && size+gs > ss.budget {
				break
			}
			resp.Grants = append(resp.Grants, g)
			size += gs
			n++
		}
		if err := ss.send(resp); err != nil {
			return err
		}
		ss.pending = ss.pending[n:]
	}
	return nil
}

// close ends the session with the writer, handing back the grants it took
// and could not send and those it never took.
func (ss *session) close() {
	undelivered := grantRefs(ss.pending)
	left, err := ss.s.e.Close(context.Background(), ss.conn, undelivered)
	if err != nil && !errors.Is(err, engine.ErrStopped) {
		ss.s.log.Warn("closing a renderer session", "renderer", ss.renderer, "undelivered", len(undelivered), "err", err)
	}
	ss.s.release(ss.who, left)
}

// reasonOf returns the ErrorInfo reason of a status.
func reasonOf(st *status.Status) string {
	for _, d := range st.Details() {
		if info, ok := d.(interface{ GetReason() string }); ok {
			return info.GetReason()
		}
	}
	if st.Code() == codes.OK {
		return ""
	}
	return st.Code().String()
}
