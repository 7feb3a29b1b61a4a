package engine

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	"github.com/leasehold/leasehold/coordinator/internal/reads"
)

// TestConnections checks how the writer grants to registered connections:
// long polls within their byte budget, sessions within their credit, and
// what happens to grants when a connection is replaced or closed.
func TestConnections(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	smallInline := func(c *Config) { c.Limits.MaxInlineBytes = 1000 }
	submitSized := func(t *testing.T, b *testBundle, req string, n, size int) {
		t.Helper()
		in := make([]jobs.DocInput, n)
		for i := range in {
			in[i] = jobs.DocInput{Document: jobs.Document{Name: fmt.Sprintf("%s-%d.pdf", req, i)}, Content: make([]byte, size)}
		}
		if _, err := b.e.Submit(ctx, SubmitRequest{Team: "alpha", RequestID: req, Docs: in}); err != nil {
			t.Fatal(err)
		}
	}
	replyBytes := func(gs []Grant) int {
		n := 0
		for _, g := range gs {
			n += int(g.Job.ContentBytes) + GrantOverheadBytes
		}
		return n
	}

	t.Run("AGrantToAWaiterNeverExceedsItsByteBudget", func(t *testing.T) {
		t.Parallel()
		b := setup(t, smallInline)
		maxGrant := b.e.MaxGrantBytes() // 1000 inline + overhead
		budget := 2*maxGrant + 100
		// Nothing ready: the call registers a waiter.
		res, err := acquire(ctx, b.e, acquireRequest{Renderer: rend("r-1"), Max: 10, Capacity: 10, MaxBytes: budget, Wait: true})
		if err != nil || res.Waiter == nil || len(res.Grants) != 0 {
			t.Fatalf("Acquire with nothing ready = %d grants, waiter %v, %v; want a waiter", len(res.Grants), res.Waiter != nil, err)
		}
		submitSized(t, b, "r1", 5, 500)
		// The submit's commit granted to the waiter: as many as its budget
		// holds while any document could still fit, in one delivery.
		gs, err := closeConn(ctx, b.e, res.Waiter, nil, false)
		if err != nil {
			t.Fatal(err)
		}
		if len(gs) != 2 || replyBytes(gs) > budget {
			t.Fatalf("the waiter got %d grants of %d bytes, want 2 within its budget of %d", len(gs), replyBytes(gs), budget)
		}
		// An immediate grant keeps to the same budget.
		res, err = acquire(ctx, b.e, acquireRequest{Renderer: rend("r-1"), Max: 10, Capacity: 10, MaxBytes: budget})
		if err != nil || len(res.Grants) != 2 || replyBytes(res.Grants) > budget {
			t.Fatalf("immediate Acquire = %d grants of %d bytes, %v; want 2 within %d", len(res.Grants), replyBytes(res.Grants), err, budget)
		}
		// A budget too small for the largest grant takes nothing.
		res, err = acquire(ctx, b.e, acquireRequest{Renderer: rend("r-1"), Max: 10, Capacity: 10, MaxBytes: maxGrant - 1, Wait: true})
		if err != nil || len(res.Grants) != 0 || res.Waiter == nil {
			t.Fatalf("Acquire with a budget below one grant = %d grants, %v; want none, waiting", len(res.Grants), err)
		}
		submitSized(t, b, "r2", 1, 10)
		if gs, err := closeConn(ctx, b.e, res.Waiter, nil, false); err != nil || len(gs) != 0 {
			t.Fatalf("the small waiter got %d grants, %v; want none", len(gs), err)
		}
		if n := b.countPhase(t, jobs.PhaseQueued); n != 2 {
			t.Errorf("%d jobs left QUEUED, want 2", n)
		}
	})

	t.Run("ASessionGetsGrantsOnlyUpToItsCredits", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ids := b.submit(t, "alpha", "r1", names("a", 5)...).JobIDs()
		conn := b.openSession(t, "r-1", 2)
		gs, _, _ := take(conn)
		if diff := cmp.Diff(ids[:2], grantedIDs(gs)); diff != "" {
			t.Fatalf("grants for 2 credits (-want +got):\n%s", diff)
		}
		b.send(t, conn, SessionInput{Heartbeats: refs(gs)})
		if more, _, _ := take(conn); len(more) != 0 {
			t.Fatalf("granted %v with no credit left", grantedIDs(more))
		}
		// "Complete this lease and grant the next" is one command: the grant
		// that refills the slot is published before the answer.
		res := b.send(t, conn, SessionInput{Completions: []CompleteRequest{success(gs[0].Job.ID, gs[0].Job.Lease.Token, "", "d")}, Credits: 1})
		if len(res.Completions) != 1 || res.Completions[0].Err != nil || res.Completions[0].Job.Phase != jobs.PhaseSucceeded {
			t.Fatalf("completion in the session = %+v, want SUCCEEDED", res.Completions)
		}
		next, _, _ := take(conn)
		if diff := cmp.Diff(ids[2:3], grantedIDs(next)); diff != "" {
			t.Fatalf("grant for the credit sent with the completion (-want +got):\n%s", diff)
		}
		if n := b.countPhase(t, jobs.PhaseQueued); n != 2 {
			t.Errorf("%d jobs left QUEUED, want 2", n)
		}
	})

	t.Run("ADrainingSessionGetsNoneAndCountsNoCapacity", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		conn := b.openSession(t, "r-1", 0)
		if got := b.capacity(t); got != 4 {
			t.Fatalf("live capacity with the session = %d, want 4", got)
		}
		b.send(t, conn, SessionInput{Draining: true, Credits: 3})
		b.submit(t, "alpha", "r1", "a.pdf", "b.pdf")
		if gs, _, _ := take(conn); len(gs) != 0 {
			t.Fatalf("a draining session was granted %v", grantedIDs(gs))
		}
		if got := b.capacity(t); got != 0 {
			t.Errorf("live capacity with the session draining = %d, want 0", got)
		}
		// The renderer's next session (after a restart of its process) is
		// not draining.
		next, _, err := b.e.Open(ctx, SessionOpen{Renderer: rend("r-1"), Instance: "i-1", Capacity: 4})
		if err != nil {
			t.Fatal(err)
		}
		b.send(t, next, SessionInput{Credits: 1})
		if gs, _, _ := take(next); len(gs) != 1 {
			t.Fatalf("the renderer's next session got %d grants for 1 credit, want 1", len(gs))
		}
	})

	t.Run("AReplacedSessionsUndeliveredGrantsMoveToTheNewSession", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ids := b.submit(t, "alpha", "r1", names("a", 3)...).JobIDs()
		old := b.openSession(t, "r-1", 2) // two grants published, not taken
		conn, _, err := b.e.Open(ctx, SessionOpen{Renderer: rend("r-1"), Instance: "i-1", Capacity: 4})
		if err != nil {
			t.Fatal(err)
		}
		if gs, _, ended := take(old); len(gs) != 0 || !errors.Is(ended, ErrReplaced) {
			t.Fatalf("the replaced session holds %v, ended %v; want nothing, ErrReplaced", grantedIDs(gs), ended)
		}
		gs, _, _ := take(conn)
		if diff := cmp.Diff(ids[:2], grantedIDs(gs)); diff != "" {
			t.Fatalf("grants moved to the new session (-want +got):\n%s", diff)
		}
		if _, err := b.e.Receive(ctx, old, SessionInput{Credits: 1}); !errors.Is(err, ErrReplaced) {
			t.Fatalf("Receive on the replaced session: err = %v, want ErrReplaced", err)
		}
		// Credit is the new session's own to give.
		b.send(t, conn, SessionInput{Received: refs(gs)})
		if more, _, _ := take(conn); len(more) != 0 {
			t.Fatalf("the new session was granted %v without credit", grantedIDs(more))
		}
		// Another process under the same id is refused, on either path.
		if _, _, err := b.e.Open(ctx, SessionOpen{Renderer: rend("r-1"), Instance: "i-2"}); !errors.Is(err, ErrRendererInUse) {
			t.Fatalf("a session of another instance: err = %v, want ErrRendererInUse", err)
		}
		if _, err := acquire(ctx, b.e, acquireRequest{Renderer: rend("r-1"), Max: 1}); !errors.Is(err, ErrRendererInUse) {
			t.Fatalf("Acquire beside a session: err = %v, want ErrRendererInUse", err)
		}
		if _, err := openStream(ctx, b.e, rend("r-1"), 1); !errors.Is(err, ErrRendererInUse) {
			t.Fatalf("a heartbeat stream beside a session: err = %v, want ErrRendererInUse", err)
		}
	})

	t.Run("GrantsMoveAcrossTwoReplacementsInOneGroup", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ids := b.submit(t, "alpha", "r1", names("a", 2)...).JobIDs()
		first := b.openSession(t, "r-1", 2)
		release := b.block(t)
		conns := make([]*Conn, 2)
		var done []<-chan struct{}
		for i := range conns {
			done = append(done, async(func() {
				c, _, err := b.e.Open(ctx, SessionOpen{Renderer: rend("r-1"), Instance: "i-1", Capacity: 4})
				if err != nil {
					t.Errorf("OpenSession %d: %v", i+2, err)
				}
				conns[i] = c
			}))
			b.waitQueued(t, i+1)
		}
		release()
		for _, d := range done {
			waitClosed(t, d, "a reconnection")
		}
		for i, c := range []*Conn{first, conns[0]} {
			if gs, _, ended := take(c); len(gs) != 0 || !errors.Is(ended, ErrReplaced) {
				t.Errorf("session %d holds %v, ended %v; want nothing, ErrReplaced", i+1, grantedIDs(gs), ended)
			}
		}
		gs, _, ended := take(conns[1])
		if diff := cmp.Diff(ids, grantedIDs(gs)); diff != "" || ended != nil {
			t.Fatalf("grants of the latest session (-want +got):\n%s\nended %v", diff, ended)
		}
	})

	t.Run("CloseConnHandsBackUndeliveredGrantsUncounted", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ids := b.submit(t, "alpha", "r1", names("a", 4)...).JobIDs()
		conn := b.openSession(t, "r-1", 3)
		sent, _, _ := take(conn)
		b.send(t, conn, SessionInput{Credits: 1}) // a fourth grant, never taken
		b.clock.Advance(time.Second)
		// The first grant was taken but its message could not be sent.
		if left, err := closeConn(ctx, b.e, conn, refs(sent[:1]), true); err != nil || len(left) != 0 {
			t.Fatalf("CloseConn = %v, %v; want the leftovers handed back, none returned", grantedIDs(left), err)
		}
		for _, id := range []uint64{ids[0], ids[3]} {
			j := b.job(t, id)
			last := j.History[len(j.History)-1]
			if j.Phase != jobs.PhaseQueued || j.Attempt != 0 || last.Kind != jobs.EventRequeued || last.Reason != jobs.ReleaseUndelivered {
				t.Errorf("undelivered job %d: %v attempt %d, last event %v %s; want QUEUED, 0, REQUEUED LEASE_UNDELIVERED",
					id, j.Phase, j.Attempt, last.Kind, last.Reason)
			}
		}
		// The delivered leases outlive the session: the renderer may
		// reconnect within their deadline.
		for _, g := range sent[1:] {
			if j := b.job(t, g.Job.ID); j.Phase != jobs.PhaseLeased || j.Lease.Token != g.Job.Lease.Token {
				t.Errorf("delivered job %d: %v under %d, want LEASED under %d", g.Job.ID, j.Phase, j.Lease.Token, g.Job.Lease.Token)
			}
		}
		if got := b.capacity(t); got != 0 {
			t.Errorf("live capacity after the session closed = %d, want 0", got)
		}
		// Closing again hands back nothing more.
		if _, err := closeConn(ctx, b.e, conn, refs(sent[1:2]), true); err != nil {
			t.Fatal(err)
		}
		if j := b.job(t, sent[1].Job.ID); j.Phase != jobs.PhaseQueued {
			t.Errorf("a lease named undelivered on a second close: %v, want it handed back too", j.Phase)
		}
	})

	t.Run("ANewerHeartbeatStreamReplacesAnOlderOne", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		old, err := openStream(ctx, b.e, rend("r-1"), 2)
		if err != nil {
			t.Fatal(err)
		}
		conn, err := openStream(ctx, b.e, rend("r-1"), 3)
		if err != nil {
			t.Fatalf("a newer heartbeat stream: %v", err)
		}
		if _, _, ended := take(old); !errors.Is(ended, ErrReplaced) {
			t.Errorf("the older stream ended %v, want ErrReplaced", ended)
		}
		if _, _, err := b.e.Open(ctx, SessionOpen{Renderer: rend("r-1"), Instance: "i-1"}); !errors.Is(err, ErrRendererInUse) {
			t.Errorf("a session beside a heartbeat stream: err = %v, want ErrRendererInUse", err)
		}
		if got := b.capacity(t); got != 3 {
			t.Errorf("live capacity = %d, want the newer stream's 3", got)
		}
		if _, err := closeConn(ctx, b.e, old, nil, true); err != nil {
			t.Fatal(err)
		}
		if got := b.capacity(t); got != 3 {
			t.Errorf("live capacity after closing the replaced stream = %d, want 3 still", got)
		}
		if _, err := closeConn(ctx, b.e, conn, nil, true); err != nil {
			t.Fatal(err)
		}
		if got := b.capacity(t); got != 0 {
			t.Errorf("live capacity after closing both = %d, want 0", got)
		}
	})
}

