package sim

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/cluster"
	"github.com/leasehold/leasehold/coordinator/internal/store"
	"github.com/leasehold/leasehold/coordinator/internal/watch"
	"google.golang.org/grpc"
)

// The cluster's size and raft's timing, scaled from the coordinator's
// production settings (HeartbeatTimeout and ElectionTimeout 500 ms,
// LeaderLeaseTimeout 250 ms) to the simulation's lease TTL.
const (
	clusterSize = 3
	quorum      = clusterSize/2 + 1
	// heartbeatTimeout is how long a follower waits without hearing from
	// the leader before it stands for election (a timer re-armed at random
	// in [heartbeatTimeout, 2·heartbeatTimeout), as raft's).
	heartbeatTimeout = leaseTTL / 10
	electionTimeout  = leaseTTL / 10
	// leaderLease is how long a leader that hears from no quorum goes on
	// believing it leads before it steps down.
	leaderLease = leaseTTL / 20
	// failoverExtend is what a promotion gives every live lease on top of
	// its TTL, as package cluster computes it (cluster.Start): a heartbeat
	// timeout to notice the failover and two elections to settle it.
	failoverExtend = heartbeatTimeout + 2*electionTimeout
)

// Consensus odds during the faulty phase.
const (
	// pInFlight, per entry a leader proposes: leadership is lost with the
	// entry in flight (the leader dies, is cut off, or a follower's
	// election timer fires), after it reached some of the followers. Its
	// outcome is unknown: it commits if the next leader holds it.
	pInFlight = 0.008
	// pRefused, per entry: raft refuses it at once (an enqueue timeout, a
	// leadership transfer under way); it was not committed, and the node
	// still leads.
	pRefused = 0.002
	// pSlowFollower, per entry and follower beyond the quorum: the
	// follower gets the entry only with a later one.
	pSlowFollower = 0.05
	// pApplyLag, per catch-up: a follower's store falls behind its log
	// for a while.
	pApplyLag = 0.02
	// pBatchCommit, per catch-up of a follower: its state machine's open
	// batch commits after it (the follower's timer fires); otherwise the
	// batch stays open into the next catch-up, as a follower's does
	// within 100 ms of entries, and a crash loses it.
	pBatchCommit = 0.3
	// pHeardFirst, per entry a deposed leader that can reach the new one
	// proposes: raft on it hears of the newer term and applies what the
	// new leader committed before its writer hears that its entry was
	// lost, while the writer's evaluated group still waits for its entry.
	pHeardFirst = 0.5
)

// peer is a cluster node's raft side and process state, as the oracle
// keeps it. The log survives the node's crashes, as raft's durable log
// does; the rest of what raft keeps in memory does not.
type peer struct {
	// log holds the node's entries from consensus.base+1 on: a prefix of
	// the committed log, and perhaps a tail of entries no quorum holds.
	log []*entry
	// term is the latest term the node knows; raftLeader is set while
	// raft on the node believes it leads that term.
	term       uint64
	raftLeader bool
	// knownCommit is the commit index the node has heard of; applied is
	// the index of the last entry applied to its store.
	knownCommit, applied uint64
	// fsm is the process's state machine over its store, steps its
	// leadership, and consistency the read path's interceptor: the real
	// code of package cluster and of the gRPC server (raft.go).
	fsm         *cluster.FSM
	steps       *cluster.Steps
	consistency grpc.UnaryServerInterceptor
	// serving is the node's Leader health entry as clients last saw it:
	// set by a promotion, cleared by a demotion or a crash.
	serving bool
	// paused is set while the process is stopped; deferred holds what
	// reached it meanwhile, run in order when it resumes. isolated is set
	// while the network cuts the node off from its peers (not from its
	// clients).
	paused   bool
	deferred []func()
	isolated bool
	// applySet is set while a catch-up of the store is scheduled;
	// crashNow kills the process once the step in progress returns;
	// barrierWait is set while a promotion waits for its barrier.
	applySet, crashNow, barrierWait bool
}

// entry is one raft log entry: a group's write set, or a new leader's
// no-op (ws nil).
type entry struct {
	index, term uint64
	ws          []byte
	proposer    *coordinator
	// events are the job events the proposer's group evaluated, kept when
	// its outcome was unknown (unknown), for the checker to check if the
	// entry commits; fed is set once the checker has them, or needs none.
	events       []watch.JobEvent
	unknown, fed bool
	injected     bool
	vanished     bool
	staleApplied bool
}

