package engine

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"syscall"
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/mutation"

	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	"github.com/leasehold/leasehold/coordinator/internal/store"
	"github.com/leasehold/leasehold/coordinator/internal/watch"
)

// command is one state change made by the writer. evaluate runs on the
// writer goroutine with the group's transaction; it records its domain
// outcome in the command itself and returns an error only when the group
// must not commit (a storage failure). A domain refusal never stops the
// writer.
//
// What a caller sent never stops it either. bbolt has no savepoints, and a
// command changes the writer's memory as it is evaluated (ready queues,
// the lease index, connections), so a command cannot be undone once begun:
// a failure inside evaluate can only abandon the whole group and stop the
// writer. So a command is judged before it begins. Every string it carries
// into a record is named by its text method and checked (checkText: UTF-8
// text without control or bidirectional formatting characters, at most
// maxTextBytes) before evaluate; a command that fails is answered
// INVALID_ARGUMENT INVALID_TEXT without touching the transaction or
// memory, and the rest of the group commits. A session's completions are
// checked one by one in completeOne, before each touches anything. The
// records evaluate writes hold only those strings, strings decoded from the
// store (which protobuf has already checked) and the code's own constants,
// so no record fails to encode and no key is too long for bbolt because of
// a caller: what is left to fail a commit is the storage itself, or a bug,
// and either fail-stops. TestEveryCommandNamesItsText keeps the text
// methods complete. Handlers refuse the same strings earlier, with the
// field's own reason; this check is what holds for any caller that reaches
// the engine.
type command interface {
	evaluate(g *group) error
	// text refuses the command (badText) when a string it carries into
	// the records it writes may not be stored; see above.
	text() error
	// refuse answers the command with err without evaluating it.
	refuse(err error)
	// outcome is the domain result handed back to the caller.
	outcome() error
	// size is about how many bytes the command carries into the commit
	// (documents, previews), to bound a group by bytes as well as count.
	size() int
}

// base carries a command's domain outcome.
type base struct{ err error }

func (b *base) outcome() error   { return b.err }
func (b *base) refuse(err error) { b.err = err }
func (b *base) size() int        { return 0 }

type request struct {
	cmd command
	// done has capacity 1 so the writer never blocks on a departed caller.
	done chan error
	// wall and mono are when the command was sent: the writer judges it
	// then (but never before the command ahead of it).
	wall time.Time
	mono time.Duration
	// term is the writer's run the command was sent to; a later run
	// refuses it (its sender was told it was not applied).
	term *term
}

// group is one commit: the commands drained together, the transaction
// they share (opened on first use), the clock reading the current command
// is judged against, and what to publish once the commit is durable.
type group struct {
	e    *Engine
	now  time.Time
	mono time.Duration
	tx   *store.Tx

	events      []watch.JobEvent
	tallies     []tally
	revocations map[string][]LeaseStatus
	deliveries  map[*Conn][]Grant
	batchDelta  map[uint64]*jobs.Counts
	teamDelta   map[string]*jobs.Counts
	// purged is what the group's purge steps deleted.
	purged PurgeResult
	// work: something may have become dispatchable; credit: a connection
	// got credit; dispatch: the pause switch changed.
	work, credit, dispatch bool
	// published is set by a mutation that publishes and answers before
	// the commit.
	published bool
	// taken are the requests the group evaluated, in order; rest those it
	// left for the next group once it was full.
	taken, rest []*request
}

// full reports whether the group's recorded write set reached
// Config.MaxWriteSetBytes: it then takes no more commands, so that its
// entry stays within the bound whatever the commands write.
func (g *group) full() bool {
	limit := g.e.cfg.MaxWriteSetBytes
	return limit > 0 && g.tx != nil && g.tx.WriteSetBytes() >= limit
}

// observer is a command that must see its whole group and writes nothing
// (the stepper's): a group that is full still evaluates it.
type observer interface{ observesGroup() }

// setClock moves the group's clock to a command's send time; the
// monotonic reading never goes backwards. A command sent before the last
// reading the writer judged by (it waited behind a group) is judged at
// that reading on both clocks, so that a deadline or retry time recorded
// on the wall clock is the one armed on the monotonic clock.
func (g *group) setClock(wall time.Time, mono time.Duration) {
	e := g.e
	if mono > e.clockMono {
		e.clockMono = mono
	} else {
		wall = wall.Add(e.clockMono - mono)
	}
	g.now, g.mono = wall, e.clockMono
}

