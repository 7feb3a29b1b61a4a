package engine

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	"github.com/leasehold/leasehold/coordinator/internal/store"
)

// TestGroupCommit checks that commands committed together are still
// decided one by one, in the order they were sent, each at its send time.
func TestGroupCommit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("InterleavedCommandsForOneJobInOneGroupAreDecidedInOrder", func(t *testing.T) {
		t.Parallel()
		b := setup(t, func(c *Config) { c.Retry.BackoffBase, c.Retry.BackoffCap = time.Millisecond, time.Millisecond })
		id := b.submit(t, "alpha", "r1", "a.pdf").FirstJob
		t0 := b.clock.Now()

		// Hold the writer, then send every command at its own time; they
		// all wait for the next group. Tokens in a fresh store start at 1.
		release := b.block(t)
		first := &probeCmd{}
		type step struct {
			at   time.Duration // since t0
			name string
			run  func() any
		}
		hb := func(renderer string, tok uint64) func() any {
			return func() any {
				res, err := heartbeat(ctx, b.e, heartbeatRequest{Renderer: rend(renderer), Leases: []LeaseRef{{Job: id, Token: tok}}})
				if err != nil {
					return err
				}
				st := res.Leases[0]
				if !st.Held {
					return fmt.Sprintf("lost reason=%s current=%d %v", st.Reason, st.CurrentToken, st.CurrentPhase)
				}
				return fmt.Sprintf("held until t0+%v", st.Deadline.Sub(t0))
			}
		}
		grant := func(renderer string) func() any {
			return func() any {
				res, err := acquire(ctx, b.e, acquireRequest{Renderer: rend(renderer), Max: 1, Capacity: 1})
				if err != nil {
					return err
				}
				var toks []uint64
				for _, g := range res.Grants {
					toks = append(toks, g.Job.Lease.Token)
				}
				return fmt.Sprintf("tokens=%v", toks)
			}
		}
		complete := func(renderer string, tok uint64) func() any {
			return func() any {
				res, err := complete(ctx, b.e, success(id, tok, renderer, fmt.Sprintf("d%d", tok)))
				return fmt.Sprintf("phase=%v reason=%s", res.Job.Phase, jobs.ReasonCode(err))
			}
		}
		steps := []step{
			{0, "probe", func() any { return b.e.do(ctx, first) }},
			{0, "grant to r-1", grant("r-1")},
			{10 * time.Second, "heartbeat r-1", hb("r-1", 1)},
			{26 * time.Second, "tick past the extended deadline", func() any { return b.e.Tick(ctx) }},
			{27 * time.Second, "late completion by r-1", complete("r-1", 1)},
			{27 * time.Second, "grant to r-2", grant("r-2")},
			{28 * time.Second, "heartbeat of the expired lease", hb("r-1", 1)},
			{28 * time.Second, "heartbeat r-2", hb("r-2", 2)},
			{29 * time.Second, "cancel", func() any {
				res, err := b.e.Cancel(ctx, CancelRequest{Job: id, Principal: "alice", Reason: "stop"})
				return fmt.Sprintf("running cancelled=%d err=%v", res.CancelledRunning, err)
			}},
			{30 * time.Second, "completion after the cancel", complete("r-2", 2)},
			{30 * time.Second, "heartbeat after the cancel", hb("r-2", 2)},
		}
		last := &probeCmd{}
		got := make([]any, len(steps))
		var done []<-chan struct{}
		for i, s := range steps {
			b.clock.Advance(t0.Add(s.at).Sub(b.clock.Now()))
			done = append(done, async(func() { got[i] = s.run() }))
			b.waitQueued(t, i+1)
		}
		done = append(done, async(func() { _ = b.e.do(ctx, last) }))
		b.waitQueued(t, len(steps)+1)
		b.clock.Advance(time.Minute) // the group starts long after the commands were sent
		release()
		for _, d := range done {
			waitClosed(t, d, "a command of the group")
		}
		if first.g == nil || first.g != last.g {
			t.Fatalf("the commands were applied in more than one group")
		}

		want := []any{
			nil,
			"tokens=[1]",
			"held until t0+25s",
			nil,
			"phase=QUEUED reason=LEASE_EXPIRED",
			"tokens=[2]",
			"lost reason=LEASE_EXPIRED current=2 LEASED",
			"held until t0+43s",
			"running cancelled=1 err=<nil>",
			"phase=CANCELLED reason=JOB_CANCELLED",
			"lost reason=JOB_CANCELLED current=2 CANCELLED",
		}
		for i := range got {
			if err, ok := got[i].(error); ok && err == nil {
				got[i] = nil
			}
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("answers in send order (-want +got):\n%s", diff)
		}

		type ev struct {
			At     time.Duration
			Kind   jobs.EventKind
			Token  uint64
			Reason string
		}
		var history []ev
		for _, e := range b.job(t, id).History[1:] {
			history = append(history, ev{e.At.Sub(t0), e.Kind, e.Token, e.Reason})
		}
		wantHistory := []ev{
			{0, jobs.EventLeased, 1, ""},
			{26 * time.Second, jobs.EventLeaseExpired, 1, "LEASE_EXPIRED"},
			{26 * time.Second, jobs.EventRetryScheduled, 1, ""},
			{27 * time.Second, jobs.EventRequeued, 0, ""},
			{27 * time.Second, jobs.EventCompletionRejected, 1, "LEASE_EXPIRED"},
			{27 * time.Second, jobs.EventLeased, 2, ""},
			{29 * time.Second, jobs.EventCancelled, 2, "FROM_LEASED"},
			{30 * time.Second, jobs.EventCompletionRejected, 2, "JOB_CANCELLED"},
		}
		if diff := cmp.Diff(wantHistory, history); diff != "" {
			t.Errorf("history, each event at its command's send time (-want +got):\n%s", diff)
		}
		if _, err := b.artifactAt(t, id, 2); !errors.Is(err, store.ErrArtifactNotFound) {
			t.Errorf("preview of the completion refused after the cancel: err = %v, want none stored", err)
		}
	})

	t.Run("AHeartbeatSentBeforeTheDeadlineIsJudgedThenAfterALongGroup", func(t *testing.T) {
		t.Parallel()
		b := setup(t, func(c *Config) { c.Mono = nil }) // the wall clock is both
		id := b.submit(t, "alpha", "r1", "a.pdf").FirstJob
		g := b.acquire(t, "r-1", 1)[0]
		t0 := b.clock.Now()

		b.clock.Advance(14 * time.Second)
		release := b.block(t)
		var res heartbeatResult
		var err error
		done := async(func() {
			res, err = heartbeat(ctx, b.e, heartbeatRequest{Renderer: rend("r-1"), Leases: []LeaseRef{{Job: id, Token: g.Job.Lease.Token}}})
		})
		b.waitQueued(t, 1)
		// The group ahead takes long: by the time the heartbeat is applied,
		// its lease's deadline (t0+15s) has passed.
		b.clock.Advance(6 * time.Second)
		release()
		waitClosed(t, done, "the heartbeat")
		if err != nil {
			t.Fatal(err)
		}
		want := LeaseStatus{Job: id, Token: g.Job.Lease.Token, Held: true, Deadline: t0.Add(29 * time.Second),
			CurrentToken: g.Job.Lease.Token, CurrentPhase: jobs.PhaseLeased}
		if diff := cmp.Diff([]LeaseStatus{want}, res.Leases); diff != "" {
			t.Fatalf("heartbeat sent at t0+14s, applied at t0+20s (-want +got):\n%s", diff)
		}
		b.tick(t, 8*time.Second)
		if j := b.job(t, id); j.Phase != jobs.PhaseLeased || countEvents(j, jobs.EventLeaseExpired) != 0 {
			t.Fatalf("at t0+28s: phase %v, %d expiries; want LEASED, never expired", j.Phase, countEvents(j, jobs.EventLeaseExpired))
		}
		b.tick(t, time.Second)
		if j := b.job(t, id); j.Phase != jobs.PhaseRetryWait {
			t.Fatalf("at the extended deadline t0+29s: phase %v, want RETRY_WAIT", j.Phase)
		}
	})

	t.Run("GroupsAreBoundedByTheBytesTheirCommandsCarry", func(t *testing.T) {
		t.Parallel()
		b := setup(t, func(c *Config) { c.MaxGroupBytes = 100 })
		before := b.groups(t)
		release := b.block(t)
		content := make([]byte, 60)
		var done []<-chan struct{}
		for i := range 4 {
			req := SubmitRequest{Team: "alpha", RequestID: fmt.Sprint(i),
				Docs: []jobs.DocInput{{Document: jobs.Document{Name: "a.pdf"}, Content: content}}}
			done = append(done, async(func() {
				if _, err := b.e.Submit(ctx, req); err != nil {
					t.Errorf("Submit %d: %v", i, err)
				}
			}))
			b.waitQueued(t, i+1)
		}
		release()
		for _, d := range done {
			waitClosed(t, d, "a submit")
		}
		after := b.groups(t)
		// The blocking command's group, then two groups of two submits: a
		// group stops taking commands once it carries MaxGroupBytes.
		if got := after.sub(before); got.groups != 3 || got.commands != 5 || got.largest != 2 {
			t.Errorf("since the block: %d groups of %d commands, the largest up to %d; want the block's and two of two submits",
				got.groups, got.commands, got.largest)
		}
		if all := b.allJobs(t); len(all) != 4 {
			t.Errorf("stored %d jobs, want 4", len(all))
		}
	})
}

