package lincheck_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasehold/leasehold/coordinator"
	"github.com/leasehold/leasehold/coordinator/lincheck"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"github.com/leasehold/leasehold/internal/leaderdial"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// The development tokens the coordinator accepts on loopback without a
// principals file.
const (
	tokenAlpha    = "dev-alpha"
	tokenBeta     = "dev-beta"
	tokenRenderer = "dev-renderer"
	tokenOperator = "dev-operator"
)

// The coordinator's configuration for a run. The lease TTL is far longer
// than any run, so no lease expires and the model need not know the
// writer's clock; retries wait milliseconds, so RETRY_WAIT jobs come back
// and attempts run out within a run.
const (
	leaseTTL    = time.Hour
	maxAttempts = 3
	backoffBase = time.Millisecond
	backoffCap  = 10 * time.Millisecond
)

// callTimeout bounds every call that is not cut short on purpose; a call
// that reaches it is recorded as Pending like any other lost answer.
const callTimeout = 30 * time.Second

// On a cluster, a call through the channel that follows the leader waits
// for a leader (gRPC's wait for ready) for up to clusterCallTimeout, which
// outlasts a failover; a call refused NOT_LEADER, or whose answer was lost,
// is sent again up to clusterTries times in all.
const (
	clusterCallTimeout = 10 * time.Second
	clusterTries       = 10
)

// options shape a run.
type options struct {
	// ops is how many RPCs to record (a client finishes the lease it is
	// working on, so a run records slightly more).
	ops int
	// clients is the number of concurrent clients: three submitters, one
	// operator, and renderers for the rest.
	clients int
	// cutRate is the share of calls given a deadline of a few hundred
	// microseconds to a few milliseconds, so that some answers are lost
	// while the call may or may not take effect.
	cutRate float64
	// liveJobs bounds the jobs not known to be terminal; submitters wait
	// above it.
	liveJobs int
	// wrongHolder makes renderers also complete other renderers' current
	// leases under their own id (NOT_LEASE_HOLDER by the contract).
	wrongHolder bool
	seed        uint64

	// nodes are the gRPC addresses of a cluster's nodes, nil for one
	// coordinator. Clients then call through one channel that follows the
	// leader (leaderdial, as the client library does) and also straight to
	// each node.
	nodes []string
	// directReads is the share of a cluster's GetJob calls sent straight
	// to a node chosen at random, linearizable as by default: a follower
	// must refuse them NOT_LEADER. A renderer also reads its job so, now
	// and then, right after its completion was answered.
	directReads float64
	// staleReads is the share of a cluster's GetJob calls that ask a node
	// chosen at random for a stale read.
	staleReads float64
	// directCancels is the share of a cluster's CancelJob calls sent
	// straight to a node chosen at random: a follower must refuse them
	// NOT_LEADER.
	directCancels float64
	// progress, if set, is told the number of calls recorded after each.
	progress func(n int)
	// until, if set, keeps the run going past ops until it is closed.
	until <-chan struct{}
	// abort, if set, ends the run once closed.
	abort <-chan struct{}
}

// coordinatorConfig is the configuration every run uses.
func coordinatorConfig(dir string, log *slog.Logger) coordinator.Config {
	return coordinator.Config{
		Listen:      "127.0.0.1:0",
		DataDir:     filepath.Join(dir, "data"),
		LeaseTTL:    leaseTTL,
		MaxAttempts: maxAttempts,
		BackoffBase: backoffBase,
		BackoffCap:  backoffCap,
		Logger:      log,
	}
}

