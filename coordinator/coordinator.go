package coordinator

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"path/filepath"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"github.com/leasehold/leasehold/client/limits"
	"github.com/leasehold/leasehold/coordinator/internal/artifacts"
	"github.com/leasehold/leasehold/coordinator/internal/auth"
	"github.com/leasehold/leasehold/coordinator/internal/console"
	"github.com/leasehold/leasehold/coordinator/internal/dispatch"
	"github.com/leasehold/leasehold/coordinator/internal/edge"
	"github.com/leasehold/leasehold/coordinator/internal/engine"
	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	"github.com/leasehold/leasehold/coordinator/internal/maintenance"
	"github.com/leasehold/leasehold/coordinator/internal/server"
	"github.com/leasehold/leasehold/coordinator/internal/store"
	"github.com/leasehold/leasehold/internal/tracing"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	berrors "go.etcd.io/bbolt/errors"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
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
	// DefaultMaxBatchInlineBytes bounds the inline content of one batch.
	DefaultMaxBatchInlineBytes = limits.DefaultMaxBatchInlineBytes
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
var keepaliveParams = keepalive.ServerParameters{Time: 10 * time.Second, Timeout: 5 * time.Second}

// keepalivePolicy lets clients ping every 5 s, with or without calls in
// flight (a renderer between leases has none), and closes the connection
// of a client that pings more often.
var keepalivePolicy = keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}

// ErrDataDirInUse is returned by New when another coordinator, in this
// process or another, has the data directory's database open: bbolt holds
// an exclusive lock on the file while it is open.
var ErrDataDirInUse = errors.New("in use by another coordinator")

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
	// Pprof serves Go's runtime profiles under /debug/pprof/ on the metrics
	// address.
	Pprof bool
	// Console serves the web console under /console/ on the metrics
	// address (see package console), and redirects "/" there. It needs
	// MetricsListen, and is refused on an address other machines can
	// reach unless HTTPTLS is set, as it signs in with bearer tokens, and
	// always with the development tokens. Its calls go through the gRPC
	// server like any client's, over an in-process connection.
	Console bool
	// ConsoleHosts are the names the console answers to besides localhost
	// and the address it listens on (host or host:port); a request for any
	// other Host is refused 421, against DNS rebinding.
	ConsoleHosts []string
	// HTTPTLS, when set, makes the metrics address serve HTTPS with it
	// (metrics, profiles and the console alike); the console's session
	// cookie is then Secure. The coordinator's TLS flags fill it in.
	HTTPTLS *tls.Config
	// TokensFile is the principals file (see package auth). Empty means the
	// development tokens (the command asks for --dev), allowed only on
	// loopback listeners, the console's too, and accepted only from peers
	// on this machine.
	// ReloadPrincipals reads it again.
	TokensFile string
	// MaxConnections bounds the connections Serve serves at once on its
	// listener (0: edge.DefaultMaxConnections); further clients wait in
	// the accept queue until one closes.
	MaxConnections int
	// TLS, when set, makes the server speak TLS only: a plaintext client
	// fails its handshake before any call, so no bearer token is read off a
	// plaintext connection. With ClientCAs and ClientAuth set (see
	// security.ServerTLS) it requires mutual TLS. Nil serves plaintext.
	TLS *tls.Config
	// TracerProvider, when set, traces every call but health checks and
	// reflection (otelgrpc), continuing the caller's trace, and stores the
	// SubmitBatch span's context with each job for its renderers. Nil
	// installs no tracing at all.
	TracerProvider trace.TracerProvider

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
	// MaxBatchInlineBytes bounds the inline content of all the documents
	// of one batch together (default 16 MiB); with MaxDocuments it sizes
	// the largest request the gRPC server receives (MaxRecvMsgSize).
	MaxBatchInlineBytes int64

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
	// MaxUploadBufferBytes bounds the bytes all uploads in progress buffer
	// together (default 256 MiB, at least MaxArtifactBytes).
	MaxUploadBufferBytes int64
	// Artifacts is where previews larger than the inline threshold go
	// (see ArtifactConfig): by default a directory beside the data file.
	Artifacts ArtifactConfig

	// Retention is how long a terminal job is kept after it ended, with
	// its history, previews, document and its batch once the batch's last
	// job goes; RejectionRetention and AuditRetention are how long rejected
	// completions and audit records are kept. Zero keeps them forever (the
	// command's flags default to 7, 30 and 365 days). Expired records are
	// deleted in bounded steps through the writer (engine.Purge).
	Retention          time.Duration
	RejectionRetention time.Duration
	AuditRetention     time.Duration
	// ShutdownTimeout bounds the graceful part of Close.
	ShutdownTimeout time.Duration

	// Cluster, when set, makes this coordinator one voter of a replicated
	// cluster (see Cluster); nil is the single node.
	Cluster *Cluster

	// Logger receives the coordinator's logs; nil means slog.Default().
	Logger *slog.Logger
	// Now is the writer's clock; nil means time.Now.
	Now func() time.Time

	// storeOptions are passed to store.Open; tests inject faults with them.
	storeOptions []store.Option
	// wrapStore, when set, wraps the artifact store; tests interleave its
	// calls with it.
	wrapStore func(artifacts.Store) artifacts.Store
	// purgeEvery, when set, replaces maintenance.RetentionIntervalDefault.
	purgeEvery time.Duration
	// keepalive, when set, replaces keepaliveParams; tests shorten it.
	keepalive *keepalive.ServerParameters
	// httpLimits, when set, replaces defaultHTTPLimits; tests shorten them.
	httpLimits *httpLimits
}