// groupStats summarises the writer's group-size histogram.
type groupStats struct {
	groups, commands int
	// largest is the smallest bucket bound that holds every group counted.
	largest int
	buckets map[float64]uint64
}

// sub returns what was observed between before and s.
func (s groupStats) sub(before groupStats) groupStats {
	d := groupStats{groups: s.groups - before.groups, commands: s.commands - before.commands}
	for ub, n := range s.buckets { // cumulative counts
		if n-before.buckets[ub] == uint64(d.groups) && (d.largest == 0 || int(ub) < d.largest) {
			d.largest = int(ub)
		}
	}
	return d
}

// groups reads the writer's group-size histogram.
func (b *testBundle) groups(t *testing.T) groupStats {
	t.Helper()
	mfs, err := b.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "leasehold_writer_group_commands" {
			continue
		}
		h := mf.GetMetric()[0].GetHistogram()
		s := groupStats{groups: int(h.GetSampleCount()), commands: int(h.GetSampleSum()), buckets: map[float64]uint64{}}
		for _, bk := range h.GetBucket() {
			s.buckets[bk.GetUpperBound()] = bk.GetCumulativeCount()
		}
		return s
	}
	t.Fatal("no leasehold_writer_group_commands metric")
	return groupStats{}
}

// TestMonotonicClock checks that deadlines and retry timers follow the
// monotonic clock, whatever the wall clock does.
func TestMonotonicClock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	fixedBackoff := func(c *Config) {
		c.Retry.BackoffBase, c.Retry.BackoffCap = 4*time.Second, 4*time.Second
	}

	t.Run("AWallStepForwardExpiresNoLease", func(t *testing.T) {
		t.Parallel()
		b := setup(t, fixedBackoff)
		id := b.submit(t, "alpha", "r1", "a.pdf").FirstJob
		g := b.acquire(t, "r-1", 1)[0]
		b.clock.StepWall(30 * time.Second)
		b.tick(t, 0)
		if p := b.job(t, id).Phase; p != jobs.PhaseLeased {
			t.Fatalf("after a +30s wall step: phase %v, want LEASED", p)
		}
		hb, err := heartbeat(ctx, b.e, heartbeatRequest{Renderer: rend("r-1"), Leases: []LeaseRef{{Job: id, Token: g.Job.Lease.Token}}})
		if err != nil || !hb.Leases[0].Held {
			t.Fatalf("heartbeat after a +30s wall step = %+v, %v; want held", hb, err)
		}
		// Deadlines follow the monotonic clock: TTL from the heartbeat.
		b.tick(t, b.cfg.LeaseTTL-time.Nanosecond)
		if p := b.job(t, id).Phase; p != jobs.PhaseLeased {
			t.Fatalf("a nanosecond before the monotonic deadline: phase %v, want LEASED", p)
		}
		b.tick(t, time.Nanosecond)
		if p := b.job(t, id).Phase; p != jobs.PhaseRetryWait {
			t.Fatalf("at the monotonic deadline: phase %v, want RETRY_WAIT", p)
		}
	})

	t.Run("AWallStepBackParksNoRetryAndNoLease", func(t *testing.T) {
		t.Parallel()
		b := setup(t, fixedBackoff)
		ids := b.submit(t, "alpha", "r1", "retry.pdf", "leased.pdf").JobIDs()
		gs := b.acquire(t, "r-1", 2)
		b.clock.StepWall(-time.Hour)
		res, err := complete(ctx, b.e, failure(ids[0], gs[0].Job.Lease.Token, "r-1", jobs.ClassTransient, "flaky"))
		if err != nil || res.Job.Phase != jobs.PhaseRetryWait {
			t.Fatalf("transient failure after a -1h wall step = %v, %v; want RETRY_WAIT", res.Job.Phase, err)
		}
		wait := res.Job.NextAttemptAt.Sub(b.clock.Now())
		b.clock.StepWall(-time.Hour)
		b.tick(t, wait)
		if p := b.job(t, ids[0]).Phase; p != jobs.PhaseQueued {
			t.Fatalf("after its backoff on the monotonic clock, despite another -1h wall step: phase %v, want QUEUED", p)
		}
		b.tick(t, b.cfg.LeaseTTL-wait)
		if p := b.job(t, ids[1]).Phase; p != jobs.PhaseRetryWait {
			t.Fatalf("a lease at its monotonic deadline, with the wall clock 2h back: phase %v, want RETRY_WAIT", p)
		}
	})

	t.Run("ExpiryFollowsTheMonotonicClockWhileTheWallClockStandsStill", func(t *testing.T) {
		t.Parallel()
		b := setup(t, fixedBackoff)
		id := b.submit(t, "alpha", "r1", "a.pdf").FirstJob
		g := b.acquire(t, "r-1", 1)[0]
		b.clock.Advance(b.cfg.LeaseTTL)
		b.clock.StepWall(-b.cfg.LeaseTTL)
		_, err := complete(ctx, b.e, success(id, g.Job.Lease.Token, "r-1", "d"))
		if !errors.Is(err, jobs.ErrLeaseExpired) {
			t.Fatalf("completion a TTL later on the monotonic clock, at the grant's wall time: err = %v, want ErrLeaseExpired", err)
		}
		if j := b.job(t, id); j.Phase != jobs.PhaseRetryWait || countEvents(j, jobs.EventLeaseExpired) != 1 {
			t.Fatalf("job = %v with %d expiries, want RETRY_WAIT after one LEASE_EXPIRED", j.Phase, countEvents(j, jobs.EventLeaseExpired))
		}
	})
}

