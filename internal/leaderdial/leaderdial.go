package leaderdial

import (
	"errors"
	"fmt"
	"net"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/resolver"
)

// HealthService is the health entry a coordinator reports SERVING while it
// leads; a single node always leads.
const HealthService = "leasehold.v1.Leader"

// anyReplicaConfig is the service config of a replicated channel: a
// subchannel per address the resolver gives, calls spread over those that
// are up. A leader channel's resolver gives the leader alone.
const anyReplicaConfig = `{"loadBalancingConfig":[{"round_robin":{}}]}`

// scheme is the resolver scheme of a listed target's any-replica channel.
// The resolver is given to each channel with grpc.WithResolvers, so the
// scheme is never registered globally.
const scheme = "leasehold-replicas"

// ErrBadAddress is wrapped by Parse's errors.
var ErrBadAddress = errors.New("bad coordinator address")

// Target is a parsed coordinator address.
type Target struct {
	raw string
	// listed holds the addresses of a comma-separated list; nil otherwise.
	listed []string
	// dns is set for a dns:/// target.
	dns bool
}

// Parse reads a coordinator address (see the package documentation). A
// list must hold at least two entries, each a host:port with a port, none
// twice; an entry may not be a gRPC target of its own.
func Parse(addr string) (Target, error) {
	addr = strings.TrimSpace(addr)
	if addr == "" {
		return Target{}, fmt.Errorf("%w: empty", ErrBadAddress)
	}
	if !strings.Contains(addr, ",") {
		return Target{raw: addr, dns: strings.HasPrefix(addr, "dns:")}, nil
	}
	seen := map[string]bool{}
	var listed []string
	for entry := range strings.SplitSeq(addr, ",") {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			return Target{}, fmt.Errorf("%w: %q has an empty entry", ErrBadAddress, addr)
		}
		if strings.Contains(entry, "/") {
			return Target{}, fmt.Errorf("%w: %q: a list holds host:port entries, not gRPC targets such as %q", ErrBadAddress, addr, entry)
		}
		host, port, err := net.SplitHostPort(entry)
		if err != nil || host == "" || port == "" {
			return Target{}, fmt.Errorf("%w: %q: entry %q is not host:port", ErrBadAddress, addr, entry)
		}
		if seen[entry] {
			return Target{}, fmt.Errorf("%w: %q lists %s twice", ErrBadAddress, addr, entry)
		}
		seen[entry] = true
		listed = append(listed, entry)
	}
	return Target{raw: strings.Join(listed, ","), listed: listed}, nil
}

// String returns the address as given, without spaces around list entries.
func (t Target) String() string { return t.raw }

// Replicated reports whether the target names several replicas (a list or
// a dns target): a channel to its leader then polls them (Leader).
func (t Target) Replicated() bool { return t.listed != nil || t.dns }

// Hosts returns what the bearer token rule must check: each listed
// address, or the target itself.
func (t Target) Hosts() []string {
	if t.listed != nil {
		return append([]string(nil), t.listed...)
	}
	return []string{t.raw}
}

// DialTarget returns the target of a channel to any replica, to give
// grpc.NewClient with AnyReplicaOptions; a channel to the leader takes
// Leader's.
func (t Target) DialTarget() string {
	if t.listed != nil {
		return scheme + ":///" + t.raw
	}
	return t.raw
}

// AnyReplicaOptions returns the options of a channel that spreads calls
// over every replica that is up, leader or not: for reads that any replica
// may serve. For a single server there are none.
func (t Target) AnyReplicaOptions() []grpc.DialOption {
	if !t.Replicated() {
		return nil
	}
	opts := []grpc.DialOption{
		grpc.WithDefaultServiceConfig(anyReplicaConfig),
		grpc.WithDisableServiceConfig(),
	}
	if t.listed != nil {
		opts = append(opts, grpc.WithResolvers(newStatic(t.listed)))
	}
	return opts
}

// static resolves a listed target to its addresses, once: the list does
// not change while the channel lives. It is its own resolver.Builder and
// resolver.Resolver, built anew by the channel when it leaves idleness.
type static struct {
	endpoints []resolver.Endpoint
}

func newStatic(listed []string) static {
	s := static{}
	for _, a := range listed {
		host, _, _ := net.SplitHostPort(a) // Parse checked it
		s.endpoints = append(s.endpoints, resolver.Endpoint{Addresses: []resolver.Address{{Addr: a, ServerName: host}}})
	}
	return s
}

// Build implements resolver.Builder.
func (s static) Build(_ resolver.Target, cc resolver.ClientConn, _ resolver.BuildOptions) (resolver.Resolver, error) {
	// The addresses never change, so an error here (a balancer refusing
	// them) has nothing to retry with; the channel reports it on its calls.
	_ = cc.UpdateState(resolver.State{Endpoints: s.endpoints})
	return s, nil
}

// Scheme implements resolver.Builder.
func (static) Scheme() string { return scheme }

// OverrideAuthority implements resolver.AuthorityOverrider: the channel's
// :authority is the first listed address rather than the whole list. TLS
// verifies each address against its own host all the same.
func (s static) OverrideAuthority(resolver.Target) string {
	return s.endpoints[0].Addresses[0].Addr
}

// ResolveNow implements resolver.Resolver; a list has nothing to refresh.
func (static) ResolveNow(resolver.ResolveNowOptions) {}

// Close implements resolver.Resolver.
func (static) Close() {}