// MaxRecvMsgSize is the largest message the gRPC server receives:
//
//	MaxBatchInlineBytes + MaxDocuments × PerDocumentRecvAllowance + RecvOverheadBytes
//
// that is, the inline content a batch may carry, 4 KiB per document for
// its metadata (name, content type, source URI, size) and 64 KiB for the
// rest of the request, with the defaults for zero fields (16 MiB + 500 ×
// 4 KiB + 64 KiB, about 18 MiB). A larger message is refused by grpc-go
// with RESOURCE_EXHAUSTED before it is decoded; a batch within the limits
// always fits, and one over them is refused whole by the batch validation
// (BATCH_TOO_LARGE) with the reason.
func (cfg Config) MaxRecvMsgSize() int {
	inline := cmp.Or(cfg.MaxBatchInlineBytes, DefaultMaxBatchInlineBytes)
	docs := int64(cmp.Or(cfg.MaxDocuments, jobs.DefaultMaxDocuments))
	n := inline + docs*PerDocumentRecvAllowance + RecvOverheadBytes
	if n <= 0 || n > math.MaxInt32 {
		return math.MaxInt32
	}
	return int(n)
}

// validate refuses what would make New fail later or misbehave: negative
// durations, sizes, limits and team share (zero means the default), a team
// share that is not a number, a backoff base above its cap, and team
// weights below 1. The command checks its flags more strictly first.
func (cfg Config) validate() error {
	checks := []struct {
		field string
		value any
		ok    bool
	}{
		{"LeaseTTL", cfg.LeaseTTL, cfg.LeaseTTL >= 0},
		{"BackoffBase", cfg.BackoffBase, cfg.BackoffBase >= 0},
		{"BackoffCap", cfg.BackoffCap, cfg.BackoffCap >= 0},
		{"MaxDocuments", cfg.MaxDocuments, cfg.MaxDocuments >= 0},
		{"MaxDocumentBytes", cfg.MaxDocumentBytes, cfg.MaxDocumentBytes >= 0},
		{"MaxBatchBytes", cfg.MaxBatchBytes, cfg.MaxBatchBytes >= 0},
		{"MaxInlineBytes", cfg.MaxInlineBytes, cfg.MaxInlineBytes >= 0},
		{"MaxBatchInlineBytes", cfg.MaxBatchInlineBytes, cfg.MaxBatchInlineBytes >= 0},
		{"MaxTeamQueue", cfg.MaxTeamQueue, cfg.MaxTeamQueue >= 0},
		{"ReplayLimit", cfg.ReplayLimit, cfg.ReplayLimit >= 0},
		{"MaxArtifactBytes", cfg.MaxArtifactBytes, cfg.MaxArtifactBytes >= 0},
		{"MaxConnections", cfg.MaxConnections, cfg.MaxConnections >= 0},
		{"MaxUploadBufferBytes", cfg.MaxUploadBufferBytes, cfg.MaxUploadBufferBytes >= 0},
		{"ShutdownTimeout", cfg.ShutdownTimeout, cfg.ShutdownTimeout >= 0},
		{"Retention", cfg.Retention, cfg.Retention >= 0},
		{"RejectionRetention", cfg.RejectionRetention, cfg.RejectionRetention >= 0},
		{"AuditRetention", cfg.AuditRetention, cfg.AuditRetention >= 0},
		{"TeamShare", cfg.TeamShare, cfg.TeamShare >= 0}, // false for NaN too
	}
	var errs []error
	for _, c := range checks {
		if !c.ok {
			errs = append(errs, fmt.Errorf("Config.%s must not be negative, got %v", c.field, c.value))
		}
	}
	if cfg.BackoffBase > 0 && cfg.BackoffCap > 0 && cfg.BackoffBase > cfg.BackoffCap {
		errs = append(errs, fmt.Errorf("Config.BackoffBase %v is above Config.BackoffCap %v", cfg.BackoffBase, cfg.BackoffCap))
	}
	for team, w := range cfg.TeamWeights {
		if w < 1 {
			errs = append(errs, fmt.Errorf("Config.TeamWeights[%q] must be at least 1, got %d", team, w))
		}
	}
	return errors.Join(errs...)
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
	// principalsFile is the loaded TokensFile, nil on the development
	// tokens; fullLogged is when connectionsFull last logged (Unix ns).
	principalsFile *auth.File
	fullLogged     atomic.Int64

	refusals *edge.Refusals
	// failed is set when the writer fail-stops; health stays NOT_SERVING.
	failed atomic.Bool

	metricsLis  net.Listener
	metricsSrv  *http.Server
	metricsOnce sync.Once
	// inproc is the console's connection to the gRPC server, nil without
	// the console.
	inproc *inProcess
	// replica is the raft side of a replicated coordinator, nil on a
	// single node.
	replica *replicated

	// background are the maintenance services: failure watching, refusal
	// summaries, retention.
	background []interface {
		Start()
		Stop()
	}
	// purger is the retention service, nil with retention off.
	purger *maintenance.Retention
	// artifacts is the artifact store, nil when previews stay inline;
	// storeHealth says whether it answered its last call.
	artifacts   artifacts.Store
	storeHealth *server.StoreHealth
	// sweep deletes the store's unreferenced objects, and storeProbe asks a
	// degraded store whether it answers again; nil without a store.
	sweep      *maintenance.Sweep
	storeProbe *storeProbe

	done      chan struct{}
	watcher   sync.WaitGroup
	closeOnce sync.Once
	closeErr  error
}