// TestRestart checks what a coordinator restart does to live leases.
func TestRestart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("EveryLiveLeaseGetsAFullTTLFromTheRestart", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ids := b.submit(t, "alpha", "r1", "a.pdf", "b.pdf").JobIDs()
		b.acquire(t, "r-1", 1)
		b.clock.Advance(10 * time.Second)
		b.acquire(t, "r-1", 1)
		b.clock.Advance(4 * time.Second) // the first lease has 1s left
		b.restart(t)
		b.tick(t, b.cfg.LeaseTTL-time.Nanosecond)
		for _, id := range ids {
			if p := b.job(t, id).Phase; p != jobs.PhaseLeased {
				t.Fatalf("job %d a nanosecond before restart+TTL: phase %v, want LEASED", id, p)
			}
		}
		b.tick(t, time.Nanosecond)
		for _, id := range ids {
			if p := b.job(t, id).Phase; p == jobs.PhaseLeased {
				t.Fatalf("job %d at restart+TTL: still LEASED", id)
			}
		}
	})

	t.Run("ARecoveredLeaseNeverHeardFromRequeuesUncountedAndAHeardOneCounts", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ids := b.submit(t, "alpha", "r1", "silent.pdf", "heard.pdf", "reclaimed.pdf", "receipted.pdf").JobIDs()
		gs := b.acquire(t, "r-1", 4)
		b.restart(t)
		b.clock.Advance(time.Second)
		hb, err := heartbeat(ctx, b.e, heartbeatRequest{Renderer: rend("r-1"), Leases: refs(gs[1:2])})
		if err != nil || !hb.Leases[0].Held {
			t.Fatalf("heartbeat after the restart = %+v, %v; want held", hb, err)
		}
		// A session reconnecting with the lease it holds is heard from too.
		_, holding, err := b.e.Open(ctx, SessionOpen{Renderer: rend("r-2"), Instance: "i", Capacity: 1, Holding: refs(gs[2:3])})
		if err != nil {
			t.Fatal(err)
		}
		if len(holding) != 1 || holding[0].Reason != "NOT_LEASE_HOLDER" {
			t.Fatalf("another renderer claiming the lease = %+v, want NOT_LEASE_HOLDER", holding)
		}
		conn, holding, err := b.e.Open(ctx, SessionOpen{Renderer: rend("r-1"), Instance: "i", Capacity: 3, Holding: refs(gs[2:3])})
		if err != nil {
			t.Fatal(err)
		}
		if len(holding) != 1 || !holding[0].Held {
			t.Fatalf("the holder reclaiming its lease = %+v, want held", holding)
		}
		// A receipt names a lease the renderer has: heard from, though not
		// extended. A receipt from another renderer does not count.
		b.send(t, conn, SessionInput{Received: refs(gs[3:4])})
		impostor := b.openSession(t, "r-3", 0)
		b.send(t, impostor, SessionInput{Received: refs(gs[:1])})
		b.tick(t, b.cfg.LeaseTTL)

		silent := b.job(t, ids[0])
		if silent.Phase != jobs.PhaseQueued || silent.Attempt != 0 || silent.Undelivered != 1 {
			t.Errorf("never heard: phase %v attempt %d undelivered %d; want QUEUED, 0, 1", silent.Phase, silent.Attempt, silent.Undelivered)
		}
		last := silent.History[len(silent.History)-1]
		if last.Kind != jobs.EventRequeued || last.Reason != jobs.ReleaseNeverHeard || last.Token != gs[0].Job.Lease.Token {
			t.Errorf("never heard: last event %+v, want REQUEUED LEASE_NEVER_HEARD for its token", last)
		}
		for _, j := range []jobs.Job{b.job(t, ids[1]), b.job(t, ids[2]), b.job(t, ids[3])} {
			if j.Phase != jobs.PhaseRetryWait || j.Attempt != 1 || countEvents(j, jobs.EventLeaseExpired) != 1 {
				t.Errorf("%s heard after the restart: phase %v attempt %d; want RETRY_WAIT after a counted expiry", j.Doc.Name, j.Phase, j.Attempt)
			}
		}
		if _, err := closeConn(ctx, b.e, conn, nil, true); err != nil {
			t.Fatal(err)
		}
	})
}