// txn returns the group's read-write transaction, beginning it on first use.
func (g *group) txn() (*store.Tx, error) {
	if g.tx == nil {
		tx, err := g.e.st.Begin()
		if err != nil {
			return nil, fmt.Errorf("beginning transaction: %w", err)
		}
		if g.e.committer.Record() {
			tx.Record()
		}
		g.tx = tx
	}
	return g.tx, nil
}

// load reads a job, without its history, in the group's transaction, with
// its live lease deadline and retry time translated from the writer's
// monotonic clock into the wall frame of g.now, so that the pure
// transitions judge them as the monotonic clock does. save writes the lease
// deadline shown to people back in its place (withShownDeadline).
func (g *group) load(id uint64) (jobs.Job, bool, error) {
	tx, err := g.txn()
	if err != nil {
		return jobs.Job{}, false, err
	}
	e := g.e
	j, found := e.held[id]
	if !found {
		j, found, err = tx.Job(id)
		if err != nil || !found {
			return j, found, err
		}
	}
	switch j.Phase {
	case jobs.PhaseLeased:
		if le := e.leases[id]; le != nil && le.token == j.Lease.Token {
			j.Lease.Deadline = g.now.Add(le.deadline - g.mono)
		}
	case jobs.PhaseRetryWait:
		if at, ok := e.retryAt[id]; ok {
			j.NextAttemptAt = g.now.Add(at - g.mono)
		}
	}
	return j, true, nil
}

// withShownDeadline returns after with its live lease's deadline as shown
// to people (leaseEntry.shown), so that a command that does not extend the
// lease, such as a refused completion, leaves the shown deadline where it
// was. A deadline that after moved past before's is an extension, decided
// now, and becomes the one shown. A lease granted in this command is not
// tracked yet; its deadline is the one decided at the grant.
func (g *group) withShownDeadline(before, after jobs.Job) jobs.Job {
	if after.Phase != jobs.PhaseLeased {
		return after
	}
	le := g.e.leases[after.ID]
	if le == nil || le.token != after.Lease.Token {
		return after
	}
	if before.Phase == jobs.PhaseLeased && before.Lease.Token == after.Lease.Token && after.Lease.Deadline.After(before.Lease.Deadline) {
		le.shown = after.Lease.Deadline
	}
	after.Lease.Deadline = le.shown
	return after
}

// monoOf translates a wall time of the group's frame to the monotonic clock.
func (g *group) monoOf(t time.Time) time.Duration { return g.mono + t.Sub(g.now) }

// save writes after: the record, its new events, the indexes and counts
// its phase change moves, and what its end makes unneeded (the document
// once it succeeded or was cancelled, previews of leases that did not
// win). before is the record as loaded (the zero Job for a new one).
func (g *group) save(before, after jobs.Job) error {
	tx, err := g.txn()
	if err != nil {
		return err
	}
	after = g.withShownDeadline(before, after)
	if after.Phase == jobs.PhaseLeased {
		stored, err := tx.PutJobAsRead(after)
		if err != nil {
			return err
		}
		g.e.held[after.ID] = stored
	} else {
		if err := tx.PutJob(after); err != nil {
			return err
		}
		delete(g.e.held, after.ID)
	}
	fresh := after.Events[min(len(before.Events), len(after.Events)):]
	if err := tx.PutEvents(after.ID, fresh); err != nil {
		return err
	}
	for _, ev := range fresh {
		g.events = append(g.events, watch.JobEvent{Job: after.ID, Batch: after.BatchID, Event: ev})
		g.tallies = append(g.tallies, tally{team: after.Team, kind: ev.Kind, reason: ev.Reason})
	}
	isNew := before.ID == 0
	if !isNew && before.Phase == after.Phase {
		return nil
	}
	g.count(after, before.Phase, after.Phase, isNew)
	wasLive := !isNew && !before.Phase.Terminal()
	switch live := !after.Phase.Terminal(); {
	case live && !wasLive:
		err = tx.SetUnfinished(after.ID, true)
		if err == nil && !isNew {
			// A replay: the job ended before, and is no longer due for
			// retention.
			err = tx.UnindexFinished(before)
		}
	case !live && wasLive:
		err = g.finish(tx, after)
	case !live && isNew:
		g.e.finished(after, g.now)
		err = tx.IndexFinished(after)
	}
	return err
}