// New opens the store in cfg.DataDir, rebuilds the engine's state from it,
// starts the writer and prepares the gRPC server. It binds the metrics
// address, if any, so that a port clash fails here.
//
// When New fails it has released everything it opened (the database and
// its file lock, the metrics listener), so that it may be called again.
// A data directory whose database another coordinator holds fails within
// a second with an error wrapping ErrDataDirInUse.
func New(cfg Config) (*Coordinator, error) {
	if cfg.DataDir == "" {
		return nil, errors.New("Config.DataDir is required")
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	c := &Coordinator{cfg: cfg, log: log, done: make(chan struct{})}
	principals, err := c.principals()
	if err != nil {
		return nil, err
	}

	var undo undoStack
	defer func() { undo.run() }()
	if err := c.openStorage(&undo); err != nil {
		return nil, err
	}
	reg := prometheus.NewRegistry()
	if cfg.Cluster != nil {
		if err := c.startReplica(reg, &undo); err != nil {
			return nil, err
		}
	}
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), buildInfo(debug.ReadBuildInfo))
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "leasehold_writer_stopped",
		Help: "1 once a commit failed and the writer stopped taking writes (fail-stop, health NOT_SERVING) until the coordinator restarts, else 0.",
	}, c.writerStopped))
	if err := c.startEngine(reg, &undo); err != nil {
		return nil, err
	}
	previews, err := c.openArtifacts(reg)
	if err != nil {
		return nil, err
	}
	c.services, err = server.New(server.Config{
		Engine:               c.eng,
		Previews:             previews,
		MaxArtifactBytes:     cfg.MaxArtifactBytes,
		MaxUploadBufferBytes: cfg.MaxUploadBufferBytes,
		// A session request can be as large as the transport receives.
		MaxSessionMessageBytes: min(server.DefaultMaxSessionMessageBytes, cfg.MaxRecvMsgSize()),
		Cluster:                c.clusterOps(),
		Logger:                 log.With("component", "server"),
	})
	if err != nil {
		return nil, err
	}
	c.newGRPCServer(principals, reg)
	undo.push(c.grpc.Stop)
	if err := c.listenMetrics(reg, principals, &undo); err != nil {
		return nil, err
	}

	undo = nil
	if c.replica != nil {
		c.watcher.Add(1)
		go c.followLeadership()
	} else {
		c.eng.Start()
	}
	c.background = append(c.background,
		maintenance.NewFailureWatcher(c.eng.Failed(), c.writerFailed),
		maintenance.NewSummarizer(c.refusals.Summarize, refusalSummaryInterval))
	if c.retention().On() {
		c.purger = maintenance.NewRetention(maintenance.RetentionConfig{Purge: c.eng.Purge, Interval: c.cfg.purgeEvery, Logger: c.log})
		c.background = append(c.background, c.purger)
	}
	if sw := c.newSweep(previews); sw != nil {
		c.storeProbe = newStoreProbe(previews.Store, c.storeHealth)
		c.background = append(c.background, sw, c.storeProbe)
	}
	for _, svc := range c.background {
		svc.Start()
	}
	return c, nil
}

