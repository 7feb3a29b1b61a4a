package auth

import (
	"context"
	"net"

	"google.golang.org/grpc/peer"
)

// LocalPeer reports whether a connection's remote address is on this
// machine: a loopback IP address, or an address of no IP network at all
// (a Unix socket, the coordinator's in-process connection), which no
// other machine can dial. Every TCP or UDP peer has an IP address, so a
// peer across the network is never taken for a local one.
//
// A proxy, a port-forward or an SSH tunnel on this machine connects from
// loopback and so passes; no check of the peer can tell what is behind it.
// That is why the development tokens are refused at start on a listener
// other machines can reach as well.
func LocalPeer(a net.Addr) bool {
	switch a := a.(type) {
	case nil:
		return false
	case *net.TCPAddr:
		return a.IP.IsLoopback()
	case *net.UDPAddr:
		return a.IP.IsLoopback()
	case *net.IPAddr:
		return a.IP.IsLoopback()
	}
	switch a.Network() {
	case "tcp", "tcp4", "tcp6", "udp", "udp4", "udp6", "ip", "ip4", "ip6":
		return LocalHostPort(a.String())
	}
	return true
}

// LocalHostPort reports whether a "host:port" remote address, as
// net/http's Request.RemoteAddr gives it, is a loopback IP address. Any
// other form is not.
func LocalHostPort(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// fromThisMachine reports whether the call of ctx came over a connection
// from this machine (LocalPeer). A context without a peer, which gRPC
// always gives its handlers and interceptors, is not.
func fromThisMachine(ctx context.Context) bool {
	p, ok := peer.FromContext(ctx)
	return ok && LocalPeer(p.Addr)
}

// errNotLocal refuses a token that is only for development (a principal
// with LoopbackOnly) on a call from another machine.
var errNotLocal = unauthenticated("this token is a public development token; it is accepted only from this machine")
