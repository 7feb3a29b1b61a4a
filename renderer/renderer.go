package renderer

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	grpcbackoff "google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"

	"github.com/leasehold/leasehold/client/limits"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"github.com/leasehold/leasehold/internal/leaderdial"
	"github.com/leasehold/leasehold/internal/security"
	"github.com/leasehold/leasehold/internal/tracing"
)

// Defaults for the zero values of Config.
const (
	// DefaultCapacity is the default Config.Capacity.
	DefaultCapacity = 2
	// DefaultHeartbeatInterval is used when neither Config.HeartbeatInterval
	// nor the coordinator's welcome sets an interval.
	DefaultHeartbeatInterval = 5 * time.Second
	// DefaultBackoffMin is the default Config.BackoffMin.
	DefaultBackoffMin = 100 * time.Millisecond
	// DefaultBackoffMax is the default Config.BackoffMax.
	DefaultBackoffMax = time.Second
	// DefaultRetryAttempts is the default Config.RetryAttempts.
	DefaultRetryAttempts = 5
	// DefaultMaxReceiveBytes is the default Config.MaxReceiveBytes.
	DefaultMaxReceiveBytes = 16 << 20
	// DefaultMaxRequestBytes is the default Config.MaxRequestBytes.
	DefaultMaxRequestBytes = 4 << 20
	// DefaultDrainTimeout is the default Config.DrainTimeout.
	DefaultDrainTimeout = 30 * time.Second
	// MaxCapacity is the largest capacity a session may declare
	// (SessionHello.capacity is 1 to 4096).
	MaxCapacity = limits.MaxRendererCapacity
	// MinMessageBytes is the smallest Config.MaxReceiveBytes and
	// Config.MaxRequestBytes accepted.
	MinMessageBytes = 64 << 10
)

// Connection tuning. The channel reconnects from 100 ms doubling to at most
// 1 s, and a Session opened with WaitForReady waits for it, so the worker is
// back within about a second of the coordinator's return.
const (
	connectBaseDelay  = 100 * time.Millisecond
	connectMaxDelay   = time.Second
	minConnectTimeout = time.Second
)

// Timeouts and delays of the session's own steps.
const (
	// rpcTimeout bounds one UploadArtifact call.
	rpcTimeout = 30 * time.Second
	// closeGrace is how long a half-closed session may take to end before it
	// is cut.
	closeGrace = time.Second
	// answerWait is how long a drain waits for the answers to its hand-backs
	// and last completions.
	answerWait = 2 * time.Second
	// idInUseBackoffMin and idInUseBackoffMax bound the retries of a session
	// refused with ALREADY_EXISTS RENDERER_ID_IN_USE.
	idInUseBackoffMin = time.Second
	idInUseBackoffMax = 30 * time.Second
	// notLeaderBackoffMin is the least wait before a session refused with
	// NOT_LEADER again before any welcome is reopened.
	notLeaderBackoffMin = 10 * time.Millisecond
	// inlineHeadroom is kept free in a request next to an inline preview,
	// for the completion's other fields and the other items.
	inlineHeadroom = 16 << 10
)

var (
	rendererIDPattern = regexp.MustCompile(`^[A-Za-z0-9._-]{1,` + strconv.Itoa(limits.MaxRendererIDBytes) + `}$`)
	instanceIDPattern = regexp.MustCompile(`^[A-Za-z0-9._-]{1,` + strconv.Itoa(limits.MaxInstanceIDBytes) + `}$`)
)

