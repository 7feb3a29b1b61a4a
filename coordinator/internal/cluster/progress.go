package cluster

import (
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"

	"github.com/leasehold/leasehold/coordinator/internal/mutation"
)

// progress is what a leader has learnt of each follower from the
// follower's answers: the follower's match index (the last entry it has
// stored that agrees with the leader's log) and when it last answered.
// raft keeps its own per-follower state to itself, so the transport under
// raft records the answers as they pass (observedTransport). Figures are
// kept per leader term: an answer of an earlier term says nothing of
// this one.
type progress struct {
	mu    sync.Mutex
	peers map[raft.ServerID]peerProgress
	now   func() time.Time
	// changed is closed, and replaced, at every answer.
	changed chan struct{}
}

// peerProgress is one follower's progress in one term.
type peerProgress struct {
	term    uint64
	match   uint64
	contact time.Time
}

func newProgress() *progress {
	return &progress{peers: map[raft.ServerID]peerProgress{}, now: time.Now, changed: make(chan struct{})}
}

// answered records an answer of id to a request of term; when matched, the
// follower's log agrees with the leader's up to match.
func (p *progress) answered(id raft.ServerID, term, respTerm uint64, matched bool, match uint64) {
	if respTerm > term {
		// The follower knows a later term: the answer is not to this
		// leadership, which is about to end.
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	pp := p.peers[id]
	if term < pp.term {
		return
	}
	if term > pp.term {
		pp = peerProgress{term: term}
	}
	pp.contact = p.now()
	if matched {
		pp.match = max(pp.match, match)
	}
	p.peers[id] = pp
	close(p.changed)
	p.changed = make(chan struct{})
}

// next returns a channel closed at the next answer recorded.
func (p *progress) next() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.changed
}

// appended records the answer to an AppendEntries request: on success the
// follower's log agrees with the leader's up to the request's last entry,
// or up to its previous entry when it carried none. A heartbeat (no
// previous entry, no entries) only shows the follower is there.
func (p *progress) appended(id raft.ServerID, req *raft.AppendEntriesRequest, resp *raft.AppendEntriesResponse) {
	var match uint64
	switch {
	case len(req.Entries) > 0:
		match = req.Entries[len(req.Entries)-1].Index
	default:
		match = req.PrevLogEntry
	}
	p.answered(id, req.Term, resp.Term, resp.Success, match)
}

// of returns what is known of id in term: its match index and the time it
// last answered, ok false when it has not answered in term.
func (p *progress) of(id raft.ServerID, term uint64) (match uint64, contact time.Time, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	pp, found := p.peers[id]
	if !found || pp.term != term {
		return 0, time.Time{}, false
	}
	return pp.match, pp.contact, true
}

// observedTransport is raft's transport with every answer of a follower
// recorded in a progress; everything else goes to the transport it wraps,
// unless the node is muted: then every request it would send fails at
// once, unsent (errMuted).
type observedTransport struct {
	raft.Transport
	p     *progress
	muted *atomic.Bool
	// self is the raft the transport serves, once it runs: heartbeats
	// take raft's fast path only when it cannot change raft's term or
	// state (SetHeartbeatHandler).
	self *atomic.Pointer[raft.Raft]
}

// errMuted is what a muted node's requests to its peers fail with.
var errMuted = errors.New("this node is muted: it cannot commit, and sends nothing to its peers until it stops leading")

// observe wraps t; muted, when set, mutes it. The result offers pre-vote
// exactly when t does, as raft asks the transport whether it can.
func observe(t raft.Transport, p *progress, muted *atomic.Bool, self *atomic.Pointer[raft.Raft]) raft.Transport {
	o := &observedTransport{Transport: t, p: p, muted: muted, self: self}
	if _, ok := t.(raft.WithPreVote); ok {
		return &observedPreVoteTransport{o}
	}
	return o
}

// errHeartbeatTerm refuses a heartbeat that raft's fast path would let
// change raft's term or state.
var errHeartbeatTerm = errors.New("a heartbeat of a later term, or to a node that does not follow, is not taken on the fast path; the leader's replication brings its term")

// SetHeartbeatHandler implements raft.Transport. raft answers heartbeats
// on the transport's own goroutine, beside its main loop, so that they do
// not wait behind the log's disk; but a heartbeat of a later term makes
// the node a follower of that term there, unsynchronized with the main
// loop (hashicorp/raft#695). A leader of term T whose main loop is just
// dispatching an entry then writes it at term T+1, and the new leader's
// entry at that index, of term T+1 too, is taken for the same one: the
// two logs diverge at an index both take as committed. So a heartbeat
// takes the fast path only when it cannot change the term or the state:
// of an earlier term, or of this node's term to a node that follows.
// Any other is answered with errHeartbeatTerm (the sender backs off and
// tries again); the leader's replication, which raft's main loop serves,
// brings the node its term instead.
func (t *observedTransport) SetHeartbeatHandler(cb func(raft.RPC)) {
	if cb == nil {
		t.Transport.SetHeartbeatHandler(nil)
		return
	}
	t.Transport.SetHeartbeatHandler(func(rpc raft.RPC) {
		if !t.heartbeatSafe(rpc) {
			rpc.Respond(nil, errHeartbeatTerm)
			return
		}
		cb(rpc)
	})
}

