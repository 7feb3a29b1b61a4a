package coordinator

import (
	"cmp"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/auth"
	"github.com/leasehold/leasehold/coordinator/internal/console"
	"github.com/leasehold/leasehold/coordinator/internal/hostcheck"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// httpLimits bound the metrics address's HTTP server (metrics, profiles,
// the console), so that slow or idle clients cannot hold it.
type httpLimits struct {
	// ReadHeader bounds reading a request's headers, Read the whole
	// request, Write the response from the end of the headers on, Idle the
	// wait for the next request on a kept-alive connection.
	ReadHeader, Read, Write, Idle time.Duration
	// MaxConns bounds the connections open at once, PerAddress those of
	// one source address; a connection past either is closed at once.
	MaxConns, PerAddress int
}

// defaultHTTPLimits are the metrics address's limits. The console has no
// long-lived stream (its live parts poll), so one write timeout serves
// every response; it is longer than the 30 s CPU profile /debug/pprof/
// takes by default, and a profile or trace asked for longer than it is
// refused by net/http/pprof itself. A browser opens about six connections
// to a host and Prometheus one or two, so 256 leaves room for many of both;
// one address may hold 32 of them, so that a flood from one peer leaves the
// kubelet's probes and Prometheus their connections. An idle kept-alive
// connection is closed after a minute: the console's live parts refresh
// more often than that, and Prometheus dials again at its next scrape.
var defaultHTTPLimits = httpLimits{
	ReadHeader: 10 * time.Second,
	Read:       30 * time.Second,
	Write:      2 * time.Minute,
	Idle:       time.Minute,
	MaxConns:   256,
	PerAddress: 32,
}

// newHTTPServer returns the server of the metrics address over h, with l's
// timeouts.
func newHTTPServer(h http.Handler, l httpLimits) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: l.ReadHeader, ReadTimeout: l.Read, WriteTimeout: l.Write, IdleTimeout: l.Idle}
}

// listenMetrics binds the metrics address, if any, with the console
// behind it when asked for; Serve serves it.
func (c *Coordinator) listenMetrics(reg *prometheus.Registry, principals *auth.Set, undo *undoStack) error {
	if c.cfg.MetricsListen == "" {
		if c.cfg.Console {
			return errors.New("the console is served on the metrics address: set one (--metrics-listen)")
		}
		return nil
	}
	lis, err := net.Listen("tcp", c.cfg.MetricsListen)
	if err != nil {
		return fmt.Errorf("listening for metrics on %s: %w", c.cfg.MetricsListen, err)
	}
	undo.push(func() { lis.Close() })
	if c.cfg.Console && c.devTokens && !localAddr(lis.Addr()) {
		return fmt.Errorf("refusing to serve the console with the public development tokens on %s; "+
			"pass a principals file (--tokens) or serve the console on a loopback address", lis.Addr())
	}
	if c.cfg.Console && c.cfg.HTTPTLS == nil && !localAddr(lis.Addr()) {
		return fmt.Errorf("refusing to serve the console on %s without TLS: it signs in with bearer tokens; "+
			"serve it on a loopback address or turn TLS on", lis.Addr())
	}
	limits := cmp.Or(c.cfg.httpLimits, &defaultHTTPLimits)
	// Below TLS, so that a handshake holds a connection slot too.
	lis = c.conns.listenHTTP(lis, *limits, reg)
	if c.cfg.HTTPTLS != nil {
		lis = tls.NewListener(lis, c.cfg.HTTPTLS)
	}
	c.metricsLis = lis
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	c.handleHealth(mux)
	if c.cfg.Pprof {
		// Profiles name functions and expose heap contents' shapes, never
		// document data; still, serve them only where metrics are served.
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	if c.cfg.Console {
		inproc, err := newInProcess(MaxSendMsgSize)
		if err != nil {
			return err
		}
		undo.push(inproc.close)
		c.inproc = inproc
		con, err := console.New(console.Config{Conn: inproc.conn, Principals: principals, Hosts: c.cfg.ConsoleHosts,
			Secure: c.cfg.HTTPTLS != nil, Logger: c.log.With("component", "console")})
		if err != nil {
			return err
		}
		mux.Handle(console.Prefix, con)
		mux.Handle("GET /{$}", con)
	}
	// Metrics, health and profiles answer to the console's names alike: a
	// web page rebound to this address reads none of them.
	hosts, err := hostcheck.New(c.cfg.ConsoleHosts, "metrics address", c.log)
	if err != nil {
		return err
	}
	c.metricsSrv = newHTTPServer(hosts.Handler(mux), *limits)
	return nil
}

// MetricsAddr returns the bound metrics address, or "" without one.
func (c *Coordinator) MetricsAddr() string {
	if c.metricsLis == nil {
		return ""
	}
	return c.metricsLis.Addr().String()
}

// ConsoleURL returns the console's address, or "" when it is off.
func (c *Coordinator) ConsoleURL() string {
	if !c.cfg.Console || c.metricsLis == nil {
		return ""
	}
	scheme := "http"
	if c.cfg.HTTPTLS != nil {
		scheme = "https"
	}
	return scheme + "://" + c.metricsLis.Addr().String() + console.Prefix
}
