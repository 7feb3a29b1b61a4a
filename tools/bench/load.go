package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"time"

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

// generator is the in-process load generator: it submits batches and follows
// them to their end with WatchBatch. It is safe for concurrent use.
type generator struct {
	jobs     *client.Client
	operator *client.Client
	runID    string
	seq      atomic.Int64
	// watches bounds the watch streams open at once.
	watches chan struct{}
}

// newGenerator dials the coordinator at addr as the submitter and as the
// operator.
func newGenerator(addr string, maxWatches int) (*generator, error) {
	jobs, err := client.Dial(addr, client.WithToken(submitterToken))
	if err != nil {
		return nil, err
	}
	operator, err := client.Dial(addr, client.WithToken(operatorToken))
	if err != nil {
		jobs.Close()
		return nil, err
	}
	return &generator{
		jobs:     jobs,
		operator: operator,
		runID:    time.Now().UTC().Format("20060102T150405.000000"),
		watches:  make(chan struct{}, maxWatches),
	}, nil
}

// close closes both connections.
func (g *generator) close() {
	g.jobs.Close()
	g.operator.Close()
}

// batch is a submitted batch.
type batch struct {
	id     string
	jobIDs []string
	// ack is when the SubmitBatch answer arrived.
	ack time.Time
}

// documentSize is the length of every benchmark document's content.
const documentSize = 160

// documents builds n small inline text documents named doc-00001.txt and
// on, unique within their batch, each documentSize bytes long.
func documents(requestID string, n int) []*leaseholdv1.Document {
	docs := make([]*leaseholdv1.Document, n)
	for i := range docs {
		name := fmt.Sprintf("doc-%05d.txt", i+1)
		content := fmt.Appendf(make([]byte, 0, documentSize), "Leasehold benchmark document %s of request %s. ", name, requestID)
		for len(content) < documentSize {
			content = append(content, "lorem ipsum dolor sit amet "...)
		}
		content = content[:documentSize]
		docs[i] = &leaseholdv1.Document{
			Name:        name,
			ContentType: "text/plain",
			SizeBytes:   documentSize,
			Content:     content,
		}
	}
	return docs
}

// submit submits n documents as one batch under a fresh request id. A full
// team queue is waited out: the same request id is sent again (it is the
// idempotency key) until the coordinator takes it.
func (g *generator) submit(ctx context.Context, phase string, n int) (*batch, error) {
	reqID := fmt.Sprintf("bench-%s-%s-%d", g.runID, phase, g.seq.Add(1))
	docs := documents(reqID, n)
	for {
		resp, err := g.jobs.SubmitBatch(ctx, team, reqID, docs, nil)
		ack := time.Now()
		switch {
		case errors.Is(err, client.ErrQueueFull):
			if err := sleep(ctx, 20*time.Millisecond); err != nil {
				return nil, err
			}
			continue
		case err != nil:
			return nil, fmt.Errorf("submitting %s: %w", reqID, err)
		}
		b := &batch{id: resp.GetBatch().GetId(), jobIDs: resp.GetBatch().GetJobIds(), ack: ack}
		if len(b.jobIDs) != n {
			return nil, fmt.Errorf("submitting %s: the answer lists %d job ids for %d documents", reqID, len(b.jobIDs), n)
		}
		return b, nil
	}
}

// submitMany submits total documents in batches of size, with workers
// SubmitBatch calls at once, and returns the batches in the order of their
// request ids. progress, if not nil, is called after each batch with the
// documents submitted so far.
func (g *generator) submitMany(ctx context.Context, phase string, total, size, workers int, progress func(int)) ([]*batch, error) {
	n := (total + size - 1) / size
	out := make([]*batch, n)
	next := atomic.Int64{}
	done := atomic.Int64{}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	for range min(workers, n) {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n || ctx.Err() != nil {
					return
				}
				docs := min(size, total-i*size)
				b, err := g.submit(ctx, phase, docs)
				if err != nil {
					cancel(err)
					return
				}
				out[i] = b
				if d := done.Add(int64(docs)); progress != nil {
					progress(int(d))
				}
			}
		})
	}
	wg.Wait()
	if err := context.Cause(ctx); err != nil {
		return nil, err
	}
	return out, nil
}

