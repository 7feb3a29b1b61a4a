package engine

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	"github.com/leasehold/leasehold/coordinator/internal/overview"
	"github.com/leasehold/leasehold/coordinator/internal/reads"
)

// everyGroup publishes the overview after every group, so that a test sees
// each command's effect at once.
func everyGroup(c *Config) { c.OverviewEvery = time.Nanosecond }

// overview reads the published overview and fails the test on an error.
func (b *testBundle) overview(t *testing.T) overview.Overview {
	t.Helper()
	o, _, err := b.e.Overview()
	if err != nil {
		t.Fatalf("Overview: %v", err)
	}
	return o
}

// team returns the figures of team, failing the test without them.
func team(t *testing.T, o overview.Overview, name string) overview.TeamStats {
	t.Helper()
	for _, ts := range o.Teams {
		if ts.Team == name {
			return ts
		}
	}
	t.Fatalf("overview has no team %q: %+v", name, o.Teams)
	return overview.TeamStats{}
}

// counts builds phase counts.
func counts(kv map[jobs.Phase]int64) jobs.Counts {
	var c jobs.Counts
	for p, n := range kv {
		c[p] = n
	}
	return c
}

// TestOverview checks the figures the writer publishes against what the
// commands did: counts, queues and their heads, leases per renderer, and
// the per-minute ring.
func TestOverview(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("Counts, queue heads and leases follow the commands", func(t *testing.T) {
		t.Parallel()
		b := setup(t, everyGroup)
		alpha := b.submit(t, "alpha", "r1", "a1.pdf", "a2.pdf", "a3.pdf").JobIDs()
		b.clock.Advance(10 * time.Second)
		beta := b.submit(t, "beta", "r1", "b1.pdf", "b2.pdf").JobIDs()

		o := b.overview(t)
		if got, want := team(t, o, "alpha"), (overview.TeamStats{Team: "alpha", Counts: counts(map[jobs.Phase]int64{jobs.PhaseQueued: 3}),
			Depth: 3, Head: alpha[0], OldestQueuedAt: epoch}); !sameTeam(got, want) {
			t.Errorf("alpha = %+v, want %+v", got, want)
		}
		if got := team(t, o, "beta"); got.Head != beta[0] || !got.OldestQueuedAt.Equal(epoch.Add(10*time.Second)) {
			t.Errorf("beta head = %d queued at %v, want %d at %v", got.Head, got.OldestQueuedAt, beta[0], epoch.Add(10*time.Second))
		}
		if !o.ReadAt.Equal(b.clock.Now()) {
			t.Errorf("ReadAt = %v, want the engine's clock %v", o.ReadAt, b.clock.Now())
		}

		gs := b.acquire(t, "r-1", 2) // a1, b1 by the fair rotation
		o = b.overview(t)
		a := team(t, o, "alpha")
		if a.Depth != 2 || a.InFlight != 1 || a.Head != alpha[1] {
			t.Errorf("alpha after a grant: depth %d in flight %d head %d, want 2, 1, %d", a.Depth, a.InFlight, a.Head, alpha[1])
		}
		want := []overview.RendererStats{{ID: "r-1", Capacity: 4, LastSeen: b.clock.Now(), Leases: []overview.LeaseStats{
			{Job: gs[0].Job.ID, Team: gs[0].Job.Team, Token: gs[0].Job.Lease.Token, Deadline: b.clock.Now().Add(15 * time.Second)},
			{Job: gs[1].Job.ID, Team: gs[1].Job.Team, Token: gs[1].Job.Lease.Token, Deadline: b.clock.Now().Add(15 * time.Second)},
		}}}
		if diff := cmp.Diff(want, o.Renderers); diff != "" {
			t.Errorf("renderers (-want +got):\n%s", diff)
		}
		if o.LiveCapacity != 4 {
			t.Errorf("LiveCapacity = %d, want 4", o.LiveCapacity)
		}

		if _, err := complete(ctx, b.e, success(gs[0].Job.ID, gs[0].Job.Lease.Token, "r-1", "d1")); err != nil {
			t.Fatal(err)
		}
		if _, err := complete(ctx, b.e, failure(gs[1].Job.ID, gs[1].Job.Lease.Token, "r-1", jobs.ClassInvalidDocument, "corrupt")); err != nil {
			t.Fatal(err)
		}
		if _, err := b.e.Cancel(ctx, CancelRequest{Job: alpha[2], Principal: "p"}); err != nil {
			t.Fatal(err)
		}
		o = b.overview(t)
		if got, want := team(t, o, "alpha").Counts, counts(map[jobs.Phase]int64{jobs.PhaseQueued: 1, jobs.PhaseSucceeded: 1, jobs.PhaseCancelled: 1}); got != want {
			t.Errorf("alpha counts = %v, want %v", got, want)
		}
		last := func(name string) overview.MinuteStats {
			ms := team(t, o, name).Minutes
			if len(ms) != overview.RingMinutes {
				t.Fatalf("%s has %d minutes, want %d", name, len(ms), overview.RingMinutes)
			}
			return ms[len(ms)-1]
		}
		if got, want := last("alpha"), (overview.MinuteStats{Start: epoch.Truncate(time.Minute), Succeeded: 1, Cancelled: 1, Depth: 1}); got != want {
			t.Errorf("alpha's last minute = %+v, want %+v", got, want)
		}
		if got, want := last("beta"), (overview.MinuteStats{Start: epoch.Truncate(time.Minute), Failed: 1, Depth: 1}); got != want {
			t.Errorf("beta's last minute = %+v, want %+v", got, want)
		}
		if len(o.Renderers) != 1 || len(o.Renderers[0].Leases) != 0 {
			t.Errorf("renderers after the completions = %+v, want r-1 without leases", o.Renderers)
		}
	})

	t.Run("Minutes roll over with the wall clock and depth carries forward", func(t *testing.T) {
		t.Parallel()
		b := setup(t, everyGroup)
		first := b.submit(t, "alpha", "r1", "a1.pdf", "a2.pdf").JobIDs()
		if _, err := b.e.Cancel(ctx, CancelRequest{Job: first[0], Principal: "p"}); err != nil {
			t.Fatal(err)
		}
		b.clock.Advance(3 * time.Minute)
		b.tick(t, 0)
		ms := team(t, b.overview(t), "alpha").Minutes
		start := epoch.Truncate(time.Minute)
		want := []overview.MinuteStats{
			{Start: start, Cancelled: 1, Depth: 1},
			{Start: start.Add(time.Minute), Depth: 1},
			{Start: start.Add(2 * time.Minute), Depth: 1},
			{Start: start.Add(3 * time.Minute), Depth: 1},
		}
		if diff := cmp.Diff(want, ms[len(ms)-4:]); diff != "" {
			t.Errorf("last four minutes (-want +got):\n%s", diff)
		}
		b.clock.Advance(overview.RingMinutes * time.Minute)
		b.tick(t, 0)
		for _, m := range team(t, b.overview(t), "alpha").Minutes {
			if m.Succeeded+m.Failed+m.Cancelled != 0 {
				t.Errorf("minute %v still counts %+v an hour later", m.Start, m)
			}
		}
	})

	t.Run("An overview read minutes after its publication is rolled on to the read", func(t *testing.T) {
		t.Parallel()
		b := setup(t, everyGroup)
		ids := b.submit(t, "alpha", "r1", "a1.pdf", "a2.pdf").JobIDs()
		if _, err := b.e.Cancel(ctx, CancelRequest{Job: ids[0], Principal: "p"}); err != nil {
			t.Fatal(err)
		}
		b.clock.Advance(2 * time.Minute) // no command: nothing is published
		o := b.overview(t)
		if !o.At.Equal(epoch) {
			t.Fatalf("overview published at %v, want %v (no command since)", o.At, epoch)
		}
		ms := team(t, o, "alpha").Minutes
		start := epoch.Truncate(time.Minute)
		want := []overview.MinuteStats{
			{Start: start, Cancelled: 1, Depth: 1},
			{Start: start.Add(time.Minute), Depth: 1},
			{Start: start.Add(2 * time.Minute), Depth: 1},
		}
		if diff := cmp.Diff(want, ms[len(ms)-3:]); diff != "" {
			t.Errorf("last three minutes (-want +got):\n%s", diff)
		}
		if len(ms) != overview.RingMinutes {
			t.Errorf("%d minutes, want %d", len(ms), overview.RingMinutes)
		}
	})

	t.Run("A change inside the interval is published when the interval ends", func(t *testing.T) {
		t.Parallel()
		b := setup(t, func(c *Config) { c.OverviewEvery = 20 * time.Millisecond })
		_, changed, err := b.e.Overview()
		if err != nil {
			t.Fatal(err)
		}
		b.submit(t, "alpha", "r1", "a1.pdf")
		for {
			o, next, err := b.e.Overview()
			if err != nil {
				t.Fatal(err)
			}
			if len(o.Teams) == 1 && o.Teams[0].Depth == 1 {
				break
			}
			// The writer publishes the submit within the interval, on its own
			// timer if no other command comes.
			select {
			case <-changed:
			case <-time.After(waitLimit):
				t.Fatalf("no overview with the submit within %v: %+v", waitLimit, o)
			}
			changed = next
		}
	})

	t.Run("A pause or resume is published at once", func(t *testing.T) {
		t.Parallel()
		// An interval no test waits out: only the urgency publishes.
		b := setup(t, func(c *Config) { c.OverviewEvery = time.Hour })
		b.submit(t, "alpha", "r1", "a1.pdf")
		for _, paused := range []bool{true, false, true} {
			if _, err := b.e.SetPaused(ctx, paused, "op", "test"); err != nil {
				t.Fatal(err)
			}
			if o := b.overview(t); o.Dispatch.Paused != paused {
				t.Errorf("after SetPaused(%v) the overview says paused = %v", paused, o.Dispatch.Paused)
			}
		}
	})

	t.Run("Counts and queues survive a restart; the minute ring starts empty", func(t *testing.T) {
		t.Parallel()
		b := setup(t, everyGroup)
		ids := b.submit(t, "alpha", "r1", "a1.pdf", "a2.pdf").JobIDs()
		if _, err := b.e.Cancel(ctx, CancelRequest{Job: ids[0], Principal: "p"}); err != nil {
			t.Fatal(err)
		}
		b.restart(t)
		a := team(t, b.overview(t), "alpha")
		if want := counts(map[jobs.Phase]int64{jobs.PhaseQueued: 1, jobs.PhaseCancelled: 1}); a.Counts != want || a.Depth != 1 || a.Head != ids[1] {
			t.Errorf("alpha after a restart = counts %v depth %d head %d, want %v, 1, %d", a.Counts, a.Depth, a.Head, want, ids[1])
		}
		if m := a.Minutes[len(a.Minutes)-1]; m.Cancelled != 0 {
			t.Errorf("last minute after a restart = %+v, want no terminal counts", m)
		}
	})
}

