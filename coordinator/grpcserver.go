package coordinator

import (
	"context"
	"crypto/tls"
	"log/slog"
	"runtime/debug"
	"time"

	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"github.com/leasehold/leasehold/coordinator/internal/auth"
	"github.com/leasehold/leasehold/coordinator/internal/edge"
	"github.com/leasehold/leasehold/internal/tracing"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"
)

// Limits of the gRPC transport.
const (
	// PerDocumentRecvAllowance and RecvOverheadBytes size the largest
	// message the server receives; see Config.MaxRecvMsgSize.
	PerDocumentRecvAllowance = 4 << 10
	RecvOverheadBytes        = 64 << 10
	// MaxSendMsgSize bounds one message the server sends. Grant batches and
	// watch events are bounded well below it by their own limits; it only
	// stops a runaway reply.
	MaxSendMsgSize = 64 << 20
	// MaxConcurrentStreams bounds the concurrent calls on one connection
	// (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS); one renderer or client
	// needs a handful. Streams per principal are capped by package edge.
	MaxConcurrentStreams = 1000
)

// keepaliveParams make the server ping a connection idle for 10 s and drop
// it when the ping is not answered within 5 s, so that a renderer that died
// without closing its connection (power loss, a partitioned node) is
// noticed in about 15 s rather than when the kernel gives up on TCP, which
// takes hours; its streams end and its capacity leaves the live total.
//
// They also bound how long a connection holds one of the listener's slots
// (see connectionAge): one without a call in flight for MaxConnectionIdle
// is closed gracefully (GOAWAY; the client dials again at its next call),
// and every connection is asked to go after MaxConnectionAge (gRPC adds up
// to 10% of jitter), its calls given MaxConnectionAgeGrace to end before
// it is closed.
var keepaliveParams = keepalive.ServerParameters{
	Time:                  10 * time.Second,
	Timeout:               5 * time.Second,
	MaxConnectionIdle:     connectionIdle,
	MaxConnectionAge:      connectionAge,
	MaxConnectionAgeGrace: connectionAgeGrace,
}

// keepalivePolicy lets clients ping every 5 s, with or without calls in
// flight (a renderer between leases has none), and closes the connection
// of a client that pings more often.
var keepalivePolicy = keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}