// startCoordinator serves a coordinator on a loopback TCP port with a data
// directory under dir, and returns its address and a function that stops
// it (also registered with t.Cleanup).
func startCoordinator(t testing.TB, dir string, log *slog.Logger) (string, func()) {
	t.Helper()
	c, err := coordinator.New(coordinatorConfig(dir, log))
	if err != nil {
		t.Fatalf("coordinator.New: %v", err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		c.Close()
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- c.Serve(lis) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			if err := c.Close(); err != nil {
				t.Errorf("closing the coordinator: %v", err)
			}
			if err := <-served; err != nil {
				t.Errorf("Serve: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return lis.Addr().String(), stop
}

// run drives opts.clients concurrent clients against the coordinator at
// addr (one address, or a cluster's, comma-separated) until opts.ops
// calls are recorded (see workload.more), and returns the history. It may
// run on a goroutine of its own: it fails the test with t.Error only.
func run(t testing.TB, addr string, opts options) *workload {
	t.Helper()
	w := &workload{opts: opts, rec: lincheck.NewRecorder(), reg: newRegistry(), cuts: map[codes.Code]int{}, faults: map[string]int{}}
	w.left.Store(int64(opts.ops))
	target, err := leaderdial.Parse(addr)
	if err != nil {
		t.Error(err)
		return w
	}
	plain := grpc.WithTransportCredentials(insecure.NewCredentials())
	var wg sync.WaitGroup
	for i := range opts.clients {
		leader := target.Leader(plain)
		conn, err := grpc.NewClient(leader.DialTarget(), append(leader.DialOptions(), plain)...)
		if err != nil {
			t.Error(err)
			break
		}
		c := &client{
			w:    w,
			id:   i,
			rng:  rand.New(rand.NewPCG(opts.seed, uint64(i))),
			jobs: leaseholdv1.NewJobServiceClient(conn),
			rend: leaseholdv1.NewRendererServiceClient(conn),
		}
		conns := []*grpc.ClientConn{conn}
		if len(opts.nodes) > 0 {
			c.callOpts = []grpc.CallOption{grpc.WaitForReady(true)}
			for _, node := range opts.nodes {
				nc, err := grpc.NewClient(node, plain)
				if err != nil {
					t.Error(err)
					continue
				}
				conns = append(conns, nc)
				c.direct = append(c.direct, leaseholdv1.NewJobServiceClient(nc))
			}
		}
		wg.Go(func() {
			defer func() {
				for _, cc := range conns {
					cc.Close()
				}
			}()
			switch {
			case i < 3:
				c.team, c.bearer, c.other = "alpha", tokenAlpha, tokenBeta
				if i == 1 {
					c.team, c.bearer, c.other = "beta", tokenBeta, tokenAlpha
				}
				c.submitter()
			case i == 3:
				c.bearer = tokenOperator
				c.operator()
			default:
				c.bearer = tokenRenderer
				c.renderer = fmt.Sprintf("renderer-%02d", i)
				c.render()
			}
		})
	}
	wg.Wait()
	return w
}

// workload is one run's shared state.
type workload struct {
	opts options
	rec  *lincheck.Recorder
	reg  *registry
	left atomic.Int64

	mu sync.Mutex
	// cuts counts the calls cut short on purpose, by the code they ended with.
	cuts map[codes.Code]int
	// faults lists calls that ended without a definite answer although
	// nobody cut them short: a sign of trouble the check also reports.
	faults map[string]int
}

// more reports whether the run should go on: until opts.ops calls are
// recorded and opts.until, if set, is closed.
func (w *workload) more() bool {
	select {
	case <-w.opts.abort:
		return false
	default:
	}
	if w.left.Load() > 0 {
		return true
	}
	if w.opts.until == nil {
		return false
	}
	select {
	case <-w.opts.until:
		return false
	default:
		return true
	}
}

// add records r.
func (w *workload) add(r lincheck.Record) {
	w.left.Add(-1)
	w.rec.Add(r)
	if w.opts.progress != nil {
		w.opts.progress(int(int64(w.opts.ops) - w.left.Load()))
	}
}

// registry is what clients know of the jobs, to choose what to work on.
type registry struct {
	mu     sync.Mutex
	jobs   []jobRef
	teamOf map[string]string
	live   map[string]bool
	// leases are the most recent grants, for cancels and stale completions.
	leases []lease
	// sent are the completions sent per job.
	sent map[string][]sentCompletion
}

type jobRef struct{ id, team string }

type lease struct {
	job      string
	token    uint64
	renderer string
}

type sentCompletion struct {
	token    uint64
	renderer string
	outcome  lincheck.Outcome
}

const recentLeases = 64

func newRegistry() *registry {
	return &registry{teamOf: map[string]string{}, live: map[string]bool{}, sent: map[string][]sentCompletion{}}
}

func (r *registry) submitted(team string, ids []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, id := range ids {
		if _, dup := r.teamOf[id]; dup {
			continue
		}
		r.jobs = append(r.jobs, jobRef{id, team})
		r.teamOf[id] = team
		r.live[id] = true
	}
}

func (r *registry) ended(id string) {
	r.mu.Lock()
	delete(r.live, id)
	r.mu.Unlock()
}

func (r *registry) liveJobs() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.live)
}

func (r *registry) granted(l lease) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.leases = append(r.leases, l)
	if len(r.leases) > 2*recentLeases {
		r.leases = append(r.leases[:0], r.leases[len(r.leases)-recentLeases:]...)
	}
}

func (r *registry) sentOn(job string, s sentCompletion) {
	r.mu.Lock()
	r.sent[job] = append(r.sent[job], s)
	r.mu.Unlock()
}

// sentFor returns a completion sent earlier on job, if any.
func (r *registry) sentFor(rng *rand.Rand, job string) (sentCompletion, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.sent[job]
	if len(s) == 0 {
		return sentCompletion{}, false
	}
	return s[rng.IntN(len(s))], true
}

// recentLease returns one of the most recent grants.
func (r *registry) recentLease(rng *rand.Rand) (lease, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := min(len(r.leases), recentLeases)
	if n == 0 {
		return lease{}, false
	}
	return r.leases[len(r.leases)-1-rng.IntN(n)], true
}

// pick returns a job of team ("" for any), preferring jobs that are being
// worked on now, so that cancels and reads race with completions.
func (r *registry) pick(rng *rand.Rand, team string) (jobRef, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.jobs) == 0 {
		return jobRef{}, false
	}
	for range 4 {
		var id string
		switch x := rng.Float64(); {
		case x < 0.5 && len(r.leases) > 0:
			n := min(len(r.leases), recentLeases)
			id = r.leases[len(r.leases)-1-rng.IntN(n)].job
		case x < 0.9:
			n := min(len(r.jobs), 2*recentLeases)
			id = r.jobs[len(r.jobs)-1-rng.IntN(n)].id
		default:
			id = r.jobs[rng.IntN(len(r.jobs))].id
		}
		if team == "" || r.teamOf[id] == team {
			return jobRef{id, r.teamOf[id]}, true
		}
	}
	return jobRef{}, false
}

