package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/leasehold/leasehold/client"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
)

// The development principals of a coordinator on loopback without a
// principals file.
const (
	submitterToken = "dev-alpha"
	team           = "alpha"
	operatorToken  = "dev-operator"
)

// Shape of the load.
const (
	// submitters submit batches of 1 to maxBatch documents, each as soon as
	// the last was acknowledged and a watch slot is free.
	submitters = 3
	maxBatch   = 12
	// watchSlots bounds the batches followed at once: the coordinator
	// allows 64 watches per caller.
	watchSlots = 40
	// invalidShare of the documents fail for good when rendered
	// (INVALID_DOCUMENT); unsupportedShare are refused at submission
	// (UNSUPPORTED_FORMAT): both feed the operator replays.
	invalidShare     = 0.08
	unsupportedShare = 0.02
	// cancelEvery and replayEvery pace the cancels and the replays.
	cancelEvery = 25 * time.Millisecond
	replayEvery = 100 * time.Millisecond
	// replaysPerJob bounds how often one job is replayed.
	replaysPerJob = 2
	// callTimeout bounds one attempt of a call; an unanswered attempt is
	// sent again with the same request id.
	callTimeout = 5 * time.Second
)

// journal is the load generator's log of what the coordinator
// acknowledged, kept in memory for the checks and written as JSON lines to
// a file for a post-mortem.
type journal struct {
	mu        sync.Mutex
	f         *os.File
	submits   []submitAck
	terminals []terminalSeen
	cancels   []cancelAck
	replays   []replayAck
}

// entry is one line of the journal file.
type entry struct {
	At    time.Time `json:"at"`
	Event string    `json:"event"`
	Data  any       `json:"data"`
}

func (j *journal) write(event string, data any) {
	line, _ := json.Marshal(entry{At: time.Now(), Event: event, Data: data})
	_, _ = j.f.Write(append(line, '\n'))
}

func (j *journal) submit(a submitAck) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.submits = append(j.submits, a)
	j.write("submit", a)
}

func (j *journal) terminal(t terminalSeen) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.terminals = append(j.terminals, t)
	j.write("terminal", t)
}

func (j *journal) cancel(c cancelAck) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.cancels = append(j.cancels, c)
	j.write("cancel", c)
}

func (j *journal) replay(r replayAck) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.replays = append(j.replays, r)
	j.write("replay", r)
}

// load drives the coordinator through the client library, as services
// and operators would: it submits batches and follows each to its end,
// cancels jobs in flight, and replays failed jobs. Every call is retried
// with the same request id until it is answered, so that a crash never
// leaves a call unanswered; it logs every answer in its journal.
type load struct {
	sub, op *client.Client
	j       *journal
	seed    uint64

	// stop ends the submits, cancels and replays; follows run on until
	// their batch is done or follow ends.
	stop   context.Context
	follow context.Context
	wg     sync.WaitGroup // submitters, canceller, replayer
	fwg    sync.WaitGroup // follows
	slots  chan struct{}

	mu      sync.Mutex
	batchOf map[string]string // job -> batch
	live    []string          // jobs not yet seen terminal, cancel candidates
	failed  []string          // jobs seen FAILED, replay candidates
	replays map[string]int    // job -> times replayed
	errs    []error
}

// newLoad dials the coordinator at addr as the submitter and as the
// operator. Calls wait for the coordinator to be back rather than failing
// while it restarts, and the connection retries every 50 to 250 ms.
func newLoad(addr string, j *journal, seed uint64) (*load, error) {
	opts := client.WithDialOptions(
		grpc.WithDefaultCallOptions(grpc.WaitForReady(true)),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 250 * time.Millisecond},
			MinConnectTimeout: callTimeout,
		}),
	)
	sub, err := client.Dial(addr, client.WithToken(submitterToken), opts)
	if err != nil {
		return nil, err
	}
	op, err := client.Dial(addr, client.WithToken(operatorToken), opts)
	if err != nil {
		sub.Close()
		return nil, err
	}
	return &load{sub: sub, op: op, j: j, seed: seed, slots: make(chan struct{}, watchSlots),
		batchOf: map[string]string{}, replays: map[string]int{}}, nil
}

