package leaderdial

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/resolver"
)

// Timing of the leader discovery. A follower notices a dead or frozen
// leader after raft's heartbeat timeout (500 ms, randomised up to 1 s) and
// the new leader serves a few tens of milliseconds after its election, so
// a failover takes 0.6 to 1.3 s. Polling every 250 ms adds at most a
// quarter of that, and a replica that does not answer a health check
// within 250 ms on loopback or a LAN (where one takes well under a
// millisecond) is stalled, not busy: the coordinator answers it from the
// health service, with no writer or disk on the way. Each poll is three
// small RPCs on connections kept open, so a client or renderer costs its
// cluster about a dozen health checks a second while its channel is in
// use.
const (
	// DefaultPollEvery is the period of the polls.
	DefaultPollEvery = 250 * time.Millisecond
	// DefaultPollTimeout is the deadline of each health check.
	DefaultPollTimeout = 250 * time.Millisecond
	// DefaultSilence is how long the leader may stay silent before its
	// streams and calls are ended with no other leader in sight: well past
	// an election (see follow).
	DefaultSilence = 3 * time.Second
	// dnsRefresh is how often a dns target is resolved again.
	dnsRefresh = 30 * time.Second
)

// Leader follows the leader of a replicated target for one channel. Its
// DialOptions give the channel a resolver of this package's own, which
// polls HealthService on every replica (Check, with a deadline, over a
// connection of its own to each) and hands the channel the one replica
// that answers SERVING, or none; and an interceptor that ends the streams
// made under a leader once that leader is left (see follow). Attempt does
// the same for one attempt of a unary call.
//
// For a target that names a single server, a Leader does nothing: its
// DialOptions are empty and Attempt only derives a context, so that one
// address is dialled exactly as before, with no polling.
//
// The polls run while the channel is in use (between its resolver's Build
// and Close: gRPC closes the resolver when the channel goes idle), so an
// idle client costs its cluster nothing. A Leader serves one channel.
type Leader struct {
	target Target
	// probe are the dial options of the polls' connections: the transport
	// the channel uses (credentials, dialer), without its interceptors.
	probe          []grpc.DialOption
	every, timeout time.Duration

	mu sync.Mutex
	f  follow
	// order is the addresses of the latest round, in the target's order.
	order []string
	// leftC is closed, and replaced, when the current leader is left;
	// changedC when the routing the channel was given changes, to routed.
	leftC, changedC chan struct{}
	routed          string
	// epochCtx is cancelled when the current leader is left: Attempt's
	// contexts hang on it.
	epochCtx    context.Context
	cancelEpoch context.CancelFunc
}

// Leader returns the leader discovery of t for one channel. probe are the
// dial options every connection to a replica needs (transport
// credentials, a bearer token, a custom dialer); the polls' own
// connections use them, with a reconnect backoff of 100 ms to 1 s.
func (t Target) Leader(probe ...grpc.DialOption) *Leader {
	l := &Leader{target: t, probe: slices.Clip(probe), every: DefaultPollEvery, timeout: DefaultPollTimeout,
		f:     follow{silence: DefaultSilence},
		leftC: make(chan struct{}), changedC: make(chan struct{})}
	l.epochCtx, l.cancelEpoch = context.WithCancel(context.Background())
	return l
}

// WithTiming returns l with the poll period, the health check deadline
// and the silence bound changed (zero keeps one); tests shorten them.
// Call it before the channel is made.
func (l *Leader) WithTiming(every, timeout, silence time.Duration) *Leader {
	if every > 0 {
		l.every = every
	}
	if timeout > 0 {
		l.timeout = timeout
	}
	if silence > 0 {
		l.f.silence = silence
	}
	return l
}

// DialTarget returns the target to give grpc.NewClient with DialOptions.
func (l *Leader) DialTarget() string {
	if !l.target.Replicated() {
		return l.target.raw
	}
	return leaderScheme + ":///" + l.target.endpoint()
}

// leaderScheme is the resolver scheme of a leader channel, given to each
// channel with grpc.WithResolvers, never registered globally.
const leaderScheme = "leasehold-leader"

// DialOptions returns the options a channel to the leader needs besides
// its transport: for a replicated target, the polling resolver, a
// service config that sends calls to the address it gives (which a
// resolver's own service config may not replace), and the stream
// interceptor that ends a stream when its leader is left; for a single
// server, none.
func (l *Leader) DialOptions() []grpc.DialOption {
	if !l.target.Replicated() {
		return nil
	}
	return []grpc.DialOption{
		grpc.WithDefaultServiceConfig(anyReplicaConfig),
		grpc.WithDisableServiceConfig(),
		grpc.WithResolvers(leaderBuilder{l}),
		grpc.WithChainStreamInterceptor(l.streamInterceptor),
	}
}

// Routed returns the address calls go to ("" while no replica answers as
// the leader), and a channel closed at the next change, once the channel
// has been given it.
func (l *Leader) Routed() (string, <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.routed, l.changedC
}