// TestRefusalsNeverStopTheWriter checks that every kind of domain refusal
// is answered and leaves the writer serving the next command.
func TestRefusalsNeverStopTheWriter(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	id := b.submit(t, "alpha", "r1", "a.pdf").FirstJob
	session := b.openSession(t, "busy", 0)

	refusals := []struct {
		name string
		do   func() error
		want error
	}{
		{"a grant to a renderer in use", func() error {
			_, err := acquire(ctx, b.e, acquireRequest{Renderer: rend("busy"), Max: 1})
			return err
		}, ErrRendererInUse},
		{"a completion of a job never leased to the caller", func() error {
			_, err := complete(ctx, b.e, success(id, 99, "r-1", "d"))
			return err
		}, jobs.ErrNotHolder},
		{"a completion of an unknown job", func() error {
			_, err := complete(ctx, b.e, success(999, 1, "r-1", "d"))
			return err
		}, jobs.ErrNotFound},
		{"a replay of an unknown batch", func() error {
			_, err := b.e.Replay(ctx, ReplayRequest{Principal: "ops", RequestID: "x", Batch: 999})
			return err
		}, jobs.ErrNotFound},
		{"a cancel of an unknown job", func() error {
			_, err := b.e.Cancel(ctx, CancelRequest{Job: 999, Principal: "alice"})
			return err
		}, jobs.ErrNotFound},
		{"a second session of another process", func() error {
			_, _, err := b.e.Open(ctx, SessionOpen{Renderer: rend("busy"), Instance: "other"})
			return err
		}, ErrRendererInUse},
		{"an upload for a job never leased to the caller", func() error {
			return b.e.Stage(ctx, StageRequest{Job: id, Token: 99, Renderer: "r-1", Preview: *preview("d")})
		}, jobs.ErrNotHolder},
		{"a grant of a job the ready queue wrongly holds", func() error {
			// Corrupt the ready queue on the writer goroutine: the writer
			// must skip the job and answer, not stop.
			queued := 0
			for _, j := range b.allJobs(t) {
				if j.Phase == jobs.PhaseQueued {
					queued++
				}
			}
			if err := b.e.do(ctx, &inspectCmd{fn: func(g *group, _ *store.Tx) { g.e.sched.Push("gamma", 999) }}); err != nil {
				return err
			}
			res, err := acquire(ctx, b.e, acquireRequest{Renderer: rend("r-1"), Max: 100})
			if err == nil && len(res.Grants) != queued {
				return fmt.Errorf("granted %v, want the %d real jobs", grantedIDs(res.Grants), queued)
			}
			return err
		}, nil},
	}
	for i, r := range refusals {
		if err := r.do(); !errors.Is(err, r.want) || (r.want == nil && err != nil) {
			t.Errorf("%s: err = %v, want %v", r.name, err, r.want)
		}
		if !b.e.Serving() {
			t.Fatalf("the writer stopped after %s", r.name)
		}
		if _, err := b.e.Submit(ctx, SubmitRequest{Team: "beta", RequestID: fmt.Sprintf("after-%d", i), Docs: docs("n.pdf")}); err != nil {
			t.Fatalf("the command after %s: %v", r.name, err)
		}
	}
	b.send(t, session, SessionInput{Credits: 1})
}

