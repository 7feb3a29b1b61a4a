package coordinator

import (
	"cmp"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"time"

	"github.com/leasehold/leasehold/client/limits"
	"github.com/leasehold/leasehold/coordinator/internal/artifacts"
	"github.com/leasehold/leasehold/coordinator/internal/cluster"
	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	"github.com/leasehold/leasehold/coordinator/internal/server"
	"github.com/leasehold/leasehold/coordinator/internal/store"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/keepalive"
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
	// ConsoleHosts are the names the metrics address (metrics, health,
	// profiles, the console) answers to besides localhost and the address
	// a request came in on (host or host:port); a request for any other
	// Host is refused 421, against DNS rebinding (see package hostcheck).
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
	// listener (0: connlimit.DefaultMaxConnections); a connection past it is
	// closed at once, and the client retries with its backoff.
	MaxConnections int
	// MaxConnectionsPerAddress bounds the connections of one source
	// address (an IPv4 address or an IPv6 /64) on that listener (0: an
	// eighth of MaxConnections), so that one peer cannot hold them all.
	MaxConnectionsPerAddress int
	// ConnAuthTimeout closes a gRPC connection that has made no call with
	// a known bearer token within it (0: connlimit.DefaultAuthTimeout).
	ConnAuthTimeout time.Duration
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
	// together (default 256 MiB, at least MaxArtifactBytes); the uploads of
	// one renderer credential may hold half of it.
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

// checkEntryBound refuses, in a cluster, limits under which one request
// could make a raft entry over cluster.MaxEntryBytes.
func (cfg Config) checkEntryBound() error {
	return cluster.CheckEntryBound(int64(cfg.MaxRecvMsgSize()), cmp.Or(cfg.MaxArtifactBytes, server.DefaultMaxArtifactBytes))
}

// validate refuses what would make New fail later or misbehave: negative
// durations, sizes, limits and team share (zero means the default), a team
// share that is not a number, a backoff base above its cap, and team
// weights below 1, and in a cluster limits that would let one request
// make a raft entry over cluster.MaxEntryBytes. The command checks its
// flags more strictly first.
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
		{"MaxConnectionsPerAddress", cfg.MaxConnectionsPerAddress, cfg.MaxConnectionsPerAddress >= 0},
		{"ConnAuthTimeout", cfg.ConnAuthTimeout, cfg.ConnAuthTimeout >= 0},
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
	if cfg.Cluster != nil {
		errs = append(errs, cfg.checkEntryBound())
	}
	return errors.Join(errs...)
}