// countPhase counts the stored jobs in phase p.
func (b *testBundle) countPhase(t *testing.T, p jobs.Phase) int {
	t.Helper()
	n := 0
	for _, j := range b.allJobs(t) {
		if j.Phase == p {
			n++
		}
	}
	return n
}

// rendererPath is one way a renderer talks to the writer: unary calls or
// a session.
type rendererPath interface {
	grant(t *testing.T, renderer string) string
	complete(t *testing.T, renderer string, req CompleteRequest) string
	heartbeat(t *testing.T, renderer string, ref LeaseRef) LeaseStatus
	handBack(t *testing.T, renderer string, ref LeaseRef) LeaseStatus
	ack(t *testing.T, renderer string, ref LeaseRef)
}

type unaryPath struct{ b *testBundle }

func (p unaryPath) grant(t *testing.T, renderer string) string {
	return describeGrants(p.b.acquire(t, renderer, 1))
}

func (p unaryPath) complete(t *testing.T, renderer string, req CompleteRequest) string {
	req.Renderer = renderer
	res, err := complete(context.Background(), p.b.e, req)
	return describeCompletion(res, err)
}

func (p unaryPath) heartbeat(t *testing.T, renderer string, ref LeaseRef) LeaseStatus {
	t.Helper()
	res, err := heartbeat(context.Background(), p.b.e, heartbeatRequest{Renderer: rend(renderer), Leases: []LeaseRef{ref}})
	if err != nil {
		t.Fatal(err)
	}
	return res.Leases[0]
}

