package coordinator

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime/debug"
	"sync"
	"time"

	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"github.com/leasehold/leasehold/coordinator/internal/auth"
	"github.com/leasehold/leasehold/coordinator/internal/dispatch"
	"github.com/leasehold/leasehold/coordinator/internal/engine"
	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	"github.com/leasehold/leasehold/coordinator/internal/server"
	"github.com/leasehold/leasehold/coordinator/internal/store"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"
)

// Defaults for Config.
const (
	// DefaultShutdownTimeout bounds how long Close waits for in-flight calls.
	DefaultShutdownTimeout = 10 * time.Second
	// DBFile is the bbolt file inside Config.DataDir; ArtifactsDir is where
	// schema 1 kept previews as files, read once by the migration.
	DBFile       = "leasehold.db"
	ArtifactsDir = "artifacts"
)

// Config configures a Coordinator. Zero fields take the defaults of the
// engine and the jobs package (lease TTL 15 s, 5 attempts, backoff 1 s to
// 5 min, 500 documents per batch, ...).
type Config struct {
	// Listen is the gRPC address the caller will serve on. New uses it only
	// to decide whether the development tokens are allowed; Serve checks
	// the listener it is given as well.
	Listen string
	// DataDir holds the bbolt file and the artifact directory; it is
	// created if needed.
	DataDir string
	// MetricsListen is the address of the HTTP /metrics endpoint; empty
	// serves no metrics over HTTP.
	MetricsListen string
	// TokensFile is the principals file (see package auth). Empty means the
	// development tokens, allowed only on a loopback address.
	TokensFile string

	// LeaseTTL is how long a lease lives without a heartbeat.
	LeaseTTL time.Duration
	// MaxAttempts, BackoffBase and BackoffCap are the default retry policy.
	MaxAttempts uint32
	BackoffBase time.Duration
	BackoffCap  time.Duration

	// Batch limits; see jobs.Limits.
	MaxDocuments     int
	MaxDocumentBytes int64
	MaxBatchBytes    int64
	MaxInlineBytes   int
	MaxTeamQueue     int

	// TeamWeights are the teams' weights in the dispatch rotation (others 1).
	TeamWeights map[string]int
	// TeamShare is the share of live capacity one team may hold while
	// another waits (default 0.75; 1 or more disables the cap).
	TeamShare float64
	// FIFO turns fair dispatch off: one global queue in arrival order.
	FIFO bool

	// DisableRunningCancel refuses to cancel LEASED jobs; by default they
	// are cancelled at once and their lease revoked.
	DisableRunningCancel bool
	// ReplayLimit is the most jobs one operator replay may touch.
	ReplayLimit int
	// Unsupported lists formats (extensions, MIME types) known to be
	// unsupported; nil means jobs.DefaultUnsupported, empty means none.
	Unsupported []string
	// MaxArtifactBytes bounds one uploaded preview (default 8 MiB).
	MaxArtifactBytes int64
	// ShutdownTimeout bounds the graceful part of Close.
	ShutdownTimeout time.Duration

	// Logger receives the coordinator's logs; nil means slog.Default().
	Logger *slog.Logger
	// Now is the writer's clock; nil means time.Now.
	Now func() time.Time

	// storeOptions are passed to store.Open; tests inject faults with them.
	storeOptions []store.Option
}

// Coordinator is a running coordinator: store, engine and gRPC server.
type Coordinator struct {
	cfg       Config
	log       *slog.Logger
	st        *store.Store
	eng       *engine.Engine
	services  *server.Services
	grpc      *grpc.Server
	health    *health.Server
	devTokens bool

	metricsLis  net.Listener
	metricsSrv  *http.Server
	metricsOnce sync.Once

	done      chan struct{}
	watcher   sync.WaitGroup
	closeOnce sync.Once
	closeErr  error
}