// consensus is the oracle that replaces raft in cluster mode: it holds
// every node's log, the commit index and the leader, and decides from the
// run's seed every outcome raft allows: an entry committed (applied to
// every reachable node's store, at once on the leader and with a lag on
// the followers), refused, or left with its outcome unknown; leaders that
// crash, stop, are cut off or hand over; elections, won by a node with
// the most up-to-date log among a reachable quorum (raft's election
// restriction), which commit what that log holds and truncate the
// divergent tails of the others.
type consensus struct {
	w     *world
	nodes []*coordinator
	term  uint64
	// leader is the node elected for term, nil until one is.
	leader *coordinator
	// base is the index of the last entry compacted out of every log (all
	// nodes applied it), baseTerm its term; committed holds the committed
	// entries after base, up to commit.
	base, baseTerm uint64
	commit         uint64
	committed      []*entry
	// pending is the entry the step in progress proposed.
	pending  *entry
	electSet bool
	// ledAt is when a promoted writer was last seen leading, during the
	// quiescent phase.
	ledAt time.Duration
	// checkpoints are store digests at applied indexes, for the nodes
	// behind them to compare with when they reach them.
	checkpoints []checkpoint
}

type checkpoint struct {
	index  uint64
	digest [32]byte
	by     string
}

func newConsensus(w *world, n int) *consensus {
	k := &consensus{w: w}
	for i := range n {
		c := newCoordinator(w)
		c.name = fmt.Sprintf("n%d", i+1)
		c.path = filepath.Join(w.cfg.Dir, c.name+".db")
		k.nodes = append(k.nodes, c)
	}
	return k
}

// begin starts the first election and the faults.
func (k *consensus) begin() {
	k.electSoon(k.electionDelay())
	k.w.after(k.w.between(2*leaseTTL, 4*leaseTTL), k.chaos)
}

// electionDelay draws how long followers take to elect a leader once
// they stop hearing from one.
func (k *consensus) electionDelay() time.Duration {
	w := k.w
	return w.between(heartbeatTimeout, 2*heartbeatTimeout) + w.between(time.Millisecond, electionTimeout/10)
}

// reachable reports whether n takes part in raft: up, running, and
// connected to its peers.
func (k *consensus) reachable(n *coordinator) bool { return n.up && !n.paused && !n.isolated }

func (k *consensus) quorate() bool {
	r := 0
	for _, n := range k.nodes {
		if k.reachable(n) {
			r++
		}
	}
	return r >= quorum
}

// leads reports whether n leads the latest term and reaches a quorum: an
// entry it proposes now commits.
func (k *consensus) leads(n *coordinator) bool {
	return n != nil && n == k.leader && n.raftLeader && n.term == k.term && k.reachable(n) && k.quorate()
}

// leading returns the node that leads and whose writer is promoted, or nil.
func (k *consensus) leading() *coordinator {
	if l := k.leader; k.leads(l) && l.e.Leading() {
		return l
	}
	return nil
}

// settled reports whether the cluster is whole again: every node up,
// running and reachable, under a promoted leader.
func (k *consensus) settled() bool {
	for _, n := range k.nodes {
		if !k.reachable(n) {
			return false
		}
	}
	return k.leading() != nil
}

// leaderlessLimit bounds how long the cluster may go without a promoted
// leader once the faults have stopped: every node is back within a lease
// TTL, and an election takes a fraction of one.
const leaderlessLimit = 10 * leaseTTL

// checkLive fails a quiescent run that has had no promoted leader for
// leaderlessLimit.
func (k *consensus) checkLive() {
	w := k.w
	switch {
	case k.leading() != nil || k.ledAt == 0:
		k.ledAt = w.now
	case w.now-k.ledAt > leaderlessLimit:
		w.failf("not live: no writer has led for %v after the faults stopped (leader %v, term %d)", w.now-k.ledAt, k.leader != nil, k.term)
	}
}

// target is the node a client's call goes to: one whose Leader health
// entry it last saw SERVING (a stopped leader's stays so), or any node
// when none does, which refuses it.
func (k *consensus) target() *coordinator {
	serving := 0
	for _, n := range k.nodes {
		if n.up && n.serving {
			serving++
		}
	}
	if serving == 0 {
		return k.nodes[k.w.pick(len(k.nodes))]
	}
	i := 0
	if serving > 1 {
		i = k.w.pick(serving)
	}
	for _, n := range k.nodes {
		if n.up && n.serving {
			if i == 0 {
				return n
			}
			i--
		}
	}
	panic("unreachable")
}