// finish drops what a job that just ended no longer needs, and indexes it
// for retention.
func (g *group) finish(tx *store.Tx, j jobs.Job) error {
	g.e.finished(j, g.now)
	if err := tx.SetUnfinished(j.ID, false); err != nil {
		return err
	}
	if err := tx.IndexFinished(j); err != nil {
		return err
	}
	// A success under the job's only lease can have no other preview: only
	// a lease can store one, under its own token.
	if j.Phase != jobs.PhaseSucceeded || len(j.Leases) > 1 {
		keep := uint64(0)
		if j.Phase == jobs.PhaseSucceeded {
			keep = j.Artifact.Token
		}
		if err := tx.DeleteArtifacts(j.ID, keep); err != nil {
			return err
		}
	}
	// A FAILED job keeps its document: an operator replay renders it again.
	if j.ContentBytes > 0 && (j.Phase == jobs.PhaseSucceeded || j.Phase == jobs.PhaseCancelled) {
		return tx.DeleteDocument(j.ID)
	}
	return nil
}

// count moves j between phases in its batch's and team's counts, in memory
// at once (later commands of the group see them) and in the store at
// commit.
func (g *group) count(j jobs.Job, from, to jobs.Phase, isNew bool) {
	if g.batchDelta == nil {
		g.batchDelta = make(map[uint64]*jobs.Counts)
		g.teamDelta = make(map[string]*jobs.Counts)
	}
	bd, td := g.batchDelta[j.BatchID], g.teamDelta[j.Team]
	if bd == nil {
		bd = &jobs.Counts{}
		g.batchDelta[j.BatchID] = bd
	}
	if td == nil {
		td = &jobs.Counts{}
		g.teamDelta[j.Team] = td
	}
	tc := g.e.teamCounts[j.Team]
	if tc == nil {
		tc = &jobs.Counts{}
		g.e.teamCounts[j.Team] = tc
	}
	if !isNew {
		bd[from]--
		td[from]--
		tc[from]--
	}
	if to != jobs.PhaseUnspecified {
		bd[to]++
		td[to]++
		tc[to]++
	}
}

// uncount removes a purged job from its batch's and team's counts.
func (g *group) uncount(j jobs.Job) { g.count(j, j.Phase, jobs.PhaseUnspecified, false) }

// storeCounts adds the group's count changes to the stored counts.
func (g *group) storeCounts() error {
	if len(g.batchDelta) == 0 && len(g.teamDelta) == 0 {
		return nil
	}
	tx, err := g.txn()
	if err != nil {
		return err
	}
	for b, d := range g.batchDelta {
		if err := tx.AddBatchCounts(b, *d); err != nil {
			return err
		}
	}
	for t, d := range g.teamDelta {
		if err := tx.AddTeamCounts(t, *d); err != nil {
			return err
		}
	}
	return nil
}

func (g *group) revoke(renderer string, s LeaseStatus) {
	if g.revocations == nil {
		g.revocations = make(map[string][]LeaseStatus)
	}
	g.revocations[renderer] = append(g.revocations[renderer], s)
}

// endConn unregisters c and ends its outbox with why. It returns the
// grants c never took: those left in its outbox, then those this group
// made to it, which are not published yet.
func (g *group) endConn(c *Conn, why error) []Grant {
	g.e.conns.remove(c)
	left := c.Outbox.end(why)
	if gs := g.deliveries[c]; len(gs) > 0 {
		delete(g.deliveries, c)
		if left == nil {
			return gs
		}
		left = append(left, gs...)
	}
	return left
}

// deliver adds gr to what the group publishes to c. A connection's first
// grant of the group makes room for as many more as it can still take
// (its credit left, the jobs still ready), so that a busy group does not
// copy its grants as they grow.
func (g *group) deliver(c *Conn, gr Grant) {
	if g.deliveries == nil {
		g.deliveries = make(map[*Conn][]Grant)
	}
	gs := g.deliveries[c]
	if gs == nil {
		gs = make([]Grant, 0, 1+max(min(c.credit, g.e.sched.Ready()), 0))
	}
	g.deliveries[c] = append(gs, gr)
}