// start begins the load; stop ends its submits, cancels and replays, and
// follow ends the follows.
func (l *load) start(stop, follow context.Context) {
	l.stop, l.follow = stop, follow
	for i := range submitters {
		l.wg.Go(func() { l.submitter(i) })
	}
	l.wg.Go(l.canceller)
	l.wg.Go(l.replayer)
}

// wait waits for the submitters, the canceller and the replayer to end
// (after stop), then for every follow.
func (l *load) wait() {
	l.wg.Wait()
	l.fwg.Wait()
}

// close closes the connections.
func (l *load) close() {
	l.sub.Close()
	l.op.Close()
}

// failures returns the unexpected refusals met.
func (l *load) failures() []error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.errs)
}

func (l *load) fail(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.errs) < maxProblems {
		l.errs = append(l.errs, err)
	}
}

// transient reports whether a failed call may succeed when sent again:
// the coordinator was down or died while answering.
func transient(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded:
		return true
	}
	return errors.Is(err, client.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded)
}

// retry calls fn with a fresh timeout until it returns an error that is
// not transient, or ctx ends; it reports how many attempts it made.
func retry(ctx context.Context, fn func(ctx context.Context) error) (int, error) {
	for attempt := 1; ; attempt++ {
		cctx, cancel := context.WithTimeout(ctx, callTimeout)
		err := fn(cctx)
		cancel()
		if err == nil || !transient(err) || ctx.Err() != nil {
			return attempt, err
		}
	}
}

// submitter submits batches until stop, each followed to its end.
func (l *load) submitter(n int) {
	rng := rand.New(rand.NewPCG(l.seed, uint64(n)))
	for seq := 1; ; seq++ {
		select {
		case <-l.stop.Done():
			return
		case l.slots <- struct{}{}:
		}
		requestID := fmt.Sprintf("chaos-%d-%d", n, seq)
		docs := documents(rng, requestID, 1+rng.IntN(maxBatch))
		var resp *leaseholdv1.SubmitBatchResponse
		// A submit under way is answered even after stop: its batch may be
		// stored already, and must be known.
		attempts, err := retry(l.follow, func(ctx context.Context) (err error) {
			resp, err = l.sub.SubmitBatch(ctx, team, requestID, docs, nil)
			return err
		})
		if err != nil {
			<-l.slots
			if l.follow.Err() == nil {
				l.fail(fmt.Errorf("submit %s: %w", requestID, err))
			}
			return
		}
		b := resp.GetBatch()
		ack := submitAck{RequestID: requestID, Batch: b.GetId(), Jobs: b.GetJobIds(), Retried: attempts > 1, Replayed: resp.GetReplayed()}
		for _, d := range docs {
			ack.Names = append(ack.Names, d.GetName())
		}
		l.j.submit(ack)
		l.mu.Lock()
		for _, id := range ack.Jobs {
			l.batchOf[id] = ack.Batch
			l.live = append(l.live, id)
		}
		l.mu.Unlock()
		l.fwg.Go(func() { l.followBatch(ack.Batch, true) })
	}
}

// documents makes n small text documents; some are invalid (fail when
// rendered) and some of an unsupported format (fail at submission).
func documents(rng *rand.Rand, requestID string, n int) []*leaseholdv1.Document {
	docs := make([]*leaseholdv1.Document, n)
	for i := range docs {
		name := fmt.Sprintf("%s-%02d.txt", requestID, i)
		content := fmt.Sprintf("document %d of request %s\n", i, requestID)
		ctype := "text/plain"
		switch r := rng.Float64(); {
		case r < invalidShare:
			content = "%INVALID " + content
		case r < invalidShare+unsupportedShare:
			name = fmt.Sprintf("%s-%02d.exe", requestID, i)
			ctype = "application/x-msdownload"
		}
		docs[i] = &leaseholdv1.Document{Name: name, ContentType: ctype, SizeBytes: int64(len(content)), Content: []byte(content)}
	}
	return docs
}

