package cluster

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/leasehold/leasehold/internal/security/securitytest"
)

// both are the extended key usages of a node's peer certificate.
var both = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}

// peerBundle is a node's raft transport under test: n1's, with the peer
// CA that signs the members' certificates, and the RPCs that reached
// raft through it.
type peerBundle struct {
	ca      *securitytest.CA
	n1      *peerTransport
	members []raft.Server

	mu      sync.Mutex
	reached []string // the ids the RPCs that reached raft claimed
}

// newPeerBundle starts n1's transport: over mutual TLS under a peer CA
// when tlsOn, else plaintext on loopback. The members are n1 (at its
// listener), n2 and n3 (at addresses no one listens on). The RPCs that
// reach raft are granted. proof, when not 0, bounds a connection's proof;
// opts change the transport's configuration.
func newPeerBundle(t *testing.T, tlsOn bool, proof time.Duration, opts ...func(*transportConfig)) *peerBundle {
	t.Helper()
	b := &peerBundle{ca: securitytest.NewCA(t, "peer CA")}
	cfg := transportConfig{Listen: "127.0.0.1:0", Members: b.memberList, Logger: hclogOf(slog.New(slog.DiscardHandler)), ProofTimeout: proof}
	for _, o := range opts {
		o(&cfg)
	}
	if tlsOn {
		cfg.TLS = b.peerTLS(b.node(t, "n1"))
	}
	n1, err := newPeerTransport(cfg)
	if err != nil {
		t.Fatal(err)
	}
	b.n1 = n1
	b.members = []raft.Server{{ID: "n1", Address: raft.ServerAddress(n1.lis.Addr().String())},
		{ID: "n2", Address: "127.0.0.1:7202"}, {ID: "n3", Address: "127.0.0.1:7203"}}
	go b.grant()
	t.Cleanup(func() { n1.Close() })
	return b
}

func (b *peerBundle) memberList() []raft.Server {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.members
}

// node issues the peer certificate of the node ids given.
func (b *peerBundle) node(t *testing.T, ids ...string) tls.Certificate {
	t.Helper()
	var uris []string
	for _, id := range ids {
		uris = append(uris, NodeURI(id))
	}
	return b.ca.IssueWithURIs(t, both, uris)
}

// peerTLS is a node's mutual TLS under the peer CA, as security.PeerTLS
// makes it.
func (b *peerBundle) peerTLS(cert tls.Certificate) *tls.Config {
	return &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: b.ca.Pool(), ClientCAs: b.ca.Pool(),
		ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12}
}

// grant answers every RPC that reaches raft, until n1 closes.
func (b *peerBundle) grant() {
	for {
		select {
		case rpc := <-b.n1.Consumer():
			b.mu.Lock()
			b.reached = append(b.reached, string(rpc.Command.(raft.WithRPCHeader).GetRPCHeader().ID))
			b.mu.Unlock()
			rpc.Respond(&raft.RequestVoteResponse{Term: 1, Granted: true}, nil)
		case <-b.n1.done:
			return
		}
	}
}

// vote sends n1 a RequestVote claiming to come from id at addr, over a
// connection dialled with cfg (plaintext when nil), as raft's transport
// sends it, and returns its outcome.
func (b *peerBundle) vote(t *testing.T, cfg *tls.Config, id, addr string) error {
	t.Helper()
	trans := raft.NewNetworkTransport(&clientStream{cfg: cfg, closed: make(chan struct{})}, 1, 5*time.Second, io.Discard)
	defer trans.Close()
	req := &raft.RequestVoteRequest{RPCHeader: raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte(id), Addr: []byte(addr)}, Term: 1}
	var resp raft.RequestVoteResponse
	err := trans.RequestVote("n1", raft.ServerAddress(b.n1.lis.Addr().String()), req, &resp)
	if err == nil && !resp.Granted {
		t.Fatalf("a vote from %s answered without error, not granted", id)
	}
	return err
}

// clientStream dials with a TLS configuration of the test's choice, or
// in plaintext: a peer, or someone who is not one.
type clientStream struct {
	cfg    *tls.Config
	closed chan struct{}
	once   sync.Once
}

func (s *clientStream) Accept() (net.Conn, error) { <-s.closed; return nil, net.ErrClosed }
func (s *clientStream) Close() error              { s.once.Do(func() { close(s.closed) }); return nil }
func (s *clientStream) Addr() net.Addr            { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)} }
func (s *clientStream) Dial(a raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	d := &net.Dialer{Timeout: timeout}
	if s.cfg == nil {
		return d.Dial("tcp", string(a))
	}
	return tls.DialWithDialer(d, "tcp", string(a), s.cfg)
}

// dialAs is a client TLS configuration presenting cert (none when nil),
// trusting n1 whatever it presents: what n1 checks is under test.
func dialAs(cert *tls.Certificate) *tls.Config {
	cfg := &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12} //nolint:gosec // the peer under test is the server
	if cert != nil {
		// Presented whatever CAs the server asks for, as an attacker would.
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert, nil }
	}
	return cfg
}

