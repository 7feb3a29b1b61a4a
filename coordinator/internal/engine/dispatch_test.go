package engine

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/leasehold/leasehold/coordinator/internal/jobs"
)

// names returns n document names with a prefix.
func names(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%d.pdf", prefix, i+1)
	}
	return out
}

// grantOne asks for one lease from a renderer of the given capacity.
func (b *testBundle) grantOne(t *testing.T, capacity int) (Grant, bool) {
	t.Helper()
	res, err := acquire(context.Background(), b.e, acquireRequest{Renderer: rend("r-1"), Max: 1, Capacity: capacity})
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if len(res.Grants) == 0 {
		return Grant{}, false
	}
	return res.Grants[0], true
}

func (b *testBundle) finish(t *testing.T, g Grant) {
	t.Helper()
	if _, err := complete(context.Background(), b.e, success(g.Job.ID, g.Job.Lease.Token, "r-1", "d")); err != nil {
		t.Fatalf("Complete job %d: %v", g.Job.ID, err)
	}
}

func grantedDocs(gs []Grant) []string {
	out := make([]string, len(gs))
	for i, g := range gs {
		out[i] = g.Job.Doc.Name
	}
	return out
}

func TestFairDispatch(t *testing.T) {
	t.Parallel()

	t.Run("GrantsAlternateBetweenTeamsWithBacklog", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.submit(t, "alpha", "r1", names("a", 5)...)
		b.submit(t, "beta", "r1", names("b", 5)...)
		var got []Grant
		for range 8 {
			g, ok := b.grantOne(t, 100)
			if !ok {
				t.Fatal("no grant with backlog in both teams")
			}
			got = append(got, g)
		}
		want := []string{"a1.pdf", "b1.pdf", "a2.pdf", "b2.pdf", "a3.pdf", "b3.pdf", "a4.pdf", "b4.pdf"}
		if diff := cmp.Diff(want, grantedDocs(got)); diff != "" {
			t.Errorf("grant order (-want +got):\n%s", diff)
		}
	})

	t.Run("OneTeamAloneGetsEveryLease", func(t *testing.T) {
		t.Parallel()
		b := setup(t, func(c *Config) { c.Dispatch.MaxShare = 0.5 })
		b.submit(t, "alpha", "r1", names("a", 8)...)
		res, err := acquire(context.Background(), b.e, acquireRequest{Renderer: rend("r-1"), Max: 8, Capacity: 4})
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(names("a", 8), grantedDocs(res.Grants)); diff != "" {
			t.Errorf("a lone team past its share got (-want +got):\n%s", diff)
		}
	})

	t.Run("InFlightCapHoldsWhileAnotherTeamWaits", func(t *testing.T) {
		t.Parallel()
		const capacity, limit = 4, 2 // MaxShare 0.5 of 4
		b := setup(t, func(c *Config) { c.Dispatch.MaxShare = 0.5 })
		b.submit(t, "alpha", "bulk", names("a", 12)...)
		var held []Grant
		inFlight := map[string]int{}
		ready := map[string]int{"alpha": 12}
		take := func() (Grant, bool) {
			t.Helper()
			g, ok := b.grantOne(t, capacity)
			if !ok {
				return g, false
			}
			team := g.Job.Team
			if inFlight[team] >= limit {
				for other, n := range ready {
					if other != team && n > 0 && inFlight[other] < limit {
						t.Fatalf("granted %s to %s at %d in flight (cap %d) while %s waits with %d ready and %d in flight",
							g.Job.Doc.Name, team, inFlight[team], limit, other, n, inFlight[other])
					}
				}
			}
			inFlight[team]++
			ready[team]--
			held = append(held, g)
			return g, true
		}
		for range limit {
			take()
		}
		b.submit(t, "beta", "small", names("b", 6)...)
		ready["beta"] = 6
		var next []Grant
		for range 2 {
			g, _ := take()
			next = append(next, g)
		}
		if diff := cmp.Diff([]string{"b1.pdf", "b2.pdf"}, grantedDocs(next)); diff != "" {
			t.Errorf("with alpha at its cap, the next grants (-want +got):\n%s", diff)
		}

		// A renderer pool of the given capacity: finish the oldest lease,
		// fill the free slots, until both backlogs are drained.
		for len(held) > 0 {
			done := held[0]
			held = held[1:]
			b.finish(t, done)
			inFlight[done.Job.Team]--
			for len(held) < capacity {
				if _, ok := take(); !ok {
					break
				}
			}
		}
		if ready["alpha"] != 0 || ready["beta"] != 0 {
			t.Errorf("left ready: %v, want both drained", ready)
		}
	})

	t.Run("RestartRebuildsReadyQueuesAndInFlightCounts", func(t *testing.T) {
		t.Parallel()
		b := setup(t, func(c *Config) { c.Dispatch.MaxShare = 0.5 })
		b.submit(t, "alpha", "bulk", names("a", 6)...)
		var before []Grant
		for range 2 {
			g, _ := b.grantOne(t, 4)
			before = append(before, g)
		}
		if diff := cmp.Diff([]string{"a1.pdf", "a2.pdf"}, grantedDocs(before)); diff != "" {
			t.Fatalf("grants before the restart (-want +got):\n%s", diff)
		}
		b.submit(t, "beta", "small", names("b", 4)...)

		b.restart(t)
		// Alpha still holds two leases, its cap: beta goes first.
		var after []Grant
		for range 2 {
			g, _ := b.grantOne(t, 4)
			after = append(after, g)
		}
		if diff := cmp.Diff([]string{"b1.pdf", "b2.pdf"}, grantedDocs(after)); diff != "" {
			t.Errorf("first grants after the restart (-want +got):\n%s", diff)
		}
		for _, g := range append(before, after...) {
			b.finish(t, g)
		}
		for {
			g, ok := b.grantOne(t, 4)
			if !ok {
				break
			}
			after = append(after, g)
			b.finish(t, g)
		}
		perTeam := map[string][]string{}
		for _, g := range after {
			perTeam[g.Job.Team] = append(perTeam[g.Job.Team], g.Job.Doc.Name)
		}
		want := map[string][]string{"alpha": names("a", 6)[2:], "beta": names("b", 4)}
		if diff := cmp.Diff(want, perTeam); diff != "" {
			t.Errorf("per-team order after the restart (-want +got):\n%s", diff)
		}
		all := b.allJobs(t)
		if i := slices.IndexFunc(all, func(j jobs.Job) bool { return j.Phase != jobs.PhaseSucceeded }); i >= 0 {
			t.Errorf("job %s ended %v, want every job SUCCEEDED exactly once", all[i].Doc.Name, all[i].Phase)
		}
	})
}