// Config configures a Worker. Zero values take the defaults named on each
// field.
type Config struct {
	// Coordinator is the coordinator's address: one gRPC target, such as
	// "127.0.0.1:7070"; or, for a cluster, every replica's host:port
	// separated by commas, or a dns:/// target resolving to all of them.
	// With replicas the worker polls each one's leasehold.v1.Leader health
	// entry and opens its session on the one that answers SERVING, leaving
	// it for another that does (see the package documentation); over TLS
	// each listed replica is verified against its own host unless
	// TLS.ServerName names one for all.
	Coordinator string
	// ID names this renderer: 1 to 128 bytes of [A-Za-z0-9._-], allowed for
	// Token's principal and used by one live process at a time.
	ID string
	// InstanceID names this process to the coordinator across reconnects: 1
	// to 64 bytes of [A-Za-z0-9._-]. Default: 16 random hex digits drawn by
	// New.
	InstanceID string
	// Token is the bearer token sent on every call; empty sends none.
	// Without TLS it is sent only to a coordinator on loopback, unless
	// InsecurePlaintext is set: New refuses a Coordinator naming another
	// host (security.ErrPlaintextToken).
	Token string
	// TLS, when set, connects over TLS: RootCAs verify the coordinator
	// (the system's roots when nil), and Certificates hold the client
	// certificate of mutual TLS. Nil connects in plaintext.
	TLS *tls.Config
	// InsecurePlaintext allows sending Token without TLS to a coordinator
	// that is not on loopback, where the network itself encrypts (a
	// service mesh). It excludes TLS.
	InsecurePlaintext bool
	// TracerProvider, when set, traces the worker's calls (otelgrpc) and
	// its work on each lease: a render span and a completion span, children
	// of the trace context the grant carries. Nil traces nothing.
	TracerProvider trace.TracerProvider
	// Capacity is how many leases the worker holds at most (default 2, at
	// most MaxCapacity).
	Capacity int
	// Provider renders the documents. Required.
	Provider Provider
	// Logger receives the worker's log lines (default slog.Default()).
	Logger *slog.Logger
	// HeartbeatInterval overrides the interval the coordinator announces in
	// its welcome; when both are zero it is 5 s.
	HeartbeatInterval time.Duration
	// RecordFile, when set, is a file to which every lease handed to this
	// renderer is appended as a line "job_id token", written as it arrives.
	RecordFile string
	// BackoffMin and BackoffMax bound the exponential backoff (with jitter)
	// between sessions and between upload retries (defaults 100 ms and 1 s).
	BackoffMin, BackoffMax time.Duration
	// RetryAttempts bounds the attempts of an upload that fails with an error
	// other than ABORTED or UNAVAILABLE (default 5). UNAVAILABLE is retried
	// while the lease is held; ABORTED is never retried.
	RetryAttempts int
	// MaxReceiveBytes is the largest message the worker receives (default 16
	// MiB, at least MinMessageBytes); it is declared to the coordinator as
	// hello.max_message_bytes, which bounds every batch of grants.
	MaxReceiveBytes int
	// MaxRequestBytes bounds one SessionRequest (default 4 MiB, at least
	// MinMessageBytes). The coordinator's welcome.max_message_bytes lowers it
	// when smaller. Previews that would not fit inline with 16 KiB to spare
	// are uploaded.
	MaxRequestBytes int
	// DrainTimeout is how long a drain lets in-flight renders finish before
	// it hands back the rest (default 30 s).
	DrainTimeout time.Duration
	// DialOptions are appended to the worker's own dial options; tests use
	// them to dial an in-process server.
	DialOptions []grpc.DialOption
}

// Worker is one renderer pod's connection to the coordinator. Create it with
// New and start it with Run; a Worker runs once. Handler and EndDrain may
// be called from any goroutine at any time; Handler's /readyz reports
// whether the worker can take work.
//
// Run's goroutine is the worker's loop: it alone holds the leases, the
// outbox of completions and hand-backs, the credits and the session, and
// the other goroutines tell it what happened on the channels below (see
// the package documentation). A Worker's fields never change once Run has
// started, but for the two flags the loop publishes for Handler.
type Worker struct {
	cfg     Config
	log     *slog.Logger
	metrics *metrics
	// leader finds the leader of Config.Coordinator, parsed: the
	// connection's resolver, and the end of a session on a leader left.
	leader *leaderdial.Leader
	// http sends presigned uploads to the artifact store.
	http *http.Client
	// transport holds the dial options of the transport and the token.
	transport []grpc.DialOption
	// tracer starts the lease spans; nil when not tracing.
	tracer trace.Tracer

	// The reports of the goroutines the loop starts: each lease's render
	// and upload, a simulated stall's start, and a session's welcome,
	// responses, requests sent and end. The loop receives on every one of
	// them until it returns, and it returns only once every goroutine that
	// reports has ended, so a report waits only for the loop's current
	// step and none is lost.
	rendered  chan rendered
	uploaded  chan uploaded
	paused    chan leaseKey
	welcomed  chan *leaseholdv1.SessionResponse
	responses chan *leaseholdv1.SessionResponse
	sent      chan sent
	ended     chan ended

	// cut is closed by EndDrain.
	cut     chan struct{}
	cutOnce sync.Once
	started atomic.Bool
	// connected and draining are the loop's state as /readyz reports it:
	// a welcomed session is open, Run's context is done.
	connected, draining atomic.Bool
}