func (k *consensus) last(n *coordinator) uint64 { return k.base + uint64(len(n.log)) }

func (k *consensus) lastTerm(n *coordinator) uint64 {
	if len(n.log) == 0 {
		return k.baseTerm
	}
	return n.log[len(n.log)-1].term
}

// atLeastAsUpToDate is raft's comparison of two logs' ends.
func (k *consensus) atLeastAsUpToDate(a, b *coordinator) bool {
	ta, tb := k.lastTerm(a), k.lastTerm(b)
	return ta > tb || (ta == tb && k.last(a) >= k.last(b))
}

// started takes a node whose process (re)started as a follower: it reads
// what its store applied, and rejoins the cluster.
func (k *consensus) started(n *coordinator) {
	rs, err := n.st.ReplicaState()
	if err != nil {
		k.w.failf("%s: reading the replica state: %v", n.name, err)
	}
	// Entries up to base are applied on every node: those of them that
	// are write sets are in the store.
	n.applied = max(rs.Applied, k.base)
	n.raftLeader, n.serving, n.paused, n.deferred, n.applySet, n.crashNow, n.barrierWait = false, false, false, nil, false, false, false
	n.knownCommit = 0
	k.rejoinSoon(n)
}

// down takes a node whose process died: raft on it is gone, and its
// followers elect another leader once they notice.
func (k *consensus) down(n *coordinator) {
	n.raftLeader, n.serving, n.paused, n.deferred = false, false, false, nil
	if k.leader == n {
		k.leader = nil
		k.electSoon(k.electionDelay())
	}
	k.leaseCheck()
}

// leaseCheck has a leader that can no longer reach a quorum step down
// once the leader lease has passed without one (raft's checkLeaderLease).
func (k *consensus) leaseCheck() {
	l := k.leader
	if l == nil || !l.up || (k.reachable(l) && k.quorate()) {
		return
	}
	inc := l.incarnation
	k.w.after(leaderLease, func() {
		l.alive(inc, func() {
			if l.raftLeader && (!k.reachable(l) || !k.quorate()) {
				k.depose(l, "heard from no quorum for the leader lease")
			}
		})
	})
}

// rejoinSoon has n hear from its peers an RTT from now.
func (k *consensus) rejoinSoon(n *coordinator) {
	inc := n.incarnation
	k.w.after(k.w.between(time.Millisecond, 5*time.Millisecond), func() { n.alive(inc, func() { k.rejoin(n) }) })
}

// rejoin brings a node that can reach its peers again up to date: a
// leader of an older term learns of the newer one and steps down; the
// leader replicates its log to it; without a leader, an election.
func (k *consensus) rejoin(n *coordinator) {
	if !k.reachable(n) {
		return
	}
	l := k.leader
	if n.raftLeader && (l != n || n.term < k.term) {
		k.depose(n, fmt.Sprintf("term %d has begun", k.term))
	}
	switch {
	case l != nil && l != n && k.leads(l):
		k.replicate(l, n)
		n.knownCommit = k.commit
		k.applySoon(n)
	case !k.leads(l):
		k.electSoon(k.electionDelay())
	}
}

// electSoon sets an election for d from now, unless one is set.
func (k *consensus) electSoon(d time.Duration) {
	if k.electSet {
		return
	}
	k.electSet = true
	k.w.after(d, func() {
		k.electSet = false
		k.elect(nil)
	})
}

