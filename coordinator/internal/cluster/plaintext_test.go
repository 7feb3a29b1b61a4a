package cluster

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/leasehold/leasehold/coordinator/internal/store"
)

// records is a slog handler that keeps every record it is given.
type records struct {
	mu   sync.Mutex
	recs []slog.Record
	// added is closed, and replaced, at every record.
	added chan struct{}
}

func (h *records) Enabled(context.Context, slog.Level) bool { return true }
func (h *records) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *records) WithGroup(string) slog.Handler            { return h }
func (h *records) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.recs = append(h.recs, r.Clone())
	if h.added != nil {
		close(h.added)
	}
	h.added = make(chan struct{})
	return nil
}

// await waits for a record at level whose message contains msg, and
// returns it.
func (h *records) await(t *testing.T, level slog.Level, msg string) slog.Record {
	t.Helper()
	deadline := time.After(time.Minute) // failsafe: the record comes as raft runs
	for {
		h.mu.Lock()
		for _, r := range h.recs {
			if r.Level == level && strings.Contains(r.Message, msg) {
				h.mu.Unlock()
				return r
			}
		}
		if h.added == nil {
			h.added = make(chan struct{})
		}
		added := h.added
		h.mu.Unlock()
		select {
		case <-added:
		case <-deadline:
			t.Fatalf("no record at %v containing %q", level, msg)
		}
	}
}

// find returns the records whose message contains msg.
func (h *records) find(msg string) []slog.Record {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []slog.Record
	for _, r := range h.recs {
		if strings.Contains(r.Message, msg) {
			out = append(out, r)
		}
	}
	return out
}

// attr returns the value of r's attribute key, as a string.
func attr(r slog.Record, key string) string {
	var v string
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == key {
			v = a.Value.String()
			return false
		}
		return true
	})
	return v
}

// startPlaintextNode starts a single-voter node on a real listener at
// listen, without TLS, and returns it with its log, or StartNode's error.
func startPlaintextNode(t *testing.T, listen string, insecure bool, peers ...Peer) (*Node, *records, error) {
	t.Helper()
	st, err := store.Open(filepath.Join(t.TempDir(), "n1.db"), store.WithoutSync())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	fsm, err := NewFSM(st)
	if err != nil {
		t.Fatal(err)
	}
	logs := &records{}
	if len(peers) == 0 {
		peers = []Peer{{ID: "n1", RaftAddr: "127.0.0.1:7201"}}
	}
	n, err := StartNode(NodeConfig{ID: "n1", Listen: listen, Advertise: "127.0.0.1:7201", Peers: peers, InmemStore: true,
		InsecurePlaintext: insecure, Logger: slog.New(logs)}, fsm)
	if err == nil {
		t.Cleanup(func() { _ = n.Shutdown() })
	}
	return n, logs, err
}

// plainConfig is the configuration of a plaintext transport on listen.
func plainConfig(listen string, anyHost bool) transportConfig {
	return transportConfig{Listen: listen, AnyHost: anyHost, Members: func() []raft.Server { return nil },
		Logger: hclogOf(slog.New(slog.DiscardHandler))}
}

// otherHostIP returns an IP address of this machine that is not loopback,
// or skips the test.
func otherHostIP(t *testing.T) net.IP {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok && !ipn.IP.IsLoopback() && ipn.IP.To4() != nil {
			return ipn.IP
		}
	}
	t.Skip("this machine has no IPv4 address but loopback")
	return nil
}