// client is one concurrent caller.
type client struct {
	w        *workload
	id       int
	rng      *rand.Rand
	jobs     leaseholdv1.JobServiceClient
	rend     leaseholdv1.RendererServiceClient
	bearer   string
	team     string // a submitter's team
	other    string // a submitter's token for the other team
	renderer string
	batches  int
	// callOpts are the options of every call through jobs and rend; direct
	// reaches each node of a cluster by itself (nil for one coordinator).
	callOpts []grpc.CallOption
	direct   []leaseholdv1.JobServiceClient
}

// clustered reports whether the client calls a cluster.
func (c *client) clustered() bool { return len(c.direct) > 0 }

// tries is how many times in all a call whose answer was lost (or, on a
// cluster, that was refused NOT_LEADER) is sent.
func (c *client) tries(single int) int {
	if c.clustered() {
		return clusterTries
	}
	return single
}

func (c *client) chance(p float64) bool { return c.rng.Float64() < p }

// callCtx returns the context of one call with bearer's credentials:
// usually with callTimeout, sometimes (cut) with a deadline so short that
// the answer may be lost while the call takes effect.
func (c *client) callCtx(bearer string, mayCut bool) (ctx context.Context, cancel context.CancelFunc, cut bool) {
	timeout := callTimeout
	if c.clustered() {
		timeout = clusterCallTimeout
	}
	if mayCut && c.chance(c.w.opts.cutRate) {
		cut = true
		timeout = 200*time.Microsecond + time.Duration(c.rng.Int64N(int64(3*time.Millisecond)))
	}
	ctx, cancel = context.WithTimeout(context.Background(), timeout)
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+bearer), cancel, cut
}

