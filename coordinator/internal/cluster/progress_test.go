package cluster

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
)

// TestProgress feeds the recorder the answers a leader gets and checks
// what it then knows of the follower: a heartbeat shows it is there and
// matches nothing, an append matches up to its last entry, an empty
// append up to its previous entry, a refusal matches nothing new, answers
// of an earlier term are ignored and a new term starts afresh.
func TestProgress(t *testing.T) {
	t.Parallel()
	now := time.Unix(1000, 0)
	p := newProgress()
	p.now = func() time.Time { return now }
	entries := func(from, to uint64) []*raft.Log {
		var out []*raft.Log
		for i := from; i <= to; i++ {
			out = append(out, &raft.Log{Index: i})
		}
		return out
	}
	ok := func(term uint64) *raft.AppendEntriesResponse {
		return &raft.AppendEntriesResponse{Term: term, Success: true}
	}
	const id = raft.ServerID("n2")
	steps := []struct {
		name      string
		req       *raft.AppendEntriesRequest
		resp      *raft.AppendEntriesResponse
		term      uint64
		wantMatch uint64
		wantKnown bool
	}{
		{"nothing heard yet", nil, nil, 2, 0, false},
		{"a heartbeat", &raft.AppendEntriesRequest{Term: 2}, ok(2), 2, 0, true},
		{"an append of entries 5 to 7", &raft.AppendEntriesRequest{Term: 2, PrevLogEntry: 4, Entries: entries(5, 7)}, ok(2), 2, 7, true},
		{"an empty append after entry 9", &raft.AppendEntriesRequest{Term: 2, PrevLogEntry: 9}, ok(2), 2, 9, true},
		{"a late answer does not go back", &raft.AppendEntriesRequest{Term: 2, PrevLogEntry: 4, Entries: entries(5, 6)}, ok(2), 2, 9, true},
		{"a refusal matches nothing new", &raft.AppendEntriesRequest{Term: 2, PrevLogEntry: 20, Entries: entries(21, 22)},
			&raft.AppendEntriesResponse{Term: 2}, 2, 9, true},
		{"a follower of a later term is no answer", &raft.AppendEntriesRequest{Term: 2, PrevLogEntry: 9, Entries: entries(10, 30)}, ok(3), 2, 9, true},
		{"a new term knows nothing yet", nil, nil, 4, 0, false},
		{"the new term's first append", &raft.AppendEntriesRequest{Term: 4, PrevLogEntry: 2, Entries: entries(3, 3)}, ok(4), 4, 3, true},
		{"an answer of the old term is ignored", &raft.AppendEntriesRequest{Term: 2, PrevLogEntry: 9, Entries: entries(10, 40)}, ok(2), 4, 3, true},
	}
	for _, s := range steps {
		now = now.Add(time.Second)
		next := p.next()
		if s.req != nil {
			p.appended(id, s.req, s.resp)
		}
		match, contact, known := p.of(id, s.term)
		if match != s.wantMatch || known != s.wantKnown {
			t.Errorf("%s: match %d, known %v; want %d, %v", s.name, match, known, s.wantMatch, s.wantKnown)
		}
		answered := s.req != nil && s.resp.Term <= s.req.Term && s.req.Term == s.term
		if answered && !contact.Equal(now) {
			t.Errorf("%s: last contact %v, want %v", s.name, contact, now)
		}
		select {
		case <-next:
			if !answered {
				t.Errorf("%s: an answer ignored woke the waiters", s.name)
			}
		default:
			if answered {
				t.Errorf("%s: an answer did not wake the waiters", s.name)
			}
		}
	}

	// A snapshot installed holds the log up to its last index.
	p.answered(id, 4, 4, true, 50)
	if match, _, _ := p.of(id, 4); match != 50 {
		t.Errorf("after a snapshot up to 50: match %d", match)
	}
}

// TestMutedTransport ensures a muted node sends nothing to its peers:
// heartbeats and appends, pipelined or not, votes, pre-votes, snapshots
// and transfers fail unsent with errMuted, and go through again once it
// is heard again.
func TestMutedTransport(t *testing.T) {
	t.Parallel()
	_, a := raft.NewInmemTransport("a")
	_, b := raft.NewInmemTransport("b")
	a.Connect("b", b)
	var muted atomic.Bool
	tr := observe(a, newProgress(), &muted, &atomic.Pointer[raft.Raft]{})
	// b answers every request it gets.
	got := make(chan string, 16)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case rpc := <-b.Consumer():
				got <- fmt.Sprintf("%T", rpc.Command)
				rpc.Respond(&raft.AppendEntriesResponse{}, nil) // only appends get through
			case <-done:
				return
			}
		}
	})
	defer func() {
		close(done)
		wg.Wait()
		a.Close()
		b.Close()
	}()
	pipe, err := tr.AppendEntriesPipeline("b", "b")
	if err != nil {
		t.Fatal(err)
	}
	defer pipe.Close()
	muted.Store(true)
	sends := map[string]func() error{
		"AppendEntries": func() error {
			return tr.AppendEntries("b", "b", &raft.AppendEntriesRequest{}, &raft.AppendEntriesResponse{})
		},
		"the pipeline's AppendEntries": func() error {
			_, err := pipe.AppendEntries(&raft.AppendEntriesRequest{}, &raft.AppendEntriesResponse{})
			return err
		},
		"AppendEntriesPipeline": func() error { _, err := tr.AppendEntriesPipeline("b", "b"); return err },
		"RequestVote":           func() error { return tr.RequestVote("b", "b", &raft.RequestVoteRequest{}, &raft.RequestVoteResponse{}) },
		"RequestPreVote": func() error {
			return tr.(raft.WithPreVote).RequestPreVote("b", "b", &raft.RequestPreVoteRequest{}, &raft.RequestPreVoteResponse{})
		},
		"TimeoutNow": func() error { return tr.TimeoutNow("b", "b", &raft.TimeoutNowRequest{}, &raft.TimeoutNowResponse{}) },
		"InstallSnapshot": func() error {
			return tr.InstallSnapshot("b", "b", &raft.InstallSnapshotRequest{}, &raft.InstallSnapshotResponse{}, strings.NewReader(""))
		},
	}
	for name, send := range sends {
		if err := send(); !errors.Is(err, errMuted) {
			t.Errorf("muted %s = %v, want errMuted", name, err)
		}
	}
	muted.Store(false)
	if err := sends["AppendEntries"](); err != nil {
		t.Fatalf("AppendEntries once heard again: %v", err)
	}
	if first := <-got; first != "*raft.AppendEntriesRequest" {
		t.Errorf("the peer got %s first, want the AppendEntries sent once heard again: nothing while muted", first)
	}
}

