package server

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/engine"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// sessionClient is a renderer's end of a Session stream that keeps
// everything it received.
type sessionClient struct {
	t       *testing.T
	stream  leaseholdv1.RendererService_SessionClient
	cancel  context.CancelFunc
	welcome *leaseholdv1.SessionWelcome
	msgs    []*leaseholdv1.SessionResponse
	grants  []*leaseholdv1.Grant
	revoked []*leaseholdv1.LeaseStatus
	// answers are the responses to requests: neither grants nor
	// revocations.
	answers []*leaseholdv1.SessionResponse
	// keepalives counts the keepalives received, which are none of the
	// above.
	keepalives int
}

// hello returns a session hello for renderer id of process instance.
func hello(id, instance string, capacity uint32) *leaseholdv1.SessionHello {
	return &leaseholdv1.SessionHello{RendererId: id, InstanceId: instance, Capacity: capacity}
}

// startSession opens a Session as token and sends first; it does not wait
// for the welcome.
func (b *testBundle) startSession(t *testing.T, token string, first *leaseholdv1.SessionRequest, opts ...grpc.CallOption) *sessionClient {
	t.Helper()
	ctx, cancel := context.WithCancel(as(t, token))
	t.Cleanup(cancel)
	stream, err := b.rend.Session(ctx, opts...)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(first); err != nil {
		t.Fatal(err)
	}
	return &sessionClient{t: t, stream: stream, cancel: cancel}
}

// openSession opens a Session as the development renderer with h and
// credits, and waits for the welcome and the first message's answer.
func (b *testBundle) openSession(t *testing.T, h *leaseholdv1.SessionHello, credits uint32, opts ...grpc.CallOption) *sessionClient {
	t.Helper()
	sc := b.startSession(t, renderer, &leaseholdv1.SessionRequest{Hello: h, Credits: credits}, opts...)
	m, err := sc.stream.Recv()
	if err != nil {
		t.Fatalf("Session hello: %v", err)
	}
	if m.GetWelcome() == nil {
		t.Fatalf("first session message = %v, want the welcome", m)
	}
	sc.welcome = m.GetWelcome()
	// The first message is answered like any other; wait for that answer
	// so that each later answer belongs to one later request.
	sc.until("the answer to the first message", func() bool { return len(sc.answers) > 0 })
	return sc
}

// recv receives one message and files it.
func (sc *sessionClient) recv() (*leaseholdv1.SessionResponse, error) {
	m, err := sc.stream.Recv()
	for err == nil && m.GetKeepalive() {
		sc.keepalives++
		m, err = sc.stream.Recv()
	}
	if err != nil {
		return nil, err
	}
	sc.msgs = append(sc.msgs, m)
	sc.grants = append(sc.grants, m.GetGrants()...)
	sc.revoked = append(sc.revoked, m.GetRevoked()...)
	if len(m.GetGrants()) == 0 && len(m.GetRevoked()) == 0 {
		sc.answers = append(sc.answers, m)
	}
	return m, nil
}

// until receives until done reports true.
func (sc *sessionClient) until(what string, done func() bool) {
	sc.t.Helper()
	for !done() {
		if _, err := sc.recv(); err != nil {
			sc.t.Fatalf("waiting for %s: %v", what, err)
		}
	}
}

// untilGrants receives until n grants arrived in all.
func (sc *sessionClient) untilGrants(n int) {
	sc.t.Helper()
	sc.until(fmt.Sprintf("%d grants", n), func() bool { return len(sc.grants) >= n })
}

// send sends req.
func (sc *sessionClient) send(req *leaseholdv1.SessionRequest) {
	sc.t.Helper()
	if err := sc.stream.Send(req); err != nil {
		sc.t.Fatalf("Session send: %v", err)
	}
}

// call sends req and returns its answer; the caller sends one request at a
// time, so each answer is the answer to one request.
func (sc *sessionClient) call(req *leaseholdv1.SessionRequest) *leaseholdv1.SessionResponse {
	sc.t.Helper()
	n := len(sc.answers)
	sc.send(req)
	sc.until("an answer", func() bool { return len(sc.answers) > n })
	return sc.answers[n]
}

// end receives until the stream ends and returns its error (nil for OK).
func (sc *sessionClient) end() error {
	for {
		if _, err := sc.recv(); err != nil {
			if err.Error() == "EOF" {
				return nil
			}
			return err
		}
	}
}