// TestStorageFull checks that a full disk fail-stops the writer with its
// own reason, acknowledging nothing of the group.
func TestStorageFull(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	acked := b.submit(t, "alpha", "r1", "a.pdf")
	b.close()
	var full atomic.Bool
	b.open(t, store.WithFault(func(string) error {
		if full.Load() {
			return fmt.Errorf("writing a page: %w", syscall.ENOSPC)
		}
		return nil
	}))
	g := b.acquire(t, "r-1", 1)[0]
	full.Store(true)
	_, err := complete(ctx, b.e, success(g.Job.ID, g.Job.Lease.Token, "r-1", "d"))
	if !errors.Is(err, ErrStorageFull) || !errors.Is(err, ErrStorageFailed) {
		t.Fatalf("completion on a full disk: err = %v, want ErrStorageFull wrapping ErrStorageFailed", err)
	}
	waitClosed(t, b.e.Failed(), "Failed on a full disk")
	if b.e.Serving() || !errors.Is(b.e.FailErr(), ErrStorageFull) {
		t.Fatalf("after a full disk: serving %v, FailErr %v; want stopped with ErrStorageFull", b.e.Serving(), b.e.FailErr())
	}
	if _, err := b.e.Submit(ctx, SubmitRequest{Team: "alpha", RequestID: "r2", Docs: docs("b.pdf")}); !errors.Is(err, ErrStorageFull) {
		t.Fatalf("submit after the fail-stop: err = %v, want ErrStorageFull", err)
	}
	full.Store(false)
	b.restart(t)
	j := b.job(t, g.Job.ID)
	if j.Phase != jobs.PhaseLeased || j.Lease.Token != g.Job.Lease.Token {
		t.Errorf("after a restart the unacknowledged completion left the job %v under %d, want LEASED under %d", j.Phase, j.Lease.Token, g.Job.Lease.Token)
	}
	if _, err := b.artifactAt(t, g.Job.ID, g.Job.Lease.Token); !errors.Is(err, store.ErrArtifactNotFound) {
		t.Errorf("the unacknowledged preview: err = %v, want none stored", err)
	}
	if all := b.allJobs(t); len(all) != int(acked.Count) {
		t.Errorf("stored %d jobs, want only the acknowledged %d", len(all), acked.Count)
	}
}
