package engine

import (
	"context"
	"fmt"
	"os"
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
	fn func(g *group, tx *store.Tx)
}

func (c *inspectCmd) apply(g *group) error {
	tx, err := g.txn()
	if err != nil {
		return err
	}
	c.fn(g, tx)
	return nil
}

// checkIndexes asserts the design's invariant 3 and the bookkeeping that
// rests on it: every non-terminal job is in exactly one of its team's ready
// queue, the lease index or the retry timers, and the counts the dispatcher
// and the queue-depth limit use agree with the store.
func checkIndexes(t *rapid.T, e *Engine) {
	var problems []string
	err := e.do(context.Background(), &inspectCmd{fn: func(g *group, tx *store.Tx) {
		queued, leased, active := map[string]int{}, map[string]int{}, map[string]int{}
		nLeased, nRetry := 0, 0
		err := tx.ForEachJob(0, func(j jobs.Job) (bool, error) {
			le, inLeases := e.leases[j.ID]
			at, inRetry := e.retryAt[j.ID]
			switch j.Phase {
			case jobs.PhaseQueued:
				queued[j.Team]++
			case jobs.PhaseLeased:
				leased[j.Team]++
				nLeased++
				if !inLeases || le.token != j.Lease.Token || !le.deadline.Equal(j.Lease.Deadline) {
					problems = append(problems, fmt.Sprintf("job %d LEASED under %d, lease index %+v (present %v)", j.ID, j.Lease.Token, le, inLeases))
				}
			case jobs.PhaseRetryWait:
				nRetry++
				if !inRetry || !at.Equal(j.NextAttemptAt) {
					problems = append(problems, fmt.Sprintf("job %d waits until %v, retry index %v (present %v)", j.ID, j.NextAttemptAt, at, inRetry))
				}
			}
			if !j.Phase.Terminal() {
				active[j.Team]++
			}
			if j.Phase != jobs.PhaseLeased && inLeases {
				problems = append(problems, fmt.Sprintf("job %d is %v but in the lease index", j.ID, j.Phase))
			}
			if j.Phase != jobs.PhaseRetryWait && inRetry {
				problems = append(problems, fmt.Sprintf("job %d is %v but in the retry index", j.ID, j.Phase))
			}
			if j.Attempt > j.Policy.MaxAttempts {
				problems = append(problems, fmt.Sprintf("job %d attempt %d over the maximum %d", j.ID, j.Attempt, j.Policy.MaxAttempts))
			}
			if (j.Artifact.Digest != "") != (j.Phase == jobs.PhaseSucceeded) {
				problems = append(problems, fmt.Sprintf("job %d is %v with artifact %q", j.ID, j.Phase, j.Artifact.Digest))
			}
			return true, nil
		})
		if err != nil {
			problems = append(problems, err.Error())
		}
		for _, team := range []string{"alpha", "beta"} {
			if got := e.sched.Depth(team); got != queued[team] {
				problems = append(problems, fmt.Sprintf("team %s: ready queue depth %d, QUEUED jobs %d", team, got, queued[team]))
			}
			if got := e.sched.InFlight(team); got != leased[team] {
				problems = append(problems, fmt.Sprintf("team %s: in flight %d, LEASED jobs %d", team, got, leased[team]))
			}
			if got := e.active[team]; got != active[team] {
				problems = append(problems, fmt.Sprintf("team %s: active count %d, unfinished jobs %d", team, got, active[team]))
			}
		}
		if len(e.leases) != nLeased || len(e.retryAt) != nRetry {
			problems = append(problems, fmt.Sprintf("index sizes: %d leases for %d LEASED, %d timers for %d RETRY_WAIT", len(e.leases), nLeased, len(e.retryAt), nRetry))
		}
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

// TestWriterInvariants drives the real writer over real bbolt with random
// sequences of every command, clock moves and restarts, and checks after
// each step that the in-memory indexes match the store, that tokens only
// grow, and that each success was set by the completion that made it.
func TestWriterInvariants(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(rt *rapid.T) {
		dir, err := os.MkdirTemp("", "leasehold-invariants-")
		if err != nil {
			rt.Fatal(err)
		}
		defer os.RemoveAll(dir)
		b := &testBundle{dir: dir, clock: &clock{t: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}}
		b.cfg = Config{
			Now:           b.clock.Now,
			LeaseTTL:      10 * time.Second,
			Retry:         jobs.RetryPolicy{MaxAttempts: 3, BackoffBase: time.Second, BackoffCap: 4 * time.Second},
			RunningCancel: rapid.Bool().Draw(rt, "runningCancel"),
			Seed:          rapid.Uint64Min(1).Draw(rt, "seed"),
		}
		b.open(t)
		defer b.close()
		ctx := context.Background()

		var (
			granted   []Grant // every grant, in order
			lastToken uint64
			requests  int
			succeeded = map[uint64]uint64{} // job -> token of the accepted success
		)
		pickGrant := func(label string) (Grant, bool) {
			if len(granted) == 0 {
				return Grant{}, false
			}
			return granted[rapid.IntRange(0, len(granted)-1).Draw(rt, label)], true
		}
		steps := rapid.IntRange(5, 30).Draw(rt, "steps")
		for range steps {
			switch rapid.IntRange(0, 8).Draw(rt, "action") {
			case 0: // submit
				team := rapid.SampledFrom([]string{"alpha", "beta"}).Draw(rt, "team")
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
			case 1: // acquire
				renderer := rapid.SampledFrom([]string{"r-1", "r-2"}).Draw(rt, "renderer")
				res, err := b.e.Acquire(ctx, AcquireRequest{Renderer: renderer, Max: rapid.IntRange(1, 3).Draw(rt, "max"), Capacity: 3})
				if err != nil {
					rt.Fatalf("Acquire: %v", err)
				}
				for _, g := range res.Grants {
					if g.Job.Lease.Token <= lastToken {
						rt.Fatalf("token %d granted after %d", g.Job.Lease.Token, lastToken)
					}
					lastToken = g.Job.Lease.Token
					granted = append(granted, g)
				}
			case 2: // heartbeat
				if g, ok := pickGrant("heartbeat"); ok {
					if _, err := b.e.Heartbeat(ctx, HeartbeatRequest{Renderer: g.Job.Lease.Renderer, Leases: []LeaseRef{{Job: g.Job.ID, Token: g.Job.Lease.Token}}}); err != nil {
						rt.Fatalf("Heartbeat: %v", err)
					}
				}
			case 3: // complete, from the current holder or a stale one
				g, ok := pickGrant("complete")
				if !ok {
					continue
				}
				req := CompleteRequest{Job: g.Job.ID, Completion: jobs.Completion{Token: g.Job.Lease.Token, Renderer: g.Job.Lease.Renderer}}
				switch rapid.IntRange(0, 2).Draw(rt, "outcome") {
				case 0:
					req.Success, req.Digest = true, fmt.Sprintf("digest-%d", g.Job.Lease.Token)
				case 1:
					req.Class = jobs.ClassTransient
				default:
					req.Class = jobs.ClassInvalidDocument
				}
				res, err := b.e.Complete(ctx, req)
				if err == nil && req.Success && !res.Replayed {
					if prev, ok := succeeded[g.Job.ID]; ok {
						rt.Fatalf("job %d succeeded twice in one cycle: tokens %d and %d", g.Job.ID, prev, req.Token)
					}
					succeeded[g.Job.ID] = req.Token
				}
			case 4: // cancel
				if g, ok := pickGrant("cancel"); ok {
					_, _ = b.e.Cancel(ctx, CancelRequest{Job: g.Job.ID, Principal: "alice"})
				}
			case 5: // replay
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
			case 6: // time passes
				b.clock.Advance(time.Duration(rapid.IntRange(0, 20).Draw(rt, "seconds")) * time.Second)
				if err := b.e.Tick(ctx); err != nil {
					rt.Fatalf("Tick: %v", err)
				}
			case 7: // an undelivered grant is handed back
				if g, ok := pickGrant("release"); ok {
					if err := b.e.Release(ctx, []LeaseRef{{Job: g.Job.ID, Token: g.Job.Lease.Token}}); err != nil {
						rt.Fatalf("Release: %v", err)
					}
				}
			case 8: // restart
				b.close()
				b.open(t)
			}
			checkIndexes(rt, b.e)
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