func ref(g *leaseholdv1.Grant) *leaseholdv1.LeaseRef {
	return &leaseholdv1.LeaseRef{JobId: g.GetJobId(), Token: g.GetLease().GetToken()}
}

func inline(g *leaseholdv1.Grant, content []byte) *leaseholdv1.SessionCompletion {
	return &leaseholdv1.SessionCompletion{JobId: g.GetJobId(), Token: g.GetLease().GetToken(),
		Outcome: &leaseholdv1.SessionCompletion_Success{Success: &leaseholdv1.CompleteSuccess{Content: content, ContentType: "image/png"}}}
}

func failed(g *leaseholdv1.Grant, token uint64, class leaseholdv1.FailureClass) *leaseholdv1.SessionCompletion {
	return &leaseholdv1.SessionCompletion{JobId: g.GetJobId(), Token: token,
		Outcome: &leaseholdv1.SessionCompletion_Failure{Failure: &leaseholdv1.CompleteFailure{Class: class, Message: "boom"}}}
}

// getJob reads a job as the development operator.
func (b *testBundle) getJob(t *testing.T, id string) *leaseholdv1.Job {
	t.Helper()
	resp, err := b.jobs.GetJob(as(t, operator), &leaseholdv1.GetJobRequest{JobId: id})
	if err != nil {
		t.Fatalf("GetJob(%s): %v", id, err)
	}
	return resp.GetJob()
}

func lastEvent(j *leaseholdv1.Job) *leaseholdv1.JobEvent {
	evs := j.GetEvents()
	if len(evs) == 0 {
		return nil
	}
	return evs[len(evs)-1]
}

