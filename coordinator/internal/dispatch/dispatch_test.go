package dispatch

import (
	"math"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// pick is one job handed out by Next.
type pick struct {
	Team string
	Job  uint64
}

// wide is a live capacity large enough that the cap never engages in a test.
const wide = 1000

// pushAll pushes jobs to team in order.
func pushAll(s *Scheduler, team string, jobs ...uint64) {
	for _, job := range jobs {
		s.Push(team, job)
	}
}

// picks calls Next n times with liveCapacity and returns what it handed out,
// failing the test if Next runs dry.
func picks(t *testing.T, s *Scheduler, n, liveCapacity int) []pick {
	t.Helper()
	var got []pick
	for i := range n {
		team, job, ok := s.Next(liveCapacity)
		if !ok {
			t.Fatalf("Next #%d found no work, want a job (picked so far: %v)", i+1, got)
		}
		got = append(got, pick{team, job})
	}
	return got
}

// teamsOf returns the teams of ps, in order.
func teamsOf(ps []pick) []string {
	var teams []string
	for _, p := range ps {
		teams = append(teams, p.Team)
	}
	return teams
}

// seq returns the jobs from, from+1, ..., from+n-1.
func seq(from uint64, n int) []uint64 {
	jobs := make([]uint64, n)
	for i := range jobs {
		jobs[i] = from + uint64(i)
	}
	return jobs
}

func TestNext(t *testing.T) {
	t.Parallel()

	t.Run("TwoTeamsOfEqualWeightAlternate", func(t *testing.T) {
		t.Parallel()
		s := New(Config{})
		pushAll(s, "a", 1, 2, 3, 4)
		pushAll(s, "b", 11, 12, 13, 14)
		got := picks(t, s, 8, wide)
		want := []pick{{"a", 1}, {"b", 11}, {"a", 2}, {"b", 12}, {"a", 3}, {"b", 13}, {"a", 4}, {"b", 14}}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("pick order (-want +got):\n%s", diff)
		}
		if _, _, ok := s.Next(wide); ok {
			t.Errorf("Next after the last job: ok = true, want false")
		}
	})

	t.Run("WeightsThreeToOneGiveThreeJobsOfTheHeavierTeamPerJobOfTheOther", func(t *testing.T) {
		t.Parallel()
		s := New(Config{Weights: map[string]int{"a": 3}})
		pushAll(s, "a", seq(1, 9)...)
		pushAll(s, "b", seq(101, 3)...)
		got := teamsOf(picks(t, s, 12, wide))
		want := []string{"a", "a", "a", "b", "a", "a", "a", "b", "a", "a", "a", "b"}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("pick order (-want +got):\n%s", diff)
		}
	})

	t.Run("DefaultWeightAppliesToTeamsMissingFromWeights", func(t *testing.T) {
		t.Parallel()
		s := New(Config{Weights: map[string]int{"a": 1}, DefaultWeight: 2})
		pushAll(s, "a", seq(1, 4)...)
		pushAll(s, "b", seq(101, 8)...)
		got := teamsOf(picks(t, s, 9, wide))
		want := []string{"a", "b", "b", "a", "b", "b", "a", "b", "b"}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("pick order (-want +got):\n%s", diff)
		}
	})

	t.Run("CapPassesOverATeamAtItsCapWhileAnotherTeamWaitsAndLiftsWhenNoneDoes", func(t *testing.T) {
		t.Parallel()
		// Live capacity 4 and the default share 0.75 give a cap of 3 leases.
		s := New(Config{Weights: map[string]int{"a": 5}})
		pushAll(s, "a", seq(1, 8)...)
		pushAll(s, "b", 101, 102, 103)
		got := teamsOf(picks(t, s, 8, 4))
		// a's turn has two jobs left after its third, but a is at the cap and b
		// is under it; once b's queue is empty a takes everything.
		want := []string{"a", "a", "a", "b", "b", "b", "a", "a"}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("pick order (-want +got):\n%s", diff)
		}
		if got, want := s.InFlight("a"), 5; got != want {
			t.Errorf("InFlight(a) = %d, want %d", got, want)
		}
		if got, want := s.InFlight("b"), 3; got != want {
			t.Errorf("InFlight(b) = %d, want %d", got, want)
		}
	})

	t.Run("TeamsAllAtTheCapKeepRotating", func(t *testing.T) {
		t.Parallel()
		// Capacity 2 gives a cap of 1.
		s := New(Config{})
		pushAll(s, "a", seq(1, 4)...)
		pushAll(s, "b", seq(101, 4)...)
		got := teamsOf(picks(t, s, 6, 2))
		want := []string{"a", "b", "a", "b", "a", "b"}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("pick order (-want +got):\n%s", diff)
		}
	})

	t.Run("ReleasingLeasesBringsATeamBackUnderItsCap", func(t *testing.T) {
		t.Parallel()
		s := New(Config{Weights: map[string]int{"a": 5}})
		pushAll(s, "a", seq(1, 8)...)
		pushAll(s, "b", seq(101, 8)...)
		first := teamsOf(picks(t, s, 4, 4)) // a, a, a at its cap of 3, then b.
		if diff := cmp.Diff([]string{"a", "a", "a", "b"}, first); diff != "" {
			t.Fatalf("first picks (-want +got):\n%s", diff)
		}
		s.Release("a")
		s.Release("a")
		// a holds 1 lease again. b's turn of one job is used up, so a gets a
		// fresh turn, reaches its cap after two jobs, and b is served again.
		got := teamsOf(picks(t, s, 4, 4))
		want := []string{"a", "a", "b", "b"}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("pick order after releases (-want +got):\n%s", diff)
		}
	})

	t.Run("ATeamArrivingLateJoinsTheRotationWithinOneRound", func(t *testing.T) {
		t.Parallel()
		s := New(Config{})
		pushAll(s, "a", 1, 2, 3, 4)
		pushAll(s, "b", 11, 12, 13, 14)
		before := picks(t, s, 2, wide)
		if diff := cmp.Diff([]pick{{"a", 1}, {"b", 11}}, before); diff != "" {
			t.Fatalf("picks before c arrives (-want +got):\n%s", diff)
		}
		pushAll(s, "c", 21, 22)
		got := picks(t, s, 8, wide)
		want := []pick{{"a", 2}, {"c", 21}, {"b", 12}, {"a", 3}, {"c", 22}, {"b", 13}, {"a", 4}, {"b", 14}}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("picks after c arrives (-want +got):\n%s", diff)
		}
	})

	t.Run("ATeamThatWentIdleIsForgottenAndServedAgainWhenItReturns", func(t *testing.T) {
		t.Parallel()
		s := New(Config{})
		pushAll(s, "a", 1)
		pushAll(s, "b", seq(11, 5)...)
		got := picks(t, s, 4, wide)
		want := []pick{{"a", 1}, {"b", 11}, {"b", 12}, {"b", 13}}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Fatalf("picks while a is idle (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff([]string{"a", "b"}, s.Teams()); diff != "" {
			t.Errorf("Teams() while a holds a lease (-want +got):\n%s", diff)
		}
		s.Release("a")
		if diff := cmp.Diff([]string{"b"}, s.Teams()); diff != "" {
			t.Errorf("Teams() after a's last lease ended (-want +got):\n%s", diff)
		}
		pushAll(s, "a", 2, 3)
		got = picks(t, s, 4, wide)
		want = []pick{{"a", 2}, {"b", 14}, {"a", 3}, {"b", 15}}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("picks after a returns (-want +got):\n%s", diff)
		}
	})

	t.Run("NextWithNothingReadyReportsNotOK", func(t *testing.T) {
		t.Parallel()
		for _, cfg := range []Config{{}, {FIFO: true}} {
			s := New(cfg)
			if team, job, ok := s.Next(wide); ok {
				t.Errorf("FIFO=%v: Next on an empty scheduler = (%q, %d, true), want ok false", cfg.FIFO, team, job)
			}
			s.Acquired("a")
			if _, _, ok := s.Next(wide); ok {
				t.Errorf("FIFO=%v: Next with leases but no ready work: ok = true, want false", cfg.FIFO)
			}
		}
	})
}

