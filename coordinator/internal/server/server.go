package server

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/auth"
	"github.com/leasehold/leasehold/coordinator/internal/engine"
	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	"github.com/leasehold/leasehold/coordinator/internal/overview"
	"github.com/leasehold/leasehold/coordinator/internal/reads"
	"github.com/leasehold/leasehold/coordinator/internal/watch"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
)

// Each service reaches the coordinator's writer and read side through an
// interface of its own, declared here beside the others and holding what
// its handlers call, no more; *engine.Engine implements them all, and each
// method has the contract of its namesake there. Commands go through the
// writer; reads may run on any goroutine.

// JobEngine is what JobService needs: submissions and cancels, and the
// reads of jobs, batches, histories and previews.
type JobEngine interface {
	Submit(ctx context.Context, req engine.SubmitRequest) (engine.SubmitResult, error)
	Cancel(ctx context.Context, req engine.CancelRequest) (engine.CancelResult, error)
	RecordAudit(ctx context.Context, rec jobs.AuditRecord) error
	Job(id uint64) (jobs.Job, error)
	Events(id uint64, after uint32) ([]jobs.Event, error)
	Batch(id uint64) (reads.BatchView, error)
	BatchStates(id uint64) ([]jobs.State, error)
	ListJobs(f reads.JobFilter) (reads.JobPage, error)
	Artifact(j jobs.Job) (jobs.Preview, error)
	WatchBatch(batch uint64) (*watch.Watch, error)
}

// RendererEngine is what RendererService needs: the session protocol (the
// unary calls are adapters over it), uploads, grants' content and the
// settings renderers are told.
type RendererEngine interface {
	Open(ctx context.Context, req engine.SessionOpen) (*engine.Conn, []engine.LeaseStatus, error)
	Receive(ctx context.Context, conn *engine.Conn, in engine.SessionInput) (engine.SessionResult, error)
	Close(ctx context.Context, conn *engine.Conn, undelivered []engine.LeaseRef) ([]engine.Grant, error)
	Stage(ctx context.Context, req engine.StageRequest) error
	Job(id uint64) (jobs.Job, error)
	Record(id uint64) (jobs.Job, error)
	ObjectClock() (uint64, error)
	ReadContent(grants []engine.Grant) error
	DispatchState() jobs.DispatchState
	HeartbeatInterval() time.Duration
	LeaseTTL() time.Duration
	MaxGrantBytes() int
}

// OperatorEngine is what OperatorService needs: replays, the dispatch
// switch, the audit trail, rejections and backups.
type OperatorEngine interface {
	Replay(ctx context.Context, req engine.ReplayRequest) (engine.ReplayResult, error)
	SetPaused(ctx context.Context, paused bool, principal, reason string) (jobs.DispatchState, error)
	ListRejections(f reads.RejectionFilter) (reads.RejectionPage, error)
	ListAudit(f reads.AuditFilter) (reads.AuditPage, error)
	Backup(w io.Writer, start func(reads.BackupInfo) error) (int64, error)
}

// OverviewEngine is what OverviewService needs: the writer's published
// overview and the batches listing.
type OverviewEngine interface {
	Overview() (overview.Overview, <-chan struct{}, error)
	ListBatches(f reads.BatchFilter) (reads.BatchPage, error)
}

// Engine is every service's engine together, as New takes it.
type Engine interface {
	JobEngine
	RendererEngine
	OperatorEngine
	OverviewEngine
}

var _ Engine = (*engine.Engine)(nil)

// Defaults for Config.
const (
	// DefaultMaxArtifactBytes bounds one preview.
	DefaultMaxArtifactBytes = 8 << 20
	// DefaultMaxInlineArtifactBytes bounds a preview sent inline in a
	// completion; larger ones are uploaded first.
	DefaultMaxInlineArtifactBytes = 1 << 20
	// DefaultMaxSessionMessageBytes is the largest SessionRequest the
	// coordinator accepts (its gRPC receive limit must be at least this).
	DefaultMaxSessionMessageBytes = 16 << 20
	// MaxAcquireWait caps an Acquire long poll.
	MaxAcquireWait = 60 * time.Second
	// UploadIdleTimeout ends an upload that sends nothing for this long;
	// UploadTimeout ends one that takes longer than this in all.
	UploadIdleTimeout = 10 * time.Second
	UploadTimeout     = 2 * time.Minute
	// artifactChunkBytes is the chunk size of GetArtifact.
	artifactChunkBytes = 64 << 10
	// defaultClientMessageBytes is gRPC's default receive limit, assumed
	// for a caller that states none.
	defaultClientMessageBytes = 4 << 20
)