// begin starts a record of kind.
func (c *client) begin(kind lincheck.Kind) lincheck.Record {
	return lincheck.Record{Client: c.id, Kind: kind, Call: c.w.rec.Now()}
}

// finish completes r with err: a definite refusal, or Pending when the
// answer was lost.
func (c *client) finish(r *lincheck.Record, err error, cut bool) {
	r.Return = c.w.rec.Now()
	if err == nil {
		r.Code = codes.OK
		return
	}
	st := status.Convert(err)
	r.Code, r.Err = st.Code(), st.Message()
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			r.Reason = info.GetReason()
		}
	}
	switch r.Code {
	case codes.Aborted, codes.FailedPrecondition, codes.NotFound, codes.InvalidArgument,
		codes.PermissionDenied, codes.ResourceExhausted, codes.AlreadyExists, codes.Unauthenticated:
		return
	}
	if r.Refused() {
		return
	}
	r.Pending = true
	c.w.mu.Lock()
	defer c.w.mu.Unlock()
	if cut {
		c.w.cuts[r.Code]++
	} else {
		c.w.faults[fmt.Sprintf("%s %s: %s %s", r.Kind, r.Job, r.Code, r.Err)]++
	}
}

// noteView tells the registry when an answer showed a job ended.
func (c *client) noteView(job string, v *lincheck.View) {
	if v != nil && (v.Phase == leaseholdv1.Phase_PHASE_SUCCEEDED || v.Phase == leaseholdv1.Phase_PHASE_FAILED || v.Phase == leaseholdv1.Phase_PHASE_CANCELLED) {
		c.w.reg.ended(job)
	}
}

// submitter submits batches of its team and reads and cancels its jobs,
// and sometimes another team's.
func (c *client) submitter() {
	for c.w.more() {
		switch x := c.rng.Float64(); {
		case x < 0.45:
			if c.w.reg.liveJobs() < c.w.opts.liveJobs {
				c.submit()
			} else {
				time.Sleep(time.Millisecond)
			}
		case x < 0.75:
			if j, ok := c.w.reg.pick(c.rng, c.team); ok {
				c.get(j.id, c.bearer, false)
			}
		case x < 0.92:
			if j, ok := c.w.reg.pick(c.rng, c.team); ok {
				c.cancel(j.id, c.bearer, false)
			}
		default:
			// A submitter of the other team sees no such job.
			if j, ok := c.w.reg.pick(c.rng, c.team); ok {
				if c.chance(0.5) {
					c.get(j.id, c.other, true)
				} else {
					c.cancel(j.id, c.other, true)
				}
			}
		}
	}
}

// operator reads and cancels jobs of every team, mostly leased ones.
func (c *client) operator() {
	for c.w.more() {
		j, ok := c.w.reg.pick(c.rng, "")
		if !ok {
			time.Sleep(time.Millisecond)
			continue
		}
		if c.chance(0.55) {
			c.get(j.id, c.bearer, false)
		} else {
			c.cancel(j.id, c.bearer, false)
		}
	}
}

// submit sends one batch of one to four documents; a lost answer is
// followed by the same request id until an answer says which jobs exist.
func (c *client) submit() {
	c.batches++
	req := &leaseholdv1.SubmitBatchRequest{
		Team:      c.team,
		RequestId: fmt.Sprintf("client%d-batch%d", c.id, c.batches),
	}
	var unsupported []bool
	for i := range 1 + c.rng.IntN(4) {
		doc := &leaseholdv1.Document{
			Name:        fmt.Sprintf("doc-%d.txt", i),
			ContentType: "text/plain",
			Content:     fmt.Appendf(nil, "%s document %d", req.RequestId, i),
		}
		bad := c.chance(0.06)
		if bad {
			doc.Name = fmt.Sprintf("macro-%d.xlsm", i)
			doc.ContentType = "application/vnd.ms-excel.sheet.macroenabled.12"
		}
		req.Documents = append(req.Documents, doc)
		unsupported = append(unsupported, bad)
	}
	var lost []lincheck.Record
	for try := 0; ; try++ {
		r := c.begin(lincheck.Submit)
		r.Unsupported = unsupported
		ctx, cancel, cut := c.callCtx(c.bearer, try == 0)
		resp, err := c.jobs.SubmitBatch(ctx, req, c.callOpts...)
		cancel()
		c.finish(&r, err, cut)
		if err == nil {
			r.Replayed = resp.GetReplayed()
			r.JobIDs = resp.GetBatch().GetJobIds()
			c.w.reg.submitted(c.team, r.JobIDs)
			for i, id := range r.JobIDs {
				if unsupported[i] {
					c.w.reg.ended(id)
				}
			}
		}
		if r.Refused() && try < c.tries(6)-1 {
			c.w.add(r)
			continue
		}
		if !r.Pending || try == c.tries(6)-1 {
			for _, l := range lost {
				l.JobIDs = r.JobIDs
				c.w.add(l)
			}
			c.w.add(r)
			return
		}
		lost = append(lost, r)
	}
}

