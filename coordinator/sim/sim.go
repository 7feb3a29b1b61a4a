package sim

import (
	"container/heap"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime/debug"
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/engine"
)

// Defaults for Config.
const (
	DefaultSteps          = 20_000
	DefaultFullCheckEvery = 2000
	// quiescentLimit bounds the simulated time the quiescent phase may take
	// to finish every job before the run fails as not live.
	quiescentLimit = 2 * time.Hour
)

// epoch is where every run's wall clock starts.
var epoch = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// Config configures one simulated run.
type Config struct {
	// Seed determines the run: the same seed replays it step for step.
	Seed uint64
	// Steps is how many scheduler steps the faulty phase takes (0:
	// DefaultSteps). The quiescent phase that follows runs until every job
	// has ended.
	Steps int
	// Dir is the directory the run keeps its bbolt file in; it must exist
	// and hold no other run's file.
	Dir string
	// Sync fsyncs every commit, as the coordinator does. Without it the
	// file is opened with bbolt's NoSync (see the package documentation).
	Sync bool
	// FullCheckEvery runs the whole-store checks after this many committed
	// events, and at least eight per job stored (so that they cost a
	// bounded share of the run), besides at the end; a restart checks
	// every job and index (0: DefaultFullCheckEvery).
	FullCheckEvery int
	// Shadow replicates every committed group's write set onto a second
	// bbolt file in Dir and fails the run when the two stores' digests
	// differ after a group (package shadow). The shadow outlives
	// the coordinator's crashes, as a replica outlives its leader's.
	Shadow bool
	// Cluster runs three coordinator nodes, each over its own bbolt file
	// in Dir, replicated by a seeded consensus oracle in place of raft
	// (see the package documentation). It excludes Shadow.
	Cluster bool
	// Trace, when set, is told what happens at every step.
	Trace func(format string, args ...any)
}

// Result counts what a run did.
type Result struct {
	// Steps is the scheduler steps taken, both phases.
	Steps int
	// Groups is the writer groups committed.
	Groups int
	// Lifecycles is the job cycles that ended (SUCCEEDED, FAILED or
	// CANCELLED), replayed ones counted again.
	Lifecycles int
	// Jobs is the jobs submitted.
	Jobs int
	// Restarts counts coordinator crashes and fail-stops; StorageFaults the
	// commits failed on purpose.
	Restarts, StorageFaults int
	// Rejected counts completions refused by the fencing check; Replayed
	// those answered as already applied.
	Rejected, Replayed int
	// SimTime is the simulated time the run took.
	SimTime time.Duration
	// Shadowed is the groups replicated onto the shadow store and found
	// equal (Config.Shadow).
	Shadowed int
	// Cluster mode: Elections counts the leaders the oracle elected;
	// Unknown the groups whose commit outcome was unknown, of which
	// LateCommits committed under a later leader and Vanished were cut
	// from every log; NotCommitted the groups raft refused at once;
	// Injected the entries of a second proposer, each refused by the base
	// guard; Reads the reads served, StaleRefused those refused because
	// the node could not verify its leadership; BatchesLost the crashes
	// of a node whose state machine held an open batch of applied
	// entries, and BatchEntriesLost those entries, applied again from
	// the log after the restart.
	Elections, Unknown, LateCommits, Vanished, NotCommitted, Injected int
	Reads, StaleRefused, BatchesLost, BatchEntriesLost                int
}

// Add adds r2's counts to r.
func (r *Result) Add(r2 Result) {
	r.Steps += r2.Steps
	r.Groups += r2.Groups
	r.Lifecycles += r2.Lifecycles
	r.Jobs += r2.Jobs
	r.Restarts += r2.Restarts
	r.StorageFaults += r2.StorageFaults
	r.Rejected += r2.Rejected
	r.Replayed += r2.Replayed
	r.SimTime += r2.SimTime
	r.Shadowed += r2.Shadowed
	r.Elections += r2.Elections
	r.Unknown += r2.Unknown
	r.LateCommits += r2.LateCommits
	r.Vanished += r2.Vanished
	r.NotCommitted += r2.NotCommitted
	r.Injected += r2.Injected
	r.Reads += r2.Reads
	r.StaleRefused += r2.StaleRefused
	r.BatchesLost += r2.BatchesLost
	r.BatchEntriesLost += r2.BatchEntriesLost
}

// Failure is a broken invariant, or a panic, found by a run: where it was
// found and what broke. The same Config replays it exactly.
type Failure struct {
	Seed uint64
	Step int
	At   time.Duration
	Msg  string
}

