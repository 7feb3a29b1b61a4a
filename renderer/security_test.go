package renderer_test

import (
	"crypto/tls"
	"errors"
	"testing"

	"github.com/leasehold/leasehold/internal/security"
	"github.com/leasehold/leasehold/renderer"
	"github.com/leasehold/leasehold/renderer/mock"
)

// TestNewTransport checks that a renderer sends its token in plaintext
// only to a coordinator on loopback, unless told the network encrypts.
func TestNewTransport(t *testing.T) {
	t.Parallel()
	p := newMock(t, mock.Config{})
	tests := []struct {
		name      string
		cfg       renderer.Config
		plaintext bool // refused with ErrPlaintextToken
		refused   bool
	}{
		{"a token in plaintext to loopback", renderer.Config{Coordinator: "127.0.0.1:7070", Token: "t"}, false, false},
		{"a token in plaintext to another host", renderer.Config{Coordinator: "coordinator:7070", Token: "t"}, true, true},
		{"a token in plaintext to another host, allowed", renderer.Config{Coordinator: "coordinator:7070", Token: "t", InsecurePlaintext: true}, false, false},
		{"a token over TLS to another host", renderer.Config{Coordinator: "coordinator:7070", Token: "t", TLS: &tls.Config{}}, false, false},
		{"TLS and insecure plaintext together", renderer.Config{Coordinator: "coordinator:7070", TLS: &tls.Config{}, InsecurePlaintext: true}, false, true},
		{"a token in plaintext to replicas on loopback", renderer.Config{Coordinator: "127.0.0.1:7070,127.0.0.1:7071", Token: "t"}, false, false},
		{"a token in plaintext to replicas, one on another host", renderer.Config{Coordinator: "127.0.0.1:7070,coordinator-2:7070", Token: "t"}, true, true},
		{"a token in plaintext to a dns name", renderer.Config{Coordinator: "dns:///coordinator:7070", Token: "t"}, true, true},
		{"a token over TLS to replicas on other hosts", renderer.Config{Coordinator: "c-0:7070,c-1:7070,c-2:7070", Token: "t", TLS: &tls.Config{}}, false, false},
		{"a malformed replica list", renderer.Config{Coordinator: "c-0:7070,,c-1:7070", TLS: &tls.Config{}}, false, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.cfg.ID, tc.cfg.Provider = "r-1", p
			_, err := renderer.New(tc.cfg)
			if got := err != nil; got != tc.refused {
				t.Fatalf("New = %v, want refused %v", err, tc.refused)
			}
			if got := errors.Is(err, security.ErrPlaintextToken); got != tc.plaintext {
				t.Errorf("New = %v; ErrPlaintextToken %v, want %v", err, got, tc.plaintext)
			}
		})
	}
}
