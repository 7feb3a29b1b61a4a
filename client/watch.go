package client

import (
	"context"
	"errors"
	"io"
	"iter"
	"time"

	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
)

// WatchBatch calls fn with each message of one watch stream of the batch:
// one snapshot per job first, then every event. It returns nil when the
// stream ends because the batch is done, fn's error if fn fails (which ends
// the stream), or the stream's error. A watcher that fell behind gets an
// error matching ErrSlowWatcher and may watch again. It does not survive a
// coordinator restart; FollowBatch does.
func (c *Client) WatchBatch(ctx context.Context, batchID string, fn func(*leaseholdv1.WatchBatchResponse) error) error {
	for msg, err := range c.BatchEvents(ctx, batchID) {
		if err != nil {
			return err
		}
		if err := fn(msg); err != nil {
			return err
		}
	}
	return nil
}

// BatchEvents iterates over one watch stream of the batch as WatchBatch
// does. Breaking out of the loop closes the stream. The stream's error, if
// any, is yielded last with a nil message.
func (c *Client) BatchEvents(ctx context.Context, batchID string) iter.Seq2[*leaseholdv1.WatchBatchResponse, error] {
	return func(yield func(*leaseholdv1.WatchBatchResponse, error) bool) {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		stream, err := c.Jobs.WatchBatch(ctx, &leaseholdv1.WatchBatchRequest{BatchId: batchID})
		if err != nil {
			yield(nil, wrapError(err))
			return
		}
		for {
			msg, err := stream.Recv()
			if errors.Is(err, io.EOF) {
				return
			}
			if err != nil {
				yield(nil, wrapError(err))
				return
			}
			if !yield(msg, nil) {
				return
			}
		}
	}
}

// The default bounds of FollowBatch's wait before watching again.
const (
	DefaultFollowMinBackoff = 100 * time.Millisecond
	DefaultFollowMaxBackoff = 2 * time.Second
)

// FollowOptions tunes FollowBatch. The zero value follows every event with
// the default backoff.
type FollowOptions struct {
	// TerminalOnly asks for terminal events only (SUCCEEDED, FAILED,
	// CANCELLED) after the opening snapshots: enough to wait for outcomes.
	TerminalOnly bool
	// Batched asks the coordinator to pack several updates into one
	// message. FollowBatch yields updates one by one either way, and
	// understands both shapes whatever it asked for.
	Batched bool
	// MinBackoff and MaxBackoff bound the wait before watching again: it
	// starts at MinBackoff, doubles after each stream that delivered
	// nothing, and never exceeds MaxBackoff. Zero: 100 ms and 2 s.
	MinBackoff, MaxBackoff time.Duration
	// OnReconnect, if set, is called on the iterating goroutine each time a
	// stream was lost and FollowBatch is about to wait delay before
	// watching again. err is what ended the stream: an error matching
	// ErrUnavailable or ErrSlowWatcher, or nil for a stream that ended
	// before the batch was done.
	OnReconnect func(err error, delay time.Duration)
}

// Update is one change to one job of a followed batch.
type Update struct {
	// JobID is the job's id.
	JobID string
	// Phase is the job's phase right after this update.
	Phase leaseholdv1.Phase
	// Event is the committed event, or nil for a snapshot: the job's phase
	// when the watch began, or after a lost stream its new phase, for a job
	// of which no event had been seen yet (see FollowBatch).
	Event *leaseholdv1.JobEvent
	// Batch holds the batch's counts after the message that carried this
	// update (updates of one message share it; do not modify it). It may
	// be nil if the coordinator sent none.
	Batch *leaseholdv1.Batch
}

// FollowBatch iterates over the updates of a batch until every job is
// terminal, watching again whenever the stream is lost, so that it
// survives a coordinator restart. Breaking out of the loop closes the
// stream.
//
// A stream ended by UNAVAILABLE (the coordinator restarted, or cannot be
// reached), by RESOURCE_EXHAUSTED SLOW_WATCHER, or with OK before the batch
// is done, is opened again after a backoff (FollowOptions), resuming from
// the last event sequence number seen of each job
// (WatchBatchRequest.resume): the coordinator sends those jobs' events
// committed since, so none is yielded twice and none is missed. A job of
// which only the opening snapshot was seen cannot be resumed by number; it
// gets a new snapshot, which FollowBatch yields only if the job's phase
// moved meanwhile. Events are also checked against the sequence numbers
// already seen, so a coordinator that repeats one does not make it yielded
// twice.
//
// Any other error ends the iteration: it is yielded last, with a zero
// Update. So is ctx's error, when ctx ends, however many times the
// coordinator was being retried. The updates are yielded on the calling
// goroutine.
func (c *Client) FollowBatch(ctx context.Context, batchID string, opts FollowOptions) iter.Seq2[Update, error] {
	return func(yield func(Update, error) bool) {
		f := &follower{c: c, batchID: batchID, opts: opts, jobs: map[string]*jobCursor{}}
		f.run(ctx, yield)
	}
}

