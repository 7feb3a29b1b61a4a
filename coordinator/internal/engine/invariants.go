package engine

import (
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	"github.com/leasehold/leasehold/coordinator/internal/store"
)

// The checks in this file state the writer's invariants as code. The
// engine's tests and the simulator (package sim) call them after every
// step; the coordinator itself never does.

// indexProblems returns how the writer's in-memory indexes disagree with the
// jobs in tx, judged at the writer's clock (now on the wall clock, mono on
// the monotonic one, read together): invariant 3 of docs/invariants.md (every
// non-terminal job is in exactly one of its team's ready queue, the lease
// index or the retry timers; each timer is armed in its heap and not
// overdue) and the counts that the dispatcher, the queue-depth limit and the
// connection registry keep.
//
// With ids nil it reads every job and recounts. Otherwise it checks the
// jobs in ids (but not whether their timers are in the heaps), and the
// totals against the per-team counts kept in the store (which CheckStore
// recounts): cheap enough to run after every group.
// visit, when set, is called with each job read, so that a caller's own
// checks of the same jobs need not read them again.
//
// It must run on the writer's goroutine, or while nothing else drives the
// writer, after a group: a timer due at mono is expired by the group that
// judges it, so one left overdue is a fault.
func (e *Engine) indexProblems(tx *store.Tx, now time.Time, mono time.Duration, ids []uint64, visit func(*store.Tx, jobs.Job)) []string {
	var problems []string
	fail := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	monoOf := func(t time.Time) time.Duration { return mono + t.Sub(now) }
	// Whether each timer is armed in its heap is checked when every job
	// is read, against a set of the heaps' entries: the heaps hold every
	// deadline set since their entries were last popped, which is many
	// more than the jobs a group touches.
	var armedSet map[timerItem]bool
	armed := func(h timerHeap, id, token uint64, at time.Duration) bool {
		if ids != nil {
			return true
		}
		if armedSet == nil {
			armedSet = make(map[timerItem]bool, len(e.leaseQ)+len(e.retryQ))
			for _, q := range []timerHeap{e.leaseQ, e.retryQ} {
				for _, it := range q {
					armedSet[it] = true
				}
			}
		}
		return armedSet[timerItem{at: at, job: id, token: token}]
	}
	counts := map[string]*jobs.Counts{}
	checkJob := func(j jobs.Job) {
		if visit != nil {
			visit(tx, j)
		}
		if counts[j.Team] == nil {
			counts[j.Team] = &jobs.Counts{}
		}
		counts[j.Team][j.Phase]++
		le, inLeases := e.leases[j.ID]
		at, inRetry := e.retryAt[j.ID]
		switch j.Phase {
		case jobs.PhaseLeased:
			switch {
			case !inLeases || le.token != j.Lease.Token || le.renderer != j.Lease.Renderer:
				fail("job %d LEASED under %d to %s, lease index %+v (present %v)", j.ID, j.Lease.Token, j.Lease.Renderer, le, inLeases)
			case le.deadline < monoOf(j.Lease.Deadline) || le.deadline > max(mono+e.cfg.LeaseTTL, e.extendedTo):
				fail("job %d lease deadline %v, stored %v (mono %v), now %v", j.ID, le.deadline, j.Lease.Deadline, monoOf(j.Lease.Deadline), mono)
			case le.deadline <= mono:
				fail("job %d lease deadline %v is overdue at %v", j.ID, le.deadline, mono)
			case !armed(e.leaseQ, j.ID, le.token, le.deadline):
				fail("job %d lease deadline %v is not in the deadline heap", j.ID, le.deadline)
			}
		case jobs.PhaseRetryWait:
			switch {
			case !inRetry:
				fail("job %d waits until %v but is not in the retry index", j.ID, j.NextAttemptAt)
			case at != monoOf(j.NextAttemptAt):
				fail("job %d retries at %v, its NextAttemptAt is %v", j.ID, at, monoOf(j.NextAttemptAt))
			case at <= mono:
				fail("job %d retry at %v is overdue at %v", j.ID, at, mono)
			case !armed(e.retryQ, j.ID, 0, at):
				fail("job %d retry at %v is not in the retry heap", j.ID, at)
			}
		}
		if j.Phase != jobs.PhaseLeased && inLeases {
			fail("job %d is %v but in the lease index", j.ID, j.Phase)
		}
		if j.Phase != jobs.PhaseRetryWait && inRetry {
			fail("job %d is %v but in the retry index", j.ID, j.Phase)
		}
		// reflect, not cmp: a held time must carry the read's location
		// and no monotonic reading, or a later judgement could differ.
		switch h, isHeld := e.held[j.ID]; {
		case isHeld && j.Phase != jobs.PhaseLeased:
			fail("job %d is %v but held by the writer", j.ID, j.Phase)
		case isHeld && !reflect.DeepEqual(h, j):
			fail("job %d is held as %+v, stored as %+v", j.ID, h, j)
		}
		if j.Attempt > j.Policy.MaxAttempts {
			fail("job %d attempt %d over the maximum %d", j.ID, j.Attempt, j.Policy.MaxAttempts)
		}
		if (j.Artifact.Digest != "") != (j.Phase == jobs.PhaseSucceeded) {
			fail("job %d is %v with artifact %q", j.ID, j.Phase, j.Artifact.Digest)
		}
	}

	var err error
	if ids == nil {
		err = tx.ForEachJob(0, func(j jobs.Job) (bool, error) {
			checkJob(j)
			return true, nil
		})
	} else {
		for _, id := range ids {
			j, found, jerr := tx.Job(id)
			if jerr != nil {
				err = jerr
				break
			}
			if !found {
				fail("job %d is not stored", id)
				continue
			}
			checkJob(j)
		}
		// The totals come from the counts the store keeps.
		counts = map[string]*jobs.Counts{}
		err = errors.Join(err, tx.ForEachTeamCounts(func(team string, c jobs.Counts) error {
			counts[team] = &c
			return nil
		}))
	}
	if err != nil {
		fail("reading jobs: %v", err)
	}

	teams := slices.Collect(maps.Keys(counts))
	for t := range e.teamCounts {
		if counts[t] == nil {
			teams = append(teams, t)
		}
	}
	var nLeased, nRetry int64
	for _, team := range teams {
		want, got := jobs.Counts{}, jobs.Counts{}
		if counts[team] != nil {
			want = *counts[team]
		}
		if c := e.teamCounts[team]; c != nil {
			got = *c
		}
		nLeased += want[jobs.PhaseLeased]
		nRetry += want[jobs.PhaseRetryWait]
		if got != want {
			fail("team %s: counts in memory %v, in the store %v", team, got, want)
		}
		if d := e.sched.Depth(team); int64(d) != want[jobs.PhaseQueued] {
			fail("team %s: ready queue depth %d, QUEUED jobs %d", team, d, want[jobs.PhaseQueued])
		}
		if f := e.sched.InFlight(team); int64(f) != want[jobs.PhaseLeased] {
			fail("team %s: in flight %d, LEASED jobs %d", team, f, want[jobs.PhaseLeased])
		}
	}
	if int64(len(e.leases)) != nLeased || int64(len(e.retryAt)) != nRetry {
		fail("index sizes: %d leases for %d LEASED, %d timers for %d RETRY_WAIT", len(e.leases), nLeased, len(e.retryAt), nRetry)
	}

	// A renderer's sessions: one of a renderer process, or any number of a
	// unary client's, each counted once.
	sessions := map[string]int{}
	for _, c := range e.conns.byID {
		sessions[c.renderer.ID]++
		if !slices.Contains(e.conns.byRenderer[c.renderer.ID], c) {
			fail("session %d of %s is not listed under its renderer", c.id, c.renderer.ID)
		}
	}
	for id, list := range e.conns.byRenderer {
		named := 0
		for _, c := range list {
			if e.conns.byID[c.id] != c {
				fail("a session listed under %s is not live", id)
			}
			if c.instance != "" {
				named++
			}
		}
		if named > 0 && len(list) > 1 {
			fail("renderer %s has %d sessions, %d of a renderer process", id, len(list), named)
		}
	}
	for id, rs := range e.renderers {
		if rs.conns != sessions[id] {
			fail("renderer %s counts %d sessions, %d live", id, rs.conns, sessions[id])
		}
	}
	for id := range sessions {
		if e.renderers[id] == nil {
			fail("renderer %s has live sessions and no state", id)
		}
	}
	return problems
}
