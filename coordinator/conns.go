package coordinator

import (
	"cmp"
	"context"
	"log/slog"
	"net"
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/artifacts"
	"github.com/leasehold/leasehold/internal/connlimit"
	"github.com/leasehold/leasehold/internal/ratelog"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/peer"
)

// The listeners whose connections are limited, the listener label of the
// connection metrics.
const (
	grpcListener = "grpc"
	httpListener = "http"
)

// connLimits are the connection limits of the gRPC listener and of the
// metrics address, their metrics and their log. Each listener's
// connections are capped in all and per source address (see connlimit.Conns);
// a gRPC connection must make an authenticated call within
// Config.ConnAuthTimeout.
type connLimits struct {
	log     *slog.Logger
	grpc    *connlimit.Conns
	http    *connlimit.Conns
	refused *prometheus.CounterVec
	// logged lets each listener's refusals of each cause be logged once a
	// minute, so that a flood of refusals costs a counter increment each
	// and a line a minute.
	logged *ratelog.Limiter
}

// The gRPC server's connection lifetimes (keepaliveParams).
const (
	// connectionIdle closes a connection without a call in flight for
	// this long. A renderer's session and a client's health watch are
	// calls in flight, so their connections are never idle; a CLI's or
	// an occasional submitter's is closed gracefully, and its client
	// dials again at its next call.
	connectionIdle = 5 * time.Minute
	// connectionAge asks every connection to go after an hour, so that
	// none holds a slot for ever and clients spread again over the
	// replicas that came back since they connected.
	connectionAge = time.Hour
	// connectionAgeGrace is what the calls of a connection asked to go
	// get before it is closed. It outlasts the longest bounded call (an
	// upload may take 2 minutes, an Acquire long poll one), so those end
	// as they would have. A call without end (a renderer's session or
	// heartbeat stream, a watch) ends UNAVAILABLE when it runs out, and
	// its client, already on a new connection for its new calls, opens
	// it again there: the renderer lists its leases in its hello and
	// keeps them (leases outlive sessions) and sends its unanswered
	// completions again; the Go client's watch resumes from the last
	// event it delivered.
	connectionAgeGrace = 3 * time.Minute
)

// descriptorReserve is what FileDescriptors counts besides the listeners'
// connections: the store, the log files of raft and its snapshots, the
// peers' connections, an upload's or a backup's file.
const descriptorReserve = 256

// FileDescriptors returns how many open files the coordinator may need
// under cfg: every connection its gRPC listener and its metrics address
// may hold at once, the idle connections it keeps to an S3 artifact
// store, and a reserve. The command warns at start when the process's
// limit is lower.
func (cfg Config) FileDescriptors() int {
	return cmp.Or(cfg.MaxConnections, connlimit.DefaultMaxConnections) + defaultHTTPLimits.MaxConns + descriptorReserve +
		artifacts.IdleConns(cfg.Artifacts.Store)
}

// refusalLogEvery is how often one listener's refusals of one cause are
// logged at most.
const refusalLogEvery = time.Minute

// newConnLimits builds the gRPC listener's limits from cfg and registers
// the metrics of both listeners; the metrics address's limits are set by
// listenHTTP.
func newConnLimits(cfg Config, reg prometheus.Registerer, log *slog.Logger) *connLimits {
	l := &connLimits{
		log:    log,
		logged: ratelog.New(refusalLogEvery, nil),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "leasehold_connections_refused_total",
			Help: "Connections refused or closed by their listener's limits, by listener (grpc, http) and cause: total (the listener was full), " +
				"per_address (the source address held its share), unauthenticated (no authenticated call within the timeout).",
		}, []string{"listener", "cause"}),
	}
	for _, lis := range []string{grpcListener, httpListener} {
		for _, cause := range []string{connlimit.CauseTotal, connlimit.CausePerAddress, connlimit.CauseUnauthenticated} {
			if lis == httpListener && cause == connlimit.CauseUnauthenticated {
				continue
			}
			l.refused.WithLabelValues(lis, cause)
		}
	}
	l.grpc = connlimit.New(connlimit.Limits{
		Max:         cmp.Or(cfg.MaxConnections, connlimit.DefaultMaxConnections),
		PerAddress:  cfg.MaxConnectionsPerAddress,
		AuthTimeout: cmp.Or(cfg.ConnAuthTimeout, connlimit.DefaultAuthTimeout),
		Refused:     l.refusedFunc(grpcListener),
	})
	reg.MustRegister(l.refused, openGauge(grpcListener, l.grpc))
	return l
}

// openGauge is leasehold_connections_open of one listener.
func openGauge(listener string, conns *connlimit.Conns) prometheus.GaugeFunc {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name:        "leasehold_connections_open",
		Help:        "Connections open now, by listener (grpc, http).",
		ConstLabels: prometheus.Labels{"listener": listener},
	}, func() float64 { return float64(conns.Open()) })
}

// listenHTTP returns the metrics address's listener with its limits (see
// httpLimits), and registers its gauge.
func (l *connLimits) listenHTTP(lis net.Listener, hl httpLimits, reg prometheus.Registerer) net.Listener {
	l.http = connlimit.New(connlimit.Limits{Max: hl.MaxConns, PerAddress: hl.PerAddress, Refused: l.refusedFunc(httpListener)})
	reg.MustRegister(openGauge(httpListener, l.http))
	return l.http.Listen(lis)
}

// refusedFunc counts a listener's refusals and logs them, each cause at
// most once a minute.
func (l *connLimits) refusedFunc(listener string) func(cause string, remote net.Addr) {
	return func(cause string, remote net.Addr) {
		l.refused.WithLabelValues(listener, cause).Inc()
		due, held := l.logged.Allow(listener + "/" + cause)
		if !due {
			return
		}
		conns := l.grpc
		if listener == httpListener {
			conns = l.http
		}
		lim := conns.Limits()
		l.log.Warn("connection refused by the listener's limits (logged once a minute; leasehold_connections_refused_total counts each)",
			"listener", listener, "cause", cause, "remote", remote.String(),
			"max_connections", lim.Max, "max_connections_per_address", lim.PerAddress, "open", conns.Open(), "unlogged", held)
	}
}

// authenticated records that the gRPC call of ctx carried a known token,
// so that its connection is not closed as unauthenticated. The
// authentication tap calls it.
func (l *connLimits) authenticated(ctx context.Context) {
	if p, ok := peer.FromContext(ctx); ok {
		l.grpc.Authenticated(p.LocalAddr, p.Addr)
	}
}
