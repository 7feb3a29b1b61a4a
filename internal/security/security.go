// Package security builds the transport security of every Leasehold
// process: the coordinator's TLS and mutual-TLS server configuration, the
// TLS configuration of its clients (the renderer, the client library and
// the CLI), and the rule that decides how a client may send its bearer
// token.
//
// # The bearer token rule
//
// A bearer token is a password: whoever reads it on the wire can act as its
// principal. A client therefore sends it only
//
//   - over TLS (or any transport credentials that give privacy and
//     integrity), in which case gRPC itself refuses to send it on a
//     connection that turns out insecure (PerRPCCredentials with
//     RequireTransportSecurity);
//   - or in plaintext to a coordinator on this machine: a loopback address
//     or a Unix socket, for every replica the client may reach. DialOptions
//     refuses a plaintext target that names another host at once, and the
//     plaintext transport it installs checks
//     the address it actually connected to, so that a name that resolves
//     elsewhere is refused at the handshake, before the token leaves;
//   - or in plaintext anywhere when the caller says so explicitly
//     (Client.InsecurePlaintext), for networks that encrypt on their own,
//     such as a service mesh with mutual TLS between sidecars.
//
// On the server side, a coordinator given a certificate serves TLS only: a
// plaintext client fails its handshake and never reaches a handler, so no
// token is read from a plaintext connection.
package security

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// ErrPlaintextToken is returned when a client would send its bearer token
// without TLS to a coordinator that is not on this machine.
var ErrPlaintextToken = errors.New("refusing to send a bearer token without TLS to a coordinator that is not on loopback")

// ServerTLS returns the coordinator's TLS configuration: its certificate
// chain and key from PEM files, TLS 1.2 at least, and, when clientCAFile is
// set, mutual TLS: every client must present a certificate that the CAs in
// clientCAFile signed, or its handshake fails. The files are read once;
// errors name the file and what is wrong with it.
func ServerTLS(certFile, keyFile, clientCAFile string) (*tls.Config, error) {
	if certFile == "" || keyFile == "" {
		return nil, errors.New("a server certificate needs both a certificate file and a key file")
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("loading the key pair %s and %s: %w", certFile, keyFile, err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if clientCAFile != "" {
		pool, err := LoadCertPool(clientCAFile)
		if err != nil {
			return nil, err
		}
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}

// ClientTLS returns a client's TLS configuration: the server is verified
// against the CAs in caFile (the system's roots when empty), under
// serverName when set (else the host of the address dialled), and with
// certFile and keyFile the client presents its own certificate, for a
// coordinator that requires mutual TLS. certFile and keyFile go together.
func ClientTLS(caFile, certFile, keyFile, serverName string) (*tls.Config, error) {
	cfg := &tls.Config{ServerName: serverName, MinVersion: tls.VersionTLS12}
	if caFile != "" {
		pool, err := LoadCertPool(caFile)
		if err != nil {
			return nil, err
		}
		cfg.RootCAs = pool
	}
	switch {
	case certFile != "" && keyFile != "":
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("loading the key pair %s and %s: %w", certFile, keyFile, err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	case certFile != "" || keyFile != "":
		return nil, errors.New("a client certificate needs both a certificate file and a key file")
	}
	return cfg, nil
}

// PeerTLS returns the mutual TLS of a replicated coordinator's raft
// traffic: each node presents its own certificate (certFile, keyFile) when
// it dials and when it is dialled, and verifies the other's against the
// peer CA in caFile, both ways. A peer's certificate must be usable for
// client and server authentication; which member it names is the raft
// transport's check.
func PeerTLS(certFile, keyFile, caFile string) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("loading the key pair %s and %s: %w", certFile, keyFile, err)
	}
	pool, err := LoadCertPool(caFile)
	if err != nil {
		return nil, err
	}
	return &tls.Config{
		Certificates: []tls.Certificate{cert},
		RootCAs:      pool,
		ClientCAs:    pool,
		ClientAuth:   tls.RequireAndVerifyClientCert,
		MinVersion:   tls.VersionTLS12,
	}, nil
}

// nodeURIPrefix begins the URI a replicated coordinator's peer
// certificate carries for each node id it may speak raft as.
const nodeURIPrefix = "spiffe://leasehold/node/"

// NodeURI returns the URI (a subject alternative name) by which a peer
// certificate names the cluster node id: spiffe://leasehold/node/<id>.
func NodeURI(id string) string { return nodeURIPrefix + id }

// NodeIDs returns the node ids a certificate names as NodeURI does.
func NodeIDs(c *x509.Certificate) []string {
	var ids []string
	for _, u := range c.URIs {
		if id, ok := strings.CutPrefix(u.String(), nodeURIPrefix); ok && id != "" && !strings.Contains(id, "/") {
			ids = append(ids, id)
		}
	}
	return ids
}

// LoadCertPool reads PEM certificates from path into a new pool. A file
// without any certificate is an error.
func LoadCertPool(path string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading CA certificates: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s holds no PEM certificate", path)
	}
	return pool, nil
}

// Client is how a client reaches the coordinator.
type Client struct {
	// Creds are the transport credentials, such as
	// credentials.NewTLS(cfg); nil means plaintext. Insecure credentials
	// given here are taken at their word, as InsecurePlaintext is.
	Creds credentials.TransportCredentials
	// Token is the bearer token sent with every call; empty sends none.
	Token string
	// InsecurePlaintext allows sending Token without TLS to a coordinator
	// that is not on loopback. Creds must then be nil.
	InsecurePlaintext bool
}

// DialOptions returns the transport and per-call credentials that reach
// the targets as c says, following the bearer token rule of the package
// documentation: targets are every address the connection may reach (the
// replicas of a cluster). Its error wraps ErrPlaintextToken when any of
// them names a host other than this one and neither Creds nor
// InsecurePlaintext is set.
func (c Client) DialOptions(targets ...string) ([]grpc.DialOption, error) {
	secure := c.Creds != nil && c.Creds.Info().SecurityProtocol != "insecure"
	if c.Creds != nil && c.InsecurePlaintext {
		return nil, errors.New("transport credentials and insecure plaintext exclude each other")
	}
	var opts []grpc.DialOption
	switch {
	case c.Creds != nil:
		opts = append(opts, grpc.WithTransportCredentials(c.Creds))
	case c.Token != "" && !c.InsecurePlaintext:
		for _, target := range targets {
			if host, remote := RemoteTarget(target); remote {
				return nil, fmt.Errorf("%w: %s names host %s; configure TLS, or allow plaintext explicitly where the network encrypts", ErrPlaintextToken, target, host)
			}
		}
		opts = append(opts, grpc.WithTransportCredentials(LoopbackOnly()))
	default:
		opts = append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()))
	}
	if c.Token != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(bearer{token: c.Token, secure: secure}))
	}
	return opts, nil
}