func TestSession(t *testing.T) {
	t.Parallel()

	t.Run("Completions are answered one by one in order and a stale one does not stop the rest", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.submit(t, alpha, "alpha", "r", doc("a.pdf"), doc("b.pdf"), doc("c.pdf"))
		sc := b.openSession(t, hello("r-s", "i-1", 4), 3)
		sc.untilGrants(3)
		g := sc.grants
		stale := failed(g[1], g[1].GetLease().GetToken()+100, leaseholdv1.FailureClass_FAILURE_CLASS_TRANSIENT)
		noOutcome := &leaseholdv1.SessionCompletion{JobId: g[1].GetJobId(), Token: g[1].GetLease().GetToken()}
		resp := sc.call(&leaseholdv1.SessionRequest{Completions: []*leaseholdv1.SessionCompletion{
			inline(g[0], []byte("png-0")), stale, noOutcome, inline(g[2], []byte("png-2")),
		}})
		type result struct {
			Job    string
			Code   codes.Code
			Reason string
			Phase  leaseholdv1.Phase
		}
		var got []result
		for _, r := range resp.GetResults() {
			got = append(got, result{r.GetJobId(), codes.Code(r.GetCode()), r.GetReason(), r.GetPhase()})
		}
		want := []result{
			{g[0].GetJobId(), codes.OK, "", leaseholdv1.Phase_PHASE_SUCCEEDED},
			{g[1].GetJobId(), codes.Aborted, "STALE_LEASE", leaseholdv1.Phase_PHASE_LEASED},
			{g[1].GetJobId(), codes.InvalidArgument, reasonMissingOutcome, leaseholdv1.Phase_PHASE_UNSPECIFIED},
			{g[2].GetJobId(), codes.OK, "", leaseholdv1.Phase_PHASE_SUCCEEDED},
		}
		if diff := cmpDiff(want, got); diff != "" {
			t.Fatalf("results (-want +got):\n%s", diff)
		}
		if r := resp.GetResults()[1]; r.GetCurrentToken() != g[1].GetLease().GetToken() {
			t.Errorf("stale result current_token = %d, want %d", r.GetCurrentToken(), g[1].GetLease().GetToken())
		}
		// The stream is still open: a heartbeat is answered.
		hb := sc.call(&leaseholdv1.SessionRequest{Heartbeats: []*leaseholdv1.LeaseRef{ref(g[1])}})
		if len(hb.GetLeases()) != 1 || hb.GetLeases()[0].GetState() != leaseholdv1.LeaseState_LEASE_STATE_HELD {
			t.Fatalf("heartbeat after a refused completion = %v, want HELD", hb.GetLeases())
		}
		for i, id := range []string{g[0].GetJobId(), g[2].GetJobId()} {
			if j := b.getJob(t, id); j.GetPhase() != leaseholdv1.Phase_PHASE_SUCCEEDED {
				t.Errorf("job %d (%s) = %v, want SUCCEEDED", i, id, j.GetPhase())
			}
		}
		rej, err := b.ops.ListRejectedCompletions(as(t, operator), &leaseholdv1.ListRejectedCompletionsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if len(rej.GetRejections()) != 1 || rej.GetRejections()[0].GetJobId() != g[1].GetJobId() || rej.GetRejections()[0].GetRendererId() != "r-s" {
			t.Errorf("rejections = %v, want the one stale completion of r-s", rej.GetRejections())
		}
	})

	t.Run("Grants are packed within the renderer's message limit", func(t *testing.T) {
		t.Parallel()
		b := setup(t, func(o *options) { o.engine = func(c *engine.Config) { c.Limits.MaxInlineBytes = 64 << 10 } })
		var docs []*leaseholdv1.Document
		for i := range 20 {
			docs = append(docs, &leaseholdv1.Document{Name: fmt.Sprintf("d%02d.pdf", i), Content: bytes.Repeat([]byte{'x'}, 60_000)})
		}
		b.submit(t, alpha, "alpha", "r", docs...)
		const limit = 150_000
		h := hello("r-s", "i-1", 20)
		h.MaxMessageBytes = limit
		sc := b.openSession(t, h, 20, grpc.MaxCallRecvMsgSize(limit))
		sc.untilGrants(20)
		carrying := 0
		for i, m := range sc.msgs {
			if n := proto.Size(m); n > limit {
				t.Errorf("message %d is %d bytes, over the limit of %d", i, n, limit)
			}
			if len(m.GetGrants()) > 0 {
				carrying++
			}
		}
		for _, g := range sc.grants {
			if len(g.GetDocument().GetContent()) != 60_000 {
				t.Fatalf("grant %s carries %d bytes of content, want 60000", g.GetJobId(), len(g.GetDocument().GetContent()))
			}
		}
		if carrying < 10 {
			t.Errorf("20 grants of 60 kB came in %d messages; under a 150 kB limit they need at least 10", carrying)
		}
	})

	t.Run("A limit that cannot hold one grant is refused at hello with MESSAGE_LIMIT_TOO_SMALL", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		h := hello("r-s", "i-1", 1)
		h.MaxMessageBytes = 64 << 10 // below one grant of a 256 KiB inline document
		sc := b.startSession(t, renderer, &leaseholdv1.SessionRequest{Hello: h})
		wantError(t, sc.end(), codes.InvalidArgument, reasonMessageLimit)
	})

	t.Run("Grants taken but not sent when the stream breaks are handed back uncounted", func(t *testing.T) {
		t.Parallel()
		var broken atomic.Bool
		b := setup(t, func(o *options) { o.intercept = breakGrants(&broken) })
		batch := b.submit(t, alpha, "alpha", "r", doc("a.pdf"), doc("b.pdf"))
		broken.Store(true)
		sc := b.startSession(t, renderer, &leaseholdv1.SessionRequest{Hello: hello("r-s", "i-1", 2), Credits: 2})
		if err := sc.end(); status.Code(err) != codes.Unavailable {
			t.Fatalf("session ended with %v, want the broken link's UNAVAILABLE", err)
		}
		if len(sc.grants) != 0 {
			t.Fatalf("the renderer received %d grants through a broken link", len(sc.grants))
		}
		for _, id := range batch.GetJobIds() {
			j := b.getJob(t, id)
			ev := lastEvent(j)
			if j.GetPhase() != leaseholdv1.Phase_PHASE_QUEUED || j.GetAttempt() != 0 ||
				ev.GetKind() != leaseholdv1.EventKind_EVENT_KIND_REQUEUED || ev.GetReason() != "LEASE_UNDELIVERED" {
				t.Errorf("job %s = %v attempt %d, last event %v %s; want QUEUED attempt 0 after REQUEUED LEASE_UNDELIVERED",
					id, j.GetPhase(), j.GetAttempt(), ev.GetKind(), ev.GetReason())
			}
		}
		broken.Store(false)
		next := b.openSession(t, hello("r-s", "i-2", 2), 2)
		next.untilGrants(2)
		for _, g := range next.grants {
			if g.GetLease().GetAttempt() != 1 {
				t.Errorf("grant %s after the hand-back is attempt %d, want 1", g.GetJobId(), g.GetLease().GetAttempt())
			}
		}
	})

	t.Run("A draining renderer is granted nothing whatever its credits", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		sc := b.openSession(t, hello("r-s", "i-1", 4), 0)
		sc.call(&leaseholdv1.SessionRequest{Draining: true, Credits: 4})
		batch := b.submit(t, alpha, "alpha", "r", doc("a.pdf"))
		sc.call(&leaseholdv1.SessionRequest{})
		if len(sc.grants) != 0 {
			t.Fatalf("a draining session received grants: %v", sc.grants)
		}
		if j := b.getJob(t, batch.GetJobIds()[0]); j.GetPhase() != leaseholdv1.Phase_PHASE_QUEUED {
			t.Fatalf("job = %v, want QUEUED while the only session drains", j.GetPhase())
		}
		other := b.openSession(t, hello("r-t", "i-2", 1), 1)
		other.untilGrants(1)
		if got := other.grants[0].GetJobId(); got != batch.GetJobIds()[0] {
			t.Errorf("a live session got %s, want %s", got, batch.GetJobIds()[0])
		}
	})

	t.Run("A hand-back re-queues the job uncounted as REQUEUED HANDED_BACK", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.submit(t, alpha, "alpha", "r", doc("a.pdf"))
		sc := b.openSession(t, hello("r-s", "i-1", 1), 1)
		sc.untilGrants(1)
		g := sc.grants[0]
		resp := sc.call(&leaseholdv1.SessionRequest{HandBacks: []*leaseholdv1.LeaseRef{ref(g)}})
		if len(resp.GetLeases()) != 1 || resp.GetLeases()[0].GetReason() != "HANDED_BACK" || resp.GetLeases()[0].GetCurrentPhase() != leaseholdv1.Phase_PHASE_QUEUED {
			t.Fatalf("hand-back answer = %v, want HANDED_BACK with the job QUEUED", resp.GetLeases())
		}
		j := b.getJob(t, g.GetJobId())
		if ev := lastEvent(j); j.GetAttempt() != 0 || ev.GetKind() != leaseholdv1.EventKind_EVENT_KIND_REQUEUED || ev.GetReason() != "HANDED_BACK" {
			t.Errorf("job after a hand-back: attempt %d, last event %v %s; want 0, REQUEUED HANDED_BACK", j.GetAttempt(), ev.GetKind(), ev.GetReason())
		}
		again := sc.call(&leaseholdv1.SessionRequest{HandBacks: []*leaseholdv1.LeaseRef{ref(g)}})
		if st := again.GetLeases()[0]; st.GetState() != leaseholdv1.LeaseState_LEASE_STATE_LOST || st.GetReason() != "STALE_LEASE" {
			t.Errorf("second hand-back = %v, want LOST STALE_LEASE", st)
		}
	})

	t.Run("A cancel is pushed as a revocation and the acknowledgement is recorded", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.submit(t, alpha, "alpha", "r", doc("a.pdf"))
		sc := b.openSession(t, hello("r-s", "i-1", 1), 1)
		sc.untilGrants(1)
		g := sc.grants[0]
		cancel, err := b.jobs.CancelJob(as(t, alpha), &leaseholdv1.CancelJobRequest{JobId: g.GetJobId(), Reason: "not needed"})
		if err != nil {
			t.Fatal(err)
		}
		if cancel.GetRunningRendererId() != "r-s" || cancel.GetAcknowledged() {
			t.Errorf("cancel: renderer %q acknowledged %v, want r-s and false", cancel.GetRunningRendererId(), cancel.GetAcknowledged())
		}
		sc.until("the revocation", func() bool { return len(sc.revoked) > 0 })
		if r := sc.revoked[0]; r.GetJobId() != g.GetJobId() || r.GetToken() != g.GetLease().GetToken() || r.GetReason() != "JOB_CANCELLED" {
			t.Fatalf("revoked = %v, want %s JOB_CANCELLED", r, g.GetJobId())
		}
		sc.call(&leaseholdv1.SessionRequest{CancelAcks: []*leaseholdv1.LeaseRef{ref(g)}})
		if j := b.getJob(t, g.GetJobId()); !j.GetCancellation().GetAcknowledged() {
			t.Errorf("cancellation not acknowledged after the ack: %v", j.GetCancellation())
		}
	})

	t.Run("A second session of the same process replaces the first", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		first := b.openSession(t, hello("r-s", "i-1", 1), 0)
		second := b.openSession(t, hello("r-s", "i-1", 1), 0)
		wantError(t, first.end(), codes.Aborted, reasonSessionReplaced)
		b.submit(t, alpha, "alpha", "r", doc("a.pdf"))
		second.call(&leaseholdv1.SessionRequest{Credits: 1})
		second.untilGrants(1)
	})

	t.Run("A session of another process under a live id is ALREADY_EXISTS RENDERER_ID_IN_USE", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		first := b.openSession(t, hello("r-s", "i-1", 1), 0)
		other := b.startSession(t, renderer, &leaseholdv1.SessionRequest{Hello: hello("r-s", "i-2", 1)})
		wantError(t, other.end(), codes.AlreadyExists, reasonRendererInUse)
		// The first session is untouched.
		b.submit(t, alpha, "alpha", "r", doc("a.pdf"))
		first.call(&leaseholdv1.SessionRequest{Credits: 1})
		first.untilGrants(1)
	})
}