// run is the writer goroutine of term t.
func (e *Engine) run(t *term) {
	defer close(t.doneC)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		e.resetTimer(timer)
		// Commands a full group left come first, without waiting.
		batch := e.carry
		e.carry = nil
		fired := false
		if len(batch) == 0 {
			select {
			case <-t.stopC:
				e.drain(t.err())
				return
			case r := <-e.reqC:
				if t.admit(r) {
					batch = append(batch, r)
				}
			case <-timer.C:
				fired = true
			}
		}
		// Timers are judged up to this instant at the end of the group:
		// every command drained below was sent before it or judges itself
		// later, and none sent after it is held back by it.
		wall, mono := e.now(), e.cfg.Mono()
		if fired {
			// A timer far behind its time: the process was frozen.
			e.noteStall(e.timerAt, mono)
		}
		bytes := 0
		for _, r := range batch {
			bytes += r.cmd.size()
		}
	more:
		for len(batch) < e.cfg.MaxGroup && bytes < e.cfg.MaxGroupBytes {
			select {
			case r := <-e.reqC:
				if t.admit(r) {
					batch = append(batch, r)
					bytes += r.cmd.size()
				}
			default:
				break more
			}
		}
		e.busySince.Store(int64(mono) + 1)
		err := e.runGroup(batch, wall, mono)
		e.busySince.Store(0)
		if err != nil {
			if t.lost(err) {
				e.lose(t)
			} else {
				e.drain(e.stoppedErr())
			}
			return
		}
	}
}

// drain answers every queued request with err.
func (e *Engine) drain(err error) {
	for {
		select {
		case r := <-e.reqC:
			r.done <- err
		default:
			return
		}
	}
}

// resetTimer arms timer for the earliest lease deadline or retry time, or
// for when an overview left dirty is due.
func (e *Engine) resetTimer(t *time.Timer) {
	next := time.Hour
	now := e.cfg.Mono()
	if at, ok := e.nextTimer(); ok {
		next = min(next, at-now)
	}
	if d, ok := e.overviewDue(); ok {
		next = min(next, d)
	}
	next = max(next, 0)
	e.timerAt = now + next
	t.Reset(next)
}

// nextTimer returns the earliest lease deadline or retry time armed, on
// the monotonic clock. Entries are invalidated lazily, so it may be
// earlier than any live deadline.
func (e *Engine) nextTimer() (time.Duration, bool) {
	var next time.Duration
	found := false
	for _, q := range []timerHeap{e.leaseQ, e.retryQ} {
		if it, ok := q.peek(); ok && (!found || it.at < next) {
			next, found = it.at, true
		}
	}
	return next, found
}

// noteStall records that the writer could apply nothing from from to to
// on the monotonic clock, if that is longer than Config.StallAfter.
// Renderers' messages that arrived meanwhile wait in their streams, so
// leases falling due during the stall or shortly after it are kept
// (stallGrace) until those messages are applied: the coordinator's own
// unavailability must not count against its renderers.
func (e *Engine) noteStall(from, to time.Duration) {
	if e.cfg.StallAfter < 0 || to-from <= e.cfg.StallAfter {
		return
	}
	e.stallFrom, e.stallTo = from, to
	e.log.Warn("writer stalled: leases falling due during it get a grace",
		"stalled", to-from, "grace", e.stallGrace())
}

// stallGrace is how long after a stall a lease that fell due during it is
// kept: half a TTL, one and a half heartbeat intervals.
func (e *Engine) stallGrace() time.Duration { return e.cfg.LeaseTTL / 2 }

// deferred reports whether le, due now, falls due during the last stall
// or its grace; if so it moves le's deadline to the grace's end.
func (e *Engine) deferred(job uint64, le *leaseEntry, now time.Duration) bool {
	end := e.stallTo + e.stallGrace()
	if e.stallTo == 0 || le.deadline < e.stallFrom || now >= end {
		return false
	}
	le.shown = le.shown.Add(end - le.deadline)
	le.deadline = end
	heap.Push(&e.leaseQ, timerItem{at: end, job: job, token: le.token})
	return true
}