// Left returns how many leaders were left so far and a channel closed when
// the next one is.
func (l *Leader) Left() (uint64, <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.f.epoch, l.leftC
}

// Describe says what the last round of polls found, for errors: the
// address routed to, or that no replica of the target answers as the
// leader.
func (l *Leader) Describe() string {
	if r, _ := l.Routed(); r != "" {
		return "leader " + r
	}
	return fmt.Sprintf("no replica of %s answers as the leader", l.target.raw)
}

// observe applies one round of answers and tells the channel's resolver
// connection of a change of routing.
func (l *Leader) observe(answers map[string]answer, order []string, now time.Time) (route string, rerouted bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.order = order
	rerouted, left := l.f.observe(answers, order, now)
	if left {
		close(l.leftC)
		l.leftC = make(chan struct{})
		l.cancelEpoch()
		l.epochCtx, l.cancelEpoch = context.WithCancel(context.Background())
	}
	return l.f.route(), rerouted
}

// announce tells Routed's callers that calls go to route now, once the
// channel has been given it.
func (l *Leader) announce(route string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.routed = route
	close(l.changedC)
	l.changedC = make(chan struct{})
}

// epoch returns the context that is cancelled when the current leader is
// left.
func (l *Leader) epoch() context.Context {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.epochCtx
}

// leaderBuilder builds a leader channel's resolver. It is the channel's
// own (grpc.WithResolvers), for the one Leader.
type leaderBuilder struct{ l *Leader }

// Build implements resolver.Builder: the polls start.
func (b leaderBuilder) Build(_ resolver.Target, cc resolver.ClientConn, _ resolver.BuildOptions) (resolver.Resolver, error) {
	r := &leaderResolver{l: b.l, cc: cc, stop: make(chan struct{}), done: make(chan struct{}), now: make(chan struct{}, 1)}
	go r.run()
	return r, nil
}

// Scheme implements resolver.Builder.
func (leaderBuilder) Scheme() string { return leaderScheme }

// OverrideAuthority implements resolver.AuthorityOverrider: the channel's
// :authority is the first listed address, or the dns name, rather than
// the whole list. TLS verifies each address against its own host all the
// same (resolver.Address.ServerName).
func (b leaderBuilder) OverrideAuthority(resolver.Target) string { return b.l.target.authority() }

// leaderResolver polls the replicas while its channel is in use and gives
// the channel the leader's address.
type leaderResolver struct {
	l    *Leader
	cc   resolver.ClientConn
	stop chan struct{}
	done chan struct{}
	// now asks for a round at once (ResolveNow).
	now chan struct{}
}

// ResolveNow implements resolver.Resolver: the next round of polls starts
// at once.
func (r *leaderResolver) ResolveNow(resolver.ResolveNowOptions) {
	select {
	case r.now <- struct{}{}:
	default:
	}
}

// Close implements resolver.Resolver: the polls stop and their
// connections close.
func (r *leaderResolver) Close() {
	close(r.stop)
	<-r.done
}

// run polls every replica each period and updates the channel when the
// routing changes (and on the first round, so that the channel knows it
// has been resolved).
func (r *leaderResolver) run() {
	defer close(r.done)
	rs := newReplicas(r.l.target, r.l.probe)
	defer rs.close()
	tick := time.NewTicker(r.l.every)
	defer tick.Stop()
	for first := true; ; first = false {
		answers, order := rs.poll(r.stop, r.l.timeout)
		route, rerouted := r.l.observe(answers, order, time.Now())
		if first || rerouted {
			var eps []resolver.Endpoint
			if route != "" {
				eps = []resolver.Endpoint{rs.endpoint(route)}
			}
			// An empty list is refused (balancer.ErrBadResolverState),
			// and the calls wait or fail fast as they asked: the error
			// says no more than that.
			_ = r.cc.UpdateState(resolver.State{Endpoints: eps})
		}
		if rerouted {
			r.l.announce(route)
		}
		select {
		case <-r.stop:
			return
		case <-tick.C:
		case <-r.now:
		}
	}
}

// replicas are the polls' connections, one per replica address.
type replicas struct {
	target Target
	probe  []grpc.DialOption
	conns  map[string]*grpc.ClientConn
	// names are the TLS server names by address.
	names map[string]string
	// order is the addresses, as listed or resolved.
	order []string
	// next is when a dns target is to be resolved again.
	next time.Time
}

func newReplicas(t Target, probe []grpc.DialOption) *replicas {
	return &replicas{target: t, probe: probe, conns: map[string]*grpc.ClientConn{}, names: map[string]string{}}
}

