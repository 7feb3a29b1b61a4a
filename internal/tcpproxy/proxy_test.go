package tcpproxy

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// failsafe bounds every wait of these tests; they end as soon as what they
// wait for happens.
const failsafe = 10 * time.Second

// testBundle is a proxy in front of a target whose accepted connections
// the test reads and writes itself.
type testBundle struct {
	proxy    *Proxy
	accepted chan net.Conn
	conns    int // connections made by connect
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &testBundle{accepted: make(chan net.Conn, 16)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			b.accepted <- c
		}
	}()
	p, err := Listen(lis.Addr().String(), 1)
	if err != nil {
		t.Fatal(err)
	}
	b.proxy = p
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		lis.Close()
		<-done
		close(b.accepted)
		for c := range b.accepted {
			c.Close()
		}
	})
	return b
}

// connect dials the proxy and returns the client's end and the target's.
func (b *testBundle) connect(t *testing.T) (client, server net.Conn) {
	t.Helper()
	client, err := net.Dial("tcp", b.proxy.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	select {
	case server = <-b.accepted:
	case <-time.After(failsafe):
		t.Fatal("the target accepted no connection")
	}
	t.Cleanup(func() { server.Close() })
	b.conns++
	want := b.conns
	waitStats(t, b.proxy, "the pair to be registered", func(s Stats) bool { return s.Accepted == want })
	return client, server
}

// readN reads exactly n bytes with the failsafe as deadline.
func readN(t *testing.T, c net.Conn, n int) []byte {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(failsafe))
	buf := make([]byte, n)
	if _, err := io.ReadFull(c, buf); err != nil {
		t.Fatalf("reading %d bytes: %v", n, err)
	}
	return buf
}

// write writes b or fails the test.
func write(t *testing.T, c net.Conn, b string) {
	t.Helper()
	if _, err := c.Write([]byte(b)); err != nil {
		t.Fatalf("writing %q: %v", b, err)
	}
}

// waitStats waits for cond with the failsafe as bound.
func waitStats(t *testing.T, p *Proxy, what string, cond func(Stats) bool) Stats {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), failsafe)
	defer cancel()
	st, err := p.WaitStats(ctx, cond)
	if err != nil {
		t.Fatalf("waiting for %s: %v (stats %+v)", what, err, st)
	}
	return st
}

// readFails waits for a read on c to fail, as it does once the proxy
// closes the connection, and returns the error.
func readFails(t *testing.T, c net.Conn) error {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(failsafe))
	_, err := c.Read(make([]byte, 1))
	if err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read = %v, want the connection closed", err)
	}
	return err
}

func TestForwardsBothWays(t *testing.T) {
	t.Parallel()
	b := setup(t)
	client, server := b.connect(t)
	write(t, client, "ping")
	if got := string(readN(t, server, 4)); got != "ping" {
		t.Errorf("target read %q, want %q", got, "ping")
	}
	write(t, server, "pong")
	if got := string(readN(t, client, 4)); got != "pong" {
		t.Errorf("client read %q, want %q", got, "pong")
	}
	// The target may read before the proxy has counted its write.
	st := waitStats(t, b.proxy, "the writes to be counted", func(s Stats) bool { return s.Delivered == [2]int64{4, 4} })
	if st.Delivered != [2]int64{4, 4} || st.Accepted != 1 || st.Open != 1 {
		t.Errorf("stats = %+v, want 4 bytes each way over 1 open connection", st)
	}
}

func TestDelayHoldsEveryChunkInOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const mean, jitter = 75 * time.Millisecond, 50 * time.Millisecond
	b.proxy.SetDelay(ToServer, mean, jitter)
	client, server := b.connect(t)
	var want bytes.Buffer
	for i := range 8 {
		msg := string(rune('a' + i))
		want.WriteString(msg)
		start := time.Now()
		write(t, client, msg)
		if got := string(readN(t, server, 1)); got != msg {
			t.Fatalf("chunk %d arrived as %q, want %q", i, got, msg)
		}
		if took := time.Since(start); took < mean-jitter {
			t.Errorf("chunk %d arrived after %v, want at least %v", i, took, mean-jitter)
		}
	}
	// Chunks written back to back keep their order whatever their delays.
	for i := range 20 {
		write(t, client, string(rune('A'+i)))
	}
	got := readN(t, server, 20)
	if want := "ABCDEFGHIJKLMNOPQRST"; string(got) != want {
		t.Errorf("back-to-back chunks arrived as %q, want %q", got, want)
	}
}

func TestBlackholeHoldsBytesWithoutClosing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	client, server := b.connect(t)
	b.proxy.Set(ToServer, Blackhole)
	write(t, client, "held")
	waitStats(t, b.proxy, "the held bytes to be read", func(s Stats) bool { return s.Received[ToServer] == 4 })
	// The other direction still flows.
	write(t, server, "back")
	if got := string(readN(t, client, 4)); got != "back" {
		t.Errorf("client read %q, want %q", got, "back")
	}
	_ = server.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	if n, err := server.Read(make([]byte, 4)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("target read %d bytes (%v) through a blackhole, want none", n, err)
	}
	if got := b.proxy.LastByte(ToServer); !got.IsZero() {
		t.Errorf("LastByte(ToServer) = %v, want zero: nothing was delivered", got)
	}
	b.proxy.Set(ToServer, Forward)
	if got := string(readN(t, server, 4)); got != "held" {
		t.Errorf("target read %q after the blackhole, want the held %q", got, "held")
	}
	if st := b.proxy.Stats(); st.Open != 1 || st.Dropped[ToServer] != 0 {
		t.Errorf("stats = %+v, want the connection open and nothing dropped", st)
	}
}