// bearer sends "authorization: Bearer <token>" with every call.
type bearer struct {
	token  string
	secure bool
}

// GetRequestMetadata implements credentials.PerRPCCredentials.
func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + b.token}, nil
}

// RequireTransportSecurity implements credentials.PerRPCCredentials: over
// secure transport credentials gRPC refuses to send the token on a
// connection whose handshake did not give privacy and integrity. Over
// plaintext, LoopbackOnly is the guard.
func (b bearer) RequireTransportSecurity() bool { return b.secure }

// RemoteTarget reports whether a gRPC target names a host other than this
// one, and which: a host:port whose host is not a loopback IP or
// "localhost", optionally after the dns or passthrough scheme. Targets it
// cannot read that way (a Unix socket, a custom resolver, an in-process
// name) are not reported remote; LoopbackOnly checks their connections.
func RemoteTarget(target string) (host string, remote bool) {
	addr := target
	for _, scheme := range []string{"dns:///", "passthrough:///"} {
		addr = strings.TrimPrefix(addr, scheme)
	}
	if strings.Contains(addr, "://") || strings.HasPrefix(addr, "unix:") {
		return "", false
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return "", false
	}
	if strings.EqualFold(host, "localhost") {
		return host, false
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return host, false
	}
	return host, true
}

// LocalAddr reports whether a connection's address is on this machine: a
// loopback IP, or a network that is not IP at all (a Unix socket, an
// in-process pipe).
func LocalAddr(a net.Addr) bool {
	switch a.Network() {
	case "tcp", "tcp4", "tcp6", "udp", "udp4", "udp6":
		if ta, ok := a.(*net.TCPAddr); ok {
			return ta.IP.IsLoopback()
		}
		host, _, err := net.SplitHostPort(a.String())
		if err != nil {
			return false
		}
		ip := net.ParseIP(host)
		return ip != nil && ip.IsLoopback()
	}
	return true
}

// LoopbackOnly returns plaintext transport credentials that complete a
// handshake only with a local address (see LocalAddr): a connection that
// reached another host is closed before anything, a bearer token
// included, is sent on it.
func LoopbackOnly() credentials.TransportCredentials {
	return loopbackOnly{TransportCredentials: insecure.NewCredentials()}
}

type loopbackOnly struct {
	credentials.TransportCredentials
}

// ClientHandshake implements credentials.TransportCredentials.
func (l loopbackOnly) ClientHandshake(ctx context.Context, authority string, conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	if !LocalAddr(conn.RemoteAddr()) {
		conn.Close()
		return nil, nil, fmt.Errorf("%w: connected to %s", ErrPlaintextToken, conn.RemoteAddr())
	}
	return l.TransportCredentials.ClientHandshake(ctx, authority, conn)
}

// Clone implements credentials.TransportCredentials.
func (l loopbackOnly) Clone() credentials.TransportCredentials {
	return loopbackOnly{TransportCredentials: l.TransportCredentials.Clone()}
}