// breakGrants returns an interceptor whose Session streams fail to send a
// message carrying grants while broken is set, as a link that breaks.
func breakGrants(broken *atomic.Bool) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if !strings.HasSuffix(info.FullMethod, "/Session") {
			return handler(srv, ss)
		}
		return handler(srv, &breakingStream{ServerStream: ss, broken: broken})
	}
}

type breakingStream struct {
	grpc.ServerStream
	broken *atomic.Bool
}

func (s *breakingStream) SendMsg(m any) error {
	if r, ok := m.(*leaseholdv1.SessionResponse); ok && len(r.GetGrants()) > 0 && s.broken.Load() {
		return status.Error(codes.Unavailable, "the link broke")
	}
	return s.ServerStream.SendMsg(m)
}

// TestSessionAnswersStayWithinTheMessageLimit sends one request whose
// answers alone outgrow the renderer's message limit.
func TestSessionAnswersStayWithinTheMessageLimit(t *testing.T) {
	t.Parallel()
	b := setup(t, func(o *options) { o.engine = func(c *engine.Config) { c.Limits.MaxInlineBytes = 16 << 10 } })
	const limit = 25_000
	const n = 1000
	h := hello("r-s", "i-1", n) // a message names at most its capacity's completions
	h.MaxMessageBytes = limit
	sc := b.openSession(t, h, 0, grpc.MaxCallRecvMsgSize(limit))
	req := &leaseholdv1.SessionRequest{}
	for i := range n {
		req.Completions = append(req.Completions, &leaseholdv1.SessionCompletion{JobId: fmt.Sprintf("x%04d", i), Token: 1,
			Outcome: &leaseholdv1.SessionCompletion_Failure{Failure: &leaseholdv1.CompleteFailure{Class: leaseholdv1.FailureClass_FAILURE_CLASS_TRANSIENT}}})
	}
	sc.send(req)
	var results []*leaseholdv1.CompletionResult
	sc.until(fmt.Sprintf("%d results", n), func() bool {
		results = results[:0]
		for _, a := range sc.answers {
			results = append(results, a.GetResults()...)
		}
		return len(results) >= n
	})
	for i, r := range results {
		if want := fmt.Sprintf("x%04d", i); r.GetJobId() != want || r.GetReason() != reasonInvalidID {
			t.Fatalf("result %d = %v, want %s INVALID_ID in request order", i, r, want)
		}
	}
	for i, m := range sc.msgs {
		if size := proto.Size(m); size > limit {
			t.Errorf("message %d is %d bytes, over the limit of %d", i, size, limit)
		}
	}
	sc.call(&leaseholdv1.SessionRequest{}) // the stream is still open
}