// heartbeatSafe reports whether raft's fast path would leave raft's term
// and state as they are for rpc. A term only grows, and a leader's term
// never equals a heartbeat's (one leader per term), so a heartbeat that
// passes here never makes a leader a follower when raft handles it. One
// window is raft's own: a follower becoming a candidate changes its state
// just before its term, and a heartbeat of its old term taken in between
// makes it a follower again; a candidate writes no entry, so no log
// diverges from it.
func (t *observedTransport) heartbeatSafe(rpc raft.RPC) bool {
	req, ok := rpc.Command.(*raft.AppendEntriesRequest)
	r := t.self.Load()
	if !ok || r == nil {
		return false
	}
	term := r.CurrentTerm()
	if mutation.On(mutation.HeartbeatLaterTerm) {
		return true
	}
	return req.Term < term || (req.Term == term && r.State() == raft.Follower)
}

// mutedErr is errMuted while the node is muted, else nil.
func (t *observedTransport) mutedErr() error {
	if t.muted.Load() {
		return errMuted
	}
	return nil
}

// AppendEntries implements raft.Transport. raft's heartbeats to each
// follower, which its own goroutines send whatever its leader loop does,
// come this way too.
func (t *observedTransport) AppendEntries(id raft.ServerID, target raft.ServerAddress, req *raft.AppendEntriesRequest, resp *raft.AppendEntriesResponse) error {
	if err := t.mutedErr(); err != nil {
		return err
	}
	if err := t.Transport.AppendEntries(id, target, req, resp); err != nil {
		return err
	}
	t.p.appended(id, req, resp)
	return nil
}

// InstallSnapshot implements raft.Transport: a follower that installed a
// snapshot holds the log up to the snapshot's last index.
func (t *observedTransport) InstallSnapshot(id raft.ServerID, target raft.ServerAddress, req *raft.InstallSnapshotRequest,
	resp *raft.InstallSnapshotResponse, data io.Reader,
) error {
	if err := t.mutedErr(); err != nil {
		return err
	}
	if err := t.Transport.InstallSnapshot(id, target, req, resp, data); err != nil {
		return err
	}
	t.p.answered(id, req.Term, resp.Term, resp.Success, req.LastLogIndex)
	return nil
}

// RequestVote implements raft.Transport.
func (t *observedTransport) RequestVote(id raft.ServerID, target raft.ServerAddress, req *raft.RequestVoteRequest, resp *raft.RequestVoteResponse) error {
	if err := t.mutedErr(); err != nil {
		return err
	}
	return t.Transport.RequestVote(id, target, req, resp)
}

// TimeoutNow implements raft.Transport.
func (t *observedTransport) TimeoutNow(id raft.ServerID, target raft.ServerAddress, req *raft.TimeoutNowRequest, resp *raft.TimeoutNowResponse) error {
	if err := t.mutedErr(); err != nil {
		return err
	}
	return t.Transport.TimeoutNow(id, target, req, resp)
}

// AppendEntriesPipeline implements raft.Transport: the pipeline's answers
// are recorded as raft reads them.
func (t *observedTransport) AppendEntriesPipeline(id raft.ServerID, target raft.ServerAddress) (raft.AppendPipeline, error) {
	if err := t.mutedErr(); err != nil {
		return nil, err
	}
	inner, err := t.Transport.AppendEntriesPipeline(id, target)
	if err != nil {
		return nil, err
	}
	op := &observedPipeline{AppendPipeline: inner, id: id, p: t.p, muted: t.muted,
		out: make(chan raft.AppendFuture), stop: make(chan struct{}), done: make(chan struct{})}
	go op.run()
	return op, nil
}

// Close implements raft.WithClose: it closes the wrapped transport when it
// can be closed.
func (t *observedTransport) Close() error {
	if c, ok := t.Transport.(raft.WithClose); ok {
		return c.Close()
	}
	return nil
}

// observedPreVoteTransport is an observedTransport over a transport that
// offers pre-vote.
type observedPreVoteTransport struct{ *observedTransport }

// RequestPreVote implements raft.WithPreVote.
func (t *observedPreVoteTransport) RequestPreVote(id raft.ServerID, target raft.ServerAddress, req *raft.RequestPreVoteRequest,
	resp *raft.RequestPreVoteResponse,
) error {
	if err := t.mutedErr(); err != nil {
		return err
	}
	return t.Transport.(raft.WithPreVote).RequestPreVote(id, target, req, resp)
}

// observedPipeline hands raft the futures of the pipeline it wraps, in
// order, after recording the answers they carry.
type observedPipeline struct {
	raft.AppendPipeline
	id    raft.ServerID
	p     *progress
	muted *atomic.Bool
	out   chan raft.AppendFuture
	stop  chan struct{}
	done  chan struct{}
	once  sync.Once
}

func (op *observedPipeline) run() {
	defer close(op.done)
	in := op.AppendPipeline.Consumer()
	for {
		select {
		case f := <-in:
			if f.Error() == nil {
				op.p.appended(op.id, f.Request(), f.Response())
			}
			select {
			case op.out <- f:
			case <-op.stop:
				return
			}
		case <-op.stop:
			return
		}
	}
}

// AppendEntries implements raft.AppendPipeline: a muted node sends
// nothing down a pipeline opened before, and raft falls back to single
// requests, which fail too.
func (op *observedPipeline) AppendEntries(req *raft.AppendEntriesRequest, resp *raft.AppendEntriesResponse) (raft.AppendFuture, error) {
	if op.muted.Load() {
		return nil, errMuted
	}
	return op.AppendPipeline.AppendEntries(req, resp)
}

// Consumer implements raft.AppendPipeline.
func (op *observedPipeline) Consumer() <-chan raft.AppendFuture { return op.out }

// Close implements raft.AppendPipeline.
func (op *observedPipeline) Close() error {
	err := op.AppendPipeline.Close()
	op.once.Do(func() { close(op.stop) })
	<-op.done
	return err
}

var (
	_ raft.WithClose   = (*observedTransport)(nil)
	_ raft.WithPreVote = (*observedPreVoteTransport)(nil)
)
