package connlimit

import (
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/leasehold/leasehold/internal/pipenet"
)

// refusals records what Limits.Refused is told.
type refusals struct {
	mu     sync.Mutex
	causes []string
	c      chan string
}

func newRefusals() *refusals { return &refusals{c: make(chan string, 64)} }

func (r *refusals) refused(cause string, _ net.Addr) {
	r.mu.Lock()
	r.causes = append(r.causes, cause)
	r.mu.Unlock()
	r.c <- cause
}

func (r *refusals) all() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.causes...)
}

// acceptAll accepts from lis until it is closed, sending each connection.
func acceptAll(t *testing.T, lis net.Listener) <-chan net.Conn {
	t.Helper()
	out := make(chan net.Conn, 64)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			out <- c
		}
	}()
	t.Cleanup(func() {
		lis.Close()
		<-done
		close(out)
		for c := range out {
			c.Close()
		}
	})
	return out
}

// dialFrom dials addr from the loopback address from (127.0.0.x: every
// address of 127/8 is this machine's on Linux).
func dialFrom(t *testing.T, from, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dialing %s from %s: %v", addr, from, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// closedByServer reports whether the server closed c: a read returns EOF
// (or a reset) rather than waiting.
func closedByServer(t *testing.T, c net.Conn) bool {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(20 * time.Second)) // a failsafe: the server closes at once
	_, err := c.Read(make([]byte, 1))
	var ne net.Error
	return err != nil && !(errors.As(err, &ne) && ne.Timeout())
}

// TestConnsPerAddress fills one source address's share: its further
// connections are refused and closed at once (per_address), while another
// address is served.
func TestConnsPerAddress(t *testing.T) {
	t.Parallel()
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := newRefusals()
	conns := New(Limits{Max: 8, PerAddress: 3, Refused: r.refused})
	accepted := acceptAll(t, conns.Listen(tcp))
	addr := tcp.Addr().String()

	for range 3 {
		dialFrom(t, "127.0.0.2", addr)
		<-accepted
	}
	flood := []net.Conn{dialFrom(t, "127.0.0.2", addr), dialFrom(t, "127.0.0.2", addr)}
	for _, c := range flood {
		if !closedByServer(t, c) {
			t.Errorf("a connection past the address's share was not closed")
		}
	}
	if got := <-r.c; got != CausePerAddress {
		t.Errorf("refusal cause = %q, want %q", got, CausePerAddress)
	}
	dialFrom(t, "127.0.0.1", addr)
	select {
	case <-accepted:
	case <-time.After(20 * time.Second): // a failsafe: it is accepted at once
		t.Fatalf("a connection from another address was not accepted while 127.0.0.2 held its share")
	}
	if got := conns.Open(); got != 4 {
		t.Errorf("open connections = %d, want 4", got)
	}
}

// TestConnsTotal fills the listener: the next connection, from any
// address, is refused (total), and once one closes another is served.
func TestConnsTotal(t *testing.T) {
	t.Parallel()
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := newRefusals()
	conns := New(Limits{Max: 2, PerAddress: 2, Refused: r.refused})
	accepted := acceptAll(t, conns.Listen(tcp))
	addr := tcp.Addr().String()
	dialFrom(t, "127.0.0.2", addr)
	first := <-accepted
	dialFrom(t, "127.0.0.3", addr)
	<-accepted
	if c := dialFrom(t, "127.0.0.4", addr); !closedByServer(t, c) {
		t.Errorf("a third connection was not refused while two were open")
	}
	if got := <-r.c; got != CauseTotal {
		t.Errorf("refusal cause = %q, want %q", got, CauseTotal)
	}
	first.Close()
	dialFrom(t, "127.0.0.4", addr)
	<-accepted
}

// TestConnsAuthTimeout checks that a connection that made no
// authenticated call within AuthTimeout is closed and counted, and that one
// that did stays open.
func TestConnsAuthTimeout(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		r := newRefusals()
		conns := New(Limits{Max: 8, PerAddress: 8, AuthTimeout: 5 * time.Second, Refused: r.refused})
		pl := pipenet.Listen(&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 7070})
		lis := conns.Listen(pl)
		defer lis.Close()
		accepted := make(chan net.Conn, 2)
		go func() {
			for {
				c, err := lis.Accept()
				if err != nil {
					return
				}
				accepted <- c
			}
		}()
		dial := func(port int) net.Conn {
			c, err := pl.Dial(t.Context(), &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2), Port: port})
			if err != nil {
				t.Fatal(err)
			}
			return c
		}
		authed, idle := dial(1001), dial(1002)
		server := <-accepted
		<-accepted
		conns.Authenticated(server.LocalAddr(), server.RemoteAddr())

		time.Sleep(4 * time.Second)
		synctest.Wait()
		if got := r.all(); len(got) != 0 {
			t.Fatalf("refusals before the timeout: %v", got)
		}
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if got := r.all(); len(got) != 1 || got[0] != CauseUnauthenticated {
			t.Fatalf("refusals after the timeout = %v, want one %q", got, CauseUnauthenticated)
		}
		if _, err := idle.Read(make([]byte, 1)); err != io.EOF {
			t.Errorf("the connection without an authenticated call: Read = %v, want EOF (closed)", err)
		}
		if got := conns.Open(); got != 1 {
			t.Errorf("open connections = %d, want 1", got)
		}
		go server.Write([]byte{1})
		if _, err := authed.Read(make([]byte, 1)); err != nil {
			t.Errorf("the authenticated connection: Read = %v, want it open", err)
		}
		server.Close()
		authed.Close()
		idle.Close()
	})
}

// TestAddressKey checks what counts as one address: an IPv4 address, an
// IPv6 /64, and nothing for a peer without an IP address.
func TestAddressKey(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		addr net.Addr
		want string
	}{
		{&net.TCPAddr{IP: net.ParseIP("10.1.2.3"), Port: 5}, "10.1.2.3"},
		{&net.TCPAddr{IP: net.ParseIP("::ffff:10.1.2.3"), Port: 5}, "10.1.2.3"},
		{&net.TCPAddr{IP: net.ParseIP("2001:db8:1:2:aaaa::1"), Port: 5}, "2001:db8:1:2::/64"},
		{&net.TCPAddr{IP: net.ParseIP("2001:db8:1:2:bbbb::9"), Port: 6}, "2001:db8:1:2::/64"},
		{&net.UnixAddr{Name: "/tmp/s", Net: "unix"}, ""},
	} {
		if got := addressKey(tc.addr); got != tc.want {
			t.Errorf("addressKey(%v) = %q, want %q", tc.addr, got, tc.want)
		}
	}
}
