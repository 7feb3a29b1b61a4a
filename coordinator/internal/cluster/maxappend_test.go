package cluster

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// countingTransport is a node's in-memory transport that counts the
// entries of each AppendEntries the node receives.
type countingTransport struct {
	*raft.InmemTransport
	out  chan raft.RPC
	stop chan struct{}

	mu      sync.Mutex
	most    int
	entries int
	// changed receives after each AppendEntries with entries.
	changed chan struct{}
}

func newCountingTransport(addr raft.ServerAddress) *countingTransport {
	_, inner := raft.NewInmemTransport(addr)
	c := &countingTransport{InmemTransport: inner, out: make(chan raft.RPC), stop: make(chan struct{}), changed: make(chan struct{}, 1)}
	go c.count()
	return c
}

func (c *countingTransport) count() {
	for {
		select {
		case rpc := <-c.InmemTransport.Consumer():
			if req, ok := rpc.Command.(*raft.AppendEntriesRequest); ok && len(req.Entries) > 0 {
				c.mu.Lock()
				c.most = max(c.most, len(req.Entries))
				c.entries += len(req.Entries)
				c.mu.Unlock()
				select {
				case c.changed <- struct{}{}:
				default:
				}
			}
			select {
			case c.out <- rpc:
			case <-c.stop:
				return
			}
		case <-c.stop:
			return
		}
	}
}

func (c *countingTransport) Consumer() <-chan raft.RPC { return c.out }

func (c *countingTransport) Close() error {
	close(c.stop)
	return c.InmemTransport.Close()
}

// TestAppendEntriesAreBounded: a follower that was away catches up in
// AppendEntries of at most maxAppendEntries entries each, not raft's 64.
func TestAppendEntriesAreBounded(t *testing.T) {
	t.Parallel()
	var trans []*countingTransport
	var peers []Peer
	for i := range 3 {
		id := fmt.Sprintf("n%d", i+1)
		trans = append(trans, newCountingTransport(raft.ServerAddress(id)))
		peers = append(peers, Peer{ID: id, RaftAddr: id})
	}
	link := func(a, b *countingTransport) {
		a.Connect(b.LocalAddr(), b.InmemTransport)
		b.Connect(a.LocalAddr(), a.InmemTransport)
	}
	link(trans[0], trans[1])
	var nodes []*Node
	leads := make(chan *Node, 8)
	for i, p := range peers {
		n, err := StartNode(NodeConfig{ID: p.ID, Peers: peers, Transport: trans[i], InmemStore: true,
			HeartbeatTimeout: 100 * time.Millisecond, ElectionTimeout: 100 * time.Millisecond, LeaderLeaseTimeout: 50 * time.Millisecond},
			newTestFSM(t, openStore(t, p.ID), new([]uint64)))
		if err != nil {
			t.Fatal(err)
		}
		nodes = append(nodes, n)
		t.Cleanup(func() { _ = n.Shutdown() })
		go func() {
			for {
				select {
				case l := <-n.LeaderChanges():
					if l {
						leads <- n
					}
				case <-n.Done():
					return
				}
			}
		}()
	}
	// n1 and n2 elect a leader and commit 40 entries while n3 is away.
	// A leader that loses its leadership on a loaded machine hands the
	// writes to the next.
	var leader *Node
	for done := 0; done < 40; {
		if leader == nil || leader.Raft.Barrier(5*time.Second).Error() != nil {
			select {
			case leader = <-leads:
			case <-time.After(time.Minute): // failsafe
				t.Fatal("no leader")
			}
			continue
		}
		done++
	}
	link(trans[0], trans[2])
	link(trans[1], trans[2])
	n3 := trans[2]
	deadline := time.After(time.Minute) // failsafe: n3 catches up within milliseconds
	for {
		n3.mu.Lock()
		most, entries := n3.most, n3.entries
		n3.mu.Unlock()
		if entries >= 40 {
			if most > maxAppendEntries || most < 2 {
				t.Errorf("n3 caught up with AppendEntries of up to %d entries, want at most %d (and more than one)", most, maxAppendEntries)
			}
			return
		}
		select {
		case <-n3.changed:
		case <-deadline:
			t.Fatalf("n3 received %d entries", entries)
		}
	}
}
