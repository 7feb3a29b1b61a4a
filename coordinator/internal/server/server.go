package server

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/auth"
	"github.com/leasehold/leasehold/coordinator/internal/engine"
	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
)

// Engine is what the handlers need of the coordinator's single writer and
// its read side; *engine.Engine implements it, and each method has the
// contract of its namesake there. Commands (Submit, Acquire, Heartbeat,
// Complete, Cancel, Replay, SetPaused, RecordAudit) go through the writer;
// reads may run on any goroutine.
type Engine interface {
	Submit(ctx context.Context, req engine.SubmitRequest) (engine.SubmitResult, error)
	Acquire(ctx context.Context, req engine.AcquireRequest) (engine.AcquireResult, error)
	Release(ctx context.Context, leases []engine.LeaseRef) error
	WorkAvailable() <-chan struct{}
	Heartbeat(ctx context.Context, req engine.HeartbeatRequest) ([]engine.LeaseStatus, error)
	RendererConnected(ctx context.Context, renderer string, capacity int) error
	RendererGone(renderer string)
	SubscribeRevocations(renderer string) (<-chan engine.LeaseStatus, func())
	Complete(ctx context.Context, req engine.CompleteRequest) (engine.CompleteResult, error)
	Cancel(ctx context.Context, req engine.CancelRequest) (engine.CancelResult, error)
	Replay(ctx context.Context, req engine.ReplayRequest) (engine.ReplayResult, error)
	SetPaused(ctx context.Context, paused bool, principal, reason string) (jobs.DispatchState, error)
	RecordAudit(ctx context.Context, rec jobs.AuditRecord) error
	Job(id uint64) (jobs.Job, error)
	Batch(id uint64) (engine.BatchView, error)
	ListJobs(f engine.JobFilter) ([]jobs.Job, error)
	ListRejections(f engine.RejectionFilter) ([]jobs.Rejection, error)
	ListAudit(before uint64, limit int) ([]jobs.AuditRecord, error)
	WatchBatch(batch uint64) (*engine.Watch, error)
	HeartbeatInterval() time.Duration
}

var _ Engine = (*engine.Engine)(nil)

// ArtifactStore is the content-addressed preview store; *store.Artifacts
// implements it.
type ArtifactStore interface {
	// Put stores at most maxBytes read from r and returns their SHA-256.
	Put(r io.Reader, maxBytes int64) (digest string, size int64, err error)
	// Open returns the artifact's content and size.
	Open(digest string) (io.ReadCloser, int64, error)
}

// Defaults for Config.
const (
	// DefaultMaxArtifactBytes bounds one upload.
	DefaultMaxArtifactBytes = 8 << 20
	// MaxAcquireWait caps an Acquire long poll.
	MaxAcquireWait = 60 * time.Second
	// artifactChunkBytes is the chunk size of GetArtifact.
	artifactChunkBytes = 64 << 10
)

// Config configures the three services.
type Config struct {
	Engine    Engine
	Artifacts ArtifactStore
	// Now is the clock of early lease checks; it should be the engine's.
	Now func() time.Time
	// MaxArtifactBytes bounds one upload (default 8 MiB).
	MaxArtifactBytes int64
	Logger           *slog.Logger
}

// core is the state the three services share.
type core struct {
	e        Engine
	art      ArtifactStore
	now      func() time.Time
	maxBytes int64
	log      *slog.Logger
	// closing is closed by Shutdown: long polls answer at once and
	// long-lived streams end, so that a graceful stop does not wait on them.
	closing   chan struct{}
	closeOnce sync.Once
}

// Services are the gRPC servers of the leasehold.v1 API.
type Services struct {
	Jobs      *JobServer
	Renderers *RendererServer
	Operators *OperatorServer
}

// New returns the three services over cfg.Engine.
func New(cfg Config) (*Services, error) {
	if cfg.Engine == nil || cfg.Artifacts == nil {
		return nil, errors.New("server: Config.Engine and Config.Artifacts are required")
	}
	c := &core{e: cfg.Engine, art: cfg.Artifacts, now: cfg.Now, maxBytes: cfg.MaxArtifactBytes, log: cfg.Logger, closing: make(chan struct{})}
	if c.now == nil {
		c.now = time.Now
	}
	if c.maxBytes <= 0 {
		c.maxBytes = DefaultMaxArtifactBytes
	}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	return &Services{Jobs: &JobServer{core: c}, Renderers: &RendererServer{core: c}, Operators: &OperatorServer{core: c}}, nil
}

// Register registers the three services on s.
func (sv *Services) Register(s grpc.ServiceRegistrar) {
	leaseholdv1.RegisterJobServiceServer(s, sv.Jobs)
	leaseholdv1.RegisterRendererServiceServer(s, sv.Renderers)
	leaseholdv1.RegisterOperatorServiceServer(s, sv.Operators)
}

// Shutdown makes pending and future Acquire long polls answer at once
// without leases and ends Heartbeat and WatchBatch streams with
// UNAVAILABLE, so that a graceful stop of the gRPC server is not held up
// by them. Unary calls keep working. It is safe to call more than once.
func (sv *Services) Shutdown() {
	c := sv.Jobs.core
	c.closeOnce.Do(func() { close(c.closing) })
}

// errShuttingDown ends long-lived streams when the coordinator stops.
var errShuttingDown = &requestError{code: codes.Unavailable, reason: reasonShuttingDown, msg: "the coordinator is shutting down; reconnect"}

// Service names, as the health service reports them.
const (
	JobServiceName      = "leasehold.v1.JobService"
	RendererServiceName = "leasehold.v1.RendererService"
	OperatorServiceName = "leasehold.v1.OperatorService"
)

// status maps err through the error table.
func (c *core) status(err error) error { return toStatus(c.log, err) }

// principal returns the caller, UNAUTHENTICATED when the interceptor put
// none in the context.
func principal(ctx context.Context) (auth.Principal, error) {
	p, ok := auth.FromContext(ctx)
	if !ok {
		return auth.Principal{}, &requestError{code: codes.Unauthenticated, reason: reasonUnauthenticated, msg: "no authenticated principal"}
	}
	return p, nil
}

// require returns the caller if it holds role, PERMISSION_DENIED otherwise.
func require(ctx context.Context, role auth.Role) (auth.Principal, error) {
	p, err := principal(ctx)
	if err != nil {
		return p, err
	}
	if !p.Can(role) {
		return p, denied("%s does not have the %s role", p.Name, role)
	}
	return p, nil
}

// access decides whether p may see and act on team's jobs, and how they are
// shown: in full to a submitter of the team, without source locations to an
// operator whose scope covers it.
func access(p auth.Principal, team string) (view, bool) {
	switch {
	case p.SubmitterOf(team):
		return viewFull, true
	case p.InScope(team):
		return viewOperator, true
	}
	return viewFull, false
}

// readTeams returns the teams p may list: nil for every team.
func readTeams(p auth.Principal) ([]string, error) {
	if p.AllScope() {
		return nil, nil
	}
	var teams []string
	if p.Can(auth.RoleSubmitter) && p.Team != "" {
		teams = append(teams, p.Team)
	}
	if p.Can(auth.RoleOperator) {
		teams = append(teams, p.Scope...)
	}
	if len(teams) == 0 {
		return nil, denied("%s may not read jobs", p.Name)
	}
	return teams, nil
}