// elect elects a leader, unless one leads: among the reachable nodes, if
// they are a quorum, one with the most up-to-date log (prefer, when it is
// one of those: a leadership transfer's target). Every reachable node
// enters the new term; the winner appends a no-op, replicates its log to
// them (truncating divergent tails) and commits it, which commits every
// entry before it, of earlier terms too; it is promoted shortly after.
func (k *consensus) elect(prefer *coordinator) {
	w := k.w
	if k.leads(k.leader) {
		return
	}
	var voters, best []*coordinator
	for _, n := range k.nodes {
		if k.reachable(n) {
			voters = append(voters, n)
		}
	}
	if len(voters) < quorum {
		k.electSoon(k.electionDelay())
		return
	}
	for _, n := range voters {
		switch {
		case len(best) == 0 || !k.atLeastAsUpToDate(best[0], n):
			best = append(best[:0], n)
		case k.atLeastAsUpToDate(n, best[0]):
			best = append(best, n)
		}
	}
	winner := best[w.pick(len(best))]
	if prefer != nil && slices.Contains(best, prefer) {
		winner = prefer
	}
	k.term++
	for _, n := range voters {
		k.depose(n, fmt.Sprintf("term %d has begun", k.term))
		n.term = k.term
	}
	k.leader = winner
	winner.raftLeader = true
	winner.log = append(winner.log, &entry{index: k.last(winner) + 1, term: k.term, fed: true})
	for _, n := range voters {
		if n != winner {
			k.replicate(winner, n)
		}
	}
	k.advanceCommit(winner, k.last(winner))
	for _, n := range voters {
		n.knownCommit = k.commit
		if n != winner {
			k.applySoon(n)
		}
	}
	w.res.Elections++
	winner.tracef("elected leader of term %d (log %d, commit %d)", k.term, k.last(winner), k.commit)
	// The coordinator hears of it, applies every committed entry (the
	// barrier), and promotes its writer.
	inc, term := winner.incarnation, k.term
	w.after(w.between(time.Millisecond, 10*time.Millisecond), func() { winner.alive(inc, func() { winner.promote(term) }) })
}

// depose makes raft on n step down, and the coordinator demote n's writer
// shortly after, as it hears of it; a leader lost brings an election.
func (k *consensus) depose(n *coordinator, why string) {
	if !n.raftLeader {
		return
	}
	n.raftLeader = false
	n.tracef("steps down: %s", why)
	if k.leader == n {
		k.leader = nil
		k.electSoon(k.electionDelay())
	}
	if n.up && n.e.Leading() {
		inc := n.incarnation
		k.w.after(k.w.between(0, time.Millisecond), func() { n.alive(inc, n.demote) })
	}
}

// replicate makes to's log match from's, the leader's: a divergent tail,
// which no quorum ever held, is cut.
func (k *consensus) replicate(from, to *coordinator) {
	i := 0
	for i < len(to.log) && i < len(from.log) && to.log[i] == from.log[i] {
		i++
	}
	if i < len(to.log) {
		// What is cut was never committed, nor applied: the leader holds
		// every committed entry (raft's leader completeness).
		if (i < len(k.committed) && to.log[i] == k.committed[i]) || to.applied > k.base+uint64(i) {
			k.w.failf("consensus: %s's log would lose entry %d, committed or applied", to.name, k.base+uint64(i)+1)
		}
		for _, e := range to.log[i:] {
			if e.unknown && e.proposer == to && !e.vanished {
				e.vanished = true
				k.w.res.Vanished++
			}
		}
		to.log = slices.Clip(to.log[:i])
	}
	to.log = append(to.log, from.log[i:]...)
	if to.term < from.term {
		to.term = from.term
		if to.raftLeader {
			k.depose(to, fmt.Sprintf("term %d has begun", from.term))
		}
	}
}

// advanceCommit commits leader l's log up to index to. Entries of an
// earlier leader committed so (their outcome was unknown to it) are
// checked now; the step in progress checks its own.
func (k *consensus) advanceCommit(l *coordinator, to uint64) {
	for k.commit < to {
		e := l.log[k.commit-k.base]
		k.committed = append(k.committed, e)
		k.commit++
		if e.ws != nil && e != k.pending && !e.fed {
			e.fed = true
			k.w.res.LateCommits++
			k.w.check.committed(e.events)
		}
	}
	l.knownCommit = k.commit
	k.compact()
}

// compact drops the entries every node applied from every log.
func (k *consensus) compact() {
	const keep = 512
	low := k.commit
	for _, n := range k.nodes {
		low = min(low, n.applied)
	}
	if low < k.base+2*keep {
		return
	}
	// Raft truncates a log only behind a snapshot of the store, and
	// FSM.Snapshot commits the open batch first: a node restarted later
	// replays from its store's applied index, which the log still holds.
	for _, n := range k.nodes {
		if n.up {
			n.fsm.Flush()
		}
	}
	drop := int(low - k.base - keep)
	for _, n := range k.nodes {
		if len(n.log) < drop {
			k.w.failf("consensus: %s applied %d with %d entries in its log after %d", n.name, n.applied, len(n.log), k.base)
		}
		n.log = append([]*entry(nil), n.log[drop:]...)
	}
	k.baseTerm = k.committed[drop-1].term
	k.committed = append([]*entry(nil), k.committed[drop:]...)
	k.base += uint64(drop)
	k.checkpoints = slices.DeleteFunc(k.checkpoints, func(cp checkpoint) bool { return cp.index <= k.base })
}