func TestFIFO(t *testing.T) {
	t.Parallel()

	t.Run("PickOrderEqualsPushOrderAcrossTeams", func(t *testing.T) {
		t.Parallel()
		s := New(Config{FIFO: true, Weights: map[string]int{"a": 5}})
		var want []pick
		for i, team := range []string{"a", "b", "a", "c", "c", "c", "b", "a", "a", "b"} {
			job := uint64(100 + i)
			s.Push(team, job)
			want = append(want, pick{team, job})
		}
		// A capacity of 1 would cap every team at one lease in fair mode.
		got := picks(t, s, len(want), 1)
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("pick order (-want +got):\n%s", diff)
		}
	})

	t.Run("RemovingTheOldestJobHandsOutTheNextOldest", func(t *testing.T) {
		t.Parallel()
		s := New(Config{FIFO: true})
		pushAll(s, "a", 1)
		pushAll(s, "b", 2)
		pushAll(s, "a", 3)
		if !s.Remove("a", 1) {
			t.Fatalf("Remove(a, 1) = false, want true")
		}
		got := picks(t, s, 2, wide)
		want := []pick{{"b", 2}, {"a", 3}}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("pick order (-want +got):\n%s", diff)
		}
	})
}

func TestRemove(t *testing.T) {
	t.Parallel()

	t.Run("ARemovedJobIsNeverPicked", func(t *testing.T) {
		t.Parallel()
		s := New(Config{})
		pushAll(s, "a", 1, 2, 3)
		if !s.Remove("a", 2) {
			t.Fatalf("Remove(a, 2) = false, want true")
		}
		if got, want := s.Depth("a"), 2; got != want {
			t.Errorf("Depth(a) = %d, want %d", got, want)
		}
		got := picks(t, s, 2, wide)
		if diff := cmp.Diff([]pick{{"a", 1}, {"a", 3}}, got); diff != "" {
			t.Errorf("pick order (-want +got):\n%s", diff)
		}
		if _, _, ok := s.Next(wide); ok {
			t.Errorf("Next after the last job: ok = true, want false")
		}
	})

	t.Run("RemoveReportsFalseForJobsThatAreNotQueuedForTheTeam", func(t *testing.T) {
		t.Parallel()
		s := New(Config{})
		pushAll(s, "a", 1, 2, 3)
		pushAll(s, "b", 4)
		if got := picks(t, s, 1, wide); got[0] != (pick{"a", 1}) {
			t.Fatalf("first pick = %v, want {a 1}", got[0])
		}
		if !s.Remove("a", 2) {
			t.Fatalf("Remove(a, 2) = false, want true")
		}
		for _, tc := range []struct {
			name string
			team string
			job  uint64
		}{
			{"a job never pushed", "a", 99},
			{"an unknown team", "nobody", 3},
			{"a job already picked", "a", 1},
			{"a job already removed", "a", 2},
			{"another team's job", "a", 4},
		} {
			if s.Remove(tc.team, tc.job) {
				t.Errorf("Remove(%q, %d) for %s = true, want false", tc.team, tc.job, tc.name)
			}
		}
		if diff := cmp.Diff([]pick{{"b", 4}, {"a", 3}}, picks(t, s, 2, wide)); diff != "" {
			t.Errorf("picks after the failed removes (-want +got):\n%s", diff)
		}
	})

	t.Run("RemovingATeamsLastJobTakesItOutOfTheRotation", func(t *testing.T) {
		t.Parallel()
		s := New(Config{})
		pushAll(s, "a", 1)
		pushAll(s, "b", 2, 3)
		if !s.Remove("a", 1) {
			t.Fatalf("Remove(a, 1) = false, want true")
		}
		if diff := cmp.Diff([]string{"b"}, s.Teams()); diff != "" {
			t.Errorf("Teams() (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff([]pick{{"b", 2}, {"b", 3}}, picks(t, s, 2, wide)); diff != "" {
			t.Errorf("pick order (-want +got):\n%s", diff)
		}
	})

	t.Run("RemovingMostOfALongQueueKeepsTheRestInOrder", func(t *testing.T) {
		t.Parallel()
		s := New(Config{})
		const n = 20_000
		pushAll(s, "a", seq(0, n)...)
		var want []pick
		for job := range uint64(n) {
			if job%10 == 3 {
				want = append(want, pick{"a", job})
				continue
			}
			if !s.Remove("a", job) {
				t.Fatalf("Remove(a, %d) = false, want true", job)
			}
		}
		if got, want := s.Depth("a"), len(want); got != want {
			t.Fatalf("Depth(a) = %d, want %d", got, want)
		}
		got := picks(t, s, len(want), wide)
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("pick order (-want +got):\n%s", diff)
		}
	})
}