// runGroup applies a group of requests in one transaction, each judged at
// its send time after the timers due by then, grants queued work to the
// connections with credit, commits through the Committer, and then
// publishes the group's effects and answers the requests. A failed commit
// fail-stops the engine: nothing of the group is acknowledged, and no
// later command is taken. The requests a full group did not take wait in
// e.carry for the next group; a group that did not commit answers them
// with its failure, or as not applied when it lost leadership.
func (e *Engine) runGroup(all []*request, wall time.Time, mono time.Duration) error {
	start := time.Now()
	g, err := e.evaluate(all, wall, mono)
	batch := g.taken
	committed := false
	if err == nil {
		if mutation.On(mutation.PublishEarly) {
			e.finish(g, batch, true, mono, start)
			g.published = true
		}
		committed, err = e.commit(g)
	}
	if err != nil {
		if mutation.On(mutation.PublishEarly) && g.published {
			all = g.rest // answered already
			batch = nil
		}
		if lost := leadershipLost(err); lost != nil {
			for _, r := range g.rest {
				r.done <- e.notLeader()
			}
			e.stepDown(g, batch, lost)
			return lost
		}
		e.failStop(g, all, err)
		return err
	}
	e.carry = g.rest
	if !mutation.On(mutation.PublishEarly) || !g.published {
		e.finish(g, batch, committed, mono, start)
	}
	return nil
}

// evaluate runs the group's commands in order, each at its send time
// after the timers due by then, then the timers due by the group's own
// clock reading, grants work to the connections with credit, and adds the
// count changes, all in the group's transaction (opened on first write,
// recording when the committer needs write sets). An error is a storage
// failure: the group must not commit.
func (e *Engine) evaluate(batch []*request, wall time.Time, mono time.Duration) (*group, error) {
	g := &group{e: e, taken: make([]*request, 0, len(batch))}
	var err error
	for i := 0; err == nil && i < len(batch); i++ {
		if _, obs := batch[i].cmd.(observer); !obs && g.full() {
			g.rest = append(g.rest, batch[i])
			continue
		}
		g.taken = append(g.taken, batch[i])
		g.setClock(batch[i].wall, batch[i].mono)
		if err = e.advance(g); err != nil {
			break
		}
		cmd := batch[i].cmd
		if terr := cmd.text(); terr != nil {
			// Handlers refuse such text first: the caller went around them.
			e.log.Warn("refused a command carrying text the store does not keep", "err", terr)
			cmd.refuse(terr)
			continue
		}
		err = cmd.evaluate(g)
	}
	if err == nil {
		g.setClock(wall, mono)
		err = e.advance(g)
	}
	if err == nil && (g.work || g.credit) {
		err = e.dispatchWaiting(g)
	}
	if err == nil {
		err = g.storeCounts()
	}
	return g, err
}

// commit makes the group durable through the committer, or rolls back a
// transaction that wrote nothing. It reports whether anything was
// committed.
func (e *Engine) commit(g *group) (bool, error) {
	if g.tx == nil {
		return false, nil
	}
	if !g.tx.Dirty() {
		return false, g.tx.Rollback()
	}
	failpointBeforeCommit()
	err := e.committer.Commit(g.tx, g.now)
	return err == nil, err
}

// finish publishes a group the committer made durable (or one that wrote
// nothing), then answers its requests.
func (e *Engine) finish(g *group, batch []*request, committed bool, mono time.Duration, start time.Time) {
	e.noteStall(mono, e.cfg.Mono())
	if committed && len(g.deliveries) > 0 {
		failpointGrantsUnpublished()
	}
	// Publish before answering, so that a caller who sees its answer can
	// rely on watchers, renderers' streams, health and metrics having been
	// told.
	e.publish(g)
	if committed {
		failpointAfterCommit()
	}
	// Before the answers, like the rest: a caller that sees its answer
	// sees it in the overview too, unless the overview was published less
	// than Config.OverviewEvery ago (then the writer's timer publishes it).
	e.maybePublishOverview(len(batch) > 0 || g.tx != nil, g.dispatch, g.now, g.mono)
	// A timer that found nothing due is no group.
	if len(batch) > 0 || committed {
		e.m.group(len(batch), time.Since(start))
	}
	for _, r := range batch {
		r.done <- r.cmd.outcome()
	}
}