// TestPlaintextRaftOnlyOnLoopback: without TLS, the raft listener, the
// address it advertises and every peer must be on loopback, and a dial
// that reaches another host is closed before anything is sent; the
// opt-out lifts both and warns at every start; the start-up line names
// the address and how it is protected.
func TestPlaintextRaftOnlyOnLoopback(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, listen string
		peers        []Peer
		want         string
	}{
		{"Every interface", "0.0.0.0:0", nil, "the raft listener 0.0.0.0:0 is not on loopback"},
		{"Every interface, no host", ":0", nil, "the raft listener :0 is not on loopback"},
		{"Another host's address", "192.0.2.1:7201", nil, "the raft listener 192.0.2.1:7201 is not on loopback"},
		{"A peer on another host", "127.0.0.1:0", []Peer{{ID: "n1", RaftAddr: "127.0.0.1:7201"}, {ID: "n2", RaftAddr: "10.0.0.2:7201"},
			{ID: "n3", RaftAddr: "127.0.0.1:7203"}}, "peer n2's raft address 10.0.0.2:7201 is not on loopback"},
	} {
		t.Run(tc.name+" is refused without TLS", func(t *testing.T) {
			t.Parallel()
			_, _, err := startPlaintextNode(t, tc.listen, false, tc.peers...)
			if !errors.Is(err, ErrPlaintextRaft) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "--"+InsecurePlaintextFlag) {
				t.Errorf("StartNode = %v, want %v naming %q and the fix", err, ErrPlaintextRaft, tc.want)
			}
		})
	}
	t.Run("A listener bound off loopback is refused by the listener itself", func(t *testing.T) {
		t.Parallel()
		// The listener itself checks the address it is bound to: a name
		// that resolves elsewhere than loopback passes no static check.
		ip := otherHostIP(t)
		if pt, err := newPeerTransport(plainConfig(net.JoinHostPort(ip.String(), "0"), false)); !errors.Is(err, ErrPlaintextRaft) {
			if pt != nil {
				pt.Close()
			}
			t.Errorf("listening on %s = %v, want %v", ip, err, ErrPlaintextRaft)
		}
	})
	t.Run("Loopback serves and says it is plaintext on loopback", func(t *testing.T) {
		t.Parallel()
		_, logs, err := startPlaintextNode(t, "localhost:0", false)
		if err != nil {
			t.Fatal(err)
		}
		lines := logs.find("raft listening")
		if len(lines) != 1 || attr(lines[0], "protection") != "plaintext on loopback only" || !strings.HasPrefix(attr(lines[0], "addr"), "127.0.0.1:") {
			t.Errorf("start-up lines %v, want one naming its loopback address and plaintext on loopback", lines)
		}
		if w := logs.find("without TLS off loopback"); len(w) != 0 {
			t.Errorf("a loopback node warned: %v", w)
		}
	})
	t.Run("The opt-out listens on every interface and warns", func(t *testing.T) {
		t.Parallel()
		_, logs, err := startPlaintextNode(t, "0.0.0.0:0", true,
			Peer{ID: "n1", RaftAddr: "127.0.0.1:7201"}, Peer{ID: "n2", RaftAddr: "10.0.0.2:7201"}, Peer{ID: "n3", RaftAddr: "10.0.0.3:7201"})
		if err != nil {
			t.Fatal(err)
		}
		lines := logs.find("raft listening")
		if len(lines) != 1 || !strings.Contains(attr(lines[0], "protection"), "opt-out") {
			t.Errorf("start-up lines %v, want one saying plaintext by opt-out", lines)
		}
		warns := slices.DeleteFunc(logs.find("without TLS off loopback"), func(r slog.Record) bool { return r.Level != slog.LevelWarn })
		if len(warns) != 1 {
			t.Errorf("warnings %v, want one at WARN", warns)
		}
	})
	t.Run("A plaintext dial that reaches another host is closed", func(t *testing.T) {
		t.Parallel()
		ip := otherHostIP(t)
		far, err := newPeerTransport(plainConfig(net.JoinHostPort(ip.String(), "0"), true))
		if err != nil {
			t.Fatal(err)
		}
		defer far.Close()
		near, err := newPeerTransport(plainConfig("127.0.0.1:0", false))
		if err != nil {
			t.Fatal(err)
		}
		defer near.Close()
		farAddr := raft.ServerAddress(far.lis.Addr().String())
		if c, err := near.dial(farAddr, 5*time.Second); !errors.Is(err, ErrPlaintextRaft) {
			if c != nil {
				c.Close()
			}
			t.Errorf("plaintext dial of %s = %v, want %v", farAddr, err, ErrPlaintextRaft)
		}
		if c, err := far.dial(farAddr, 5*time.Second); err != nil {
			t.Errorf("dial of %s by the opt-out = %v, want connected", farAddr, err)
		} else {
			c.Close()
		}
	})
}