// followBatch follows a batch until every job in it is terminal, logging
// each terminal event. held says the caller took a watch slot for it;
// otherwise it takes one.
func (l *load) followBatch(batch string, held bool) {
	if !held {
		select {
		case <-l.follow.Done():
			return
		case l.slots <- struct{}{}:
		}
	}
	defer func() { <-l.slots }()
	opts := client.FollowOptions{TerminalOnly: true, Batched: true, MinBackoff: 50 * time.Millisecond, MaxBackoff: 250 * time.Millisecond}
	for u, err := range l.sub.FollowBatch(l.follow, batch, opts) {
		if err != nil {
			if l.follow.Err() == nil {
				l.fail(fmt.Errorf("following batch %s: %w", batch, err))
			}
			return
		}
		if !terminalPhase(u.Phase) {
			continue
		}
		if e := u.Event; e != nil && terminalKind(e.GetKind()) {
			l.j.terminal(terminalSeen{Job: u.JobID, Seq: e.GetSeq(), Kind: e.GetKind()})
		}
		l.mu.Lock()
		if i := slices.Index(l.live, u.JobID); i >= 0 {
			l.live[i] = l.live[len(l.live)-1]
			l.live = l.live[:len(l.live)-1]
		}
		if u.Phase == leaseholdv1.Phase_PHASE_FAILED && l.replays[u.JobID] < replaysPerJob && !slices.Contains(l.failed, u.JobID) {
			l.failed = append(l.failed, u.JobID)
		}
		l.mu.Unlock()
	}
}

// canceller cancels a random job in flight every cancelEvery until stop.
func (l *load) canceller() {
	rng := rand.New(rand.NewPCG(l.seed, 1000))
	tick := time.NewTicker(cancelEvery)
	defer tick.Stop()
	for {
		select {
		case <-l.stop.Done():
			return
		case <-tick.C:
		}
		l.mu.Lock()
		if len(l.live) == 0 {
			l.mu.Unlock()
			continue
		}
		job := l.live[rng.IntN(len(l.live))]
		l.mu.Unlock()
		ctx, cancel := context.WithTimeout(l.stop, callTimeout)
		_, err := l.sub.CancelJob(ctx, job, "chaos")
		cancel()
		switch {
		case err == nil:
			l.j.cancel(cancelAck{Job: job, Cancelled: true})
		case errors.Is(err, client.ErrAlreadyTerminal):
			l.j.cancel(cancelAck{Job: job, AlreadyTerminal: true})
		case transient(err) || l.stop.Err() != nil:
			// Unanswered: the cancel may or may not have been applied.
		default:
			l.fail(fmt.Errorf("cancel %s: %w", job, err))
		}
	}
}

// replayer replays a few failed jobs every replayEvery until stop, each
// replay sent again with its request id until answered, and follows the
// batches of the jobs it re-queued.
func (l *load) replayer() {
	tick := time.NewTicker(replayEvery)
	defer tick.Stop()
	for seq := 1; ; seq++ {
		select {
		case <-l.stop.Done():
			return
		case <-tick.C:
		}
		l.mu.Lock()
		ids := l.failed[:min(4, len(l.failed))]
		l.failed = slices.Clone(l.failed[len(ids):])
		for _, id := range ids {
			l.replays[id]++
		}
		l.mu.Unlock()
		if len(ids) == 0 {
			continue
		}
		requestID := fmt.Sprintf("chaos-replay-%d", seq)
		req := &leaseholdv1.ReplayJobsRequest{RequestId: requestID, JobIds: ids, Reason: "chaos", IncludePermanent: true}
		var resp *leaseholdv1.ReplayJobsResponse
		_, err := retry(l.follow, func(ctx context.Context) (err error) {
			resp, err = l.op.ReplayJobs(ctx, req)
			return err
		})
		if err != nil {
			if l.follow.Err() == nil {
				l.fail(fmt.Errorf("replay %s: %w", requestID, err))
			}
			return
		}
		ack := replayAck{RequestID: requestID, AuditID: resp.GetAuditId(), Replayed: resp.GetReplayed()}
		batches := map[string]bool{}
		l.mu.Lock()
		for _, it := range resp.GetItems() {
			if it.GetAction() == leaseholdv1.ReplayAction_REPLAY_ACTION_REQUEUE {
				ack.Requeued = append(ack.Requeued, it.GetJobId())
				l.live = append(l.live, it.GetJobId())
				batches[l.batchOf[it.GetJobId()]] = true
			}
		}
		l.mu.Unlock()
		l.j.replay(ack)
		for b := range batches {
			l.fwg.Go(func() { l.followBatch(b, false) })
		}
	}
}