// Error implements error.
func (f *Failure) Error() string {
	return fmt.Sprintf("seed %d, step %d (simulated %v): %s", f.Seed, f.Step, f.At, f.Msg)
}

// Run runs one simulation: a faulty phase of cfg.Steps scheduler steps, in
// which every actor and fault is enabled, then a quiescent phase without
// faults that must bring every job to a terminal phase. Every invariant is
// checked after every writer group. It returns what the run did and a
// *Failure for the first invariant broken.
func Run(cfg Config) (res Result, err error) {
	if cfg.Dir == "" {
		return res, errors.New("sim: Config.Dir is required")
	}
	if cfg.Cluster && cfg.Shadow {
		return res, errors.New("sim: Config.Cluster and Config.Shadow exclude each other: every node of a cluster is a replica")
	}
	if cfg.Steps <= 0 {
		cfg.Steps = DefaultSteps
	}
	if cfg.FullCheckEvery <= 0 {
		cfg.FullCheckEvery = DefaultFullCheckEvery
	}
	w := newWorld(cfg)
	defer func() {
		for _, n := range w.nodes {
			n.shutdown()
		}
		res = w.res
		res.Steps, res.SimTime = w.step, w.now
		if p := recover(); p != nil {
			f, ok := p.(*Failure)
			if !ok {
				f = &Failure{Seed: cfg.Seed, Step: w.step, At: w.now, Msg: fmt.Sprintf("panic: %v\n%s", p, debug.Stack())}
			}
			err = f
		}
	}()
	w.run()
	return res, nil
}

// world is one simulated run: the clock, the agenda of what happens next,
// the coordinator, the actors around it and the checker that watches.
type world struct {
	cfg Config
	rng *rand.Rand
	// batchRng decides when a follower's open batch commits: a stream of
	// its own, so that holding batches shifts none of the draws that
	// shape the rest of a seed's run.
	batchRng *rand.Rand
	// now is the simulated time since the run began.
	now    time.Duration
	seq    uint64
	agenda agenda
	step   int
	// faults is set during the faulty phase.
	faults bool
	res    Result

	// coord is the single node; nodes are every node (coord alone, or
	// the cluster's three), and raft the cluster's consensus oracle.
	coord      *coordinator
	nodes      []*coordinator
	raft       *consensus
	check      *checker
	renderers  []*renderer
	unary      []*unaryRenderer
	submitters []*submitter
	op         *operator
	reader     *reader
}

func newWorld(cfg Config) *world {
	w := &world{cfg: cfg, rng: rand.New(rand.NewPCG(cfg.Seed, 0x5eed_1ea5e401d)),
		batchRng: rand.New(rand.NewPCG(cfg.Seed, 0xba7c_4e5)), faults: true}
	w.check = newChecker(w)
	if cfg.Cluster {
		w.raft = newConsensus(w, clusterSize)
		w.nodes = w.raft.nodes
	} else {
		w.coord = newCoordinator(w)
		w.nodes = []*coordinator{w.coord}
	}
	nTeams := 2 + w.rng.IntN(2)
	for i := range nTeams {
		team := fmt.Sprintf("team-%c", 'a'+i)
		for range 1 + w.rng.IntN(2) {
			w.submitters = append(w.submitters, newSubmitter(w, team, len(w.submitters)))
		}
	}
	for i := range 3 + w.rng.IntN(3) {
		w.renderers = append(w.renderers, newRenderer(w, fmt.Sprintf("r-%d", i+1), 8+w.rng.IntN(57)))
	}
	w.unary = append(w.unary, newUnaryRenderer(w, "u-1", 2+w.rng.IntN(6)))
	w.op = newOperator(w)
	if cfg.Cluster {
		w.reader = &reader{w: w}
	}
	return w
}

// run starts everyone and steps until the quiescent phase ends.
func (w *world) run() {
	for _, n := range w.nodes {
		n.start()
	}
	if w.raft != nil {
		w.raft.begin()
	}
	for _, s := range w.submitters {
		s.start()
	}
	for _, r := range w.renderers {
		r.start()
	}
	for _, u := range w.unary {
		u.start()
	}
	w.op.start()
	if w.reader != nil {
		w.reader.start()
	}
	for w.step < w.cfg.Steps {
		w.stepOnce()
	}
	w.quiesce()
	deadline := w.now + quiescentLimit
	for !w.settled() {
		if w.now > deadline || len(w.agenda) == 0 {
			w.failf("not live: %s %v after the faults stopped", w.check.unfinishedSummary(), w.now-(deadline-quiescentLimit))
		}
		if w.raft != nil {
			w.raft.checkLive()
		}
		w.stepOnce()
	}
	w.final()
}

