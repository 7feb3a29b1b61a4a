package dispatch

import (
	"fmt"
	"math"
	"slices"
	"testing"

	"pgregory.net/rapid"
)

// propertyTeams are the teams the property test draws from.
var propertyTeams = []string{"a", "b", "c", "d"}

// queued is a job in the model's queue, with its place in global push order.
type queued struct {
	job uint64
	seq int
}

// model is the obviously correct reference the Scheduler is checked against:
// plain slices in push order and plain counters.
type model struct {
	cfg      Config
	queues   map[string][]queued
	inFlight map[string]int
	pushes   int
	nextJob  uint64
	// handedOut lists jobs handed out by Next and not queued again since.
	handedOut []queued
}

func (m *model) ready() int {
	n := 0
	for _, q := range m.queues {
		n += len(q)
	}
	return n
}

// where returns the team job is queued for and its index there.
func (m *model) where(job uint64) (string, int, bool) {
	for team, q := range m.queues {
		for i, e := range q {
			if e.job == job {
				return team, i, true
			}
		}
	}
	return "", 0, false
}

// capFor is the cap computed straight from the definition.
func (m *model) capFor(live int) int {
	if m.cfg.FIFO || m.cfg.MaxShare >= 1 {
		return math.MaxInt
	}
	share := m.cfg.MaxShare
	if share == 0 {
		share = 0.75
	}
	return max(1, int(math.Floor(share*float64(max(live, 1)))))
}

func (m *model) teams() []string {
	var teams []string
	for _, team := range propertyTeams {
		if len(m.queues[team]) > 0 || m.inFlight[team] > 0 {
			teams = append(teams, team)
		}
	}
	return teams
}