func TestLongQueues(t *testing.T) {
	t.Parallel()

	t.Run("ALongQueueDrainsInPushOrderAndIsForgotten", func(t *testing.T) {
		t.Parallel()
		s := New(Config{})
		const n = 50_000
		pushAll(s, "a", seq(1, n)...)
		for i, job := range seq(1, n) {
			team, got, ok := s.Next(wide)
			if !ok || team != "a" || got != job {
				t.Fatalf("Next #%d = (%q, %d, %v), want (a, %d, true)", i+1, team, got, ok, job)
			}
			s.Release(team)
		}
		if err := s.checkInvariants(); err != nil {
			t.Fatal(err)
		}
		if got := s.Teams(); len(got) != 0 {
			t.Errorf("Teams() after draining = %v, want none", got)
		}
	})

	t.Run("JobsWithIdsFarApartAreAllFound", func(t *testing.T) {
		t.Parallel()
		s := New(Config{})
		jobs := []uint64{1 << 40, 7, 1<<40 + 1, 0, 1<<63 + 5, 8, 1 << 20, math.MaxUint64}
		for _, job := range jobs {
			s.Push("a", job)
			s.Push("b", job) // Already queued for a: ignored.
		}
		if err := s.checkInvariants(); err != nil {
			t.Fatal(err)
		}
		if !s.Remove("a", 0) || !s.Remove("a", math.MaxUint64) {
			t.Fatalf("Remove of queued jobs 0 and MaxUint64 = false, want true")
		}
		var want []pick
		for _, job := range jobs {
			if job != 0 && job != math.MaxUint64 {
				want = append(want, pick{"a", job})
			}
		}
		if diff := cmp.Diff(want, picks(t, s, len(want), wide)); diff != "" {
			t.Errorf("pick order (-want +got):\n%s", diff)
		}
		if err := s.checkInvariants(); err != nil {
			t.Fatal(err)
		}
	})
}