// get reads job with bearer's credentials; on a cluster, now and then
// straight from a node, linearizable or stale.
func (c *client) get(job, bearer string, foreign bool) {
	node, stale := 0, false
	if c.clustered() {
		switch x := c.rng.Float64(); {
		case x < c.w.opts.directReads:
			node = 1 + c.rng.IntN(len(c.direct))
		case x < c.w.opts.directReads+c.w.opts.staleReads:
			node, stale = 1+c.rng.IntN(len(c.direct)), true
		}
	}
	c.read(job, bearer, foreign, node, stale)
}

// read reads job with bearer's credentials from node (0: the leader) as a
// stale read or a linearizable one.
func (c *client) read(job, bearer string, foreign bool, node int, stale bool) {
	r := c.begin(lincheck.Get)
	r.Job, r.Foreign, r.Node, r.Stale = job, foreign, node, stale
	ctx, cancel, cut := c.callCtx(bearer, true)
	jobs, opts := c.jobs, c.callOpts
	var header metadata.MD
	if node > 0 {
		jobs, opts = c.direct[node-1], []grpc.CallOption{grpc.Header(&header)}
	}
	if stale {
		ctx = metadata.AppendToOutgoingContext(ctx, "leasehold-read", "stale")
	}
	resp, err := jobs.GetJob(ctx, &leaseholdv1.GetJobRequest{JobId: job}, opts...)
	cancel()
	c.finish(&r, err, cut)
	if err == nil {
		r.View = lincheck.ViewOf(resp.GetJob())
		if stale {
			if v := header.Get("leasehold-applied-index"); len(v) > 0 {
				r.AppliedIndex, _ = strconv.ParseUint(v[0], 10, 64)
			}
		} else {
			c.noteView(job, r.View)
		}
	}
	c.w.add(r)
}

// probe reads job, now and then on a cluster, straight from a node chosen
// at random right after a write to it was answered: a node that served a
// linearizable read from a store behind the leader's would show the job
// as it was before that write.
func (c *client) probe(job string) {
	if c.clustered() && c.chance(0.3) {
		c.read(job, tokenOperator, false, 1+c.rng.IntN(len(c.direct)), false)
	}
}

// cancel cancels job with bearer's credentials; on a cluster, now and
// then straight on a node.
func (c *client) cancel(job, bearer string, foreign bool) {
	r := c.begin(lincheck.Cancel)
	r.Job, r.Foreign = job, foreign
	jobs, opts := c.jobs, c.callOpts
	if c.clustered() && c.chance(c.w.opts.directCancels) {
		r.Node = 1 + c.rng.IntN(len(c.direct))
		jobs, opts = c.direct[r.Node-1], nil
	}
	ctx, cancel, cut := c.callCtx(bearer, true)
	resp, err := jobs.CancelJob(ctx, &leaseholdv1.CancelJobRequest{JobId: job, Reason: "lincheck"}, opts...)
	cancel()
	c.finish(&r, err, cut)
	switch {
	case err == nil:
		r.AlreadyCancelled, r.RunningRenderer = resp.GetAlreadyCancelled(), resp.GetRunningRendererId()
		r.View = lincheck.ViewOf(resp.GetJob())
		c.noteView(job, r.View)
	case r.Code == codes.FailedPrecondition:
		c.w.reg.ended(job)
	}
	c.w.add(r)
	if err == nil && !foreign {
		c.probe(job)
	}
}