// propose is raft's Apply on node n for one entry, a group's write set
// as the real Committer proposes it: it returns once the entry is
// committed and applied to n's store, with the state machine's response,
// or fails as raft does, with an error the Committer classifies: never
// appended (raft.ErrNotLeader, raft.ErrEnqueueTimeout), or in the log
// when leadership was lost (raft.ErrLeadershipLost: its outcome is
// unknown).
func (k *consensus) propose(n *coordinator, ws []byte) (any, error) {
	w := k.w
	if !n.raftLeader {
		// Raft on n already knows it does not lead; its writer has not
		// heard yet.
		w.res.NotCommitted++
		return nil, cluster.ErrRaftNotLeader
	}
	if w.faulty(pRefused) {
		w.res.NotCommitted++
		n.tracef("raft refuses the entry at once")
		return nil, cluster.ErrRaftEnqueueTimeout
	}
	e := &entry{index: k.last(n) + 1, term: n.term, ws: ws, proposer: n}
	n.log = append(n.log, e)
	k.pending = e
	if !k.leads(n) {
		// A leader cut off from its quorum, or deposed without knowing it:
		// no quorum acknowledges the entry, and raft fails it when it steps
		// down, which it does once it hears of the newer term or its leader
		// lease runs out (rejoin, leaseCheck). The writer is told at once,
		// though raft may first have heard from the new leader, cut the
		// entry and applied the entries committed in its place.
		w.res.Unknown++
		if l := k.leader; l != nil && l != n && k.leads(l) && k.reachable(n) && w.faulty(pHeardFirst) {
			n.tracef("hears of term %d before its writer hears its entry was lost", k.term)
			k.depose(n, fmt.Sprintf("term %d has begun", k.term))
			k.replicate(l, n)
			n.knownCommit = k.commit
			k.applyOn(n)
		}
		return nil, cluster.ErrRaftLeadershipLost
	}
	if w.faulty(pInFlight) {
		w.res.Unknown++
		for _, f := range k.nodes {
			if f != n && k.reachable(f) && w.chance(0.5) {
				k.replicate(n, f)
			}
		}
		switch x := w.rng.Float64(); {
		case x < 0.4:
			n.crashNow = true
			k.depose(n, "its process dies with an entry in flight")
		case x < 0.7:
			k.isolate(n, w.between(leaseTTL/5, leaseTTL))
			k.depose(n, "cut off with an entry in flight")
		default:
			k.depose(n, "a follower's election timer fired with an entry in flight")
		}
		return nil, cluster.ErrRaftLeadershipLost
	}
	acks := 1
	for _, f := range k.nodes {
		if f == n || !k.reachable(f) || (acks >= quorum && w.faulty(pSlowFollower)) {
			continue
		}
		k.replicate(n, f)
		acks++
	}
	k.advanceCommit(n, e.index)
	for _, f := range k.nodes {
		if f != n && k.reachable(f) {
			f.knownCommit = k.commit
			k.applySoon(f)
		}
	}
	k.applyOn(n)
	if e.staleApplied {
		return store.ErrStaleBase, nil
	}
	return nil, nil
}

// stepped hands the oracle what node n's step returned: the entry it
// proposed, if any, is committed and checked now (err nil), or keeps the
// events the group evaluated, to be checked if the entry commits later.
func (k *consensus) stepped(n *coordinator, evs []watch.JobEvent, err error) {
	e := k.pending
	k.pending = nil
	if e == nil || e.proposer != n {
		return
	}
	if err == nil || e.index <= k.commit {
		e.fed = true
		return
	}
	e.unknown, e.events = true, evs
}

// applySoon catches n's store up with what n knows is committed, after a
// lag.
func (k *consensus) applySoon(n *coordinator) {
	w := k.w
	if n.applySet || !n.up {
		return
	}
	n.applySet = true
	d := w.between(0, 40*time.Millisecond)
	if w.faulty(pApplyLag) {
		d = w.between(leaseTTL/4, leaseTTL)
	}
	inc := n.incarnation
	w.after(d, func() {
		n.alive(inc, func() {
			n.applySet = false
			k.applyOn(n)
		})
	})
}