func TestPush(t *testing.T) {
	t.Parallel()

	t.Run("PushingAQueuedJobAgainChangesNothing", func(t *testing.T) {
		t.Parallel()
		s := New(Config{})
		pushAll(s, "a", 1, 2, 1)
		pushAll(s, "b", 2)
		if got, want := s.Depth("a"), 2; got != want {
			t.Errorf("Depth(a) = %d, want %d", got, want)
		}
		if got, want := s.Depth("b"), 0; got != want {
			t.Errorf("Depth(b) = %d, want %d", got, want)
		}
		if got, want := s.Ready(), 2; got != want {
			t.Errorf("Ready() = %d, want %d", got, want)
		}
		if diff := cmp.Diff([]pick{{"a", 1}, {"a", 2}}, picks(t, s, 2, wide)); diff != "" {
			t.Errorf("pick order (-want +got):\n%s", diff)
		}
	})

	t.Run("AJobHandedOutCanBeQueuedAgain", func(t *testing.T) {
		t.Parallel()
		s := New(Config{})
		pushAll(s, "a", 1)
		picks(t, s, 1, wide)
		s.Release("a")
		pushAll(s, "a", 1)
		if diff := cmp.Diff([]pick{{"a", 1}}, picks(t, s, 1, wide)); diff != "" {
			t.Errorf("pick after the retry (-want +got):\n%s", diff)
		}
	})
}

func TestLeases(t *testing.T) {
	t.Parallel()

	t.Run("AcquiredCountsRebuiltLeasesTowardsTheCap", func(t *testing.T) {
		t.Parallel()
		s := New(Config{})
		for range 3 {
			s.Acquired("a")
		}
		pushAll(s, "a", 1, 2)
		pushAll(s, "b", 3, 4)
		if got, want := s.InFlight("a"), 3; got != want {
			t.Errorf("InFlight(a) = %d, want %d", got, want)
		}
		// Capacity 4 gives a cap of 3: a is at it, so b goes first.
		got := teamsOf(picks(t, s, 4, 4))
		if diff := cmp.Diff([]string{"b", "b", "a", "a"}, got); diff != "" {
			t.Errorf("pick order (-want +got):\n%s", diff)
		}
	})

	t.Run("ReleasingATeamWithoutLeasesChangesNothing", func(t *testing.T) {
		t.Parallel()
		s := New(Config{})
		s.Release("a")
		pushAll(s, "b", 1)
		s.Release("b")
		if got := s.InFlight("a"); got != 0 {
			t.Errorf("InFlight(a) = %d, want 0", got)
		}
		if got := s.InFlight("b"); got != 0 {
			t.Errorf("InFlight(b) = %d, want 0", got)
		}
		if diff := cmp.Diff([]string{"b"}, s.Teams()); diff != "" {
			t.Errorf("Teams() (-want +got):\n%s", diff)
		}
	})
}

