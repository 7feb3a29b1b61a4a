package renderer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"github.com/leasehold/leasehold/renderer/mock"
)

// Defaults for the zero values of Config.
const (
	// DefaultCapacity is the default Config.Capacity.
	DefaultCapacity = 2
	// DefaultAcquireWait is the default Config.AcquireWait.
	DefaultAcquireWait = 30 * time.Second
	// DefaultHeartbeatInterval is used when neither Config.HeartbeatInterval
	// nor the coordinator sets an interval.
	DefaultHeartbeatInterval = 5 * time.Second
	// DefaultBackoffMin is the default Config.BackoffMin.
	DefaultBackoffMin = 100 * time.Millisecond
	// DefaultBackoffMax is the default Config.BackoffMax.
	DefaultBackoffMax = 5 * time.Second
	// DefaultRetryAttempts is the default Config.RetryAttempts.
	DefaultRetryAttempts = 5
	// MaxCapacity is the largest capacity the coordinator accepts
	// (AcquireRequest.max_leases is 1 to 64).
	MaxCapacity = 64
	// MaxAcquireWait is the longest long poll the coordinator honours.
	MaxAcquireWait = 60 * time.Second
)

// Timeouts for single calls. Acquire gets its wait plus acquireSlack, so a
// coordinator that never answers does not hang the acquire loop.
const (
	rpcTimeout   = 30 * time.Second
	acquireSlack = 10 * time.Second
	closeGrace   = time.Second
)

var rendererIDPattern = regexp.MustCompile(`^[A-Za-z0-9._-]{1,128}$`)

// Provider renders one document under one lease. It must return promptly with
// ctx.Err() once ctx is done. A *mock.Failure error is reported to the
// coordinator with its class; any other error is reported as transient.
type Provider interface {
	Render(ctx context.Context, in mock.Input) (mock.Output, error)
}

// Config configures a Worker. Zero values take the defaults named on each
// field.
type Config struct {
	// Coordinator is the coordinator's gRPC target, such as "127.0.0.1:7070".
	Coordinator string
	// ID names this renderer: 1 to 128 bytes of [A-Za-z0-9._-], unique among
	// live renderers.
	ID string
	// Token is the bearer token sent on every call; empty sends none.
	Token string
	// Capacity is how many leases the worker holds at most (default 2, at
	// most MaxCapacity).
	Capacity int
	// Provider renders the documents. Required.
	Provider Provider
	// Logger receives the worker's log lines (default slog.Default()).
	Logger *slog.Logger
	// AcquireWait is how long one Acquire long poll waits for work (default
	// 30 s, at most 60 s).
	AcquireWait time.Duration
	// HeartbeatInterval overrides the interval the coordinator returns in
	// AcquireResponse.heartbeat_interval; when both are zero it is 5 s.
	HeartbeatInterval time.Duration
	// RecordFile, when set, is a file to which every lease handed to this
	// renderer is appended as a line "job_id token", written as it arrives.
	RecordFile string
	// BackoffMin and BackoffMax bound the exponential backoff (with jitter)
	// between reconnects and retries (defaults 100 ms and 5 s).
	BackoffMin, BackoffMax time.Duration
	// RetryAttempts bounds the attempts of an upload or completion that fails
	// with an error other than ABORTED or UNAVAILABLE (default 5). UNAVAILABLE
	// is retried until the worker stops; ABORTED is never retried.
	RetryAttempts int
	// DialOptions are appended to the worker's own dial options; tests use
	// them to dial an in-process server.
	DialOptions []grpc.DialOption
}

// Worker is one renderer pod's connection to the coordinator. Create it with
// New and start it with Run; a Worker runs once.
type Worker struct {
	cfg    Config
	log    *slog.Logger
	record *os.File

	// interval is the heartbeat interval in nanoseconds.
	interval atomic.Int64
	// slotFreed is signalled (without blocking) whenever a lease ends.
	slotFreed chan struct{}
	// wakeHeartbeat asks the heartbeat sender to send at once (cancel acks).
	wakeHeartbeat chan struct{}
	// wg counts the lease goroutines.
	wg sync.WaitGroup

	mu sync.Mutex
	// leases holds every lease whose goroutine is still running, including
	// lost ones that are winding down; they count against capacity.
	leases map[leaseKey]*lease
	// acks are revocations acted on and not yet sent.
	acks []*leaseholdv1.LeaseRef
}

