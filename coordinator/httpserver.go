package coordinator

import (
	"net/http"
	"time"
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