func TestCap(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		cfg  Config
		live int
		want int
	}{
		{"no live renderers count as one", Config{}, 0, 1},
		{"a negative capacity counts as one", Config{}, -3, 1},
		{"the cap is at least one lease", Config{}, 1, 1},
		{"the default share is three quarters", Config{}, 4, 3},
		{"the share is rounded down", Config{}, 10, 7},
		{"a configured share applies", Config{MaxShare: 0.5}, 9, 4},
		{"a share of one disables the cap", Config{MaxShare: 1}, 9, math.MaxInt},
		{"FIFO mode has no cap", Config{FIFO: true}, 9, math.MaxInt},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := New(tc.cfg).Cap(tc.live); got != tc.want {
				t.Errorf("Cap(%d) = %d, want %d", tc.live, got, tc.want)
			}
		})
	}
}

func TestNewPanicsOnInvalidConfig(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		cfg  Config
	}{
		{"a weight of zero", Config{Weights: map[string]int{"a": 0}}},
		{"a negative default weight", Config{DefaultWeight: -1}},
		{"a negative share", Config{MaxShare: -0.5}},
		{"a share that is not a number", Config{MaxShare: math.NaN()}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			defer func() {
				if recover() == nil {
					t.Errorf("New(%+v) did not panic", tc.cfg)
				}
			}()
			New(tc.cfg)
		})
	}
}

func TestWeightsAreCopied(t *testing.T) {
	t.Parallel()
	weights := map[string]int{"a": 2}
	s := New(Config{Weights: weights})
	weights["a"] = 1
	pushAll(s, "a", seq(1, 4)...)
	pushAll(s, "b", seq(11, 2)...)
	got := teamsOf(picks(t, s, 6, wide))
	if diff := cmp.Diff([]string{"a", "a", "b", "a", "a", "b"}, got); diff != "" {
		t.Errorf("pick order (-want +got):\n%s", diff)
	}
}

func TestHead(t *testing.T) {
	t.Parallel()

	t.Run("an unknown or empty team has no head", func(t *testing.T) {
		t.Parallel()
		s := New(Config{})
		if job, ok := s.Head("alpha"); ok {
			t.Errorf("Head(alpha) = %d, true on a new scheduler, want false", job)
		}
		s.Push("alpha", 1)
		s.Acquired("alpha")
		if _, _, ok := s.Next(wide); !ok {
			t.Fatal("Next found no work")
		}
		if job, ok := s.Head("alpha"); ok {
			t.Errorf("Head(alpha) = %d, true after its only job was taken, want false", job)
		}
	})

	t.Run("the head follows pops and removals from the front", func(t *testing.T) {
		t.Parallel()
		s := New(Config{})
		pushAll(s, "alpha", 5, 6, 7, 8)
		pushAll(s, "beta", 9)
		check := func(want uint64) {
			t.Helper()
			if got, ok := s.Head("alpha"); !ok || got != want {
				t.Errorf("Head(alpha) = %d, %v, want %d, true", got, ok, want)
			}
		}
		check(5)
		s.Remove("alpha", 6) // a tombstone behind the head
		check(5)
		s.Remove("alpha", 5) // the head itself: the next live job takes its place
		check(7)
		for {
			team, job, ok := s.Next(wide)
			if !ok || team == "alpha" {
				if job != 7 {
					t.Fatalf("Next = %s %d, want alpha 7", team, job)
				}
				break
			}
		}
		check(8)
		if got, ok := s.Head("beta"); !ok || got != 9 {
			t.Errorf("Head(beta) = %d, %v, want 9, true", got, ok)
		}
	})
}