// stepOnce takes the next thing that happens off the agenda.
func (w *world) stepOnce() {
	ev := heap.Pop(&w.agenda).(*event)
	w.now = ev.at
	w.step++
	ev.fn()
}

// quiesce ends the faulty phase: no more losses, long delays, crashes,
// pauses or impostors; new work stops, what was submitted must finish.
func (w *world) quiesce() {
	w.faults = false
	w.tracef("faults stop")
	w.op.quiesce()
}

// settled reports whether the quiescent phase is done: every submission
// acknowledged, every job ended, dispatch running (and, in cluster mode,
// every node up and reachable under a leader).
func (w *world) settled() bool {
	if w.raft != nil && !w.raft.settled() {
		return false
	}
	if (w.raft == nil && !w.coord.up) || w.check.nonTerminal > 0 || w.op.pauseWanted() {
		return false
	}
	for _, s := range w.submitters {
		if !s.settled() {
			return false
		}
	}
	return true
}

// final checks the end of a settled run.
func (w *world) final() {
	if w.raft != nil {
		w.raft.final()
		return
	}
	w.check.final(w.coord)
}

// failf stops the run with a broken invariant.
func (w *world) failf(format string, args ...any) {
	panic(&Failure{Seed: w.cfg.Seed, Step: w.step, At: w.now, Msg: fmt.Sprintf(format, args...)})
}

func (w *world) tracef(format string, args ...any) {
	if w.cfg.Trace != nil {
		w.cfg.Trace("%6d %12v "+format, append([]any{w.step, w.now}, args...)...)
	}
}

// after schedules fn d from now.
func (w *world) after(d time.Duration, fn func()) {
	w.seq++
	heap.Push(&w.agenda, &event{at: w.now + max(d, 0), seq: w.seq, fn: fn})
}

// wall is the wall clock: it moves with simulated time.
func (w *world) wall() time.Time { return epoch.Add(w.now) }

// target is the node a client's call or stream goes to: the single node,
// or in cluster mode one the client's health checks say leads.
func (w *world) target() *coordinator {
	if w.raft == nil {
		return w.coord
	}
	return w.raft.target()
}

// leadershipErr reports whether err is a refusal of a cluster's writer
// that lost, or never had, leadership: the command was not applied, or
// may have been (ErrOutcomeUnknown). Callers retry it; in single-node
// mode no such answer is legal.
func (w *world) leadershipErr(err error) bool {
	return w.raft != nil && (errors.Is(err, engine.ErrNotLeader) || errors.Is(err, engine.ErrOutcomeUnknown))
}

// dispatchPaused reports whether dispatch is, or may be, paused: as the
// leader's writer says, and in cluster mode while no writer leads.
func (w *world) dispatchPaused() bool {
	if w.raft == nil {
		return w.coord.up && w.coord.e.DispatchState().Paused
	}
	l := w.raft.leading()
	return l == nil || l.e.DispatchState().Paused
}

// chance reports true with probability p.
func (w *world) chance(p float64) bool { return w.rng.Float64() < p }

// faulty reports true with probability p during the faulty phase.
func (w *world) faulty(p float64) bool { return w.faults && w.rng.Float64() < p }

// between draws a duration uniformly from [lo, hi).
func (w *world) between(lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo
	}
	return lo + time.Duration(w.rng.Int64N(int64(hi-lo)))
}

// pick returns a uniformly drawn index below n (n > 0).
func (w *world) pick(n int) int { return w.rng.IntN(n) }

// event is one thing that happens at a simulated time; seq orders events
// at the same time by when they were scheduled.
type event struct {
	at  time.Duration
	seq uint64
	fn  func()
}

type agenda []*event

func (a agenda) Len() int { return len(a) }
func (a agenda) Less(i, j int) bool {
	if a[i].at != a[j].at {
		return a[i].at < a[j].at
	}
	return a[i].seq < a[j].seq
}
func (a agenda) Swap(i, j int) { a[i], a[j] = a[j], a[i] }
func (a *agenda) Push(x any)   { *a = append(*a, x.(*event)) }
func (a *agenda) Pop() any {
	old := *a
	ev := old[len(old)-1]
	old[len(old)-1] = nil
	*a = old[:len(old)-1]
	return ev
}
