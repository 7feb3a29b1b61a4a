package cluster

import (
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/testclock"
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

// TestRaftRefusalLog: the raft listener logs its refusals of one cause
// once a minute, each line with the source of the refusal it was written
// for and how many went unlogged since the last; every refusal is
// counted. Before, a connection that never proved itself was counted and
// not logged, so nothing named the source of a handshake flood.
func TestRaftRefusalLog(t *testing.T) {
	t.Parallel()
	const msg = "refused a raft connection"
	clock := testclock.New(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	logged := func(h *records, cause string) []slog.Record {
		var out []slog.Record
		for _, r := range h.find(msg) {
			if attr(r, "cause") == cause {
				out = append(out, r)
			}
		}
		return out
	}
	withLog := func(h *records) func(*transportConfig) {
		return func(c *transportConfig) { c.Log, c.Now = slog.New(h), clock.Now }
	}

	t.Run("Connections that prove nothing", func(t *testing.T) {
		h := &records{}
		b := newPeerBundle(t, false, 50*time.Millisecond, withLog(h))
		addr := b.n1.lis.Addr().String()
		// The line is written before the connection is closed: once the
		// test sees a close, its refusal was logged or held back.
		_, closed := idleConns(t, addr, "127.0.0.1", 5)
		receive(t, closed, 5, "connections closed after the proof timeout")
		lines := logged(h, causeHandshake)
		if len(lines) != 1 {
			t.Fatalf("%d lines for 5 handshake refusals within a minute, want 1: %v", len(lines), lines)
		}
		if r := attr(lines[0], "remote"); !strings.HasPrefix(r, "127.0.0.1:") {
			t.Errorf("the line names remote %q, want the refused connection's 127.0.0.1:port", r)
		}
		if u := attr(lines[0], "unlogged"); u != "0" {
			t.Errorf("the first line says %s unlogged, want 0", u)
		}

		clock.Advance(time.Minute)
		_, closed = idleConns(t, addr, "127.0.0.4", 1)
		receive(t, closed, 1, "a connection closed after the proof timeout, a minute later")
		lines = logged(h, causeHandshake)
		if len(lines) != 2 {
			t.Fatalf("%d lines after a minute and one more refusal, want 2", len(lines))
		}
		if r, u := attr(lines[1], "remote"), attr(lines[1], "unlogged"); !strings.HasPrefix(r, "127.0.0.4:") || u != "4" {
			t.Errorf("the minute's line names remote %q with %s unlogged, want 127.0.0.4:port and the 4 held back", r, u)
		}
	})
	t.Run("Each cause has its own minute", func(t *testing.T) {
		h := &records{}
		b := newPeerBundle(t, false, time.Minute, withLog(h))
		from := &net.TCPAddr{IP: net.ParseIP("127.0.0.6"), Port: 40000}
		b.n1.refuse(causeHandshake, from, nil)
		b.n1.refuse(causePerAddress, from, nil)
		b.n1.refuse(causeHandshake, from, nil)
		b.n1.refuse(causeNotAMember, from, nil)
		b.n1.refuseFrom("RPC", causeNotAMember, "peer", "n9", nil)
		if got := len(h.find(msg)); got != 3 {
			t.Errorf("%d connection lines for three causes within a minute, want one each", got)
		}
		if got := len(h.find("refused a raft RPC")); got != 1 {
			t.Errorf("%d RPC lines after a connection refusal of the same cause, want 1", got)
		}
	})
	t.Run("Connections past an address's share", func(t *testing.T) {
		h := &records{}
		b := newPeerBundle(t, false, time.Minute, withLog(h))
		_, closed := idleConns(t, b.n1.lis.Addr().String(), "127.0.0.3", raftMaxPendingPerAddress+3)
		receive(t, closed, 3, "connections past the address's share closed")
		lines := logged(h, causePerAddress)
		if len(lines) != 1 {
			t.Fatalf("%d lines for 3 per-address refusals, want 1", len(lines))
		}
		if r := attr(lines[0], "remote"); !strings.HasPrefix(r, "127.0.0.3:") {
			t.Errorf("the line names remote %q, want 127.0.0.3:port", r)
		}
	})
}
