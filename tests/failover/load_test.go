package failover

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/leasehold/leasehold/client"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
)

// team is the team every batch is submitted for.
const team = "alpha"

// ack is one acknowledged submit: when it was sent (its last attempt) and
// answered, and the jobs it announced.
type ack struct {
	batch       string
	jobs        []string
	sent, acked time.Time
}

// load submits batches of one to three documents at a steady pace, each
// under a request id of its own that it sends again until it is answered,
// so that a failover leaves no submit unanswered; every answer is kept.
type load struct {
	c     *client.Client
	every time.Duration
	rng   *rand.Rand

	mu       sync.Mutex
	acks     []ack
	errs     map[string]int // refusals by error, retried
	notified chan struct{}  // closed and replaced on every ack
	next     int
}

func newLoad(c *client.Client, every time.Duration, seed uint64) *load {
	return &load{c: c, every: every, rng: rand.New(rand.NewPCG(seed, 1)), errs: map[string]int{}, notified: make(chan struct{})}
}

// run submits until ctx ends. A submit under way when ctx ends is
// abandoned unanswered: it was never acknowledged, so nothing is owed.
func (l *load) run(ctx context.Context) {
	tick := time.NewTicker(l.every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		l.mu.Lock()
		l.next++
		id, n := fmt.Sprintf("load-%d", l.next), 1+l.rng.IntN(3)
		l.mu.Unlock()
		l.submit(ctx, id, n)
	}
}

// submit sends one batch of n documents under request id until it is
// acknowledged or ctx ends, and reports whether it was.
func (l *load) submit(ctx context.Context, id string, n int) bool {
	docs := make([]*leaseholdv1.Document, n)
	for i := range docs {
		content := fmt.Sprintf("%s document %d", id, i)
		docs[i] = &leaseholdv1.Document{Name: fmt.Sprintf("%s-%d.txt", id, i), ContentType: "text/plain",
			Content: []byte(content), SizeBytes: int64(len(content))}
	}
	for ctx.Err() == nil {
		sent := time.Now()
		cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		resp, err := l.c.SubmitBatch(cctx, team, id, docs, nil)
		cancel()
		if err == nil {
			l.record(ack{batch: resp.GetBatch().GetId(), jobs: resp.GetBatch().GetJobIds(), sent: sent, acked: time.Now()})
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		l.mu.Lock()
		l.errs[errorName(err)]++
		l.mu.Unlock()
		if errors.Is(err, client.ErrQueueFull) {
			select {
			case <-ctx.Done():
			case <-time.After(l.every):
			}
		}
	}
	return false
}

// errorName is the client sentinel an error wraps, for the report.
func errorName(err error) string {
	for _, s := range []error{client.ErrNotLeader, client.ErrOutcomeUnknown, client.ErrUnavailable, client.ErrQueueFull,
		context.DeadlineExceeded} {
		if errors.Is(err, s) {
			return s.Error()
		}
	}
	return err.Error()
}

func (l *load) record(a ack) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.acks = append(l.acks, a)
	close(l.notified)
	l.notified = make(chan struct{})
}

// lastBatch returns the batch of the last acknowledged submit.
func (l *load) lastBatch() (string, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.acks) == 0 {
		return "", false
	}
	return l.acks[len(l.acks)-1].batch, true
}

// count returns the number of acknowledged submits and a channel closed
// at the next one.
func (l *load) count() (int, <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.acks), l.notified
}

// waitAcks waits until n more submits than after were acknowledged, or
// ctx ends.
func (l *load) waitAcks(ctx context.Context, after, n int) error {
	for {
		got, changed := l.count()
		if got >= after+n {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d submits acknowledged of the %d awaited: %w", got-after, n, ctx.Err())
		case <-changed:
		}
	}
}

// firstAckSince returns how long after t the first submit sent at or
// after t was acknowledged, or false if none was.
func (l *load) firstAckSince(t time.Time) (time.Duration, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	best, ok := time.Duration(0), false
	for i := len(l.acks) - 1; i >= 0; i-- {
		a := l.acks[i]
		if a.acked.Before(t) {
			break
		}
		if !a.sent.Before(t) && (!ok || a.acked.Sub(t) < best) {
			best, ok = a.acked.Sub(t), true
		}
	}
	return best, ok
}

// snapshot returns every acknowledged submit and the refusals retried.
func (l *load) snapshot() ([]ack, map[string]int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	errs := make(map[string]int, len(l.errs))
	for k, v := range l.errs {
		errs[k] = v
	}
	return append([]ack(nil), l.acks...), errs
}

// probe sends a one-document submit every poll, each under a request id
// of its own, from struck until one sent at or after struck is
// acknowledged (by anyone: the load too). A client's call that went to a
// leader the kernel no longer schedules waits until it runs again; the
// next ones go to the new leader as soon as it reports itself, so the
// first acknowledgement says when the cluster took writes again. The
// channel delivers, once every probe was answered or ctx ended, whether
// one was acknowledged.
func (l *load) probe(ctx context.Context, name string, struck time.Time, poll time.Duration) <-chan bool {
	done := make(chan bool, 1)
	go func() {
		var wg sync.WaitGroup
		tick := time.NewTicker(poll)
		defer tick.Stop()
		for i := 0; ; i++ {
			wg.Go(func() { l.submit(ctx, fmt.Sprintf("%s-%d", name, i), 1) })
			_, changed := l.count()
			if _, ok := l.firstAckSince(struck); ok {
				break
			}
			select {
			case <-ctx.Done():
			case <-changed:
			case <-tick.C:
			}
			if ctx.Err() != nil {
				break
			}
			if _, ok := l.firstAckSince(struck); ok {
				break
			}
		}
		wg.Wait()
		_, ok := l.firstAckSince(struck)
		done <- ok
	}()
	return done
}