func (p unaryPath) handBack(t *testing.T, renderer string, ref LeaseRef) LeaseStatus {
	t.Helper()
	res, err := heartbeat(context.Background(), p.b.e, heartbeatRequest{Renderer: rend(renderer), HandBacks: []LeaseRef{ref}})
	if err != nil {
		t.Fatal(err)
	}
	return res.HandBacks[0]
}

func (p unaryPath) ack(t *testing.T, renderer string, ref LeaseRef) {
	t.Helper()
	if _, err := heartbeat(context.Background(), p.b.e, heartbeatRequest{Renderer: rend(renderer), Acks: []LeaseRef{ref}}); err != nil {
		t.Fatal(err)
	}
}

type sessionPath struct {
	b     *testBundle
	conns map[string]*Conn
}

func (p sessionPath) conn(t *testing.T, renderer string) *Conn {
	if p.conns[renderer] == nil {
		p.conns[renderer] = p.b.openSession(t, renderer, 0)
	}
	return p.conns[renderer]
}

func (p sessionPath) grant(t *testing.T, renderer string) string {
	t.Helper()
	c := p.conn(t, renderer)
	p.b.send(t, c, SessionInput{Credits: 1})
	gs, _, _ := take(c)
	if err := p.b.e.ReadContent(gs); err != nil {
		t.Fatal(err)
	}
	return describeGrants(gs)
}