// applyOn applies to n's store the committed entries its log holds, up to
// the commit index it knows, through n's state machine (the real
// cluster.FSM), and compares its digest at every checkpoint it reaches. A write set
// refused as evaluated on another base (ErrStaleBase) is legal only from
// an injected second proposer, which the base guard must always refuse.
func (k *consensus) applyOn(n *coordinator) {
	w := k.w
	limit := min(n.knownCommit, k.commit)
	for n.applied < limit {
		stop := limit
		var cp *checkpoint
		for i := range k.checkpoints {
			if c := &k.checkpoints[i]; c.index > n.applied && c.index <= stop {
				stop, cp = c.index, c
			}
		}
		i := n.applied
		var batch []cluster.Command
		var ents []*entry
		for i < stop {
			pos := i - k.base
			if int(pos) >= len(n.log) || n.log[pos] != k.committed[pos] {
				break
			}
			if e := n.log[pos]; e.ws != nil {
				batch = append(batch, cluster.Command{Index: e.index, Data: e.ws})
				ents = append(ents, e)
			}
			i++
		}
		if i == n.applied {
			return
		}
		if len(batch) > 0 {
			for j, r := range n.fsm.ApplyCommands(batch) {
				e := ents[j]
				refused, _ := r.(error)
				switch {
				case errors.Is(refused, store.ErrStaleBase) && !e.injected:
					w.failf("%s: entry %d, proposed by %s in term %d, was refused as evaluated on another base (ErrStaleBase), and no second proposer was injected",
						n.name, e.index, e.proposer.name, e.term)
				case r == nil && e.injected:
					w.failf("%s: entry %d of an injected second proposer was applied: the base guard let a write set of a past base through", n.name, e.index)
				case r != nil:
					e.staleApplied = true
				}
			}
		}
		n.applied = i
		if cp != nil && i == cp.index {
			k.compareDigest(n, *cp)
		}
		if i < stop {
			break
		}
	}
	if w.batchRng.Float64() < pBatchCommit {
		n.fsm.Flush()
	}
}

// checkpoint records the digest of node n's store at its applied index
// (the checker's full checks, on the leader), compares the nodes already
// there, and has those behind compare when they reach it.
func (k *consensus) checkpoint(n *coordinator) {
	d := k.digest(n)
	cp := checkpoint{index: n.applied, digest: d, by: n.name}
	behind := false
	for _, o := range k.nodes {
		switch {
		case o == n:
		case o.applied == cp.index && o.up:
			k.compareDigest(o, cp)
		case o.applied < cp.index:
			behind = true
		}
	}
	low := cp.index
	for _, o := range k.nodes {
		low = min(low, o.applied)
	}
	k.checkpoints = slices.DeleteFunc(k.checkpoints, func(c checkpoint) bool { return c.index <= low || c.index == cp.index })
	if behind {
		k.checkpoints = append(k.checkpoints, cp)
	}
}

func (k *consensus) compareDigest(n *coordinator, cp checkpoint) {
	if d := k.digest(n); d != cp.digest {
		k.w.failf("%s's store at applied index %d has digest %x, %s's had %x at the same index", n.name, cp.index, d[:8], cp.by, cp.digest[:8])
	}
}

// digest is the digest of n's store at its applied index: its state
// machine's open batch committed first, as raft's snapshot of a follower
// commits it.
func (k *consensus) digest(n *coordinator) [32]byte {
	n.fsm.Flush()
	d, err := n.st.Digest()
	if err != nil {
		k.w.failf("%s: digest: %v", n.name, err)
	}
	return d
}

// final ends a settled run: every node catches up with the leader, and
// every store must then be the leader's, record for record; the checker
// checks the leader's as at the end of a single node's run.
func (k *consensus) final() {
	l := k.leading()
	for _, n := range k.nodes {
		if n != l {
			k.replicate(l, n)
		}
		n.knownCommit = k.commit
		k.applyOn(n)
	}
	want := k.digest(l)
	for _, n := range k.nodes {
		if n.applied != l.applied {
			k.w.failf("after quiescing %s applied %d entries, the leader %s %d", n.name, n.applied, l.name, l.applied)
		}
		k.compareDigest(n, checkpoint{index: l.applied, digest: want, by: l.name})
	}
	k.w.check.final(l)
}