func TestDropDiscardsBytes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	client, server := b.connect(t)
	b.proxy.Set(ToServer, Drop)
	write(t, client, "lost")
	waitStats(t, b.proxy, "the bytes to be dropped", func(s Stats) bool { return s.Dropped[ToServer] == 4 })
	b.proxy.Set(ToServer, Forward)
	write(t, client, "kept")
	if got := string(readN(t, server, 4)); got != "kept" {
		t.Errorf("target read %q, want %q (the dropped bytes never arrive)", got, "kept")
	}
}

func TestResetClosesEveryConnection(t *testing.T) {
	t.Parallel()
	b := setup(t)
	client1, server1 := b.connect(t)
	client2, _ := b.connect(t)
	if n := b.proxy.Reset(); n != 2 {
		t.Errorf("Reset() = %d, want 2", n)
	}
	readFails(t, client1)
	readFails(t, client2)
	readFails(t, server1)
	if st := b.proxy.Stats(); st.Reset != 2 || st.Open != 0 {
		t.Errorf("stats = %+v, want 2 reset and none open", st)
	}
}

func TestRefuseClosesNewConnections(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.proxy.Refuse(true)
	// The reset may come before the dial returns, or after.
	if c, err := net.Dial("tcp", b.proxy.Addr()); err == nil {
		defer c.Close()
		readFails(t, c)
	}
	waitStats(t, b.proxy, "the refusal", func(s Stats) bool { return s.Refused == 1 })
	b.proxy.Refuse(false)
	client, server := b.connect(t)
	write(t, client, "ok")
	if got := string(readN(t, server, 2)); got != "ok" {
		t.Errorf("target read %q, want %q", got, "ok")
	}
}

func TestMaxAgeCutsConnections(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.proxy.SetMaxAge(50 * time.Millisecond)
	client, _ := b.connect(t)
	readFails(t, client)
	waitStats(t, b.proxy, "the connection to age out", func(s Stats) bool { return s.AgedOut == 1 && s.Open == 0 })
}

func TestEndOfOneSideClosesThePair(t *testing.T) {
	t.Parallel()
	b := setup(t)
	client, server := b.connect(t)
	write(t, client, "bye")
	readN(t, server, 3)
	client.Close()
	readFails(t, server)
	waitStats(t, b.proxy, "the pair to end", func(s Stats) bool { return s.Ended == 1 && s.Open == 0 })
}

func TestLastDataCountsOnlyDataFrames(t *testing.T) {
	t.Parallel()
	b := setup(t)
	client, server := b.connect(t)
	settings := frame(0x4, nil)
	data := frame(frameTypeData, []byte("hello"))
	delivered := func(n int) {
		t.Helper()
		readN(t, server, n)
		waitStats(t, b.proxy, "the write to be counted", func(s Stats) bool { return s.Delivered[ToServer] >= int64(n) })
	}
	write(t, client, http2Preface+string(settings))
	delivered(len(http2Preface) + len(settings))
	if got := b.proxy.LastData(ToServer); !got.IsZero() {
		t.Errorf("LastData after the preface and SETTINGS = %v, want zero", got)
	}
	// A DATA frame split across writes counts once its last byte is delivered.
	write(t, client, string(data[:7]))
	delivered(7)
	if got := b.proxy.LastData(ToServer); !got.IsZero() {
		t.Errorf("LastData after half a DATA frame = %v, want zero", got)
	}
	before := time.Now()
	write(t, client, string(data[7:]))
	readN(t, server, len(data)-7)
	waitStats(t, b.proxy, "the write to be counted", func(s Stats) bool {
		return s.Delivered[ToServer] == int64(len(http2Preface)+len(settings)+len(data))
	})
	if got := b.proxy.LastData(ToServer); got.Before(before) {
		t.Errorf("LastData after a whole DATA frame = %v, want at or after %v", got, before)
	}
}

func TestFrameReader(t *testing.T) {
	t.Parallel()
	data, empty, ping := frame(frameTypeData, []byte("abc")), frame(frameTypeData, nil), frame(0x6, make([]byte, 8))
	stream := []byte(http2Preface)
	for _, f := range [][]byte{ping, data, empty, data, ping} {
		stream = append(stream, f...)
	}
	for _, size := range []int{1, 2, 5, 9, 10, len(stream)} {
		f := &frameReader{skip: len(http2Preface)}
		got := 0
		for b := stream; len(b) > 0; b = b[min(size, len(b)):] {
			got += f.feed(b[:min(size, len(b))])
		}
		if got != 2 {
			t.Errorf("fed in chunks of %d bytes: %d DATA frames ended, want 2 (empty ones and pings do not count)", size, got)
		}
	}
}

// frame encodes an HTTP/2 frame on stream 1.
func frame(typ byte, payload []byte) []byte {
	n := len(payload)
	h := []byte{byte(n >> 16), byte(n >> 8), byte(n), typ, 0, 0, 0, 0, 1}
	return append(h, payload...)
}