// Config configures the services.
type Config struct {
	Engine Engine
	// Cluster is the raft node of a replicated coordinator, for
	// ClusterService; nil on a single node.
	Cluster Cluster
	// SessionKeepalives has quiet renderer sessions sent a keepalive at a
	// third of the heartbeat interval, named in the welcome, so that a
	// renderer can leave a leader that stopped answering for the one that
	// replaced it: the wiring sets it for a replicated coordinator. A
	// single node has no other to move to, and a one-way path that still
	// carries a renderer's heartbeats keeps its leases there.
	SessionKeepalives bool
	// MaxArtifactBytes bounds one preview (default 8 MiB).
	MaxArtifactBytes int64
	// MaxInlineArtifactBytes bounds a preview inline in a completion
	// (default 1 MiB).
	MaxInlineArtifactBytes int
	// MaxSessionMessageBytes is told to renderers as the largest
	// SessionRequest accepted (default 16 MiB).
	MaxSessionMessageBytes int
	// MaxUploadBufferBytes bounds the bytes all uploads in progress buffer
	// together (default DefaultMaxUploadBufferBytes, at least
	// MaxArtifactBytes); the uploads of one credential may hold half of
	// it, or MaxArtifactBytes when that is more.
	MaxUploadBufferBytes int64
	// Previews is where previews too large to keep inline go; the zero
	// value keeps every preview inline, as a node without a store does.
	Previews Previews
	Logger   *slog.Logger
}

// core is the state the services share: limits, the log, the shutdown.
type core struct {
	maxBytes  int64
	maxInline int
	maxMsg    int
	log       *slog.Logger
	// uploadIdle and uploadTotal bound an upload (UploadIdleTimeout and
	// UploadTimeout); tests shorten them.
	uploadIdle  time.Duration
	uploadTotal time.Duration
	// uploads are the uploads in progress and their bytes.
	uploads *uploads
	// previews is the artifact store as the services use it.
	previews Previews
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
	Overview  *OverviewServer
	Cluster   *ClusterServer
}

// New returns the services over cfg.Engine.
func New(cfg Config) (*Services, error) {
	if cfg.Engine == nil {
		return nil, errors.New("server: Config.Engine is required")
	}
	c := &core{
		maxBytes:  cmp.Or(cfg.MaxArtifactBytes, DefaultMaxArtifactBytes),
		maxInline: cmp.Or(cfg.MaxInlineArtifactBytes, DefaultMaxInlineArtifactBytes),
		maxMsg:    cmp.Or(cfg.MaxSessionMessageBytes, DefaultMaxSessionMessageBytes),
		log:       cfg.Logger,
		closing:   make(chan struct{}),

		uploadIdle:  UploadIdleTimeout,
		uploadTotal: UploadTimeout,
		previews:    cfg.Previews.withDefaults(),
	}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	c.maxInline = min(c.maxInline, int(c.maxBytes))
	c.uploads = newUploads(max(cmp.Or(cfg.MaxUploadBufferBytes, DefaultMaxUploadBufferBytes), c.maxBytes), c.maxBytes)
	return &Services{Jobs: &JobServer{core: c, e: cfg.Engine, denied: newDeniedAudits(cfg.Engine.RecordAudit, c.log)}, Renderers: &RendererServer{core: c, e: cfg.Engine, keepalives: cfg.SessionKeepalives},
		Operators: &OperatorServer{core: c, e: cfg.Engine}, Overview: &OverviewServer{core: c, e: cfg.Engine},
		Cluster: &ClusterServer{core: c, e: cfg.Engine, cl: cfg.Cluster}}, nil
}

// Register registers the services on s.
func (sv *Services) Register(s grpc.ServiceRegistrar) {
	leaseholdv1.RegisterJobServiceServer(s, sv.Jobs)
	leaseholdv1.RegisterRendererServiceServer(s, sv.Renderers)
	leaseholdv1.RegisterOperatorServiceServer(s, sv.Operators)
	leaseholdv1.RegisterOverviewServiceServer(s, sv.Overview)
	leaseholdv1.RegisterClusterServiceServer(s, sv.Cluster)
}

// Shutdown makes pending and future Acquire long polls answer at once
// without leases and ends Heartbeat, WatchBatch and WatchOverview streams with
// UNAVAILABLE, so that a graceful stop of the gRPC server is not held up
// by them, and records the refused cancels counted and not yet recorded.
// Unary calls keep working. It is safe to call more than once.
func (sv *Services) Shutdown() {
	c := sv.Jobs.core
	c.closeOnce.Do(func() {
		close(c.closing)
		sv.Jobs.denied.flushAll()
	})
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
// operator whose scope covers it. A job p may not see is answered as one
// that does not exist.
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

// rendererFor returns the renderer a call acts as: id, which must be well
// formed and allowed for the caller's credential.
func rendererFor(p auth.Principal, id string) (engine.Renderer, error) {
	if err := checkRendererID(id); err != nil {
		return engine.Renderer{}, err
	}
	if !p.MayUseRendererID(id) {
		return engine.Renderer{}, &requestError{code: codes.PermissionDenied, reason: reasonRendererNotAllowed,
			msg: fmt.Sprintf("%s may not act as renderer %q; the principals file lists the ids it may use", p.Name, id)}
	}
	return engine.Renderer{ID: id, Principal: p.Name, MaxCapacity: p.MaxCapacity}, nil
}
