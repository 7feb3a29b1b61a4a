package pipenet

import (
	"context"
	"errors"
	"net"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// TestListener connects a client through the listener and checks both
// ends' addresses, that bytes pass, and that a closed listener refuses.
func TestListener(t *testing.T) {
	t.Parallel()
	local := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 7070}
	remote := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2), Port: 40000}
	l := Listen(local)
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := l.Accept()
		if err == nil {
			accepted <- c
		}
	}()
	client, err := l.Dial(context.Background(), remote)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	server := <-accepted
	defer server.Close()
	if server.LocalAddr() != local || server.RemoteAddr() != remote {
		t.Errorf("server end addresses = %v, %v; want %v, %v", server.LocalAddr(), server.RemoteAddr(), local, remote)
	}
	go client.Write([]byte("x"))
	b := make([]byte, 1)
	if _, err := server.Read(b); err != nil || b[0] != 'x' {
		t.Errorf("Read = %q, %v; want the byte written", b, err)
	}
	l.Close()
	if _, err := l.Dial(context.Background(), nil); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Dial after Close = %v, want net.ErrClosed", err)
	}
	if _, err := l.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Accept after Close = %v, want net.ErrClosed", err)
	}
}