// sameTeam compares team figures without their minutes.
func sameTeam(a, b overview.TeamStats) bool {
	a.Minutes, b.Minutes = nil, nil
	return cmp.Equal(a, b)
}

// waitLimit is the failsafe bound of a wait on the writer's timer.
const waitLimit = 10 * time.Second

// TestListBatches checks the batch listing: newest first, filtered by team,
// state and creation time, paged without gaps or repeats.
func TestListBatches(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	var ids []uint64 // in creation order: a1 b1 a2 b2 a3
	for i, team := range []string{"alpha", "beta", "alpha", "beta", "alpha"} {
		ids = append(ids, b.submit(t, team, "r"+string(rune('0'+i)), "x.pdf", "y.pdf").ID)
		b.clock.Advance(time.Minute)
	}
	// Finish the second alpha batch.
	if _, err := b.e.Cancel(ctx, CancelRequest{Batch: ids[2], Principal: "p"}); err != nil {
		t.Fatal(err)
	}
	list := func(t *testing.T, f reads.BatchFilter) []uint64 {
		t.Helper()
		var out []uint64
		for range 10 {
			page, err := b.e.ListBatches(f)
			if err != nil {
				t.Fatal(err)
			}
			for _, v := range page.Batches {
				out = append(out, v.Batch.ID)
			}
			if page.Next == 0 {
				return out
			}
			f.Before = page.Next
		}
		t.Fatalf("listing %+v did not end", f)
		return nil
	}
	at := func(i int) time.Time { return epoch.Add(time.Duration(i) * time.Minute) }
	for _, tc := range []struct {
		name string
		f    reads.BatchFilter
		want []uint64
	}{
		{"every batch, newest first", reads.BatchFilter{}, []uint64{ids[4], ids[3], ids[2], ids[1], ids[0]}},
		{"every batch in pages of two", reads.BatchFilter{Limit: 2}, []uint64{ids[4], ids[3], ids[2], ids[1], ids[0]}},
		{"one team", reads.BatchFilter{Teams: []string{"alpha"}, Limit: 1}, []uint64{ids[4], ids[2], ids[0]}},
		{"two teams merged", reads.BatchFilter{Teams: []string{"beta", "alpha"}, Limit: 3}, []uint64{ids[4], ids[3], ids[2], ids[1], ids[0]}},
		{"a team without batches", reads.BatchFilter{Teams: []string{"gamma"}}, nil},
		{"running only", reads.BatchFilter{State: reads.BatchRunning}, []uint64{ids[4], ids[3], ids[1], ids[0]}},
		{"done only", reads.BatchFilter{State: reads.BatchDone}, []uint64{ids[2]}},
		{"created from the third minute", reads.BatchFilter{CreatedAfter: at(2)}, []uint64{ids[4], ids[3], ids[2]}},
		{"created before the third minute", reads.BatchFilter{CreatedBefore: at(2)}, []uint64{ids[1], ids[0]}},
		{"created in a window, one team", reads.BatchFilter{Teams: []string{"beta"}, CreatedAfter: at(1), CreatedBefore: at(4)}, []uint64{ids[3], ids[1]}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, list(t, tc.f)); diff != "" {
				t.Errorf("ListBatches(%+v) (-want +got):\n%s", tc.f, diff)
			}
		})
	}

	t.Run("Each batch carries its counts", func(t *testing.T) {
		page, err := b.e.ListBatches(reads.BatchFilter{Teams: []string{"alpha"}, State: reads.BatchDone})
		if err != nil {
			t.Fatal(err)
		}
		if len(page.Batches) != 1 {
			t.Fatalf("done alpha batches = %+v, want one", page.Batches)
		}
		v := page.Batches[0]
		if want := counts(map[jobs.Phase]int64{jobs.PhaseCancelled: 2}); v.Counts != want || !v.Done {
			t.Errorf("batch %d = counts %v done %v, want %v, true", v.Batch.ID, v.Counts, v.Done, want)
		}
	})
}

