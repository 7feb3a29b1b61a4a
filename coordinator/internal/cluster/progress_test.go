package cluster

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

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
	tr := observe(a, newProgress(), &muted)
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