// TestSessionRevocationsStayWithinTheMessageLimit cancels a batch of many
// leases held by one session with a small message limit.
func TestSessionRevocationsStayWithinTheMessageLimit(t *testing.T) {
	t.Parallel()
	const n = 1000
	b := setup(t, func(o *options) {
		o.engine = func(c *engine.Config) { c.Limits.MaxInlineBytes = 16 << 10; c.Limits.MaxDocuments = n }
	})
	docs := make([]*leaseholdv1.Document, n)
	for i := range docs {
		docs[i] = &leaseholdv1.Document{Name: fmt.Sprintf("d%04d.pdf", i), Content: []byte("x")}
	}
	batch := b.submit(t, alpha, "alpha", "r", docs...)
	const limit = 25_000
	h := hello("r-s", "i-1", n)
	h.MaxMessageBytes = limit
	sc := b.openSession(t, h, n, grpc.MaxCallRecvMsgSize(limit))
	sc.untilGrants(n)
	if _, err := b.jobs.CancelBatch(as(t, alpha), &leaseholdv1.CancelBatchRequest{BatchId: batch.GetId()}); err != nil {
		t.Fatal(err)
	}
	sc.until(fmt.Sprintf("%d revocations", n), func() bool { return len(sc.revoked) >= n })
	for i, m := range sc.msgs {
		if size := proto.Size(m); size > limit {
			t.Errorf("message %d is %d bytes, over the limit of %d", i, size, limit)
		}
	}
}