// TestSchedulerMatchesModel drives a Scheduler with random sequences of every
// call and checks after each one that every job pushed and not removed is
// handed out exactly once, in push order within its team (in global push
// order in FIFO mode), that no team at its cap is picked while another team
// with ready work is under it (invariant 9), and that the counters equal the
// model's.
func TestSchedulerMatchesModel(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(rt *rapid.T) {
		cfg := Config{
			Weights:       map[string]int{},
			DefaultWeight: rapid.IntRange(0, 3).Draw(rt, "defaultWeight"),
			MaxShare:      rapid.SampledFrom([]float64{0, 0.25, 0.5, 0.75, 1}).Draw(rt, "maxShare"),
			FIFO:          rapid.Bool().Draw(rt, "fifo"),
		}
		for _, team := range propertyTeams[:2] {
			if w := rapid.IntRange(0, 4).Draw(rt, "weight "+team); w > 0 {
				cfg.Weights[team] = w
			}
		}
		s := New(cfg)
		m := &model{cfg: cfg, queues: map[string][]queued{}, inFlight: map[string]int{}}
		drawTeam := func(rt *rapid.T) string { return rapid.SampledFrom(propertyTeams).Draw(rt, "team") }

		push := func(team string, job uint64) {
			s.Push(team, job)
			if _, _, ok := m.where(job); ok {
				return // Queued already: Push changes nothing.
			}
			m.pushes++
			m.queues[team] = append(m.queues[team], queued{job, m.pushes})
			m.handedOut = slices.DeleteFunc(m.handedOut, func(e queued) bool { return e.job == job })
		}
		remove := func(team string, job uint64) {
			got := s.Remove(team, job)
			qTeam, i, ok := m.where(job)
			want := ok && qTeam == team
			if got != want {
				rt.Fatalf("Remove(%q, %d) = %v, want %v", team, job, got, want)
			}
			if want {
				m.queues[team] = slices.Delete(m.queues[team], i, i+1)
			}
		}
		next := func(live int) {
			ready := map[string]bool{}
			for team, q := range m.queues {
				ready[team] = len(q) > 0
			}
			team, job, ok := s.Next(live)
			if !ok {
				if m.ready() != 0 {
					rt.Fatalf("Next(%d) found no work, want one of %d ready jobs", live, m.ready())
				}
				return
			}
			q := m.queues[team]
			if len(q) == 0 {
				rt.Fatalf("Next(%d) = (%q, %d), but the team has no ready job", live, team, job)
			}
			if q[0].job != job {
				rt.Fatalf("Next(%d) = (%q, %d), want the team's oldest job %d", live, team, job, q[0].job)
			}
			if cfg.FIFO {
				for other, oq := range m.queues {
					if len(oq) > 0 && oq[0].seq < q[0].seq {
						rt.Fatalf("FIFO Next = (%q, %d) pushed %d-th, but %q's job %d was pushed earlier (%d-th)",
							team, job, q[0].seq, other, oq[0].job, oq[0].seq)
					}
				}
			}
			capLimit := m.capFor(live)
			if got := s.Cap(live); got != capLimit {
				rt.Fatalf("Cap(%d) = %d, want %d", live, got, capLimit)
			}
			if m.inFlight[team] >= capLimit {
				for other, has := range ready {
					if other != team && has && m.inFlight[other] < capLimit {
						rt.Fatalf("Next(%d) took %q with %d in flight (cap %d) while %q with ready work had %d",
							live, team, m.inFlight[team], capLimit, other, m.inFlight[other])
					}
				}
			}
			m.queues[team] = q[1:]
			m.inFlight[team]++
			m.handedOut = append(m.handedOut, q[0])
		}

		rt.Repeat(map[string]func(*rapid.T){
			"push new job": func(rt *rapid.T) {
				m.nextJob++
				push(drawTeam(rt), m.nextJob)
			},
			"push many new jobs": func(rt *rapid.T) {
				team := drawTeam(rt)
				for range rapid.IntRange(1, 300).Draw(rt, "n") {
					m.nextJob++
					push(team, m.nextJob)
				}
			},
			"push a job with a distant id": func(rt *rapid.T) {
				m.nextJob += rapid.Uint64Range(2, 5000).Draw(rt, "gap")
				push(drawTeam(rt), m.nextJob)
			},
			"push a job with any id": func(rt *rapid.T) {
				push(drawTeam(rt), rapid.Uint64().Draw(rt, "job"))
			},
			"push a known job again": func(rt *rapid.T) {
				if m.nextJob == 0 {
					rt.Skip("no job yet")
				}
				push(drawTeam(rt), rapid.Uint64Range(1, m.nextJob).Draw(rt, "job"))
			},
			"remove a queued job": func(rt *rapid.T) {
				var all []queued
				var owners []string
				for _, team := range propertyTeams {
					for _, e := range m.queues[team] {
						all = append(all, e)
						owners = append(owners, team)
					}
				}
				if len(all) == 0 {
					rt.Skip("nothing queued")
				}
				i := rapid.IntRange(0, len(all)-1).Draw(rt, "i")
				remove(owners[i], all[i].job)
			},
			"remove most of a team's queue": func(rt *rapid.T) {
				team := drawTeam(rt)
				keep := rapid.IntRange(2, 10).Draw(rt, "keep one in")
				for i, e := range slices.Clone(m.queues[team]) {
					if i%keep != 0 {
						remove(team, e.job)
					}
				}
			},
			"remove any job for any team": func(rt *rapid.T) {
				remove(drawTeam(rt), rapid.Uint64Range(0, m.nextJob+1).Draw(rt, "job"))
			},
			"next": func(rt *rapid.T) {
				next(rapid.IntRange(-1, 12).Draw(rt, "live"))
			},
			"next many": func(rt *rapid.T) {
				live := rapid.IntRange(1, 12).Draw(rt, "live")
				for range rapid.IntRange(1, 300).Draw(rt, "n") {
					next(live)
				}
			},
			"release": func(rt *rapid.T) {
				team := drawTeam(rt)
				s.Release(team)
				if m.inFlight[team] > 0 {
					m.inFlight[team]--
				}
			},
			"acquired": func(rt *rapid.T) {
				team := drawTeam(rt)
				s.Acquired(team)
				m.inFlight[team]++
			},
			"": func(rt *rapid.T) {
				if err := s.checkInvariants(); err != nil {
					rt.Fatal(err)
				}
				for _, team := range propertyTeams {
					if got, want := s.Depth(team), len(m.queues[team]); got != want {
						rt.Fatalf("Depth(%q) = %d, want %d", team, got, want)
					}
					if got, want := s.InFlight(team), m.inFlight[team]; got != want {
						rt.Fatalf("InFlight(%q) = %d, want %d", team, got, want)
					}
				}
				if got, want := s.Ready(), m.ready(); got != want {
					rt.Fatalf("Ready() = %d, want %d", got, want)
				}
				if got, want := s.Teams(), m.teams(); !slices.Equal(got, want) {
					rt.Fatalf("Teams() = %v, want %v", got, want)
				}
				for _, e := range m.handedOut {
					if s.Remove(teamOf(m, e.job), e.job) {
						rt.Fatalf("Remove of job %d, already handed out, = true, want false", e.job)
					}
				}
			},
		})

		// Drain: every job still queued comes out exactly once.
		want := m.ready()
		for i := range want {
			before := len(m.handedOut)
			next(rapid.IntRange(1, 12).Draw(rt, fmt.Sprintf("drain live %d", i)))
			if len(m.handedOut) != before+1 {
				rt.Fatalf("drain: Next handed out nothing with %d jobs ready", m.ready())
			}
		}
		if _, _, ok := s.Next(1); ok {
			rt.Fatalf("Next after draining: ok = true, want false")
		}
	})
}

// teamOf returns a team to try removing a handed-out job from: the team that
// last had it queued is unknown to the model, so any team will do, and the
// Scheduler must refuse for all of them.
func teamOf(m *model, job uint64) string {
	return propertyTeams[job%uint64(len(propertyTeams))]
}