// undoStack holds what New has opened, to close it, newest first, when a
// later step fails. New empties it once it has succeeded.
type undoStack []func()

// push adds f to run on failure.
func (u *undoStack) push(f func()) { *u = append(*u, f) }

// run runs the pushed functions, newest first.
func (u undoStack) run() {
	for i := len(u) - 1; i >= 0; i-- {
		u[i]()
	}
}

// openStorage creates the data directory and opens the bbolt store in it,
// migrating a file of an earlier schema (previews kept as files under
// ArtifactsDir are copied into it). A database locked by another
// coordinator is reported as ErrDataDirInUse rather than as bbolt's bare
// "timeout".
func (c *Coordinator) openStorage(undo *undoStack) error {
	dir := c.cfg.DataDir
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return fmt.Errorf("creating data directory: %w", err)
	}
	dbPath := filepath.Join(dir, DBFile)
	legacy := filepath.Join(dir, ArtifactsDir)
	opts := append([]store.Option{store.WithLegacyArtifacts(legacy)}, c.cfg.storeOptions...)
	st, err := store.Open(dbPath, opts...)
	if errors.Is(err, berrors.ErrTimeout) {
		return fmt.Errorf("data directory %s: %w (its database %s stayed locked); "+
			"stop the other coordinator or pass another --data-dir", dir, ErrDataDirInUse, dbPath)
	}
	if err != nil {
		return err
	}
	c.st = st
	undo.push(func() { st.Close() })
	if m := st.Migration(); m.From != 0 {
		c.log.Info("migrated the store to the current schema", "from", m.From, "to", store.SchemaVersion, "jobs", m.Jobs,
			"artifacts", m.Artifacts, "missing_artifacts", m.MissingArtifacts, "legacy_artifact_dir", legacy)
	}
	return nil
}