// heartbeatCatcher is a transport that keeps the heartbeat handler raft
// gives it, so that a test can call it as the transport's goroutine does.
type heartbeatCatcher struct {
	raft.Transport
	handler func(raft.RPC)
}

func (h *heartbeatCatcher) SetHeartbeatHandler(cb func(raft.RPC)) { h.handler = cb }

// TestHeartbeatFastPath: a heartbeat reaches raft's fast path only when it
// cannot change raft's term or state there, beside raft's main loop. A
// heartbeat of a later term to a leader is refused: on the fast path it
// would make the leader a follower of that term while its main loop may be
// writing an entry, which it would then write at the later term.
func TestHeartbeatFastPath(t *testing.T) {
	t.Parallel()
	_, trans := raft.NewInmemTransport("a")
	conf := raft.DefaultConfig()
	conf.LocalID = "a"
	conf.HeartbeatTimeout, conf.ElectionTimeout = 50*time.Millisecond, 50*time.Millisecond
	conf.LeaderLeaseTimeout, conf.CommitTimeout = 50*time.Millisecond, 5*time.Millisecond
	conf.Logger = hclog.NewNullLogger()
	store := raft.NewInmemStore()
	snaps := raft.NewInmemSnapshotStore()
	if err := raft.BootstrapCluster(conf, store, store, snaps, trans, raft.Configuration{
		Servers: []raft.Server{{ID: "a", Address: trans.LocalAddr()}},
	}); err != nil {
		t.Fatal(err)
	}
	r, err := raft.NewRaft(conf, &raft.MockFSM{}, store, store, snaps, trans)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Shutdown().Error() })
	for lead := range r.LeaderCh() {
		if lead {
			break
		}
	}

	catcher := &heartbeatCatcher{}
	var muted atomic.Bool
	var self atomic.Pointer[raft.Raft]
	tr := observe(catcher, newProgress(), &muted, &self)
	taken := 0
	tr.SetHeartbeatHandler(func(rpc raft.RPC) {
		taken++
		rpc.Respond(&raft.AppendEntriesResponse{}, nil)
	})
	beat := func(term uint64) error {
		resp := make(chan raft.RPCResponse, 1)
		catcher.handler(raft.RPC{Command: &raft.AppendEntriesRequest{Term: term}, RespChan: resp})
		return (<-resp).Error
	}

	term := r.CurrentTerm()
	if err := beat(term + 1); err == nil {
		t.Fatal("a heartbeat before the transport knows its raft was taken on the fast path")
	}
	self.Store(r)
	if err := beat(term + 1); !errors.Is(err, errHeartbeatTerm) || taken != 0 {
		t.Fatalf("a heartbeat of a later term to the leader: %v, taken %d times; want errHeartbeatTerm, not taken", err, taken)
	}
	if got := r.CurrentTerm(); got != term || r.State() != raft.Leader {
		t.Fatalf("after the refused heartbeat raft is %v at term %d, want the leader at %d", r.State(), got, term)
	}
	if err := beat(term - 1); err != nil || taken != 1 {
		t.Fatalf("a heartbeat of an earlier term: %v, taken %d times; want it taken (raft ignores it)", err, taken)
	}

	// A follower at term 5 (its stable store says so, and with no
	// configuration it never stands for election) takes its leader's
	// heartbeats of that term on the fast path: the steady state.
	fstore := raft.NewInmemStore()
	if err := fstore.SetUint64([]byte("CurrentTerm"), 5); err != nil {
		t.Fatal(err)
	}
	_, ftrans := raft.NewInmemTransport("f")
	fconf := *conf
	fconf.LocalID = "f"
	follower, err := raft.NewRaft(&fconf, &raft.MockFSM{}, fstore, fstore, raft.NewInmemSnapshotStore(), ftrans)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { follower.Shutdown().Error() })
	self.Store(follower)
	if follower.State() != raft.Follower || follower.CurrentTerm() != 5 {
		t.Fatalf("the follower is %v at term %d, want a follower at 5", follower.State(), follower.CurrentTerm())
	}
	if err := beat(5); err != nil || taken != 2 {
		t.Fatalf("a heartbeat of the follower's term: %v, taken %d times; want it taken", err, taken)
	}
	if err := beat(6); !errors.Is(err, errHeartbeatTerm) || taken != 2 {
		t.Fatalf("a heartbeat of a later term to a follower: %v, taken %d times; want errHeartbeatTerm, not taken", err, taken)
	}
}