// New validates cfg, applies the defaults and returns a Worker.
func New(cfg Config) (*Worker, error) {
	cfg.Capacity = cmp.Or(cfg.Capacity, DefaultCapacity)
	cfg.AcquireWait = cmp.Or(cfg.AcquireWait, DefaultAcquireWait)
	cfg.BackoffMin = cmp.Or(cfg.BackoffMin, DefaultBackoffMin)
	cfg.BackoffMax = cmp.Or(cfg.BackoffMax, DefaultBackoffMax)
	cfg.RetryAttempts = cmp.Or(cfg.RetryAttempts, DefaultRetryAttempts)
	switch {
	case cfg.Coordinator == "":
		return nil, errors.New("renderer: coordinator address is required")
	case !rendererIDPattern.MatchString(cfg.ID):
		return nil, fmt.Errorf("renderer: id %q must be 1 to 128 bytes of [A-Za-z0-9._-]", cfg.ID)
	case cfg.Capacity < 1 || cfg.Capacity > MaxCapacity:
		return nil, fmt.Errorf("renderer: capacity %d is not between 1 and %d", cfg.Capacity, MaxCapacity)
	case cfg.Provider == nil:
		return nil, errors.New("renderer: a provider is required")
	case cfg.AcquireWait < 0 || cfg.AcquireWait > MaxAcquireWait:
		return nil, fmt.Errorf("renderer: acquire wait %v is not between 0 and %v", cfg.AcquireWait, MaxAcquireWait)
	case cfg.HeartbeatInterval < 0:
		return nil, fmt.Errorf("renderer: heartbeat interval %v is negative", cfg.HeartbeatInterval)
	case cfg.BackoffMin <= 0 || cfg.BackoffMax < cfg.BackoffMin:
		return nil, fmt.Errorf("renderer: backoff bounds %v..%v are invalid", cfg.BackoffMin, cfg.BackoffMax)
	case cfg.RetryAttempts < 1:
		return nil, fmt.Errorf("renderer: retry attempts %d must be positive", cfg.RetryAttempts)
	}
	w := &Worker{
		cfg:           cfg,
		log:           cmp.Or(cfg.Logger, slog.Default()),
		slotFreed:     make(chan struct{}, 1),
		wakeHeartbeat: make(chan struct{}, 1),
		leases:        make(map[leaseKey]*lease),
	}
	w.interval.Store(int64(cmp.Or(cfg.HeartbeatInterval, DefaultHeartbeatInterval)))
	return w, nil
}

// Run connects to the coordinator and works until ctx is done, then stops
// acquiring, cancels the in-flight renders, closes its streams and returns
// nil. It returns an error when it cannot start (the record file cannot be
// opened) or when the coordinator refuses this renderer for good
// (UNAUTHENTICATED, PERMISSION_DENIED, INVALID_ARGUMENT or UNIMPLEMENTED from
// Acquire). Run must be called at most once.
func (w *Worker) Run(ctx context.Context) error {
	if w.cfg.RecordFile != "" {
		f, err := os.OpenFile(w.cfg.RecordFile, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
		if err != nil {
			return fmt.Errorf("renderer: opening record file: %w", err)
		}
		w.record = f
		defer f.Close()
	}
	opts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	if w.cfg.Token != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(bearerToken(w.cfg.Token)))
	}
	opts = append(opts, w.cfg.DialOptions...)
	conn, err := grpc.NewClient(w.cfg.Coordinator, opts...)
	if err != nil {
		return fmt.Errorf("renderer: connecting to %s: %w", w.cfg.Coordinator, err)
	}
	defer conn.Close()
	client := leaseholdv1.NewRendererServiceClient(conn)

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	hbDone := make(chan struct{})
	go func() {
		defer close(hbDone)
		w.heartbeatLoop(ctx, client)
	}()
	w.log.Info("renderer started", "id", w.cfg.ID, "coordinator", w.cfg.Coordinator, "capacity", w.cfg.Capacity)
	err = w.acquireLoop(ctx, client)
	cancel()
	w.wg.Wait()
	<-hbDone
	w.log.Info("renderer stopped", "id", w.cfg.ID)
	return err
}

