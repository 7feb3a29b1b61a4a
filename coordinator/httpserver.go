package coordinator

import (
	"net"
	"net/http"
	"time"

	"golang.org/x/net/netutil"
)

// httpLimits bound the metrics address's HTTP server (metrics, profiles,
// the console), so that slow or idle clients cannot hold it.
type httpLimits struct {
	// ReadHeader bounds reading a request's headers, Read the whole
	// request, Write the response from the end of the headers on, Idle the
	// wait for the next request on a kept-alive connection.
	ReadHeader, Read, Write, Idle time.Duration
	// MaxConns bounds the connections open at once; one more waits until
	// one closes.
	MaxConns int
}

// defaultHTTPLimits are the metrics address's limits. The console has no
// long-lived stream (its live parts poll), so one write timeout serves
// every response; it is longer than the 30 s CPU profile /debug/pprof/
// takes by default, and a profile or trace asked for longer than it is
// refused by net/http/pprof itself. A browser opens about six connections
// to a host and Prometheus one or two, so 256 leaves room for many of both.
var defaultHTTPLimits = httpLimits{
	ReadHeader: 10 * time.Second,
	Read:       30 * time.Second,
	Write:      2 * time.Minute,
	Idle:       2 * time.Minute,
	MaxConns:   256,
}

// newHTTPServer returns the server of the metrics address over h, with l's
// timeouts.
func newHTTPServer(h http.Handler, l httpLimits) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: l.ReadHeader, ReadTimeout: l.Read, WriteTimeout: l.Write, IdleTimeout: l.Idle}
}

// limitConns returns lis accepting at most l.MaxConns connections at once.
// It goes below TLS, so that a handshake holds a connection slot too.
func limitConns(lis net.Listener, l httpLimits) net.Listener {
	return netutil.LimitListener(lis, l.MaxConns)
}
