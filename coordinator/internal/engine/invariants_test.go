package engine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	"github.com/leasehold/leasehold/coordinator/internal/store"
	"pgregory.net/rapid"
)

// inspectCmd runs fn on the writer goroutine, after the group's expiries,
// with the group's transaction, so it sees exactly the writer's state.
type inspectCmd struct {
	base
	noText
	fn func(g *group, tx *store.Tx)
}

func (c *inspectCmd) evaluate(g *group) error {
	tx, err := g.txn()
	if err != nil {
		return err
	}
	c.fn(g, tx)
	return nil
}

// teams are the teams the invariants test submits for.
var teams = []string{"alpha", "beta"}

// tester is what the checks need of *testing.T and *rapid.T.
type tester interface {
	Helper()
	Fatal(args ...any)
	Fatalf(format string, args ...any)
	Error(args ...any)
	FailNow()
}

// checkIndexes asserts, on the writer goroutine, that the writer's
// in-memory indexes agree with every stored job (indexProblems).
func checkIndexes(t tester, e *Engine) {
	t.Helper()
	var problems []string
	err := e.do(context.Background(), &inspectCmd{fn: func(g *group, tx *store.Tx) {
		problems = e.indexProblems(tx, g.now, g.mono, nil, nil)
	}})
	if err != nil {
		t.Fatalf("inspect: %v", err)
	}
	for _, p := range problems {
		t.Error(p)
	}
	if len(problems) > 0 {
		t.FailNow()
	}
}

// checkStore asserts that the committed state agrees with itself and that
// tokens granted since prev are above every token before
// (store.VerifySince).
func checkStore(t tester, st *store.Store, prev store.TokenState) store.TokenState {
	t.Helper()
	sum, now, err := st.VerifySince(prev)
	if err == nil {
		err = sum.Err()
	}
	if err != nil {
		t.Fatal(err)
	}
	return now
}

// connKind is which of the renderer protocols' calls opened a session.
type connKind int

const (
	kindSession connKind = iota + 1 // a Session stream: an instance, credits
	kindStream                      // a unary client's heartbeat stream
	kindWaiter                      // a unary Acquire's long poll
)

// testConn is a connection the invariants test holds, with what it took.
type testConn struct {
	conn     *Conn
	renderer string
	instance string
	kind     connKind
	// max and budget bound a waiter's grants.
	max, budget int
	got         []Grant
}

