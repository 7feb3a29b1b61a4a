package engine

import (
	"errors"
	"fmt"
	"maps"
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
// the monotonic one, read together): the design's invariant 3 (every
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
	counts := map[string]*store.Counts{}
	checkJob := func(j jobs.Job) {
		if visit != nil {
			visit(tx, j)
		}
		if counts[j.Team] == nil {
			counts[j.Team] = &store.Counts{}
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
		counts = map[string]*store.Counts{}
		err = errors.Join(err, tx.ForEachTeamCounts(func(team string, c store.Counts) error {
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
		want, got := store.Counts{}, store.Counts{}
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

// StoreState is what CheckStore learned of the committed state, for the
// next check to compare against.
type StoreState struct {
	// LastToken is the fencing-token counter.
	LastToken uint64
	// Tokens maps every token granted to its job.
	Tokens map[uint64]uint64
	// LeasesTo counts the leases ever granted per renderer.
	LeasesTo map[string]int
}

// CheckStore reads the committed state of st in one read transaction and
// returns how it breaks the writer's invariants, joined, or nil: the
// per-batch and per-team counts, the unfinished index, previews, documents
// and histories agree with the stored jobs; tokens are unique, grow within
// each job, and those granted since prev (the state an earlier check
// returned, or the zero StoreState) are above every token granted before
// it; only the current lease is live; a success keeps exactly the preview
// its completion referenced. Any goroutine may call it; it costs a read of
// every job, its history and its previews.
func CheckStore(st *store.Store, prev StoreState) (StoreState, error) {
	var problems []error
	fail := func(format string, args ...any) { problems = append(problems, fmt.Errorf(format, args...)) }
	now := StoreState{Tokens: map[uint64]uint64{}, LeasesTo: map[string]int{}}
	err := st.View(func(tx *store.Tx) error {
		now.LastToken = tx.LastToken()
		batches, teamCounts := map[uint64]*store.Counts{}, map[string]*store.Counts{}
		var live []uint64
		err := tx.ForEachJob(0, func(j jobs.Job) (bool, error) {
			if batches[j.BatchID] == nil {
				batches[j.BatchID] = &store.Counts{}
			}
			batches[j.BatchID][j.Phase]++
			if teamCounts[j.Team] == nil {
				teamCounts[j.Team] = &store.Counts{}
			}
			teamCounts[j.Team][j.Phase]++
			if !j.Phase.Terminal() {
				live = append(live, j.ID)
			}

			// Leases: tokens grow within the job, are never shared, and
			// only the current one is live.
			var prevTok uint64
			for _, l := range j.Leases {
				now.LeasesTo[l.Renderer]++
				if other, dup := now.Tokens[l.Token]; dup {
					fail("token %d granted to jobs %d and %d", l.Token, other, j.ID)
				}
				now.Tokens[l.Token] = j.ID
				if l.Token <= prevTok {
					fail("job %d: token %d after %d", j.ID, l.Token, prevTok)
				}
				prevTok = l.Token
				if owner, seen := prev.Tokens[l.Token]; seen && owner != j.ID {
					fail("job %d: token %d was job %d's at the previous check", j.ID, l.Token, owner)
				} else if !seen && l.Token <= prev.LastToken {
					fail("job %d: new token %d is not above the last token %d of the previous check", j.ID, l.Token, prev.LastToken)
				}
				if l.Token > now.LastToken {
					fail("job %d: token %d above the stored counter %d", j.ID, l.Token, now.LastToken)
				}
				if isLive := l.Kind == jobs.LeaseLive; isLive != (j.Phase == jobs.PhaseLeased && l.Token == j.Lease.Token) {
					fail("job %d is %v under %d, lease %d is %v", j.ID, j.Phase, j.Lease.Token, l.Token, l.Kind)
				}
			}
			if j.Phase == jobs.PhaseLeased && (len(j.Leases) == 0 || j.Leases[len(j.Leases)-1].Token != j.Lease.Token) {
				fail("job %d LEASED under %d, which is not its last lease", j.ID, j.Lease.Token)
			}

			// Previews: a success keeps exactly the one its completion
			// referenced; an ended job keeps no other.
			for _, l := range j.Leases {
				a, err := tx.Artifact(j.ID, l.Token)
				stored := err == nil
				if err != nil && !errors.Is(err, store.ErrArtifactNotFound) {
					return false, err
				}
				switch {
				case j.Phase == jobs.PhaseSucceeded && l.Token == j.Artifact.Token:
					if !stored || a.Digest != j.Artifact.Digest || a.Renderer != j.Artifact.Renderer || int64(len(a.Content)) != j.Artifact.Size {
						fail("job %d SUCCEEDED with %+v, stored preview %+v (%v)", j.ID, j.Artifact, a, err)
					}
				case j.Phase.Terminal() && stored:
					fail("job %d is %v and keeps the preview of lease %d", j.ID, j.Phase, l.Token)
				}
			}
			if j.Phase == jobs.PhaseSucceeded && !slices.ContainsFunc(j.Leases, func(l jobs.LeaseRecord) bool {
				return l.Token == j.Artifact.Token && l.Kind == jobs.LeaseCompleted && l.Outcome == jobs.Outcome(true, j.Artifact.Digest, 0)
			}) {
				fail("job %d artifact token %d is not a lease completed with its digest", j.ID, j.Artifact.Token)
			}

			// Documents: kept while the job may be rendered (again).
			doc := tx.Document(j.ID)
			switch {
			case (j.Phase == jobs.PhaseSucceeded || j.Phase == jobs.PhaseCancelled) && doc != nil:
				fail("job %d is %v and keeps its document", j.ID, j.Phase)
			case !j.Phase.Terminal() && j.ContentBytes > 0 && int64(len(doc)) != j.ContentBytes:
				fail("job %d is %v with %d bytes of document, want %d", j.ID, j.Phase, len(doc), j.ContentBytes)
			}

			// History: one record per event, in order.
			evs, err := tx.Events(j.ID, 0)
			if err != nil {
				return false, err
			}
			if len(evs) != int(j.EventSeq) {
				fail("job %d: EventSeq %d, %d events stored", j.ID, j.EventSeq, len(evs))
			}
			for i, ev := range evs {
				if ev.Seq != uint32(i+1) {
					fail("job %d: event %d has seq %d", j.ID, i+1, ev.Seq)
					break
				}
			}
			return true, nil
		})
		if err != nil {
			return err
		}
		for id, want := range batches {
			got, err := tx.BatchCounts(id)
			if err != nil {
				return err
			}
			if got != *want {
				fail("batch %d: stored counts %v, recount %v", id, got, *want)
			}
		}
		stored := map[string]store.Counts{}
		if err := tx.ForEachTeamCounts(func(team string, c store.Counts) error {
			stored[team] = c
			return nil
		}); err != nil {
			return err
		}
		for team, c := range teamCounts {
			if got := stored[team]; got != *c {
				fail("team %s: stored counts %v, recount %v", team, got, *c)
			}
		}
		for team, got := range stored {
			if teamCounts[team] == nil && got != (store.Counts{}) {
				fail("team %s: stored counts %v, no jobs", team, got)
			}
		}
		if idx := tx.UnfinishedAfter(0, 1<<30); !slices.Equal(idx, live) {
			fail("unfinished index %v, non-terminal jobs %v", idx, live)
		}
		if err := tx.CheckIndexes(); err != nil {
			fail("%v", err)
		}
		return nil
	})
	if err != nil {
		return now, fmt.Errorf("reading the store: %w", err)
	}
	if now.LastToken < prev.LastToken {
		fail("token counter went back from %d to %d", prev.LastToken, now.LastToken)
	}
	return now, errors.Join(problems...)
}
