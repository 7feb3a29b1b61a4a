package engine

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	"github.com/leasehold/leasehold/coordinator/internal/store"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// losingCommitter commits in place until told to lose: then it rolls the
// group back and answers as a replicated committer does when leadership
// is lost with the entry proposed, or before it.
type losingCommitter struct {
	lose atomic.Pointer[error]
}

func (c *losingCommitter) Record() bool { return false }

func (c *losingCommitter) Commit(tx *store.Tx, _ time.Time) error {
	if p := c.lose.Load(); p != nil {
		_ = tx.Rollback()
		return *p
	}
	return tx.Commit()
}

func (c *losingCommitter) arm(err error) { c.lose.Store(&err) }

func TestLeadership(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	setupLosing := func(t *testing.T) (*testBundle, *losingCommitter) {
		t.Helper()
		lc := &losingCommitter{}
		b := setup(t, func(c *Config) { c.Committer = lc })
		return b, lc
	}

	t.Run("AGroupWhoseOutcomeIsUnknownPublishesNothingAndDropsTheTerm", func(t *testing.T) {
		t.Parallel()
		b, lc := setupLosing(t)
		first := b.submit(t, "alpha", "r1", "a.pdf")
		conn := b.openSession(t, "r-1", 1)
		gs, _, _ := take(conn)
		if len(gs) != 1 {
			t.Fatalf("granted %d, want 1", len(gs))
		}
		w, err := b.e.WatchBatch(first.ID)
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		lost := b.e.Lost()

		lc.arm(ErrOutcomeUnknown)
		_, err = b.e.Submit(ctx, SubmitRequest{Team: "alpha", RequestID: "r2", Docs: docs("b.pdf")})
		if !errors.Is(err, ErrOutcomeUnknown) {
			t.Fatalf("a submit whose commit lost leadership: %v, want ErrOutcomeUnknown", err)
		}
		waitClosed(t, lost, "Lost")
		if _, _, ended := take(conn); !errors.Is(ended, ErrNotLeader) {
			t.Errorf("the session after the term ended: %v, want ErrNotLeader", ended)
		}
		if _, err := w.Next(ctx); !errors.Is(err, ErrNotLeader) {
			t.Errorf("the watch after the term ended: %v, want ErrNotLeader", err)
		}
		if _, err := b.e.Submit(ctx, SubmitRequest{Team: "alpha", RequestID: "r3", Docs: docs("c.pdf")}); !errors.Is(err, ErrNotLeader) {
			t.Errorf("a command after the writer stepped down: %v, want ErrNotLeader", err)
		}
		b.e.Demote()
		if b.e.Leading() {
			t.Fatal("Leading after Demote")
		}
		if _, err := b.e.Submit(ctx, SubmitRequest{Team: "alpha", RequestID: "r4", Docs: docs("d.pdf")}); !errors.Is(err, ErrNotLeader) {
			t.Errorf("a command to a follower: %v, want ErrNotLeader", err)
		}

		// Promoted again: the state is the store's, not what the lost group
		// evaluated, and the lease of the first job is live, with its TTL
		// and the extension.
		lc.lose.Store(nil)
		const extend = 5 * time.Second
		if err := b.e.Promote(extend, time.Time{}); err != nil {
			t.Fatalf("Promote: %v", err)
		}
		if j := b.job(t, first.FirstJob); j.Phase != jobs.PhaseLeased || j.Lease.Token != gs[0].Job.Lease.Token {
			t.Fatalf("the leased job after promotion: %v token %d, want LEASED under %d", j.Phase, j.Lease.Token, gs[0].Job.Lease.Token)
		}
		if _, err := b.e.Batch(first.ID + 1); !errors.Is(err, jobs.ErrNotFound) {
			t.Errorf("the lost group's batch: %v, want it absent", err)
		}
		b.clock.Advance(b.cfg.LeaseTTL + extend/2)
		b.tick(t, 0)
		if j := b.job(t, first.FirstJob); j.Phase != jobs.PhaseLeased {
			t.Fatalf("past the TTL, within the extension: %v, want LEASED", j.Phase)
		}
		b.clock.Advance(extend)
		b.tick(t, 0)
		if j := b.job(t, first.FirstJob); j.Phase == jobs.PhaseLeased {
			t.Fatalf("past the TTL and the extension: still LEASED")
		}
	})

	t.Run("AGroupNotCommittedAnswersNotLeader", func(t *testing.T) {
		t.Parallel()
		b, lc := setupLosing(t)
		lc.arm(ErrNotLeader)
		_, err := b.e.Submit(ctx, SubmitRequest{Team: "alpha", RequestID: "r1", Docs: docs("a.pdf")})
		if !errors.Is(err, ErrNotLeader) {
			t.Fatalf("a submit that was not committed: %v, want ErrNotLeader", err)
		}
		if !b.e.Serving() {
			t.Fatal("a lost leadership fail-stopped the engine")
		}
	})

	t.Run("PromotionStampsNothingBeforeTheWallFloor", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.e.Demote()
		floor := b.clock.Now().Add(time.Hour)
		if err := b.e.Promote(0, floor); err != nil {
			t.Fatal(err)
		}
		batch := b.submit(t, "alpha", "r1", "a.pdf")
		if j := b.job(t, batch.FirstJob); !j.CreatedAt.After(floor) {
			t.Fatalf("a job created after a promotion with the floor %v was stamped %v", floor, j.CreatedAt)
		}
	})

	// A deposed leader's streams end at once: a renderer finds the new
	// leader, and a WatchBatch stream (submit --wait, the console) is not
	// left waiting on a writer that will publish nothing.
	t.Run("DemoteEndsSessionsAndWatches", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		batch := b.submit(t, "alpha", "r1", "a.pdf")
		conn := b.openSession(t, "r-1", 0)
		w, err := b.e.WatchBatch(batch.ID)
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		b.e.Demote()
		if _, _, ended := take(conn); !errors.Is(ended, ErrNotLeader) {
			t.Errorf("the session after Demote: ended %v, want ErrNotLeader", ended)
		}
		// A watch that ended says so at once; one still open would wait,
		// and answer the cancelled context.
		done, cancel := context.WithCancel(ctx)
		cancel()
		if _, err := w.Next(done); !errors.Is(err, ErrNotLeader) {
			t.Errorf("the watch after Demote: %v, want ErrNotLeader", err)
		}
	})

	// A command sent to one term and read by the next, a caller's send
	// racing the term's end (its caller is told NOT_LEADER when that term
	// ends), is refused by the new term, never applied.
	t.Run("ACommandSentToAnEarlierTermIsRefusedByTheNext", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		earlier := b.e.term.Load()
		b.e.Demote()
		if err := b.e.Promote(0, time.Time{}); err != nil {
			t.Fatal(err)
		}
		c, err := b.e.newSubmitCmd(SubmitRequest{Team: "alpha", RequestID: "late", Docs: docs("a.pdf")})
		if err != nil {
			t.Fatal(err)
		}
		r := &request{cmd: c, done: make(chan error, 1), wall: b.clock.Now(), mono: b.e.cfg.Mono(), term: earlier}
		b.e.reqC <- r
		if err := <-r.done; !errors.Is(err, ErrNotLeader) {
			t.Fatalf("a command of the earlier term: %v, want ErrNotLeader", err)
		}
		if js := b.allJobs(t); len(js) != 0 {
			t.Fatalf("the refused command's jobs are stored: %d", len(js))
		}
	})

	t.Run("PromoteRefusesWhileATermRuns", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		if err := b.e.Promote(0, time.Time{}); err == nil {
			t.Fatal("Promote while the writer runs: no error")
		}
	})
}