// acquireWatch takes one of the watch slots, waiting for one to free. The
// returned function gives it back.
func (g *generator) acquireWatch(ctx context.Context) (func(), error) {
	select {
	case g.watches <- struct{}{}:
		return func() { <-g.watches }, nil
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
}

// followToEnd takes a watch slot (waiting for one to free), follows b until
// every job is terminal, calling terminal for each as follow does, and
// gives the slot back.
func (g *generator) followToEnd(ctx context.Context, b *batch, terminal func(at time.Time, phase leaseholdv1.Phase)) error {
	release, err := g.acquireWatch(ctx)
	if err != nil {
		return err
	}
	defer release()
	return g.follow(ctx, b, followHooks{terminal: terminal})
}

// update is one job's phase as a watch reports it.
type update struct {
	jobID string
	phase leaseholdv1.Phase
}

// updatesOf returns the job updates a watch message carries: the batched
// shape (updates) when present, otherwise the single job_id and phase. A
// message without a job (batch counts only) carries none.
func updatesOf(msg *leaseholdv1.WatchBatchResponse) []update {
	if us := msg.GetUpdates(); len(us) > 0 {
		out := make([]update, 0, len(us))
		for _, u := range us {
			if u.GetJobId() != "" {
				out = append(out, update{u.GetJobId(), u.GetPhase()})
			}
		}
		return out
	}
	if msg.GetJobId() == "" {
		return nil
	}
	return []update{{msg.GetJobId(), msg.GetPhase()}}
}

// terminal reports whether a job in phase p never changes again.
func terminal(p leaseholdv1.Phase) bool {
	switch p {
	case leaseholdv1.Phase_PHASE_SUCCEEDED, leaseholdv1.Phase_PHASE_FAILED, leaseholdv1.Phase_PHASE_CANCELLED:
		return true
	}
	return false
}

// followHooks are what a follower reports. Either may be nil. They are
// called from the follower's goroutine.
type followHooks struct {
	// terminal is called once per job, when its terminal phase first
	// arrives, with the arrival time.
	terminal func(at time.Time, phase leaseholdv1.Phase)
	// opened is called once, when every job of the batch has been reported
	// (the opening snapshot has arrived in full).
	opened func()
}

// follow watches b until every job is terminal, asking for terminal updates
// only and batched messages (a coordinator that ignores either still works).
// A watch that ends early (a slow watcher, or too many streams) is opened
// again; the new snapshot reports what happened meanwhile. The caller holds
// a watch slot.
func (g *generator) follow(ctx context.Context, b *batch, hooks followHooks) error {
	index := make(map[string]int, len(b.jobIDs))
	for i, id := range b.jobIDs {
		index[id] = i
	}
	seen := make([]bool, len(b.jobIDs))
	done := make([]bool, len(b.jobIDs))
	unseen, remaining := len(b.jobIDs), len(b.jobIDs)
	for attempt := 0; ; attempt++ {
		err := g.watchOnce(ctx, b.id, func(msg *leaseholdv1.WatchBatchResponse) bool {
			at := time.Now()
			for _, u := range updatesOf(msg) {
				i, ok := index[u.jobID]
				if !ok {
					continue
				}
				if !seen[i] {
					seen[i] = true
					if unseen--; unseen == 0 && hooks.opened != nil {
						hooks.opened()
					}
				}
				if terminal(u.phase) && !done[i] {
					done[i] = true
					remaining--
					if hooks.terminal != nil {
						hooks.terminal(at, u.phase)
					}
				}
			}
			return remaining > 0
		})
		if remaining == 0 {
			return nil
		}
		switch code := status.Code(err); {
		case err == nil, code == codes.ResourceExhausted:
			// The stream ended before every job was seen terminal: the
			// watcher fell behind, or the caller holds too many streams.
			if attempt >= 1000 {
				return fmt.Errorf("watching batch %s: gave up after %d attempts: %v", b.id, attempt+1, err)
			}
			if err := sleep(ctx, 10*time.Millisecond); err != nil {
				return err
			}
		default:
			if ctx.Err() != nil {
				return context.Cause(ctx)
			}
			return fmt.Errorf("watching batch %s: %w", b.id, err)
		}
	}
}

// watchOnce opens one watch of batchID and hands each message to fn until fn
// returns false (the stream is then closed) or the stream ends. It returns
// nil when either happens cleanly, else the stream's error.
func (g *generator) watchOnce(ctx context.Context, batchID string, fn func(*leaseholdv1.WatchBatchResponse) bool) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := g.jobs.Jobs.WatchBatch(ctx, &leaseholdv1.WatchBatchRequest{BatchId: batchID, TerminalOnly: true, Batched: true})
	if err != nil {
		return err
	}
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if !fn(msg) {
			return nil
		}
	}
}

// tally counts terminal arrivals from many followers.
type tally struct {
	mu        sync.Mutex
	succeeded int
	failed    map[leaseholdv1.Phase]int
	last      time.Time
	latencies []time.Duration
}

// add records one job's terminal update, arrived at, of a batch
// acknowledged at ack; keepLatency keeps at − ack.
func (t *tally) add(at time.Time, phase leaseholdv1.Phase, ack time.Time, keepLatency bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if phase == leaseholdv1.Phase_PHASE_SUCCEEDED {
		t.succeeded++
	} else {
		if t.failed == nil {
			t.failed = make(map[leaseholdv1.Phase]int)
		}
		t.failed[phase]++
	}
	if at.After(t.last) {
		t.last = at
	}
	if keepLatency {
		t.latencies = append(t.latencies, at.Sub(ack))
	}
}

// snapshot returns the counts so far.
func (t *tally) snapshot() (succeeded, failed int, last time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, n := range t.failed {
		failed += n
	}
	return t.succeeded, failed, t.last
}

// failures describes the jobs that did not succeed, or is empty.
func (t *tally) failures() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var parts []string
	for p, n := range t.failed {
		parts = append(parts, fmt.Sprintf("%d %s", n, strings.TrimPrefix(p.String(), "PHASE_")))
	}
	return strings.Join(parts, ", ")
}

// followInOrder follows batches, opening their watches in the order given as
// watch slots free (a team's queue is first in, first out, so the first
// batches finish first), and returns when all are terminal. opened is closed
// once the first min(len(batches), slots) watches have their snapshots.
func (g *generator) followInOrder(ctx context.Context, batches []*batch, t *tally, opened chan<- struct{}) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	early := min(len(batches), cap(g.watches))
	var openedN atomic.Int64
	var wg sync.WaitGroup
	for i, b := range batches {
		release, err := g.acquireWatch(ctx)
		if err != nil {
			break
		}
		hooks := followHooks{terminal: func(at time.Time, p leaseholdv1.Phase) { t.add(at, p, b.ack, false) }}
		if i < early && opened != nil {
			hooks.opened = func() {
				if openedN.Add(1) == int64(early) {
					close(opened)
				}
			}
		}
		wg.Go(func() {
			defer release()
			if err := g.follow(ctx, b, hooks); err != nil {
				cancel(err)
			}
		})
	}
	wg.Wait()
	return context.Cause(ctx)
}