// failStop stops the writer after a failed commit: nothing of the group is
// acknowledged. A full disk is told apart so that callers and health can
// say so.
func (e *Engine) failStop(g *group, batch []*request, err error) {
	if g.tx != nil {
		_ = g.tx.Rollback()
	}
	why := ErrStorageFailed
	if errors.Is(err, syscall.ENOSPC) {
		why = fmt.Errorf("%w: %w", ErrStorageFull, ErrStorageFailed)
	}
	e.failErr.Store(&why)
	e.serving.Store(false)
	close(e.failedC)
	e.log.Error("commit failed; writer stopped, acknowledging nothing", "err", err, "commands", len(batch))
	for _, r := range batch {
		r.done <- why
	}
}

// publish hands the group's committed effects to watchers and to
// renderers' connections.
func (e *Engine) publish(g *group) {
	for _, ev := range g.events {
		e.hub.Publish(ev)
	}
	e.m.tally(g.tallies)
	if g.purged != (PurgeResult{}) {
		e.m.purgedN(g.purged)
	}
	for r, list := range g.revocations {
		for _, c := range e.conns.byRenderer[r] {
			c.Outbox.pushRevoked(list)
		}
	}
	for c, gs := range g.deliveries {
		c.Outbox.pushGrants(gs)
	}
	if g.dispatch && e.cfg.OnDispatch != nil {
		e.cfg.OnDispatch(e.DispatchState())
	}
	e.m.snapshot()
}

// advance expires every lease whose deadline has passed and re-queues
// every job whose backoff has elapsed by the group's clock, so that
// "expired" is decided in the writer's order, before the command sent at
// that time.
func (e *Engine) advance(g *group) error {
	for {
		it, ok := e.leaseQ.peek()
		if !ok || it.at > g.mono {
			break
		}
		heap.Pop(&e.leaseQ)
		le := e.leases[it.job]
		if le == nil || le.token != it.token || le.deadline != it.at || e.deferred(it.job, le, g.mono) {
			continue
		}
		if err := e.expire(g, it.job, le); err != nil {
			return err
		}
	}
	for {
		it, ok := e.retryQ.peek()
		if !ok || it.at > g.mono {
			break
		}
		heap.Pop(&e.retryQ)
		if at, waiting := e.retryAt[it.job]; !waiting || at != it.at {
			continue
		}
		// Load before leaving the retry index: load translates the retry
		// time from the monotonic clock into the wall frame Requeue judges.
		j, found, err := g.load(it.job)
		delete(e.retryAt, it.job)
		if err != nil {
			return err
		}
		if !found {
			continue
		}
		next, err := j.Requeue(g.now)
		if err != nil {
			e.log.Error("retry index disagrees with the store", "job", it.job, "err", err)
			continue
		}
		if err := g.save(j, next); err != nil {
			return err
		}
		e.sched.Push(next.Team, next.ID)
		g.work = true
	}
	return nil
}

// expire ends a lease whose deadline passed: counted, or re-queued
// uncounted when its holder was never heard from.
func (e *Engine) expire(g *group, id uint64, le *leaseEntry) error {
	j, found, err := g.load(id)
	if err != nil {
		return err
	}
	// A lease dropped from the index leaves its team's leases in flight
	// too, which count every entry of the index.
	if !found {
		delete(e.leases, id)
		e.sched.Release(le.team)
		return nil
	}
	next, err := j.Expire(g.now, e.jitter(), le.heard)
	if err != nil {
		e.log.Error("lease index disagrees with the store", "job", id, "err", err)
		delete(e.leases, id)
		e.sched.Release(le.team)
		return nil
	}
	if err := g.save(j, next); err != nil {
		return err
	}
	e.endLease(g, j, next)
	return nil
}

// endLease updates the indexes after a LEASED job moved on to next.
func (e *Engine) endLease(g *group, before, next jobs.Job) {
	delete(e.leases, before.ID)
	e.sched.Release(before.Team)
	g.work = true
	switch next.Phase {
	case jobs.PhaseRetryWait:
		e.trackRetry(next.ID, g.monoOf(next.NextAttemptAt))
	case jobs.PhaseQueued:
		e.sched.Push(next.Team, next.ID)
	}
}

// Tick runs one empty group: due leases expire and due retries re-queue.
// The writer does this by itself on a timer; tests with an injected clock
// call it after moving the clock.
func (e *Engine) Tick(ctx context.Context) error {
	return e.do(ctx, &tickCmd{})
}

type tickCmd struct {
	base
	noText
}

func (c *tickCmd) evaluate(*group) error { return nil }
