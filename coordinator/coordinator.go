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
	"sync/atomic"
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/artifacts"
	"github.com/leasehold/leasehold/coordinator/internal/auth"
	"github.com/leasehold/leasehold/coordinator/internal/cluster"
	"github.com/leasehold/leasehold/coordinator/internal/dispatch"
	"github.com/leasehold/leasehold/coordinator/internal/edge"
	"github.com/leasehold/leasehold/coordinator/internal/engine"
	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	"github.com/leasehold/leasehold/coordinator/internal/maintenance"
	"github.com/leasehold/leasehold/coordinator/internal/server"
	"github.com/leasehold/leasehold/coordinator/internal/store"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	berrors "go.etcd.io/bbolt/errors"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
)

// ErrDataDirInUse is returned by New when another coordinator, in this
// process or another, has the data directory's database open: bbolt holds
// an exclusive lock on the file while it is open.
var ErrDataDirInUse = errors.New("in use by another coordinator")

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
	// tokens.
	principalsFile *auth.File
	// conns are the listeners' connection limits.
	conns *connLimits

	refusals *edge.Refusals
	// failed is set when the writer fail-stops; health stays NOT_SERVING.
	failed atomic.Bool

	metricsLis  net.Listener
	metricsSrv  *http.Server
	metricsOnce sync.Once
	// inproc is the console's connection to the gRPC server, nil without
	// the console.
	inproc *inProcess
	// replica is this node's member of a replicated cluster, nil on a
	// single node.
	replica *cluster.Replica

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
	c := &Coordinator{cfg: cfg, log: log}
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
		SessionKeepalives:      c.replica != nil,
		Logger:                 log.With("component", "server"),
	})
	if err != nil {
		return nil, err
	}
	c.conns = newConnLimits(cfg, reg, log)
	c.newGRPCServer(principals, reg)
	undo.push(c.grpc.Stop)
	if err := c.listenMetrics(reg, principals, &undo); err != nil {
		return nil, err
	}

	undo = nil
	if c.replica != nil {
		c.replica.Follow(c.eng, replicaHealth{c})
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
	opts := []store.Option{store.WithLegacyArtifacts(legacy)}
	if c.cfg.Cluster != nil {
		opts = append(opts, store.WithPageSize(cluster.StorePageSize))
	}
	opts = append(opts, c.cfg.storeOptions...)
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
		ecfg.Committer = c.replica.Committer()
		ecfg.LeaderHint = c.replica.LeaderHint
		ecfg.MaxGroupBytes = cluster.MaxGroupBytes
		ecfg.MaxWriteSetBytes = cluster.MaxGroupBytes
	}
	eng, err := engine.New(ecfg)
	if err != nil {
		return fmt.Errorf("starting the engine: %w", err)
	}
	c.eng = eng
	undo.push(eng.Stop)
	return nil
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
	lis = c.conns.grpc.Listen(lis)
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

// Close stops the coordinator: health turns NOT_SERVING, long polls and
// streams end, in-flight calls get up to ShutdownTimeout to finish (then
// are cut), the writer stops and the store closes. It is safe to call more
// than once and returns the first call's error.
func (c *Coordinator) Close() error {
	c.closeOnce.Do(func() {
		if c.replica != nil {
			c.replica.HandOver()
			c.replica.StopFollowing()
		}
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
			if err := c.replica.Shutdown(); err != nil {
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