// chaos, during the faulty phase, now and then kills, stops or cuts off
// the leader or a follower, hands leadership over, or injects a second
// proposer's entry.
func (k *consensus) chaos() {
	w := k.w
	if !w.faults {
		return
	}
	w.after(w.between(leaseTTL/4, 3*leaseTTL/2), k.chaos)
	l := k.leading()
	var f *coordinator
	if i := w.pick(len(k.nodes)); k.nodes[i] != l {
		f = k.nodes[i]
	}
	switch x := w.rng.Float64(); {
	case x < 0.15:
		if l != nil {
			l.crash("killed while leading")
		}
	case x < 0.4:
		if l != nil {
			k.pause(l, w.between(leaseTTL/10, leaseTTL/2))
		}
	case x < 0.55:
		if l != nil {
			k.isolate(l, w.between(leaseTTL/5, leaseTTL))
		}
	case x < 0.65:
		k.transfer()
	case x < 0.72:
		if f != nil && f.up {
			f.crash("killed while following")
		}
	case x < 0.79:
		if f != nil {
			k.isolate(f, w.between(leaseTTL/5, leaseTTL))
		}
	case x < 0.86:
		if f != nil {
			k.pause(f, w.between(leaseTTL/10, leaseTTL/2))
		}
	default:
		k.inject()
	}
}

// pause stops n's process for d (SIGSTOP): nothing runs on it, what
// reaches it waits, and its followers elect another leader if it led and
// the pause outlasts their heartbeat timeout. When it resumes it first
// runs what waited, as a process does before it hears from its peers.
func (k *consensus) pause(n *coordinator, d time.Duration) {
	w := k.w
	if !n.up || n.paused {
		return
	}
	n.paused = true
	n.tracef("stopped for %v", d)
	if k.leader == n {
		k.electSoon(k.electionDelay())
	} else {
		k.leaseCheck()
	}
	inc := n.incarnation
	w.after(d, func() {
		if !n.up || n.incarnation != inc {
			return
		}
		n.paused = false
		n.tracef("resumes")
		fns := n.deferred
		n.deferred = nil
		for _, fn := range fns {
			fn()
		}
		k.rejoinSoon(n)
	})
}

// isolate cuts n off from its peers for d, not from its clients. A leader
// steps down once it has heard from no quorum for the leader lease; the
// others elect another.
func (k *consensus) isolate(n *coordinator, d time.Duration) {
	w := k.w
	if n.isolated {
		return
	}
	n.isolated = true
	n.tracef("cut off from its peers for %v", d)
	if n.raftLeader {
		inc := n.incarnation
		w.after(leaderLease, func() {
			n.alive(inc, func() {
				if n.isolated {
					k.depose(n, "heard from no quorum for the leader lease")
				}
			})
		})
	}
	if k.leader == n {
		k.electSoon(k.electionDelay())
	} else {
		k.leaseCheck()
	}
	w.after(d, func() {
		n.isolated = false
		n.tracef("reconnected to its peers")
		if n.up {
			k.rejoinSoon(n)
		}
	})
}

// transfer hands leadership to a reachable follower, which raft first
// brings up to date (raft.LeadershipTransfer).
func (k *consensus) transfer() {
	w := k.w
	l := k.leading()
	if l == nil {
		return
	}
	var to []*coordinator
	for _, n := range k.nodes {
		if n != l && k.reachable(n) {
			to = append(to, n)
		}
	}
	if len(to) == 0 {
		return
	}
	t := to[w.pick(len(to))]
	k.replicate(l, t)
	t.knownCommit = k.commit
	k.applySoon(t)
	k.depose(l, "hands leadership over to "+t.name)
	w.after(w.between(time.Millisecond, 5*time.Millisecond), func() { k.elect(t) })
}

// commitAll commits every entry of leader l's log, as an entry appended
// after them does once a quorum holds it, and applies them to l's store.
func (k *consensus) commitAll(l *coordinator) {
	for _, f := range k.nodes {
		if f != l && k.reachable(f) {
			k.replicate(l, f)
		}
	}
	k.advanceCommit(l, k.last(l))
	for _, f := range k.nodes {
		if f != l && k.reachable(f) {
			f.knownCommit = k.commit
			k.applySoon(f)
		}
	}
	k.applyOn(l)
}

// inject has a second proposer slip into the leader's log a write set
// committed before, evaluated on a base long past: the base guard must
// refuse it on every node, changing nothing.
func (k *consensus) inject() {
	w := k.w
	l := k.leading()
	if l == nil {
		return
	}
	var old []*entry
	for i := len(k.committed) - 1; i >= 0 && len(old) < 8; i-- {
		if e := k.committed[i]; e.ws != nil {
			old = append(old, e)
		}
	}
	if len(old) == 0 {
		return
	}
	o := old[w.pick(len(old))]
	e := &entry{index: k.last(l) + 1, term: k.term, ws: o.ws, injected: true, fed: true, proposer: l}
	l.log = append(l.log, e)
	w.res.Injected++
	l.tracef("a second proposer's entry %d (the write set of entry %d) is committed", e.index, o.index)
	k.commitAll(l)
}

