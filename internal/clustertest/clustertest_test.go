package clustertest

import (
	"bufio"
	"io"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/proctest"
)

var coordinatorBin string

func TestMain(m *testing.M) {
	proctest.Main(m, "clustertest", []string{"coordinator"}, func(dir string) {
		coordinatorBin = filepath.Join(dir, "coordinator")
	})
}

// echo listens on loopback and echoes every line back, until the test ends.
func echo(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		<-done
	})
	return l.Addr().String()
}

// roundTrip dials addr, sends a first line naming from (as a raft
// request's header names its sender) and reports whether it comes back.
func roundTrip(t *testing.T, addr, from string) bool {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, "\x00header "+from+"\n"); err != nil {
		return false
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	return err == nil && line == "\x00header "+from+"\n"
}

func TestPartition(t *testing.T) {
	targets := []string{echo(t), echo(t), echo(t)}
	p, err := newPartition(targets)
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	a := p.addrs

	t.Run("Every node reaches every other", func(t *testing.T) {
		for from := range a {
			for to := range a {
				if from != to && !roundTrip(t, a[to], a[from]) {
					t.Errorf("node %d does not reach node %d", from, to)
				}
			}
		}
	})
	t.Run("An isolated node reaches no one and no one reaches it; the others still talk", func(t *testing.T) {
		p.isolate(0)
		for _, pair := range [][2]int{{0, 1}, {0, 2}, {1, 0}, {2, 0}} {
			if roundTrip(t, a[pair[1]], a[pair[0]]) {
				t.Errorf("node %d reaches node %d across the cut", pair[0], pair[1])
			}
		}
		if !roundTrip(t, a[2], a[1]) || !roundTrip(t, a[1], a[2]) {
			t.Error("nodes 1 and 2 do not reach each other while 0 is isolated")
		}
		p.heal(0)
		if !roundTrip(t, a[1], a[0]) || !roundTrip(t, a[0], a[2]) {
			t.Error("node 0 does not reach the others once healed")
		}
	})
	t.Run("Isolating a node closes its open connections", func(t *testing.T) {
		c, err := net.Dial("tcp", a[1])
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		r := bufio.NewReader(c)
		if _, err := io.WriteString(c, "\x00header "+a[0]+"\n"); err != nil {
			t.Fatal(err)
		}
		if _, err := r.ReadString('\n'); err != nil {
			t.Fatalf("first line: %v", err)
		}
		p.isolate(0)
		defer p.heal(0)
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := r.ReadString('\n'); err != io.EOF {
			t.Errorf("reading after the cut = %v, want EOF", err)
		}
	})
}

// TestCluster runs three coordinator processes through the harness's
// faults: the leader isolated and a new one elected without it, healed,
// killed and restarted, a follower wiped and caught up again, and the
// stores equal at the end.
func TestCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three coordinator processes")
	}
	c := Start(t, Options{Coordinator: coordinatorBin, Procs: proctest.Options{Timeout: time.Minute, Tail: 40}})
	first := c.WaitLeader()

	c.Isolate(first)
	second := c.WaitLeader(first)
	if second == first {
		t.Fatalf("the isolated leader %d was found leading", first)
	}
	c.Heal(first)

	c.Kill(second)
	third := c.WaitLeader(second)
	c.Restart(second)

	follower := (third + 1) % c.N()
	c.Kill(follower)
	c.Wipe(follower)
	c.Restart(follower)

	reps, err := c.Digests(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if reps[0].AppliedIndex == 0 || len(reps[0].Digest) != 64 {
		t.Errorf("report of n1 = %+v, want an applied index and a digest", reps[0])
	}
}