// TestFollowerExportsNoWriterGauges: a demoted writer's queue gauges
// would be summed with the leader's across a cluster's nodes, so a
// follower exports the store's gauges alone, and a promoted writer all.
func TestFollowerExportsNoWriterGauges(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.submit(t, "alpha", "r1", "a.pdf")
	count := func(name string) int {
		t.Helper()
		n, err := testutil.GatherAndCount(b.reg, name)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if got := count("leasehold_queue_depth"); got == 0 {
		t.Fatal("a leading writer exports no leasehold_queue_depth")
	}
	b.e.Demote()
	for _, name := range []string{"leasehold_queue_depth", "leasehold_leases_in_flight", "leasehold_jobs", "leasehold_dispatch_paused", "leasehold_live_renderer_capacity"} {
		if got := count(name); got != 0 {
			t.Errorf("a follower exports %d series of %s, want none", got, name)
		}
	}
	if got := count("leasehold_store_size_bytes"); got != 1 {
		t.Errorf("a follower exports %d series of leasehold_store_size_bytes, want 1", got)
	}
	if err := b.e.Promote(0, time.Time{}); err != nil {
		t.Fatal(err)
	}
	b.tick(t, 0)
	if got := count("leasehold_queue_depth"); got == 0 {
		t.Error("a promoted writer exports no leasehold_queue_depth")
	}
}

// gatedCommitter commits in place once released: the group before waits
// in Commit, as on a frozen disk. entered receives each group that waits.
type gatedCommitter struct {
	entered chan struct{}
	release chan struct{}
}

func (c *gatedCommitter) Record() bool { return false }

func (c *gatedCommitter) Commit(tx *store.Tx, _ time.Time) error {
	c.entered <- struct{}{}
	<-c.release
	return tx.Commit()
}

// TestBusy ensures Busy tells how long the writer has been on the group
// whose commit it waits for, on the monotonic clock, and 0 while it waits
// for work: the signal a leader that cannot commit steps down on.
func TestBusy(t *testing.T) {
	t.Parallel()
	gc := &gatedCommitter{entered: make(chan struct{}, 1), release: make(chan struct{})}
	b := setup(t, func(c *Config) { c.Committer = gc })
	if got := b.e.Busy(); got != 0 {
		t.Fatalf("Busy of an idle writer = %v, want 0", got)
	}
	done := make(chan error, 1)
	go func() {
		_, err := b.e.Submit(context.Background(), SubmitRequest{Team: "alpha", RequestID: "r1", Docs: docs("a.pdf")})
		done <- err
	}()
	<-gc.entered
	b.clock.Advance(2 * time.Second)
	if got := b.e.Busy(); got != 2*time.Second {
		t.Errorf("Busy with a commit held for 2 s = %v, want 2s", got)
	}
	close(gc.release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