// follower is the state of one FollowBatch iteration: what was seen of
// each job, in the order the jobs were first seen.
type follower struct {
	c       *Client
	batchID string
	opts    FollowOptions

	order []string
	jobs  map[string]*jobCursor
	batch *leaseholdv1.Batch // the latest counts seen
}

// jobCursor is what a follower has yielded of one job.
type jobCursor struct {
	seq   uint32 // JobEvent.seq of the last event yielded; 0 for none
	phase leaseholdv1.Phase
}

// run watches until the batch is done, yield stops, or an error ends it.
func (f *follower) run(ctx context.Context, yield func(Update, error) bool) {
	minDelay, maxDelay := f.opts.MinBackoff, f.opts.MaxBackoff
	if minDelay <= 0 {
		minDelay = DefaultFollowMinBackoff
	}
	if maxDelay <= 0 {
		maxDelay = DefaultFollowMaxBackoff
	}
	maxDelay = max(maxDelay, minDelay)
	delay := minDelay
	for {
		received, stopped, err := f.watchOnce(ctx, yield)
		switch {
		case stopped:
			return
		case ctx.Err() != nil:
			yield(Update{}, ctx.Err())
			return
		case err == nil && f.batch.GetDone():
			return
		case err != nil && !resumable(err):
			yield(Update{}, err)
			return
		}
		if received {
			delay = minDelay
		}
		if f.opts.OnReconnect != nil {
			f.opts.OnReconnect(err, delay)
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			yield(Update{}, ctx.Err())
			return
		case <-t.C:
		}
		delay = min(2*delay, maxDelay)
	}
}

// resumable reports whether a stream that ended with err is worth opening
// again: the coordinator is restarting or unreachable, or it dropped a
// watcher that fell behind.
func resumable(err error) bool {
	return errors.Is(err, ErrUnavailable) || errors.Is(err, ErrSlowWatcher)
}

// watchOnce opens one stream, resuming where the follower is, and yields
// its updates until it ends. It reports whether any message arrived,
// whether yield asked to stop, and the stream's error (nil for a clean end).
func (f *follower) watchOnce(ctx context.Context, yield func(Update, error) bool) (received, stopped bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := f.c.Jobs.WatchBatch(ctx, &leaseholdv1.WatchBatchRequest{
		BatchId:      f.batchID,
		Resume:       f.cursors(),
		TerminalOnly: f.opts.TerminalOnly,
		Batched:      f.opts.Batched,
	})
	if err != nil {
		return false, false, wrapError(err)
	}
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return received, false, nil
		}
		if err != nil {
			return received, false, wrapError(err)
		}
		received = true
		if msg.GetBatch() != nil {
			f.batch = msg.GetBatch()
		}
		if !f.deliver(msg, yield) {
			return received, true, nil
		}
	}
}

// cursors lists the jobs of which an event was yielded, with the last
// event's sequence number, for WatchBatchRequest.resume.
func (f *follower) cursors() []*leaseholdv1.JobCursor {
	var cs []*leaseholdv1.JobCursor
	for _, id := range f.order {
		if seq := f.jobs[id].seq; seq > 0 {
			cs = append(cs, &leaseholdv1.JobCursor{JobId: id, Seq: seq})
		}
	}
	return cs
}

// deliver yields the news in one message, in either shape; it returns false
// when yield asked to stop.
func (f *follower) deliver(msg *leaseholdv1.WatchBatchResponse, yield func(Update, error) bool) bool {
	if ups := msg.GetUpdates(); len(ups) > 0 {
		for _, u := range ups {
			if !f.apply(Update{JobID: u.GetJobId(), Phase: u.GetPhase(), Event: u.GetEvent(), Batch: msg.GetBatch()}, yield) {
				return false
			}
		}
		return true
	}
	if msg.GetJobId() == "" {
		return true // counts only
	}
	return f.apply(Update{JobID: msg.GetJobId(), Phase: msg.GetPhase(), Event: msg.GetEvent(), Batch: msg.GetBatch()}, yield)
}

// apply records u and yields it unless it is old news: an event at or
// before the job's cursor, or a snapshot of a known job in the phase last
// yielded for it.
func (f *follower) apply(u Update, yield func(Update, error) bool) bool {
	st, known := f.jobs[u.JobID]
	if !known {
		st = &jobCursor{}
		f.jobs[u.JobID] = st
		f.order = append(f.order, u.JobID)
	}
	switch {
	case u.Event != nil:
		if seq := u.Event.GetSeq(); seq != 0 { // 0: a coordinator that numbers no events
			if seq <= st.seq {
				return true
			}
			st.seq = seq
		}
	case known && u.Phase == st.phase:
		return true
	}
	st.phase = u.Phase
	return yield(u, nil)
}