func TestMinuteRingSeries(t *testing.T) {
	t.Parallel()
	var r minuteRing
	now := epoch
	r.finished(now.Add(-2*time.Minute), jobs.PhaseSucceeded)
	r.sample(now.Add(-2*time.Minute), 7)
	r.finished(now.Add(-time.Minute), jobs.PhaseFailed)
	r.finished(now.Add(-overview.RingMinutes*time.Minute), jobs.PhaseSucceeded) // out of the window
	got := r.series(now, 3)
	if len(got) != overview.RingMinutes {
		t.Fatalf("series has %d minutes, want %d", len(got), overview.RingMinutes)
	}
	start := now.Truncate(time.Minute)
	want := []overview.MinuteStats{
		{Start: start.Add(-3 * time.Minute)},
		{Start: start.Add(-2 * time.Minute), Succeeded: 1, Depth: 7},
		{Start: start.Add(-time.Minute), Failed: 1, Depth: 7},
		{Start: start, Depth: 3},
	}
	if diff := cmp.Diff(want, got[len(got)-4:]); diff != "" {
		t.Errorf("series (-want +got):\n%s", diff)
	}
	if got[0].Succeeded != 0 {
		t.Errorf("the oldest minute counts %+v, want the minute an hour ago forgotten", got[0])
	}
}