// TestSessionHalfCloseAnswersWhatWasSent closes the renderer's side of a
// session right after its last completions: they are applied and answered
// before the stream ends.
func TestSessionHalfCloseAnswersWhatWasSent(t *testing.T) {
	t.Parallel()
	for i := range 5 {
		t.Run(fmt.Sprintf("Round %d", i), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.submit(t, alpha, "alpha", "r", doc("a.pdf"), doc("b.pdf"))
			sc := b.openSession(t, hello("r-s", "i-1", 2), 2)
			sc.untilGrants(2)
			g := sc.grants
			sc.send(&leaseholdv1.SessionRequest{Completions: []*leaseholdv1.SessionCompletion{inline(g[0], []byte("png"))}})
			sc.send(&leaseholdv1.SessionRequest{HandBacks: []*leaseholdv1.LeaseRef{ref(g[1])}})
			if err := sc.stream.CloseSend(); err != nil {
				t.Fatal(err)
			}
			if err := sc.end(); err != nil {
				t.Fatalf("session ended with %v, want OK", err)
			}
			var results, leases int
			for _, a := range sc.answers {
				results += len(a.GetResults())
				leases += len(a.GetLeases())
			}
			if results != 1 || leases != 1 {
				t.Errorf("answers before the end: %d results, %d lease statuses; want 1 and 1", results, leases)
			}
			if j := b.getJob(t, g[0].GetJobId()); j.GetPhase() != leaseholdv1.Phase_PHASE_SUCCEEDED {
				t.Errorf("completed job = %v, want SUCCEEDED", j.GetPhase())
			}
			if j := b.getJob(t, g[1].GetJobId()); j.GetPhase() != leaseholdv1.Phase_PHASE_QUEUED || j.GetAttempt() != 0 {
				t.Errorf("handed-back job = %v attempt %d, want QUEUED attempt 0", j.GetPhase(), j.GetAttempt())
			}
		})
	}
}

// TestSessionKeepalive ensures a quiet session of a coordinator that sends
// keepalives (a replicated one) hears from it at the keepalive interval
// its welcome names, a third of the heartbeat interval, by messages marked
// keepalive that carry nothing else; and that one that does not names no
// interval.
func TestSessionKeepalive(t *testing.T) {
	t.Parallel()
	b := setup(t, func(o *options) {
		o.engine = func(c *engine.Config) { c.LeaseTTL = 900 * time.Millisecond }
		o.server = func(c *Config) { c.SessionKeepalives = true }
	})
	sc := b.openSession(t, hello("r-k", "i-1", 1), 0)
	if single := setup(t).openSession(t, hello("r-k", "i-1", 1), 0); single.welcome.GetKeepaliveInterval() != nil {
		t.Errorf("a coordinator without keepalives named an interval of %v", single.welcome.GetKeepaliveInterval().AsDuration())
	}
	if got, want := sc.welcome.GetKeepaliveInterval().AsDuration(), 100*time.Millisecond; got != want {
		t.Errorf("welcome.keepalive_interval = %v, want %v (a third of the 300ms heartbeat interval)", got, want)
	}
	// Bounded, so that a coordinator that never sends one fails the test.
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	type received struct {
		m   *leaseholdv1.SessionResponse
		err error
	}
	got := make(chan received, 1)
	go func() {
		m, err := sc.stream.Recv()
		got <- received{m, err}
	}()
	select {
	case r := <-got:
		if r.err != nil || !r.m.GetKeepalive() || proto.Size(r.m) != proto.Size(&leaseholdv1.SessionResponse{Keepalive: true}) {
			t.Errorf("the quiet session got %v, %v; want a bare keepalive", r.m, r.err)
		}
	case <-ctx.Done():
		t.Fatal("a quiet session heard nothing for 10 s")
	}
}