// New validates cfg, applies the defaults and returns a Worker.
func New(cfg Config) (*Worker, error) {
	cfg.Capacity = cmp.Or(cfg.Capacity, DefaultCapacity)
	cfg.BackoffMin = cmp.Or(cfg.BackoffMin, DefaultBackoffMin)
	cfg.BackoffMax = cmp.Or(cfg.BackoffMax, DefaultBackoffMax)
	cfg.RetryAttempts = cmp.Or(cfg.RetryAttempts, DefaultRetryAttempts)
	cfg.MaxReceiveBytes = cmp.Or(cfg.MaxReceiveBytes, DefaultMaxReceiveBytes)
	cfg.MaxRequestBytes = cmp.Or(cfg.MaxRequestBytes, DefaultMaxRequestBytes)
	cfg.DrainTimeout = cmp.Or(cfg.DrainTimeout, DefaultDrainTimeout)
	if cfg.InstanceID == "" {
		var b [8]byte
		_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
		cfg.InstanceID = hex.EncodeToString(b[:])
	}
	switch {
	case cfg.Coordinator == "":
		return nil, errors.New("renderer: coordinator address is required")
	case !rendererIDPattern.MatchString(cfg.ID):
		return nil, fmt.Errorf("renderer: id %q must be 1 to 128 bytes of [A-Za-z0-9._-]", cfg.ID)
	case !instanceIDPattern.MatchString(cfg.InstanceID):
		return nil, fmt.Errorf("renderer: instance id %q must be 1 to 64 bytes of [A-Za-z0-9._-]", cfg.InstanceID)
	case cfg.Capacity < 1 || cfg.Capacity > MaxCapacity:
		return nil, fmt.Errorf("renderer: capacity %d is not between 1 and %d", cfg.Capacity, MaxCapacity)
	case cfg.Provider == nil:
		return nil, errors.New("renderer: a provider is required")
	case cfg.HeartbeatInterval < 0:
		return nil, fmt.Errorf("renderer: heartbeat interval %v is negative", cfg.HeartbeatInterval)
	case cfg.BackoffMin <= 0 || cfg.BackoffMax < cfg.BackoffMin:
		return nil, fmt.Errorf("renderer: backoff bounds %v..%v are invalid", cfg.BackoffMin, cfg.BackoffMax)
	case cfg.RetryAttempts < 1:
		return nil, fmt.Errorf("renderer: retry attempts %d must be positive", cfg.RetryAttempts)
	case cfg.MaxReceiveBytes < MinMessageBytes || cfg.MaxReceiveBytes > math.MaxUint32:
		return nil, fmt.Errorf("renderer: max receive bytes %d is not between %d and %d", cfg.MaxReceiveBytes, MinMessageBytes, uint32(math.MaxUint32))
	case cfg.MaxRequestBytes < MinMessageBytes:
		return nil, fmt.Errorf("renderer: max request bytes %d is below %d", cfg.MaxRequestBytes, MinMessageBytes)
	case cfg.DrainTimeout < 0:
		return nil, fmt.Errorf("renderer: drain timeout %v is negative", cfg.DrainTimeout)
	}
	target, err := leaderdial.Parse(cfg.Coordinator)
	if err != nil {
		return nil, fmt.Errorf("renderer: %w", err)
	}
	var creds credentials.TransportCredentials
	if cfg.TLS != nil {
		creds = credentials.NewTLS(cfg.TLS)
	}
	transport, err := security.Client{Creds: creds, Token: cfg.Token, InsecurePlaintext: cfg.InsecurePlaintext}.DialOptions(target.Hosts()...)
	if err != nil {
		return nil, fmt.Errorf("renderer: %w", err)
	}
	w := &Worker{
		cfg:       cfg,
		log:       cmp.Or(cfg.Logger, slog.Default()),
		metrics:   newMetrics(cfg.Capacity),
		leader:    target.Leader(transport...),
		transport: transport,
		http:      &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64, IdleConnTimeout: time.Minute}},
		rendered:  make(chan rendered),
		uploaded:  make(chan uploaded),
		paused:    make(chan leaseKey),
		welcomed:  make(chan *leaseholdv1.SessionResponse),
		responses: make(chan *leaseholdv1.SessionResponse),
		sent:      make(chan sent),
		ended:     make(chan ended),
		cut:       make(chan struct{}),
	}
	if cfg.TracerProvider != nil {
		w.tracer = cfg.TracerProvider.Tracer(tracerName)
	}
	return w, nil
}