// refresh sets the addresses: a list's once, a dns target's every
// dnsRefresh. A failed lookup keeps the addresses it had and is tried
// again a second later.
func (rs *replicas) refresh(stop <-chan struct{}, timeout time.Duration) {
	if rs.order != nil && (!rs.target.dns || time.Now().Before(rs.next)) {
		return
	}
	var order []string
	names := map[string]string{}
	if rs.target.listed != nil {
		for _, a := range rs.target.listed {
			host, _, _ := net.SplitHostPort(a) // Parse checked it
			order, names[a] = append(order, a), host
		}
	} else {
		ctx, cancel := stopContext(stop, max(timeout, time.Second))
		addrs, host, err := rs.target.lookup(ctx)
		cancel()
		if err != nil {
			rs.next = time.Now().Add(time.Second)
			return
		}
		for _, a := range addrs {
			order, names[a] = append(order, a), host
		}
	}
	rs.next = time.Now().Add(dnsRefresh)
	for a, cc := range rs.conns {
		if !slices.Contains(order, a) {
			cc.Close()
			delete(rs.conns, a)
		}
	}
	rs.order, rs.names = order, names
}

// stopContext returns a context that ends after timeout, or as soon as
// stop is closed.
func stopContext(stop <-chan struct{}, timeout time.Duration) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	go func() {
		select {
		case <-stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// poll asks every replica for HealthService at once, each within timeout,
// and returns the answers by address with the addresses in order.
func (rs *replicas) poll(stop <-chan struct{}, timeout time.Duration) (map[string]answer, []string) {
	rs.refresh(stop, timeout)
	ctx, cancel := stopContext(stop, timeout)
	defer cancel()
	got := make([]answer, len(rs.order))
	var wg sync.WaitGroup
	for i, a := range rs.order {
		cc := rs.conn(a)
		if cc == nil {
			continue
		}
		wg.Go(func() { got[i] = check(ctx, cc) })
	}
	wg.Wait()
	answers := make(map[string]answer, len(got))
	for i, a := range rs.order {
		answers[a] = got[i]
	}
	return answers, slices.Clone(rs.order)
}

// check asks one replica whether it leads.
func check(ctx context.Context, cc *grpc.ClientConn) answer {
	resp, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{Service: HealthService})
	switch {
	case err != nil:
		return silent
	case resp.GetStatus() == healthpb.HealthCheckResponse_SERVING:
		return serving
	}
	return notServing
}

// conn returns the polls' connection to addr, opening it on first use; nil
// when it cannot be made (the options are refused, which the channel's
// own connections then report).
func (rs *replicas) conn(addr string) *grpc.ClientConn {
	if cc, ok := rs.conns[addr]; ok {
		return cc
	}
	opts := append(slices.Clone(rs.probe),
		grpc.WithAuthority(net.JoinHostPort(rs.names[addr], portOf(addr))),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
			MinConnectTimeout: time.Second,
		}))
	cc, err := grpc.NewClient("passthrough:///"+addr, opts...)
	if err != nil {
		return nil
	}
	rs.conns[addr] = cc
	return cc
}

// endpoint is the channel's endpoint of addr, verified over TLS against
// the host it was listed or resolved under.
func (rs *replicas) endpoint(addr string) resolver.Endpoint {
	return resolver.Endpoint{Addresses: []resolver.Address{{Addr: addr, ServerName: rs.names[addr]}}}
}

func (rs *replicas) close() {
	for _, cc := range rs.conns {
		cc.Close()
	}
}

// portOf returns the port of a host:port.
func portOf(addr string) string {
	_, port, _ := net.SplitHostPort(addr)
	return port
}

// dnsParts splits a dns target into its DNS server (empty for the
// system's), its host and its port (443 when none is given, as gRPC's
// own dns resolver does).
func (t Target) dnsParts() (server, host, port string, err error) {
	rest := strings.TrimPrefix(t.raw, "dns:")
	if strings.HasPrefix(rest, "//") {
		server, rest, _ = strings.Cut(strings.TrimPrefix(rest, "//"), "/")
	}
	rest = strings.TrimPrefix(rest, "/")
	host, port, err = net.SplitHostPort(rest)
	if err != nil {
		host, port, err = rest, "443", nil
	}
	if host == "" {
		return "", "", "", fmt.Errorf("%w: %q names no host", ErrBadAddress, t.raw)
	}
	return server, host, port, nil
}

// lookup resolves a dns target to its replicas' addresses, and returns
// the name their certificates must carry.
func (t Target) lookup(ctx context.Context) (addrs []string, host string, err error) {
	server, host, port, err := t.dnsParts()
	if err != nil {
		return nil, "", err
	}
	res := net.DefaultResolver
	if server != "" {
		res = &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, server)
		}}
	}
	ips, err := res.LookupHost(ctx, host)
	if err != nil {
		return nil, "", err
	}
	slices.Sort(ips)
	for _, ip := range ips {
		addrs = append(addrs, net.JoinHostPort(ip, port))
	}
	return addrs, host, nil
}

// endpoint is what a leader channel's target names after its scheme.
func (t Target) endpoint() string {
	if t.listed != nil {
		return t.raw
	}
	_, host, port, _ := t.dnsParts()
	return net.JoinHostPort(host, port)
}

// authority is the :authority of a replicated channel.
func (t Target) authority() string {
	if t.listed != nil {
		return t.listed[0]
	}
	return t.endpoint()
}