// alive runs fn at the node if its process inc still runs; a stopped
// process runs it when it resumes.
func (c *coordinator) alive(inc int, fn func()) {
	if !c.up || c.incarnation != inc {
		return
	}
	if c.paused {
		c.deferred = append(c.deferred, func() { c.alive(inc, fn) })
		return
	}
	fn()
}

// promote is the coordinator hearing that raft on the node leads term: the
// leadership's real promotion (cluster.Steps: raft's barrier, which the
// oracle commits and applies only while the node leads a quorum, then the
// writer promoted with the failover's extension and the store's wall
// floor, the Leader health entry, the announcement). A barrier that
// fails is tried again a little later, as the leader's work tries again.
func (c *coordinator) promote(term uint64) {
	w, k := c.w, c.w.raft
	if !c.raftLeader || c.term != term {
		c.barrierWait = false
		return
	}
	if c.e.Leading() {
		c.demote()
	}
	if !c.steps.Promote() {
		if !c.barrierWait {
			c.barrierWait = true
			c.tracef("the barrier waits for a quorum")
		}
		inc := c.incarnation
		w.after(leaderLease/5, func() { c.alive(inc, func() { c.promote(term) }) })
		return
	}
	c.barrierWait = false
	c.timerSet = false
	c.timerGen++
	c.tracef("leads term %d: the writer is promoted (applied %d, commit %d)", term, c.applied, k.commit)
	w.check.promoted(failoverExtend)
	// The writer's first group runs at once, as its timer does: what fell
	// due meanwhile (retries) is taken; then the whole store is checked, as
	// after a restart.
	c.group()
	if c.e.Leading() {
		w.check.restarted(c)
	}
}

// demote is the coordinator hearing that raft on the node no longer leads:
// the leadership's real demotion (its health says so, and the writer is
// demoted, answering what is queued NOT_LEADER and ending every session).
func (c *coordinator) demote() {
	leading := c.e.Leading()
	c.steps.Demote()
	if !leading {
		return
	}
	c.kinds = nil
	c.tracef("the writer is demoted")
	c.answer()
	c.push()
}

// lostLeadership follows a group whose commit lost leadership: the writer
// stepped down by itself, answering the group OUTCOME_UNKNOWN or
// NOT_LEADER and ending every session; the coordinator promotes it again
// if raft still says this node leads.
func (c *coordinator) lostLeadership(taken int, evs []watch.JobEvent, err error) {
	w := c.w
	w.raft.stepped(c, evs, err)
	c.serving = false
	c.kinds = nil
	c.tracef("group of %d loses leadership: %v", taken, err)
	if c.crashNow {
		c.crashNow = false
		c.crash("with an entry in flight")
		return
	}
	c.answer()
	c.push()
	if c.raftLeader {
		inc, term := c.incarnation, c.term
		w.after(w.between(time.Millisecond, 10*time.Millisecond), func() { c.alive(inc, func() { c.promote(term) }) })
	}
}

// getBatch is the full name of the read the reader sends.
const getBatch = "/leasehold.v1.JobService/GetBatch"

// read serves a linearizable read of the batch of key through the gRPC
// server's real read-consistency interceptor (server.Consistency over the
// leadership's VerifyLeader): the node confirms with a quorum that it
// leads, or refuses NOT_LEADER, then reads its store. The checker sees
// what the answer says as it leaves.
func (c *coordinator) read(key [2]string) {
	w := c.w
	served := false
	_, refused := c.consistency(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: getBatch},
		func(context.Context, any) (any, error) {
			served = true
			b, err := c.e.Batch(w.check.acked[key].id)
			w.res.Reads++
			w.check.read(c, key, b, err)
			return nil, err
		})
	if !served && refused != nil && c.e.Leading() {
		w.res.StaleRefused++
	}
}

// reader reads batches whose submission was answered, from whichever node
// it finds leading: a read must see every write answered before it was
// sent.
type reader struct{ w *world }

func (rd *reader) start() { rd.tick() }

func (rd *reader) tick() {
	w := rd.w
	if !w.faults {
		return
	}
	w.after(w.between(leaseTTL/200, leaseTTL/40), rd.tick)
	key, ok := w.check.recentAcked()
	if !ok {
		return
	}
	w.rpc(func(c *coordinator, _ func(func())) { c.read(key) })
}
