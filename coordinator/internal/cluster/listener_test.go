package cluster

import (
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"testing"
	"time"
)

// idleConns opens n TCP connections to addr from the loopback address
// from, which send nothing, and returns them with a channel that receives
// once for each the other end closes. The test skips where from cannot be
// bound.
func idleConns(t *testing.T, addr, from string, n int) ([]net.Conn, <-chan struct{}) {
	t.Helper()
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 10 * time.Second}
	closed := make(chan struct{}, n)
	var conns []net.Conn
	for i := range n {
		c, err := d.Dial("tcp", addr)
		if err != nil {
			if i == 0 {
				t.Skipf("dialling from %s: %v", from, err)
			}
			t.Fatalf("connection %d: %v", i, err)
		}
		conns = append(conns, c)
		go func() {
			// The failsafe deadline only stops a broken build from
			// hanging; the read ends when the listener closes it.
			_ = c.SetReadDeadline(time.Now().Add(time.Minute))
			if _, err := c.Read(make([]byte, 1)); errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || isReset(err) {
				closed <- struct{}{}
			}
		}()
	}
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	return conns, closed
}

// isReset reports whether err is a connection reset by the other end.
func isReset(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && !op.Timeout()
}

// receive receives n times from c.
func receive(t *testing.T, c <-chan struct{}, n int, what string) {
	t.Helper()
	for i := range n {
		select {
		case <-c:
		case <-time.After(time.Minute):
			t.Fatalf("%s: %d of %d", what, i, n)
		}
	}
}

// openFiles counts this process's open descriptors.
func openFiles(t *testing.T) int {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("counting descriptors: %v", err)
	}
	return len(fds)
}

// heapInUse returns the heap in use after a collection.
func heapInUse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}

// TestRaftListenerLimits: 1,000 idle connections from one address hold
// no more of the raft port than that address's share: the others are
// closed at once, without raft's buffers; a member from another address
// gets through meanwhile; the descriptors and the heap they cost stay
// bounded; and a connection that proves nothing is closed once its proof
// timeout passes.
func TestRaftListenerLimits(t *testing.T) {
	t.Parallel()
	t.Run("Idle connections from one address", func(t *testing.T) {
		t.Parallel()
		b := newPeerBundle(t, true, time.Minute)
		addr := b.n1.lis.Addr().String()
		fds, heap := openFiles(t), heapInUse()
		_, closed := idleConns(t, addr, "127.0.0.2", 1000)
		receive(t, closed, 1000-raftMaxPendingPerAddress, "idle connections closed past the address's share")
		n2 := b.node(t, "n2")
		if err := b.vote(t, dialAs(&n2), "n2", "127.0.0.1:7202"); err != nil {
			t.Fatalf("a member's vote while an address holds its share: %v", err)
		}
		// The test's own 1,000 ends are open; the listener's ends of all
		// but the share are closed.
		if got, most := openFiles(t)-fds, 1000+raftMaxPendingPerAddress+16; got > most {
			t.Errorf("%d descriptors more than before, want at most %d", got, most)
		}
		if grown := int64(heapInUse()) - int64(heap); grown > 32<<20 {
			t.Errorf("the heap grew by %d MiB with 1,000 idle connections, want under 32 MiB", grown>>20)
		}
		b.n1.mu.Lock()
		pending := b.n1.adm.pending
		b.n1.mu.Unlock()
		if pending != raftMaxPendingPerAddress {
			t.Errorf("%d connections proving themselves, want the address's share, %d", pending, raftMaxPendingPerAddress)
		}
	})
	t.Run("Closing the transport closes the connections proving themselves", func(t *testing.T) {
		t.Parallel()
		b := newPeerBundle(t, true, 10*time.Minute)
		_, closed := idleConns(t, b.n1.lis.Addr().String(), "127.0.0.1", 3)
		// Wait until the three are proving themselves: the accept loop
		// takes them within microseconds.
		for failsafe := time.Now().Add(time.Minute); ; runtime.Gosched() {
			b.n1.mu.Lock()
			pending := b.n1.adm.pending
			b.n1.mu.Unlock()
			if pending == 3 {
				break
			}
			if time.Now().After(failsafe) {
				t.Fatalf("%d connections proving themselves, want 3", pending)
			}
		}
		b.n1.Close()
		receive(t, closed, 3, "connections proving themselves closed by Close")
	})
	t.Run("A connection that proves nothing is closed after the proof timeout", func(t *testing.T) {
		t.Parallel()
		for _, tlsOn := range []bool{true, false} {
			b := newPeerBundle(t, tlsOn, 100*time.Millisecond)
			_, closed := idleConns(t, b.n1.lis.Addr().String(), "127.0.0.1", 3)
			receive(t, closed, 3, "idle connections closed after the proof timeout")
		}
	})
}