// TestPeerIdentity: the accepting end takes an RPC only from a peer whose
// certificate the peer CA signed, names a member's id (not merely a host
// a member has), and whose RPC claims that member at its address; the
// dialling end takes only the member whose address it dialled.
func TestPeerIdentity(t *testing.T) {
	t.Parallel()
	b := newPeerBundle(t, true, 0)
	n2 := b.node(t, "n2")
	clientCA := securitytest.NewCA(t, "client CA")
	renderer := clientCA.IssueWithURIs(t, both, []string{NodeURI("n2")}, "renderer-1")
	hostOnly := b.ca.IssueFor(t, both, "localhost", "n2.peers.test")
	stranger := b.node(t, "n9")
	shared := b.node(t, "n2", "n3")
	for _, tc := range []struct {
		name     string
		cfg      *tls.Config
		id, addr string
		refused  bool
	}{
		{"A peer without a certificate", dialAs(nil), "n2", "127.0.0.1:7202", true},
		{"A client certificate from the client CA naming a member", dialAs(&renderer), "n2", "127.0.0.1:7202", true},
		{"A peer CA certificate naming a member's host but no id", dialAs(&hostOnly), "n2", "127.0.0.1:7202", true},
		{"A peer CA certificate naming an id that is no member", dialAs(&stranger), "n9", "127.0.0.1:7209", true},
		{"A member's certificate claiming another member", dialAs(&n2), "n3", "127.0.0.1:7203", true},
		{"A member's certificate claiming itself at another address", dialAs(&n2), "n2", "127.0.0.1:9999", true},
		{"Plaintext to a TLS port", nil, "n2", "127.0.0.1:7202", true},
		{"A member", dialAs(&n2), "n2", "127.0.0.1:7202", false},
		{"A certificate naming two members, claiming one", dialAs(&shared), "n3", "127.0.0.1:7203", false},
	} {
		err := b.vote(t, tc.cfg, tc.id, tc.addr)
		if tc.refused != (err != nil) {
			t.Errorf("%s: vote = %v, want refused %v", tc.name, err, tc.refused)
		}
	}
	b.mu.Lock()
	if got := b.reached; len(got) != 2 || got[0] != "n2" || got[1] != "n3" {
		t.Errorf("RPCs that reached raft claimed %q, want only the two accepted", got)
	}
	b.mu.Unlock()

	t.Run("The dialling end takes only the member it dialled", func(t *testing.T) {
		for _, tc := range []struct {
			name    string
			cert    tls.Certificate
			refused bool
		}{
			{"Another member's certificate", b.node(t, "n3"), true},
			{"A certificate naming a member's host", hostOnly, true},
			{"The member's certificate", b.node(t, "n2"), false},
		} {
			// A node listening where the members say n2 is.
			srv, err := newPeerTransport(transportConfig{Listen: "127.0.0.1:0", TLS: b.peerTLS(tc.cert), Members: b.memberList,
				Logger: hclogOf(slog.New(slog.DiscardHandler))})
			if err != nil {
				t.Fatal(err)
			}
			b.mu.Lock()
			b.members = []raft.Server{b.members[0], {ID: "n2", Address: raft.ServerAddress(srv.lis.Addr().String())}, b.members[2]}
			b.mu.Unlock()
			c, err := b.n1.dial(raft.ServerAddress(srv.lis.Addr().String()), 5*time.Second)
			if c != nil {
				c.Close()
			}
			if tc.refused != errors.Is(err, errNotAMember) || !tc.refused && err != nil {
				t.Errorf("%s: dial = %v, want refused %v", tc.name, err, tc.refused)
			}
			srv.Close()
		}
	})
}

// TestPlaintextPeers: on loopback without TLS, an RPC is taken only when
// its header claims a member at that member's address.
func TestPlaintextPeers(t *testing.T) {
	t.Parallel()
	b := newPeerBundle(t, false, 0)
	for _, tc := range []struct {
		name, id, addr string
		refused        bool
	}{
		{"A stranger", "n9", "127.0.0.1:7209", true},
		{"A member at another address", "n2", "127.0.0.1:9999", true},
		{"A member", "n2", "127.0.0.1:7202", false},
	} {
		if err := b.vote(t, nil, tc.id, tc.addr); tc.refused != (err != nil) {
			t.Errorf("%s: vote = %v, want refused %v", tc.name, err, tc.refused)
		}
	}
}

// TestCheckPeerCertificate: a node's own peer certificate must name its
// id and serve both ends.
func TestCheckPeerCertificate(t *testing.T) {
	t.Parallel()
	ca := securitytest.NewCA(t, "peer CA")
	if err := CheckPeerCertificate(ca.IssueWithURIs(t, both, []string{NodeURI("n1")}), "n1"); err != nil {
		t.Errorf("a node's certificate: %v", err)
	}
	for name, cert := range map[string]tls.Certificate{
		"another node's":             ca.IssueWithURIs(t, both, []string{NodeURI("n2")}),
		"one for its host only":      ca.IssueFor(t, both, "n1.peers.test"),
		"one for server auth only":   ca.IssueWithURIs(t, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, []string{NodeURI("n1")}),
		"a URI under another prefix": ca.IssueWithURIs(t, both, []string{"spiffe://other/node/n1"}),
	} {
		if err := CheckPeerCertificate(cert, "n1"); err == nil {
			t.Errorf("%s certificate passed", name)
		}
	}
}