// newGRPCServer builds the gRPC server: transport limits and keepalive,
// the edge codec, the interceptor chains, the services, health and
// reflection.
//
// The interceptors run in this order: Prometheus, refusal counting, the
// caller slot, logging (refusals rate-limited), authentication, stream caps
// (streams only), the malformed-request check, recovery. Counting and
// logging come before authentication so that they see its refusals; the
// caller slot lets the log line name the principal authentication found;
// the stream caps need the principal that authentication puts in the
// context. TLS and tracing, when configured, sit below the interceptors
// (transport credentials and a stats handler).
func (c *Coordinator) newGRPCServer(principals *auth.Set, reg *prometheus.Registry) {
	srvMetrics := grpcprom.NewServerMetrics(grpcprom.WithServerHandlingTimeHistogram())
	reg.MustRegister(srvMetrics)
	rpcLog := interceptorLogger(c.log.With("component", "grpc"))
	c.refusals = edge.NewRefusals(edge.RefusalsConfig{Logger: rpcLog, Registerer: reg})
	logOpts := []logging.Option{logging.WithLogOnEvents(logging.FinishCall), logging.WithLevels(codeToLevel),
		logging.WithFieldsFromContext(callerFields)}
	recoverOpt := recovery.WithRecoveryHandlerContext(func(ctx context.Context, p any) error {
		c.log.ErrorContext(ctx, "panic in a handler", "panic", p, "stack", string(debug.Stack()))
		return status.Error(codes.Internal, "internal error")
	})
	streamCaps := edge.NewStreamCaps(edge.DefaultStreamCaps()...)
	// On a replicated coordinator, the read mode last: reads are judged
	// once the caller is known and the request is well formed.
	readUnary, readStream := c.consistency()
	kp := keepaliveParams
	if c.cfg.keepalive != nil {
		kp = *c.cfg.keepalive
	}
	opts := []grpc.ServerOption{
		// Stop waits for handlers, so none outlives the engine it calls.
		grpc.WaitForHandlers(true),
		grpc.MaxRecvMsgSize(c.cfg.MaxRecvMsgSize()),
		grpc.MaxSendMsgSize(MaxSendMsgSize),
		grpc.MaxConcurrentStreams(MaxConcurrentStreams),
		grpc.KeepaliveParams(kp),
		grpc.KeepaliveEnforcementPolicy(keepalivePolicy),
		grpc.ForceServerCodecV2(edge.ServerCodec()),
		// A call without a known token is refused from its headers,
		// before its request is read (and counted and logged as refused).
		grpc.InTapHandle(principals.InTapHandle(c.refusals.Early, c.conns.authenticated)),
		grpc.ChainUnaryInterceptor(
			srvMetrics.UnaryServerInterceptor(),
			c.refusals.UnaryServerInterceptor(),
			auth.CallerUnaryServerInterceptor(),
			logging.UnaryServerInterceptor(c.refusals.Logger(), logOpts...),
			principals.UnaryServerInterceptor(),
			edge.MalformedUnaryInterceptor(),
			recovery.UnaryServerInterceptor(recoverOpt),
		),
		grpc.ChainUnaryInterceptor(readUnary...),
		grpc.ChainStreamInterceptor(
			srvMetrics.StreamServerInterceptor(),
			c.refusals.StreamServerInterceptor(),
			auth.CallerStreamServerInterceptor(),
			logging.StreamServerInterceptor(c.refusals.Logger(), logOpts...),
			principals.StreamServerInterceptor(),
			streamCaps.StreamServerInterceptor(),
			edge.MalformedStreamInterceptor(),
			recovery.StreamServerInterceptor(recoverOpt),
		),
		grpc.ChainStreamInterceptor(readStream...),
	}
	if c.cfg.TLS != nil {
		opts = append(opts, grpc.Creds(serverCreds{credentials.NewTLS(c.cfg.TLS)}))
	}
	if c.cfg.TracerProvider != nil {
		opts = append(opts, tracing.ServerOption(c.cfg.TracerProvider))
	}
	c.grpc = grpc.NewServer(opts...)
	c.services.Register(c.grpc)
	c.health = health.NewServer()
	healthpb.RegisterHealthServer(c.grpc, c.health)
	reflection.Register(c.grpc)
	srvMetrics.InitializeMetrics(c.grpc)
	c.initHealth()
}

// tlsMode names the transport security for the log: "off", "tls" or
// "mtls" (client certificates required).
func (c *Coordinator) tlsMode() string {
	switch {
	case c.cfg.TLS == nil:
		return "off"
	case c.cfg.TLS.ClientAuth == tls.RequireAndVerifyClientCert:
		return "mtls"
	}
	return "tls"
}

// interceptorLogger adapts slog to the logging interceptor.
func interceptorLogger(l *slog.Logger) logging.Logger {
	return logging.LoggerFunc(func(ctx context.Context, lvl logging.Level, msg string, fields ...any) {
		l.Log(ctx, slog.Level(lvl), msg, fields...)
	})
}

// callerFields names the principal of a call, and its team if it has one,
// on the call's "finished call" line. The Caller is empty for calls that
// need no token (health, reflection) and for those refused before
// authentication succeeded; the token itself is never logged.
func callerFields(ctx context.Context) logging.Fields {
	p, ok := auth.CallerFromContext(ctx).Principal()
	if !ok {
		return nil
	}
	f := logging.Fields{"principal", p.Name}
	if p.Team != "" {
		f = append(f, "team", p.Team)
	}
	return f
}

// codeToLevel logs successful calls at Debug (Acquire and heartbeats are
// frequent), refusals and unavailability at Info (streams end UNAVAILABLE at
// every shutdown; a failed commit is logged by the engine at Error) and
// server faults at Error.
func codeToLevel(code codes.Code) logging.Level {
	switch code {
	case codes.OK:
		return logging.LevelDebug
	case codes.Internal, codes.Unknown, codes.DataLoss, codes.Unimplemented:
		return logging.LevelError
	}
	return logging.LevelInfo
}
