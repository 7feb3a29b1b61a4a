package cluster

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/leasehold/leasehold/internal/security/securitytest"
)

// TestPeerCertificateMustNameAMember: the raft listener takes a peer whose
// certificate the cluster CA signed only when it names a member's host;
// a certificate the same CA signed for a renderer or a client is refused,
// and a member added to the configuration is taken once it is there.
func TestPeerCertificateMustNameAMember(t *testing.T) {
	ca := securitytest.NewCA(t, "cluster CA")
	both := []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	node := ca.IssueFor(t, both, "n1.peers.test", "localhost")
	cfg := &tls.Config{Certificates: []tls.Certificate{node}, RootCAs: ca.Pool(), ClientCAs: ca.Pool(),
		ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12}
	sl, err := listen("127.0.0.1:0", "", cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer sl.Close()
	members := []raft.ServerAddress{"n1.peers.test:7201", "n2.peers.test:7201"}
	sl.setMembers(func() []raft.ServerAddress { return members })

	// handshake dials the listener presenting cert and returns the
	// accepting end's verdict.
	handshake := func(t *testing.T, cert tls.Certificate) error {
		t.Helper()
		accepted := make(chan error, 1)
		go func() {
			c, err := sl.Accept()
			if err != nil {
				accepted <- err
				return
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			accepted <- c.(*tls.Conn).Handshake()
		}()
		c, err := tls.Dial("tcp", sl.Listener.Addr().String(), &tls.Config{Certificates: []tls.Certificate{cert},
			RootCAs: ca.Pool(), ServerName: "n1.peers.test", MinVersion: tls.VersionTLS12})
		if err == nil {
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			_, _ = c.Write([]byte{0})
			_, _ = c.Read(make([]byte, 1))
			c.Close()
		}
		return <-accepted
	}

	if err := handshake(t, ca.IssueFor(t, both, "n2.peers.test")); err != nil {
		t.Errorf("a member's certificate: %v, want accepted", err)
	}
	for name, cert := range map[string]tls.Certificate{
		"a renderer's client certificate":  ca.Client(t, "renderer-1"),
		"a certificate for another host":   ca.IssueFor(t, both, "mallory.test"),
		"a future member's, not yet added": ca.IssueFor(t, both, "n4.peers.test"),
	} {
		if err := handshake(t, cert); !errors.Is(err, errNotAMember) {
			t.Errorf("%s: %v, want refused as no member", name, err)
		}
	}
	members = append(members, "n4.peers.test:7201")
	sl.setMembers(func() []raft.ServerAddress { return members })
	if err := handshake(t, ca.IssueFor(t, both, "n4.peers.test")); err != nil {
		t.Errorf("an added member's certificate: %v, want accepted", err)
	}
}