// TestWriterInvariants drives the real writer over real bbolt with random
// sequences of every command (unary calls, renderer sessions and long
// polls, uploads, clock moves and restarts) and checks after each step
// that the in-memory indexes match the store, that the stored counts,
// indexes, previews and documents match the stored jobs, that tokens only
// grow, that each success was set by the completion that made it, and that
// connections get no more than their credit and byte budget allow.
func TestWriterInvariants(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(rt *rapid.T) {
		dir, err := os.MkdirTemp("", "leasehold-invariants-")
		if err != nil {
			rt.Fatal(err)
		}
		defer os.RemoveAll(dir)
		b := newBundle(dir)
		b.cfg.LeaseTTL = 10 * time.Second
		b.cfg.Retry = jobs.RetryPolicy{MaxAttempts: 3, BackoffBase: time.Second, BackoffCap: 4 * time.Second}
		b.cfg.RunningCancel = rapid.Bool().Draw(rt, "runningCancel")
		b.cfg.Seed = rapid.Uint64Min(1).Draw(rt, "seed")
		b.cfg.Limits.MaxInlineBytes = 64
		// Retention short enough for the clock moves below to reach, in
		// steps small enough to stop at their bound.
		step := rapid.IntRange(1, 3).Draw(rt, "purgeStep")
		b.cfg.Retention = Retention{Jobs: 30 * time.Second, Rejections: time.Minute, Audit: time.Minute, Step: step}
		b.start(rt)
		defer b.close()
		ctx := context.Background()

		var (
			granted  []Grant // every grant seen, in order
			requests int
			// succeeded maps a job to the token of its accepted success in
			// this cycle.
			succeeded = map[uint64]uint64{}
			conns     []*testConn
			// credits counts the credit sent per session renderer; draining
			// holds the leases granted to a renderer when it began to drain.
			credits  = map[string]int{}
			draining = map[string]int{}
			state    = checkStore(rt, b.st, store.TokenState{})
		)
		sessionIDs := []string{"s-1", "s-2"}
		unaryIDs := []string{"u-1", "u-2"}
		liveOf := func(renderer string) []*testConn {
			var out []*testConn
			for _, c := range conns {
				if c.renderer == renderer {
					out = append(out, c)
				}
			}
			return out
		}
		dropConn := func(c *testConn) { conns = slices.DeleteFunc(conns, func(x *testConn) bool { return x == c }) }
		pickGrant := func(label string) (Grant, bool) {
			if len(granted) == 0 {
				return Grant{}, false
			}
			return granted[rapid.IntRange(0, len(granted)-1).Draw(rt, label)], true
		}
		pickConn := func(label string, kinds ...connKind) (*testConn, bool) {
			var of []*testConn
			for _, c := range conns {
				if slices.Contains(kinds, c.kind) {
					of = append(of, c)
				}
			}
			if len(of) == 0 {
				return nil, false
			}
			return of[rapid.IntRange(0, len(of)-1).Draw(rt, label)], true
		}
		// received records grants a connection took.
		received := func(c *testConn, gs []Grant) {
			for _, g := range gs {
				if g.Job.Lease.Renderer != c.renderer {
					rt.Fatalf("grant of job %d to %s delivered to %s", g.Job.ID, g.Job.Lease.Renderer, c.renderer)
				}
			}
			c.got = append(c.got, gs...)
			granted = append(granted, gs...)
		}
		accept := func(req CompleteRequest, res CompleteResult) {
			if res.Err != nil || !req.Success || res.Replayed {
				return
			}
			if prev, ok := succeeded[req.Job]; ok {
				rt.Fatalf("job %d succeeded twice in one cycle: tokens %d and %d", req.Job, prev, req.Token)
			}
			succeeded[req.Job] = req.Token
		}
		// completion draws a completion of g, sent by renderer.
		completion := func(g Grant, renderer string) CompleteRequest {
			req := CompleteRequest{Job: g.Job.ID, Completion: jobs.Completion{Token: g.Job.Lease.Token, Renderer: renderer}}
			digest := fmt.Sprintf("digest-%d", g.Job.Lease.Token)
			switch rapid.IntRange(0, 3).Draw(rt, "outcome") {
			case 0:
				req.Success, req.Preview = true, preview(digest)
			case 1:
				req.Success, req.Digest = true, digest // names an upload, if any
			case 2:
				req.Class = jobs.ClassTransient
			default:
				req.Class = jobs.ClassInvalidDocument
			}
			return req
		}
		// someRefs draws up to n lease references from the grants seen.
		someRefs := func(label string, n int) []LeaseRef {
			var out []LeaseRef
			for range rapid.IntRange(0, n).Draw(rt, label) {
				if g, ok := pickGrant(label); ok {
					out = append(out, LeaseRef{Job: g.Job.ID, Token: g.Job.Lease.Token})
				}
			}
			return out
		}

		// Actions by weight: the renderer paths come up most.
		var actions []int
		for action, weight := range []int{3, 1, 1, 1, 2, 1, 1, 1, 2, 1, 2, 5, 2, 1, 1, 1, 2} {
			for range weight {
				actions = append(actions, action)
			}
		}
		steps := rapid.IntRange(5, 60).Draw(rt, "steps")
		for range steps {
			switch rapid.SampledFrom(actions).Draw(rt, "action") {
			case 0: // submit
				team := rapid.SampledFrom(teams).Draw(rt, "team")
				n := rapid.IntRange(1, 3).Draw(rt, "docs")
				names := make([]string, n)
				for i := range names {
					names[i] = fmt.Sprintf("d%d.pdf", i)
				}
				if rapid.Bool().Draw(rt, "unsupported") {
					names[0] = "macro.docm"
				}
				requests++
				if _, err := b.e.Submit(ctx, SubmitRequest{Team: team, RequestID: fmt.Sprint(requests), Docs: docs(names...)}); err != nil {
					rt.Fatalf("Submit: %v", err)
				}
			case 1: // unary acquire, or a long poll
				renderer := rapid.SampledFrom(unaryIDs).Draw(rt, "renderer")
				req := acquireRequest{Renderer: rend(renderer), Max: rapid.IntRange(1, 3).Draw(rt, "max"), Capacity: 3,
					Wait: rapid.IntRange(0, 3).Draw(rt, "wait") == 0}
				if rapid.Bool().Draw(rt, "budget") {
					req.MaxBytes = rapid.IntRange(1, 3).Draw(rt, "grants") * b.e.MaxGrantBytes()
				}
				res, err := acquire(ctx, b.e, req)
				if err != nil {
					rt.Fatalf("Acquire: %v", err)
				}
				w := &testConn{conn: res.Waiter, renderer: renderer, kind: kindWaiter, max: req.Max, budget: req.MaxBytes}
				received(w, res.Grants)
				if res.Waiter != nil {
					conns = append(conns, w)
				} else if err := checkWaiter(w); err != nil {
					rt.Fatal(err)
				}
			case 2: // a long poll ends
				w, ok := pickConn("waiter", kindWaiter)
				if !ok {
					continue
				}
				release := rapid.Bool().Draw(rt, "releaseLeftovers")
				left, err := closeConn(ctx, b.e, w.conn, nil, release)
				if err != nil {
					rt.Fatalf("CloseConn(waiter): %v", err)
				}
				if release && len(left) > 0 {
					rt.Fatalf("CloseConn handing back leftovers returned %d grants", len(left))
				}
				received(w, left)
				if err := checkWaiter(w); err != nil {
					rt.Fatal(err)
				}
				dropConn(w)
			case 3: // unary heartbeat, by the holder or another renderer
				if g, ok := pickGrant("heartbeat"); ok {
					renderer := rapid.SampledFrom([]string{g.Job.Lease.Renderer, "u-1"}).Draw(rt, "heartbeater")
					if _, err := heartbeat(ctx, b.e, heartbeatRequest{Renderer: rend(renderer), Leases: []LeaseRef{{Job: g.Job.ID, Token: g.Job.Lease.Token}},
						HandBacks: someRefs("handbacks", 1), Acks: someRefs("acks", 1)}); err != nil {
						rt.Fatalf("Heartbeat: %v", err)
					}
				}
			case 4: // unary complete, from the holder, a stale one or an impostor
				g, ok := pickGrant("complete")
				if !ok {
					continue
				}
				renderer := rapid.SampledFrom([]string{g.Job.Lease.Renderer, "u-2"}).Draw(rt, "completer")
				req := completion(g, renderer)
				res, err := complete(ctx, b.e, req)
				if err != nil && !jobs.IsFence(err) && !errors.Is(err, jobs.ErrArtifactMissing) && !errors.Is(err, jobs.ErrNotFound) {
					rt.Fatalf("Complete: %v", err)
				}
				res.Err = err
				accept(req, res)
			case 5: // an upload under a lease, by the holder or another renderer
				if g, ok := pickGrant("stage"); ok {
					renderer := rapid.SampledFrom([]string{g.Job.Lease.Renderer, "u-1"}).Draw(rt, "uploader")
					p := preview(fmt.Sprintf("digest-%d", g.Job.Lease.Token))
					p.Content = append(p.Content, renderer...)
					err := b.e.Stage(ctx, StageRequest{Job: g.Job.ID, Token: g.Job.Lease.Token, Renderer: renderer, Preview: *p})
					if err != nil && !jobs.IsFence(err) && !errors.Is(err, jobs.ErrNotFound) {
						rt.Fatalf("Stage: %v", err)
					}
				}
			case 6: // cancel
				if g, ok := pickGrant("cancel"); ok {
					_, _ = b.e.Cancel(ctx, CancelRequest{Job: g.Job.ID, Principal: "alice"})
				}
			case 7: // replay
				if g, ok := pickGrant("replay"); ok {
					requests++
					res, err := b.e.Replay(ctx, ReplayRequest{Principal: "ops", RequestID: fmt.Sprint(requests), Reason: "r",
						JobIDs: []uint64{g.Job.ID}, IncludePermanent: rapid.Bool().Draw(rt, "permanent")})
					if err != nil {
						rt.Fatalf("Replay: %v", err)
					}
					if res.Requeued > 0 {
						delete(succeeded, g.Job.ID) // a new cycle may succeed again
					}
				}
			case 8: // time passes, with or without a tick
				b.clock.Advance(time.Duration(rapid.IntRange(0, 20).Draw(rt, "seconds")) * time.Second)
				if rapid.Bool().Draw(rt, "tick") {
					if err := b.e.Tick(ctx); err != nil {
						rt.Fatalf("Tick: %v", err)
					}
				}
			case 9: // an undelivered grant is handed back
				if g, ok := pickGrant("release"); ok {
					if err := release(ctx, b.e, g.Job.Lease.Renderer, []LeaseRef{{Job: g.Job.ID, Token: g.Job.Lease.Token}}); err != nil {
						rt.Fatalf("Release: %v", err)
					}
				}
			case 10: // a session or heartbeat stream opens
				renderer := rapid.SampledFrom(sessionIDs).Draw(rt, "sessionRenderer")
				instance := rapid.SampledFrom([]string{"i-1", "i-1", "i-1", "i-2"}).Draw(rt, "instance")
				kind := kindSession
				if rapid.IntRange(0, 3).Draw(rt, "stream") == 0 {
					kind = kindStream
				}
				// A renderer process's session replaces its own and is
				// refused beside any other; a unary client's stream
				// replaces its older stream, lives beside its polls, and is
				// refused beside a process's session.
				live := liveOf(renderer)
				var old *testConn
				opens := true
				for _, c := range live {
					switch {
					case kind == kindSession && c.kind == kindSession && c.instance == instance, kind == kindStream && c.kind == kindStream:
						old = c
					case kind == kindSession || c.kind == kindSession:
						opens = false
					}
				}
				var conn *Conn
				var err error
				if kind == kindSession {
					var holding []LeaseRef
					// A renderer names at most its capacity (2) in a list.
					for _, g := range granted {
						if len(holding) < 2 && g.Job.Lease.Renderer == renderer && rapid.Bool().Draw(rt, "holding") {
							holding = append(holding, LeaseRef{Job: g.Job.ID, Token: g.Job.Lease.Token})
						}
					}
					var st []LeaseStatus
					conn, st, err = b.e.Open(ctx, SessionOpen{Renderer: rend(renderer), Instance: instance, Capacity: 2, Holding: holding})
					if err == nil && len(st) != len(holding) {
						rt.Fatalf("OpenSession answered %d of %d held leases", len(st), len(holding))
					}
				} else {
					conn, err = openStream(ctx, b.e, rend(renderer), 2)
				}
				if opens != (err == nil) || (err != nil && !errors.Is(err, ErrRendererInUse)) {
					rt.Fatalf("opening a %v of %s/%s beside %+v: err = %v", kind, renderer, instance, old, err)
				}
				if err != nil {
					continue
				}
				if kind == kindStream {
					instance = ""
				}
				if opens && old != nil {
					gs, _, ended := take(old.conn)
					if len(gs) != 0 || !errors.Is(ended, ErrReplaced) {
						rt.Fatalf("the replaced connection of %s holds %d grants, ended %v", renderer, len(gs), ended)
					}
					dropConn(old)
				}
				delete(draining, renderer)
				conns = append(conns, &testConn{conn: conn, renderer: renderer, instance: instance, kind: kind})
			case 11: // a session message
				c, ok := pickConn("session", kindSession)
				if !ok {
					continue
				}
				in := SessionInput{Heartbeats: someRefs("heartbeats", 2), HandBacks: someRefs("handbacks", 1), Acks: someRefs("acks", 1),
					Credits: rapid.IntRange(0, 4).Draw(rt, "credits"), Draining: rapid.IntRange(0, 9).Draw(rt, "drain") == 0}
				for _, g := range c.got {
					if len(in.Received) < 2 && rapid.Bool().Draw(rt, "receipt") {
						in.Received = append(in.Received, LeaseRef{Job: g.Job.ID, Token: g.Job.Lease.Token})
					}
				}
				for range rapid.IntRange(0, 2).Draw(rt, "completions") {
					// Mostly its own leases; sometimes any (stale or another's).
					if len(c.got) > 0 && rapid.IntRange(0, 2).Draw(rt, "own") > 0 {
						in.Completions = append(in.Completions, completion(c.got[rapid.IntRange(0, len(c.got)-1).Draw(rt, "ownLease")], ""))
					} else if g, ok := pickGrant("sessionComplete"); ok {
						in.Completions = append(in.Completions, completion(g, ""))
					}
				}
				res, err := b.e.Receive(ctx, c.conn, in)
				if err != nil {
					rt.Fatalf("Receive: %v", err)
				}
				if len(res.Completions) != len(in.Completions) || len(res.Heartbeats) != len(in.Heartbeats) || len(res.HandBacks) != len(in.HandBacks) {
					rt.Fatalf("Receive answered %d/%d completions, %d/%d heartbeats, %d/%d hand-backs", len(res.Completions), len(in.Completions),
						len(res.Heartbeats), len(in.Heartbeats), len(res.HandBacks), len(in.HandBacks))
				}
				for i, req := range in.Completions {
					req.Renderer = c.renderer
					accept(req, res.Completions[i])
				}
				credits[c.renderer] += in.Credits
				if _, was := draining[c.renderer]; in.Draining && !was {
					draining[c.renderer] = state.LeasesTo[c.renderer]
				}
				if rapid.Bool().Draw(rt, "takeAfterSend") { // as the handler does when its outbox signals
					gs, _, _ := take(c.conn)
					received(c, gs)
				}
			case 12: // a connection takes what was published to it
				if c, ok := pickConn("taker", kindSession, kindStream, kindWaiter); ok {
					gs, _, _ := take(c.conn)
					received(c, gs)
				}
			case 13: // a session or stream ends
				c, ok := pickConn("closer", kindSession, kindStream)
				if !ok {
					continue
				}
				var undelivered []LeaseRef
				for _, g := range c.got {
					if rapid.IntRange(0, 3).Draw(rt, "undelivered") == 0 {
						undelivered = append(undelivered, LeaseRef{Job: g.Job.ID, Token: g.Job.Lease.Token})
					}
				}
				if rapid.Bool().Draw(rt, "takeBeforeClose") {
					gs, _, _ := take(c.conn)
					received(c, gs)
				}
				if _, err := closeConn(ctx, b.e, c.conn, undelivered, true); err != nil {
					rt.Fatalf("CloseConn: %v", err)
				}
				dropConn(c)
			case 14: // restart: connections die with the process
				for _, c := range conns {
					if c.kind == kindWaiter {
						gs, _, _ := take(c.conn)
						received(c, gs)
						if err := checkWaiter(c); err != nil {
							rt.Fatal(err)
						}
					}
				}
				conns = nil
				draining = map[string]int{}
				b.close()
				b.start(rt)
			case 16: // a retention step: time passes, then one bounded purge
				b.clock.Advance(time.Duration(rapid.IntRange(0, 40).Draw(rt, "purgeSeconds")) * time.Second)
				res, err := b.e.Purge(ctx)
				if err != nil {
					rt.Fatalf("Purge: %v", err)
				}
				if res.Jobs > step || res.Rejections > step || res.Audit > step {
					rt.Fatalf("a purge step of %d deleted %+v", step, res)
				}
				for _, g := range granted {
					if _, err := b.e.Job(g.Job.ID); errors.Is(err, jobs.ErrNotFound) {
						delete(succeeded, g.Job.ID)
					}
				}
			case 15: // a session renderer's unary call is refused while its session lives
				if c, ok := pickConn("inUse", kindSession); ok {
					if _, err := acquire(ctx, b.e, acquireRequest{Renderer: rend(c.renderer), Max: 1}); !errors.Is(err, ErrRendererInUse) {
						rt.Fatalf("Acquire beside the session of %s: err = %v, want ErrRendererInUse", c.renderer, err)
					}
				}
			}

			checkIndexes(rt, b.e)
			state = checkStore(rt, b.st, state)
			for _, id := range sessionIDs {
				// A session renderer is granted only through its sessions,
				// within the credit it sent.
				if got := state.LeasesTo[id]; got > credits[id] {
					rt.Fatalf("%s was granted %d leases for %d credits", id, got, credits[id])
				}
				if n, ok := draining[id]; ok && state.LeasesTo[id] > n {
					rt.Fatalf("%s was granted %d leases while draining, %d before", id, state.LeasesTo[id], n)
				}
			}
			for _, c := range conns {
				if c.kind == kindWaiter {
					if err := checkWaiter(c); err != nil {
						rt.Fatal(err)
					}
				}
			}
			for id, tok := range succeeded {
				j, err := b.e.Job(id)
				if err != nil {
					rt.Fatal(err)
				}
				if j.Phase == jobs.PhaseSucceeded && j.Artifact.Token != tok {
					rt.Fatalf("job %d artifact token %d, accepted success was token %d", id, j.Artifact.Token, tok)
				}
			}
		}
	})
}

// checkWaiter reports a long poll that got more than its Max or byte
// budget allow.
func checkWaiter(w *testConn) error {
	bytes := 0
	for _, g := range w.got {
		bytes += int(g.Job.ContentBytes) + GrantOverheadBytes
	}
	if len(w.got) > w.max || (w.budget > 0 && bytes > w.budget) {
		return fmt.Errorf("a long poll of %s for %d leases in %d bytes got %d in %d bytes", w.renderer, w.max, w.budget, len(w.got), bytes)
	}
	return nil
}