func (p sessionPath) complete(t *testing.T, renderer string, req CompleteRequest) string {
	t.Helper()
	res := p.b.send(t, p.conn(t, renderer), SessionInput{Completions: []CompleteRequest{req}})
	return describeCompletion(res.Completions[0], res.Completions[0].Err)
}

func (p sessionPath) heartbeat(t *testing.T, renderer string, ref LeaseRef) LeaseStatus {
	t.Helper()
	return p.b.send(t, p.conn(t, renderer), SessionInput{Heartbeats: []LeaseRef{ref}}).Heartbeats[0]
}

func (p sessionPath) handBack(t *testing.T, renderer string, ref LeaseRef) LeaseStatus {
	t.Helper()
	return p.b.send(t, p.conn(t, renderer), SessionInput{HandBacks: []LeaseRef{ref}}).HandBacks[0]
}

func (p sessionPath) ack(t *testing.T, renderer string, ref LeaseRef) {
	t.Helper()
	p.b.send(t, p.conn(t, renderer), SessionInput{Acks: []LeaseRef{ref}})
}

func describeGrants(gs []Grant) string {
	s := ""
	for _, g := range gs {
		s += fmt.Sprintf("job %d token %d attempt %d until %v content %q; ", g.Job.ID, g.Job.Lease.Token, g.Job.Attempt,
			g.Job.Lease.Deadline.Sub(epoch), g.Content)
	}
	return s
}

