package replica

import (
	"crypto/tls"
	"fmt"
	"net"
	"time"

	"github.com/hashicorp/raft"
)

// streamLayer is raft's transport over TCP, or over mutual TLS when tls is
// set: peers then present certificates the cluster CA signed, and each end
// checks the other's.
type streamLayer struct {
	net.Listener
	advertise net.Addr
	tls       *tls.Config
}

// listen opens the raft listener on addr; advertise is the address peers
// dial (the listener's own when empty).
func listen(addr, advertise string, cfg *tls.Config) (*streamLayer, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("raft listener: %w", err)
	}
	s := &streamLayer{Listener: l, advertise: l.Addr(), tls: cfg}
	if advertise != "" {
		a, err := net.ResolveTCPAddr("tcp", advertise)
		if err != nil {
			l.Close()
			return nil, fmt.Errorf("raft advertise address %q: %w", advertise, err)
		}
		s.advertise = a
	}
	if cfg != nil {
		s.Listener = tls.NewListener(l, cfg)
	}
	return s, nil
}

// Addr implements net.Listener: the address peers dial.
func (s *streamLayer) Addr() net.Addr { return s.advertise }

// Dial implements raft.StreamLayer.
func (s *streamLayer) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	d := &net.Dialer{Timeout: timeout}
	if s.tls == nil {
		return d.Dial("tcp", string(address))
	}
	return tls.DialWithDialer(d, "tcp", string(address), s.tls)
}

var _ raft.StreamLayer = (*streamLayer)(nil)