// startEngine builds the engine over the store (it rebuilds the indexes
// here); the writer starts at the end of New.
func (c *Coordinator) startEngine(reg prometheus.Registerer, undo *undoStack) error {
	cfg := c.cfg
	unsupported := cfg.Unsupported
	if unsupported == nil {
		unsupported = jobs.DefaultUnsupported
	}
	ecfg := engine.Config{
		Store:    c.st,
		Now:      cfg.Now,
		LeaseTTL: cfg.LeaseTTL,
		Retry:    jobs.RetryPolicy{MaxAttempts: cfg.MaxAttempts, BackoffBase: cfg.BackoffBase, BackoffCap: cfg.BackoffCap},
		Limits: jobs.Limits{
			MaxDocuments:        cfg.MaxDocuments,
			MaxDocumentBytes:    cfg.MaxDocumentBytes,
			MaxBatchBytes:       cfg.MaxBatchBytes,
			MaxInlineBytes:      cfg.MaxInlineBytes,
			MaxBatchInlineBytes: cfg.MaxBatchInlineBytes,
			MaxTeamQueue:        cfg.MaxTeamQueue,
			MaxAttempts:         max(cfg.MaxAttempts, jobs.DefaultMaxAttemptsBound),
		},
		Unsupported:   jobs.NewFormats(unsupported),
		Dispatch:      dispatch.Config{Weights: cfg.TeamWeights, MaxShare: cfg.TeamShare, FIFO: cfg.FIFO},
		RunningCancel: !cfg.DisableRunningCancel,
		ReplayLimit:   cfg.ReplayLimit,
		Retention:     c.retention(),
		Registerer:    reg,
		Logger:        c.log.With("component", "engine"),
		OnDispatch:    func(st jobs.DispatchState) { c.setDispatchHealth(st.Paused) },
	}
	if c.replica != nil {
		ecfg.Committer = c.replica.committer
		ecfg.LeaderHint = c.leaderHint
		ecfg.MaxGroupBytes = clusterGroupBytes
	}
	eng, err := engine.New(ecfg)
	if err != nil {
		return fmt.Errorf("starting the engine: %w", err)
	}
	c.eng = eng
	undo.push(eng.Stop)
	return nil
}

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
		grpc.InTapHandle(principals.InTapHandle(c.refusals.Early)),
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
	for _, name := range serviceNames {
		c.health.SetServingStatus(name, healthpb.HealthCheckResponse_SERVING)
	}
	// A single node always leads; a replica leads once promoted.
	leader := healthpb.HealthCheckResponse_SERVING
	if c.replica != nil {
		leader = healthpb.HealthCheckResponse_NOT_SERVING
		c.health.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	}
	c.health.SetServingStatus(LeaderHealthName, leader)
	c.setDispatchHealth(c.eng.DispatchState().Paused)
	c.reportStoreHealth()
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
	lis = limitConns(lis, *limits)
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
	c.metricsSrv = newHTTPServer(mux, *limits)
	return nil
}

// serviceNames are the names the health service reports on.
var serviceNames = []string{"", server.JobServiceName, server.RendererServiceName, server.OperatorServiceName, server.OverviewServiceName,
	server.ClusterServiceName}

// DispatchHealthName is the health entry that reports dispatch: SERVING
// while leases are granted, NOT_SERVING while an operator has paused
// dispatch or after the writer fail-stopped. The services themselves stay
// SERVING during a pause.
const DispatchHealthName = "leasehold.v1.Dispatch"

// setDispatchHealth reports the dispatch switch on DispatchHealthName. It
// runs on the writer goroutine (OnDispatch) and in New; once the writer
// has fail-stopped the entry stays NOT_SERVING.
func (c *Coordinator) setDispatchHealth(paused bool) {
	st := healthpb.HealthCheckResponse_SERVING
	if paused || c.failed.Load() {
		st = healthpb.HealthCheckResponse_NOT_SERVING
	}
	c.health.SetServingStatus(DispatchHealthName, st)
}

// principals loads the principals file, or falls back to the development
// tokens on a loopback address.
func (c *Coordinator) principals() (*auth.Set, error) {
	if c.cfg.TokensFile != "" {
		f, err := auth.OpenFile(c.cfg.TokensFile, c.log)
		if err != nil {
			return nil, err
		}
		c.principalsFile = f
		return f.Set(), nil
	}
	if c.cfg.Listen != "" && !loopbackHost(c.cfg.Listen) {
		return nil, fmt.Errorf("no principals file (--tokens) and listen address %s is not loopback: "+
			"refusing to serve the public development tokens on a network address", c.cfg.Listen)
	}
	c.devTokens = true
	c.log.Warn("no principals file: using the public development tokens (dev-alpha, dev-beta, dev-renderer, dev-operator, dev-operator-alpha); " +
		"loopback listeners only, and only from this machine")
	return auth.DevPrincipals(), nil
}