// render acquires leases and completes them, with stale, wrong and
// repeated completions mixed in.
func (c *client) render() {
	for c.w.more() {
		grants := c.acquire()
		if len(grants) == 0 {
			switch x := c.rng.Float64(); {
			case x < 0.2:
				c.staleCompletion()
			case x < 0.35:
				if j, ok := c.w.reg.pick(c.rng, ""); ok {
					c.get(j.id, tokenOperator, false)
				}
			}
			continue
		}
		for _, g := range grants {
			c.work(g)
		}
	}
}

// acquire asks for one to three leases, at once or with a short wait.
func (c *client) acquire() []lincheck.Grant {
	n := uint32(1 + c.rng.IntN(3))
	req := &leaseholdv1.AcquireRequest{RendererId: c.renderer, MaxLeases: n, Capacity: n}
	if c.chance(0.5) {
		req.Wait = durationpb.New(time.Duration(5+c.rng.IntN(15)) * time.Millisecond)
	}
	r := c.begin(lincheck.Acquire)
	r.Renderer = c.renderer
	ctx, cancel, cut := c.callCtx(c.bearer, true)
	resp, err := c.rend.Acquire(ctx, req, c.callOpts...)
	cancel()
	c.finish(&r, err, cut)
	for _, g := range resp.GetLeases() {
		gr := lincheck.Grant{Job: g.GetJobId(), Token: g.GetLease().GetToken(), Renderer: g.GetLease().GetRendererId(), Attempt: g.GetLease().GetAttempt()}
		r.Grants = append(r.Grants, gr)
		c.w.reg.granted(lease{job: gr.Job, token: gr.Token, renderer: c.renderer})
	}
	c.w.add(r)
	return r.Grants
}

// preview is the deterministic preview of a job rendered under a token.
func preview(job string, token uint64) []byte {
	return fmt.Appendf(nil, "preview of %s rendered under lease %d", job, token)
}