// Run connects to the coordinator and works until ctx is done, then drains:
// it tells the coordinator at once that it takes no more work, lets the
// renders in flight finish and complete for up to Config.DrainTimeout (or
// until EndDrain), hands back the leases still unfinished, waits briefly for
// the answers, closes the session and returns nil.
//
// While ctx is live, a broken session is reopened with backoff, keeping the
// leases in progress. Run returns an error when it cannot start (the record
// file cannot be opened) or when the coordinator refuses this renderer for
// good (UNAUTHENTICATED, PERMISSION_DENIED, INVALID_ARGUMENT or UNIMPLEMENTED
// on Session); the renders in flight are then cancelled. Run must be called
// at most once.
func (w *Worker) Run(ctx context.Context) error {
	if !w.started.CompareAndSwap(false, true) {
		return errors.New("renderer: Run called twice")
	}
	var record *os.File
	if w.cfg.RecordFile != "" {
		f, err := os.OpenFile(w.cfg.RecordFile, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
		if err != nil {
			return fmt.Errorf("renderer: opening record file: %w", err)
		}
		record = f
		defer f.Close()
	}
	conn, err := grpc.NewClient(w.leader.DialTarget(), w.dialOptions()...)
	if err != nil {
		return fmt.Errorf("renderer: connecting to %s: %w", w.cfg.Coordinator, err)
	}
	defer conn.Close()
	l := newLoop(ctx, w, leaseholdv1.NewRendererServiceClient(conn), record)
	w.log.Info("renderer started", "id", w.cfg.ID, "instance", w.cfg.InstanceID,
		"coordinator", w.cfg.Coordinator, "capacity", w.cfg.Capacity)
	err = l.run(ctx)
	w.log.Info("renderer stopped", "id", w.cfg.ID)
	return err
}

// dialOptions returns the options of the worker's one connection: the
// leader-following resolver and service config of a replicated
// coordinator, the transport (TLS or plaintext) with the bearer token,
// reconnect tuned to find a returning coordinator within about a second,
// the receive limit declared in hello, tracing if configured, then
// Config.DialOptions.
func (w *Worker) dialOptions() []grpc.DialOption {
	bo := grpcbackoff.DefaultConfig
	bo.BaseDelay, bo.MaxDelay = connectBaseDelay, connectMaxDelay
	opts := append(w.leader.DialOptions(), w.transport...)
	opts = append(opts,
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: bo, MinConnectTimeout: minConnectTimeout}),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(w.cfg.MaxReceiveBytes)),
	)
	if w.cfg.TracerProvider != nil {
		opts = append(opts, tracing.DialOption(w.cfg.TracerProvider))
	}
	return append(opts, w.cfg.DialOptions...)
}

// EndDrain cuts a drain short: the leases still in progress are handed back
// at once instead of after Config.DrainTimeout. Called before the drain
// starts, it makes the drain skip its wait. It is safe to call from any
// goroutine, any number of times.
func (w *Worker) EndDrain() {
	w.cutOnce.Do(func() { close(w.cut) })
}