// acquireLoop long-polls Acquire for free capacity until ctx is done. It
// returns nil on ctx cancellation and an error when the coordinator refuses
// this renderer for good.
func (w *Worker) acquireLoop(ctx context.Context, client leaseholdv1.RendererServiceClient) error {
	bo := w.newBackoff()
	for {
		free := w.freeSlots()
		if free == 0 {
			select {
			case <-ctx.Done():
				return nil
			case <-w.slotFreed:
			}
			continue
		}
		start := time.Now()
		actx, cancel := context.WithTimeout(ctx, w.cfg.AcquireWait+acquireSlack)
		resp, err := client.Acquire(actx, &leaseholdv1.AcquireRequest{
			RendererId: w.cfg.ID,
			MaxLeases:  uint32(free),
			Capacity:   uint32(w.cfg.Capacity),
			Wait:       durationpb.New(w.cfg.AcquireWait),
		})
		cancel()
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			switch status.Code(err) {
			case codes.Unauthenticated, codes.PermissionDenied, codes.InvalidArgument, codes.Unimplemented:
				w.log.Error("acquire refused", "err", err, "reason", reasonOf(err))
				return fmt.Errorf("renderer: acquire refused: %w", err)
			}
			d := bo.next()
			w.log.Warn("acquire failed", "err", err, "retry_in", d)
			if !sleepCtx(ctx, d) {
				return nil
			}
			continue
		}
		bo.reset()
		if hi := resp.GetHeartbeatInterval(); w.cfg.HeartbeatInterval == 0 && hi != nil && hi.AsDuration() > 0 {
			w.interval.Store(int64(hi.AsDuration()))
		}
		for _, g := range resp.GetLeases() {
			w.start(ctx, client, g)
		}
		if len(resp.GetLeases()) == 0 {
			if resp.GetDispatchPaused() {
				w.log.Debug("dispatch paused")
			}
			// A coordinator that answers an empty poll at once must not make
			// this loop spin.
			if time.Since(start) < w.cfg.BackoffMin && !sleepCtx(ctx, w.cfg.BackoffMin) {
				return nil
			}
		}
	}
}

// freeSlots returns how many more leases the worker may hold.
func (w *Worker) freeSlots() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return max(0, w.cfg.Capacity-len(w.leases))
}

// start records a grant and starts its lease goroutine. It runs on the
// acquire loop's goroutine.
func (w *Worker) start(ctx context.Context, client leaseholdv1.RendererServiceClient, g *leaseholdv1.Grant) {
	key := leaseKey{jobID: g.GetJobId(), token: g.GetLease().GetToken()}
	w.recordGrant(key)
	w.mu.Lock()
	if _, dup := w.leases[key]; dup {
		w.mu.Unlock()
		w.log.Warn("duplicate grant ignored", "job", key.jobID, "token", key.token)
		return
	}
	if len(w.leases) >= w.cfg.Capacity {
		w.mu.Unlock()
		w.log.Warn("grant over capacity ignored", "job", key.jobID, "token", key.token)
		return
	}
	lctx, cancel := context.WithCancelCause(ctx)
	l := &lease{key: key, grant: g, parent: ctx, ctx: lctx, cancel: cancel}
	w.leases[key] = l
	w.mu.Unlock()
	w.log.Info("lease acquired", "job", key.jobID, "token", key.token, "attempt", g.GetLease().GetAttempt(), "team", g.GetTeam())
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		defer w.finish(l)
		w.work(client, l)
	}()
}

// recordGrant appends the grant to the record file, if any. A failed write
// is logged and does not stop the work.
func (w *Worker) recordGrant(key leaseKey) {
	if w.record == nil {
		return
	}
	if _, err := fmt.Fprintf(w.record, "%s %d\n", key.jobID, key.token); err != nil {
		w.log.Error("recording grant", "job", key.jobID, "token", key.token, "err", err)
	}
}

// finish forgets a lease whose goroutine is ending, frees its slot and, if
// the lease was revoked, queues its cancel ack now that the work has stopped.
func (w *Worker) finish(l *lease) {
	w.mu.Lock()
	delete(w.leases, l.key)
	if l.revoked {
		w.acks = append(w.acks, l.key.ref())
	}
	revoked := l.revoked
	w.mu.Unlock()
	l.cancel(nil)
	select {
	case w.slotFreed <- struct{}{}:
	default:
	}
	if revoked {
		w.wake()
	}
}

// wake asks the heartbeat sender to send at once.
func (w *Worker) wake() {
	select {
	case w.wakeHeartbeat <- struct{}{}:
	default:
	}
}

// bearerToken sends "authorization: Bearer <token>" on every call.
type bearerToken string

// GetRequestMetadata implements credentials.PerRPCCredentials.
func (t bearerToken) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(t)}, nil
}

// RequireTransportSecurity implements credentials.PerRPCCredentials. The
// coordinator is reached over a trusted network without TLS.
func (bearerToken) RequireTransportSecurity() bool { return false }