func digestOf(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// work completes one lease.
func (c *client) work(g lincheck.Grant) {
	if c.chance(0.08) {
		c.complete(g.Job, 1<<50+c.rng.Uint64N(1<<40), c.renderer, c.failure(), true)
	}
	if c.chance(0.08) {
		c.staleCompletion()
	}
	if c.chance(0.1) {
		c.get(g.Job, tokenOperator, false)
	}
	if c.w.opts.wrongHolder && c.chance(0.05) {
		c.complete(g.Job, g.Token, "impostor-"+c.renderer, c.failure(), true)
	}
	if c.chance(0.3) {
		// Leave room for a cancel to race the completion.
		time.Sleep(time.Duration(c.rng.IntN(1000)) * time.Microsecond)
	}
	var outcome lincheck.Outcome
	switch x := c.rng.Float64(); {
	case x < 0.65:
		outcome = c.upload(g)
	case x < 0.85:
		outcome = lincheck.Outcome{Class: leaseholdv1.FailureClass_FAILURE_CLASS_TRANSIENT}
	case x < 0.93:
		outcome = lincheck.Outcome{Class: leaseholdv1.FailureClass_FAILURE_CLASS_INVALID_DOCUMENT}
	default:
		outcome = lincheck.Outcome{Class: leaseholdv1.FailureClass_FAILURE_CLASS_UNSUPPORTED_FORMAT}
	}
	c.w.reg.sentOn(g.Job, sentCompletion{token: g.Token, renderer: c.renderer, outcome: outcome})
	// A lost answer is followed by the same completion: a replay.
	for try := 0; try < c.tries(4); try++ {
		if r := c.complete(g.Job, g.Token, c.renderer, outcome, try == 0); !r.Pending && !r.Refused() {
			if r.Code == codes.OK {
				c.probe(g.Job)
			}
			break
		}
	}
	if c.chance(0.1) {
		c.complete(g.Job, g.Token, c.renderer, outcome, true)
	}
	if c.chance(0.04) {
		other := c.failure()
		if other == outcome {
			other = lincheck.Outcome{Class: leaseholdv1.FailureClass_FAILURE_CLASS_INVALID_DOCUMENT}
			if other == outcome {
				other.Class = leaseholdv1.FailureClass_FAILURE_CLASS_TRANSIENT
			}
		}
		c.complete(g.Job, g.Token, c.renderer, other, true)
	}
}

// failure returns a random failure outcome.
func (c *client) failure() lincheck.Outcome {
	return lincheck.Outcome{Class: leaseholdv1.FailureClass(1 + c.rng.IntN(3))}
}

// staleCompletion repeats a completion sent earlier on a recently leased
// job (a replay, or stale if the job moved on), or sends a failure under
// one of its earlier tokens.
func (c *client) staleCompletion() {
	l, ok := c.w.reg.recentLease(c.rng)
	if !ok {
		return
	}
	if s, ok := c.w.reg.sentFor(c.rng, l.job); ok && c.chance(0.6) {
		c.complete(l.job, s.token, s.renderer, s.outcome, true)
		return
	}
	if s, ok := c.w.reg.sentFor(c.rng, l.job); ok {
		c.complete(l.job, s.token, s.renderer, c.failure(), true)
	}
}

// upload stores the lease's preview and returns the success outcome that
// names it. When the upload's answer is lost the bytes may or may not be
// stored, so the attempt is reported as a transient failure instead.
func (c *client) upload(g lincheck.Grant) lincheck.Outcome {
	content := preview(g.Job, g.Token)
	success := lincheck.Outcome{Success: true, Digest: digestOf(content)}
	r := c.begin(lincheck.Upload)
	r.Job, r.Renderer, r.Token = g.Job, c.renderer, g.Token
	ctx, cancel, cut := c.callCtx(c.bearer, true)
	defer cancel()
	err := func() error {
		stream, err := c.rend.UploadArtifact(ctx, c.callOpts...)
		if err != nil {
			return err
		}
		md := &leaseholdv1.ArtifactMetadata{JobId: g.Job, Token: g.Token, RendererId: c.renderer, ContentType: "image/png", ExpectedSha256: success.Digest}
		if err := stream.Send(&leaseholdv1.UploadArtifactRequest{Part: &leaseholdv1.UploadArtifactRequest_Metadata{Metadata: md}}); err != nil && err != io.EOF {
			return err
		}
		if err := stream.Send(&leaseholdv1.UploadArtifactRequest{Part: &leaseholdv1.UploadArtifactRequest_Chunk{Chunk: content}}); err != nil && err != io.EOF {
			return err
		}
		resp, err := stream.CloseAndRecv()
		if err == nil && resp.GetDigest() != success.Digest {
			return fmt.Errorf("upload returned digest %s, want %s", resp.GetDigest(), success.Digest)
		}
		return err
	}()
	c.finish(&r, err, cut)
	c.w.add(r)
	if r.Pending || r.Refused() {
		return lincheck.Outcome{Class: leaseholdv1.FailureClass_FAILURE_CLASS_TRANSIENT}
	}
	return success
}

// complete sends one completion and records it.
func (c *client) complete(job string, token uint64, renderer string, o lincheck.Outcome, mayCut bool) lincheck.Record {
	req := &leaseholdv1.CompleteRequest{JobId: job, Token: token, RendererId: renderer}
	if o.Success {
		req.Outcome = &leaseholdv1.CompleteRequest_Success{Success: &leaseholdv1.CompleteSuccess{ArtifactDigest: o.Digest}}
	} else {
		req.Outcome = &leaseholdv1.CompleteRequest_Failure{Failure: &leaseholdv1.CompleteFailure{Class: o.Class, Message: "lincheck"}}
	}
	r := c.begin(lincheck.Complete)
	r.Job, r.Token, r.Renderer, r.Outcome = job, token, renderer, o
	ctx, cancel, cut := c.callCtx(c.bearer, mayCut)
	resp, err := c.rend.Complete(ctx, req, c.callOpts...)
	cancel()
	c.finish(&r, err, cut)
	if err == nil {
		r.Replayed = resp.GetReplayed()
		r.View = lincheck.ViewOf(resp.GetJob())
		c.noteView(job, r.View)
	}
	c.w.add(r)
	return r
}