func describeCompletion(res CompleteResult, err error) string {
	reason := jobs.ReasonCode(err)
	if reason == "" && err != nil {
		reason = err.Error()
	}
	return fmt.Sprintf("phase=%v replayed=%v refused=%s", res.Job.Phase, res.Replayed, reason)
}

// TestSessionAndUnaryPathsAgree runs one scripted sequence of renderer
// calls, stale, impostor and racing ones included, through unary calls on
// one engine and through sessions on another, and compares every answer
// and the stored outcome.
func TestSessionAndUnaryPathsAgree(t *testing.T) {
	t.Parallel()
	type outcome struct {
		Answers    []string
		Jobs       []jobs.Job
		Rejections []jobs.Rejection
		Previews   map[uint64]string
	}
	run := func(t *testing.T, newPath func(*testBundle) rendererPath) outcome {
		b := setup(t, func(c *Config) { c.Retry.BackoffBase, c.Retry.BackoffCap = time.Second, time.Second })
		ctx := context.Background()
		p := newPath(b)
		ids := b.submit(t, "alpha", "r1", "a.pdf", "b.pdf", "c.pdf", "d.pdf", "e.pdf").JobIDs()
		a, bb, c, d, e := ids[0], ids[1], ids[2], ids[3], ids[4]
		var o outcome
		say := func(format string, args ...any) { o.Answers = append(o.Answers, fmt.Sprintf(format, args...)) }
		status := func(s LeaseStatus) string {
			if !s.Held {
				return fmt.Sprintf("lost reason=%s current=%d %v", s.Reason, s.CurrentToken, s.CurrentPhase)
			}
			return fmt.Sprintf("held until %v current=%d %v", s.Deadline.Sub(epoch), s.CurrentToken, s.CurrentPhase)
		}
		cancel := func(id uint64) string {
			res, err := b.e.Cancel(ctx, CancelRequest{Job: id, Principal: "alice", Reason: "race"})
			return fmt.Sprintf("cancel result=%d err=%s", res.Result, jobs.ReasonCode(err))
		}

		say("grant %s", p.grant(t, "r-1"))                                                     // a, token 1
		say("complete a %s", p.complete(t, "r-1", success(a, 1, "", "da")))                    // SUCCEEDED
		say("replay a %s", p.complete(t, "r-1", success(a, 1, "", "da")))                      // replayed
		say("other outcome a %s", p.complete(t, "r-1", success(a, 1, "", "other")))            // OUTCOME_MISMATCH
		say("grant %s", p.grant(t, "r-1"))                                                     // b, token 2
		say("heartbeat b %s", status(p.heartbeat(t, "r-1", LeaseRef{Job: bb, Token: 2})))      // held
		b.tick(t, 16*time.Second)                                                              // b expires
		say("late b %s", p.complete(t, "r-1", success(bb, 2, "", "db")))                       // LEASE_EXPIRED
		say("late heartbeat b %s", status(p.heartbeat(t, "r-1", LeaseRef{Job: bb, Token: 2}))) // LEASE_EXPIRED
		say("grant %s", p.grant(t, "r-1"))                                                     // c, token 3
		say("impostor c %s", p.complete(t, "r-2", success(c, 3, "", "dc")))                    // NOT_LEASE_HOLDER
		say("impostor heartbeat c %s", status(p.heartbeat(t, "r-2", LeaseRef{Job: c, Token: 3})))
		say("%s", cancel(c))                                                             // cancel wins
		say("complete c %s", p.complete(t, "r-1", success(c, 3, "", "dc")))              // JOB_CANCELLED
		p.ack(t, "r-1", LeaseRef{Job: c, Token: 3})                                      // acknowledged
		b.tick(t, 2*time.Second)                                                         // b re-queued
		say("grant %s", p.grant(t, "r-1"))                                               // d, token 4
		say("complete d %s", p.complete(t, "r-1", success(d, 4, "", "dd")))              // completion wins
		say("%s", cancel(d))                                                             // ALREADY_TERMINAL
		say("grant %s", p.grant(t, "r-1"))                                               // e, token 5
		say("hand back e %s", status(p.handBack(t, "r-1", LeaseRef{Job: e, Token: 5})))  // HANDED_BACK
		say("heartbeat e %s", status(p.heartbeat(t, "r-1", LeaseRef{Job: e, Token: 5}))) // STALE_LEASE
		say("grant %s", p.grant(t, "r-1"))                                               // b again, token 6
		say("fail b %s", p.complete(t, "r-1", failure(bb, 6, "", jobs.ClassTransient, "flaky")))
		say("grant %s", p.grant(t, "r-1")) // e again, token 7
		say("stale e %s", p.complete(t, "r-1", success(e, 5, "", "de")))
		say("fail e %s", p.complete(t, "r-1", failure(e, 7, "", jobs.ClassInvalidDocument, "broken")))
		say("unknown %s", p.complete(t, "r-1", success(999, 7, "", "dx")))
		say("grant %s", p.grant(t, "r-1")) // nothing ready

		o.Jobs = b.allJobs(t)
		page, err := b.e.ListRejections(reads.RejectionFilter{Limit: 1000})
		if err != nil {
			t.Fatal(err)
		}
		o.Rejections = page.Rejections
		o.Previews = map[uint64]string{}
		for _, j := range o.Jobs {
			if j.Phase == jobs.PhaseSucceeded {
				art, err := b.e.Artifact(j)
				if err != nil {
					t.Fatalf("Artifact(%d): %v", j.ID, err)
				}
				o.Previews[j.ID] = art.Digest + " " + string(art.Content)
			}
		}
		return o
	}

	unary := run(t, func(b *testBundle) rendererPath { return unaryPath{b} })
	session := run(t, func(b *testBundle) rendererPath { return sessionPath{b, map[string]*Conn{}} })

	wantAnswers := []string{
		`grant job 1 token 1 attempt 1 until 15s content "content of a.pdf"; `,
		"complete a phase=SUCCEEDED replayed=false refused=",
		"replay a phase=SUCCEEDED replayed=true refused=",
		"other outcome a phase=SUCCEEDED replayed=false refused=OUTCOME_MISMATCH",
		`grant job 2 token 2 attempt 1 until 15s content "content of b.pdf"; `,
		"heartbeat b held until 15s current=2 LEASED",
		"late b phase=RETRY_WAIT replayed=false refused=LEASE_EXPIRED",
		"late heartbeat b lost reason=LEASE_EXPIRED current=2 RETRY_WAIT",
		`grant job 3 token 3 attempt 1 until 31s content "content of c.pdf"; `,
		"impostor c phase=LEASED replayed=false refused=NOT_LEASE_HOLDER",
		"impostor heartbeat c lost reason=NOT_LEASE_HOLDER current=0 UNSPECIFIED", // never held: told nothing
		"cancel result=2 err=",
		"complete c phase=CANCELLED replayed=false refused=JOB_CANCELLED",
		`grant job 4 token 4 attempt 1 until 33s content "content of d.pdf"; `,
		"complete d phase=SUCCEEDED replayed=false refused=",
		"cancel result=0 err=ALREADY_TERMINAL",
		`grant job 5 token 5 attempt 1 until 33s content "content of e.pdf"; `,
		"hand back e lost reason=HANDED_BACK current=5 QUEUED",
		"heartbeat e lost reason=STALE_LEASE current=5 QUEUED",
		`grant job 2 token 6 attempt 2 until 33s content "content of b.pdf"; `,
		"fail b phase=RETRY_WAIT replayed=false refused=",
		`grant job 5 token 7 attempt 1 until 33s content "content of e.pdf"; `,
		"stale e phase=LEASED replayed=false refused=STALE_LEASE",
		"fail e phase=FAILED replayed=false refused=",
		"unknown phase=UNSPECIFIED replayed=false refused=not found",
		"grant ",
	}
	if diff := cmp.Diff(wantAnswers, unary.Answers); diff != "" {
		t.Errorf("unary answers (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(unary, session); diff != "" {
		t.Errorf("session outcome differs from the unary one (-unary +session):\n%s", diff)
	}
}
