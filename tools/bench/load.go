package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

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
// them to their end with client.FollowBatch. It is safe for concurrent use.
type generator struct {
	jobs     *client.Client
	operator *client.Client
	runID    string
	seq      atomic.Int64
	// watches bounds the watch streams open at once.
	watches chan struct{}
	// refusedWait is the pause before following a batch again after its
	// watch was refused with TOO_MANY_STREAMS (see follow); nil waits
	// 10 ms.
	refusedWait func(context.Context) error
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

// jobSeen is what a follower has seen of one job.
type jobSeen uint8

const (
	notSeen      jobSeen = iota // nothing yet
	seenLive                    // a phase that is not terminal
	seenTerminal                // its terminal phase
)

// followOptions are the bench's FollowBatch options: terminal updates
// only, batched messages (a coordinator that ignores either still works),
// and a short wait before watching again, so that a lost stream costs the
// figures little.
var followOptions = client.FollowOptions{
	TerminalOnly: true,
	Batched:      true,
	MinBackoff:   10 * time.Millisecond,
	MaxBackoff:   100 * time.Millisecond,
}

// follow follows b with client.FollowBatch until every job is terminal,
// calling the hooks. An update is timed when FollowBatch yields it, on
// this goroutine as it arrives: a terminal update's time is its arrival
// at the follower. The caller holds a watch slot.
//
// FollowBatch watches again by itself after a stream that ended early (a
// slow watcher, a coordinator that cannot be reached). A watch refused
// with TOO_MANY_STREAMS is followed again here after a short pause: the
// coordinator frees a caller's stream once its handler has returned, a
// moment after the client closed it, so a follower that takes the slot
// another just gave back can be refused although the harness holds
// fewer streams than it may. Its jobs' states carry over, so no job is
// reported twice.
func (g *generator) follow(ctx context.Context, b *batch, hooks followHooks) error {
	seen := make(map[string]jobSeen, len(b.jobIDs))
	for _, id := range b.jobIDs {
		seen[id] = notSeen
	}
	unseen, remaining := len(b.jobIDs), len(b.jobIDs)
	for attempt := 0; ; attempt++ {
		var err error
		for u, ferr := range g.jobs.FollowBatch(ctx, b.id, followOptions) {
			if ferr != nil {
				err = ferr
				break
			}
			at := time.Now()
			st, ours := seen[u.JobID]
			if !ours || st == seenTerminal {
				continue
			}
			if st == notSeen {
				seen[u.JobID] = seenLive
				if unseen--; unseen == 0 && hooks.opened != nil {
					hooks.opened()
				}
			}
			if terminal(u.Phase) {
				seen[u.JobID] = seenTerminal
				remaining--
				if hooks.terminal != nil {
					hooks.terminal(at, u.Phase)
				}
			}
			if remaining == 0 {
				return nil
			}
		}
		switch {
		case remaining == 0:
			return nil
		case err == nil:
			// FollowBatch ends cleanly only once the batch is done, and a
			// done batch's jobs are all terminal.
			return fmt.Errorf("watching batch %s: the watch ended with %d jobs not terminal", b.id, remaining)
		case ctx.Err() != nil:
			return context.Cause(ctx)
		case !errors.Is(err, client.ErrTooManyStreams):
			return fmt.Errorf("watching batch %s: %w", b.id, err)
		case attempt >= 1000:
			return fmt.Errorf("watching batch %s: gave up after %d attempts: %w", b.id, attempt+1, err)
		}
		wait := g.refusedWait
		if wait == nil {
			wait = func(ctx context.Context) error { return sleep(ctx, 10*time.Millisecond) }
		}
		if err := wait(ctx); err != nil {
			return err
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