// ReloadPrincipals reads the principals file again (the command calls it
// on SIGHUP): a valid file replaces the principals at once, for gRPC calls
// and console sign-ins alike, so a token removed from it is refused from
// its next call; an invalid one leaves the principals as they were. Either
// way the log says what happened, and the error says why a reload failed.
func (c *Coordinator) ReloadPrincipals() error {
	if c.principalsFile == nil {
		err := errors.New("no principals file to reload: the coordinator runs on the development tokens")
		c.log.Warn("reloading the principals", "err", err)
		return err
	}
	return c.principalsFile.Reload()
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

// writerFailed reports a fail-stopped writer: every health entry turns
// NOT_SERVING and stays so until a restart.
func (c *Coordinator) writerFailed() {
	c.log.Error("storage commit failed: the writer stopped; reporting NOT_SERVING")
	c.failed.Store(true)
	for _, name := range append(serviceNames, DispatchHealthName, LeaderHealthName) {
		c.health.SetServingStatus(name, healthpb.HealthCheckResponse_NOT_SERVING)
	}
}

// writerStopped is the value of leasehold_writer_stopped: 1 once the
// writer has fail-stopped (see watchFailure), else 0. An alert on it tells
// an operator what health tells Kubernetes, and why writes are refused.
func (c *Coordinator) writerStopped() float64 {
	if c.failed.Load() {
		return 1
	}
	return 0
}

// refusalSummaryInterval is how often the summaries of suppressed refusal
// log lines are written.
const refusalSummaryInterval = time.Second

// retention is the engine's retention from the configuration.
func (c *Coordinator) retention() engine.Retention {
	return engine.Retention{Jobs: c.cfg.Retention, Rejections: c.cfg.RejectionRetention, Audit: c.cfg.AuditRetention}
}

// Serve serves gRPC on lis (and metrics, if configured) until Close. It
// refuses a non-loopback listener when the development tokens are in use.
// After Close it returns nil.
func (c *Coordinator) Serve(lis net.Listener) error {
	if c.devTokens && !localAddr(lis.Addr()) {
		return fmt.Errorf("refusing to serve the public development tokens on %s; pass a principals file", lis.Addr())
	}
	lis = edge.LimitListener(lis, cmp.Or(c.cfg.MaxConnections, edge.DefaultMaxConnections), c.connectionsFull)
	if c.metricsSrv != nil {
		c.metricsOnce.Do(func() {
			if c.inproc != nil {
				go c.inproc.serve(c.grpc)
			}
			go func() {
				if err := c.metricsSrv.Serve(c.metricsLis); err != nil && !errors.Is(err, http.ErrServerClosed) {
					c.log.Error("metrics server stopped", "err", err)
				}
			}()
		})
	}
	attrs := []any{"addr", lis.Addr().String(), "tls", c.tlsMode(), "tracing", c.cfg.TracerProvider != nil}
	if c.metricsLis != nil {
		attrs = append(attrs, "metrics", c.metricsLis.Addr().String())
	}
	if u := c.ConsoleURL(); u != "" {
		attrs = append(attrs, "console", u)
	}
	c.log.Info("coordinator listening", attrs...)
	if c.cfg.TLS == nil && !localAddr(lis.Addr()) {
		c.log.Warn("serving without TLS on a network address: bearer tokens cross the network in the clear; pass --tls-cert and --tls-key")
	}
	return c.grpc.Serve(lis)
}

// connectionsFull logs, at most once a minute, that the gRPC listener has
// as many connections open as it serves.
func (c *Coordinator) connectionsFull() {
	now, last := time.Now().UnixNano(), c.fullLogged.Load()
	if now-last >= int64(time.Minute) && c.fullLogged.CompareAndSwap(last, now) {
		c.log.Warn("gRPC connection limit reached: new connections wait until one closes",
			"max_connections", cmp.Or(c.cfg.MaxConnections, edge.DefaultMaxConnections))
	}
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

// Close stops the coordinator: health turns NOT_SERVING, long polls and
// streams end, in-flight calls get up to ShutdownTimeout to finish (then
// are cut), the writer stops and the store closes. It is safe to call more
// than once and returns the first call's error.
func (c *Coordinator) Close() error {
	c.closeOnce.Do(func() {
		c.handOver()
		close(c.done)
		c.watcher.Wait()
		for _, svc := range c.background {
			svc.Stop()
		}
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
		if c.inproc != nil {
			c.inproc.close()
		}
		c.eng.Stop()
		if c.replica != nil {
			if err := c.replica.node.Shutdown(); err != nil {
				c.log.Warn("stopping raft", "err", err)
			}
		}
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