// New opens the store in cfg.DataDir, rebuilds the engine's state from it,
// starts the writer and prepares the gRPC server. It binds the metrics
// address, if any, so that a port clash fails here.
func New(cfg Config) (c *Coordinator, err error) {
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	if cfg.DataDir == "" {
		return nil, errors.New("Config.DataDir is required")
	}
	c = &Coordinator{cfg: cfg, log: log, done: make(chan struct{})}

	principals, err := c.principals()
	if err != nil {
		return nil, err
	}

	var cleanup []func()
	defer func() {
		if err != nil {
			for i := len(cleanup) - 1; i >= 0; i-- {
				cleanup[i]()
			}
		}
	}()
	if err := os.MkdirAll(cfg.DataDir, 0o750); err != nil {
		return nil, fmt.Errorf("creating data directory: %w", err)
	}
	opts := append([]store.Option{store.WithLegacyArtifacts(filepath.Join(cfg.DataDir, ArtifactsDir))}, cfg.storeOptions...)
	c.st, err = store.Open(filepath.Join(cfg.DataDir, DBFile), opts...)
	if err != nil {
		return nil, err
	}
	cleanup = append(cleanup, func() { c.st.Close() })
	if m := c.st.Migration(); m.From != 0 {
		log.Info("migrated the store to the current schema", "from", m.From, "to", store.SchemaVersion, "jobs", m.Jobs,
			"artifacts", m.Artifacts, "missing_artifacts", m.MissingArtifacts, "legacy_artifact_dir", filepath.Join(cfg.DataDir, ArtifactsDir))
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	unsupported := cfg.Unsupported
	if unsupported == nil {
		unsupported = jobs.DefaultUnsupported
	}
	c.eng, err = engine.New(engine.Config{
		Store:    c.st,
		Now:      cfg.Now,
		LeaseTTL: cfg.LeaseTTL,
		Retry:    jobs.RetryPolicy{MaxAttempts: cfg.MaxAttempts, BackoffBase: cfg.BackoffBase, BackoffCap: cfg.BackoffCap},
		Limits: jobs.Limits{
			MaxDocuments:     cfg.MaxDocuments,
			MaxDocumentBytes: cfg.MaxDocumentBytes,
			MaxBatchBytes:    cfg.MaxBatchBytes,
			MaxInlineBytes:   cfg.MaxInlineBytes,
			MaxTeamQueue:     cfg.MaxTeamQueue,
			MaxAttempts:      max(cfg.MaxAttempts, jobs.DefaultMaxAttemptsBound),
		},
		Unsupported:   jobs.NewFormats(unsupported),
		Dispatch:      dispatch.Config{Weights: cfg.TeamWeights, MaxShare: cfg.TeamShare, FIFO: cfg.FIFO},
		RunningCancel: !cfg.DisableRunningCancel,
		ReplayLimit:   cfg.ReplayLimit,
		Registerer:    reg,
		Logger:        log.With("component", "engine"),
		OnDispatch:    func(st jobs.DispatchState) { c.setDispatchHealth(st.Paused) },
	})
	if err != nil {
		return nil, fmt.Errorf("starting the engine: %w", err)
	}
	c.services, err = server.New(server.Config{
		Engine:           c.eng,
		MaxArtifactBytes: cfg.MaxArtifactBytes,
		Logger:           log.With("component", "server"),
	})
	if err != nil {
		return nil, err
	}

	srvMetrics := grpcprom.NewServerMetrics(grpcprom.WithServerHandlingTimeHistogram())
	reg.MustRegister(srvMetrics)
	rpcLog := interceptorLogger(log.With("component", "grpc"))
	logOpts := []logging.Option{logging.WithLogOnEvents(logging.FinishCall), logging.WithLevels(codeToLevel)}
	recoverOpt := recovery.WithRecoveryHandlerContext(func(ctx context.Context, p any) error {
		log.ErrorContext(ctx, "panic in a handler", "panic", p, "stack", string(debug.Stack()))
		return status.Error(codes.Internal, "internal error")
	})
	c.grpc = grpc.NewServer(
		// Stop waits for handlers, so none outlives the engine it calls.
		grpc.WaitForHandlers(true),
		grpc.ChainUnaryInterceptor(
			srvMetrics.UnaryServerInterceptor(),
			logging.UnaryServerInterceptor(rpcLog, logOpts...),
			principals.UnaryServerInterceptor(),
			recovery.UnaryServerInterceptor(recoverOpt),
		),
		grpc.ChainStreamInterceptor(
			srvMetrics.StreamServerInterceptor(),
			logging.StreamServerInterceptor(rpcLog, logOpts...),
			principals.StreamServerInterceptor(),
			recovery.StreamServerInterceptor(recoverOpt),
		),
	)
	c.services.Register(c.grpc)
	c.health = health.NewServer()
	healthpb.RegisterHealthServer(c.grpc, c.health)
	reflection.Register(c.grpc)
	srvMetrics.InitializeMetrics(c.grpc)
	for _, name := range serviceNames {
		c.health.SetServingStatus(name, healthpb.HealthCheckResponse_SERVING)
	}
	c.setDispatchHealth(c.eng.DispatchState().Paused)

	if cfg.MetricsListen != "" {
		c.metricsLis, err = net.Listen("tcp", cfg.MetricsListen)
		if err != nil {
			return nil, fmt.Errorf("listening for metrics: %w", err)
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
		c.metricsSrv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	}

	c.eng.Start()
	c.watcher.Add(1)
	go c.watchFailure()
	return c, nil
}

// serviceNames are the names the health service reports on.
var serviceNames = []string{"", server.JobServiceName, server.RendererServiceName, server.OperatorServiceName}

// DispatchHealthName is the health entry that reports dispatch: SERVING
// while leases are granted, NOT_SERVING while an operator has paused
// dispatch. The services themselves stay SERVING during a pause.
const DispatchHealthName = "leasehold.v1.Dispatch"

// setDispatchHealth reports the dispatch switch on DispatchHealthName.
func (c *Coordinator) setDispatchHealth(paused bool) {
	st := healthpb.HealthCheckResponse_SERVING
	if paused {
		st = healthpb.HealthCheckResponse_NOT_SERVING
	}
	c.health.SetServingStatus(DispatchHealthName, st)
}

// principals loads the principals file, or falls back to the development
// tokens on a loopback address.
func (c *Coordinator) principals() (*auth.Set, error) {
	if c.cfg.TokensFile != "" {
		return auth.LoadFile(c.cfg.TokensFile)
	}
	if c.cfg.Listen != "" && !loopbackHost(c.cfg.Listen) {
		return nil, fmt.Errorf("no principals file (--tokens) and listen address %s is not loopback: "+
			"refusing to serve the public development tokens on a network address", c.cfg.Listen)
	}
	c.devTokens = true
	c.log.Warn("no principals file: using the public development tokens (dev-alpha, dev-beta, dev-renderer, dev-operator, dev-operator-alpha); loopback only")
	return auth.DevPrincipals(), nil
}

// loopbackHost reports whether a host:port address names a loopback host.
func loopbackHost(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// localAddr reports whether a listener address is reachable only from this
// machine: a loopback TCP address, or a non-network listener (a Unix
// socket, an in-process buffer).
func localAddr(a net.Addr) bool {
	switch a.Network() {
	case "tcp", "tcp4", "tcp6", "udp", "udp4", "udp6":
		if ta, ok := a.(*net.TCPAddr); ok {
			return ta.IP.IsLoopback()
		}
		return loopbackHost(a.String())
	}
	return true
}

// watchFailure turns health NOT_SERVING when the writer fail-stops.
func (c *Coordinator) watchFailure() {
	defer c.watcher.Done()
	select {
	case <-c.eng.Failed():
		c.log.Error("storage commit failed: the writer stopped; reporting NOT_SERVING")
		for _, name := range serviceNames {
			c.health.SetServingStatus(name, healthpb.HealthCheckResponse_NOT_SERVING)
		}
	case <-c.done:
	}
}

// Serve serves gRPC on lis (and metrics, if configured) until Close. It
// refuses a non-loopback listener when the development tokens are in use.
// After Close it returns nil.
func (c *Coordinator) Serve(lis net.Listener) error {
	if c.devTokens && !localAddr(lis.Addr()) {
		return fmt.Errorf("refusing to serve the public development tokens on %s; pass a principals file", lis.Addr())
	}
	if c.metricsSrv != nil {
		c.metricsOnce.Do(func() {
			go func() {
				if err := c.metricsSrv.Serve(c.metricsLis); err != nil && !errors.Is(err, http.ErrServerClosed) {
					c.log.Error("metrics server stopped", "err", err)
				}
			}()
		})
	}
	attrs := []any{"addr", lis.Addr().String()}
	if c.metricsLis != nil {
		attrs = append(attrs, "metrics", c.metricsLis.Addr().String())
	}
	c.log.Info("coordinator listening", attrs...)
	return c.grpc.Serve(lis)
}

// MetricsAddr returns the bound metrics address, or "" without one.
func (c *Coordinator) MetricsAddr() string {
	if c.metricsLis == nil {
		return ""
	}
	return c.metricsLis.Addr().String()
}

// Close stops the coordinator: health turns NOT_SERVING, long polls and
// streams end, in-flight calls get up to ShutdownTimeout to finish (then
// are cut), the writer stops and the store closes. It is safe to call more
// than once and returns the first call's error.
func (c *Coordinator) Close() error {
	c.closeOnce.Do(func() {
		close(c.done)
		c.watcher.Wait()
		c.health.Shutdown()
		c.services.Shutdown()

		stopped := make(chan struct{})
		go func() {
			c.grpc.GracefulStop()
			close(stopped)
		}()
		timer := time.NewTimer(cmp.Or(c.cfg.ShutdownTimeout, DefaultShutdownTimeout))
		select {
		case <-stopped:
			timer.Stop()
		case <-timer.C:
			c.log.Warn("graceful stop timed out; closing remaining calls")
			c.grpc.Stop()
			<-stopped
		}

		if c.metricsSrv != nil {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			if err := c.metricsSrv.Shutdown(ctx); err != nil {
				c.metricsSrv.Close()
			}
			cancel()
			c.metricsLis.Close()
		}
		c.eng.Stop()
		if err := c.st.Close(); err != nil {
			c.closeErr = fmt.Errorf("closing the store: %w", err)
		}
		c.log.Info("coordinator stopped")
	})
	return c.closeErr
}

// interceptorLogger adapts slog to the logging interceptor.
func interceptorLogger(l *slog.Logger) logging.Logger {
	return logging.LoggerFunc(func(ctx context.Context, lvl logging.Level, msg string, fields ...any) {
		l.Log(ctx, slog.Level(lvl), msg, fields...)
	})
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
