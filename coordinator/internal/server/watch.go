package server

import (
	"context"
	"errors"

	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	"github.com/leasehold/leasehold/coordinator/internal/reads"
	"github.com/leasehold/leasehold/coordinator/internal/watch"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
)

// maxUpdatesPerMessage bounds a batched WatchBatchResponse.
const maxUpdatesPerMessage = 500

// WatchBatch implements JobService.WatchBatch: it subscribes first, then
// reads every job of the batch (sending a snapshot, or for a resumed job its
// stored events after the cursor), then each committed event not already
// sent, and ends with OK once every job is terminal.
func (s *JobServer) WatchBatch(req *leaseholdv1.WatchBatchRequest, stream leaseholdv1.JobService_WatchBatchServer) error {
	ctx := stream.Context()
	p, err := principal(ctx)
	if err != nil {
		return s.status(err)
	}
	bv, v, err := s.batch(p, req.GetBatchId())
	if err != nil {
		return s.status(err)
	}
	b := bv.Batch
	s.holdTeam(ctx, b.Team, v)
	resume := make(map[uint64]uint32, len(req.GetResume()))
	for i, c := range req.GetResume() {
		id, err := parseJobID(c.GetJobId(), "resume.job_id")
		if err != nil {
			return s.status(err)
		}
		if id < b.FirstJob || id >= b.FirstJob+uint64(b.Count) {
			return s.status(invalidArg("resume", reasonInvalidID, "resume[%d] names job %s, which is not in batch %s", i, c.GetJobId(), req.GetBatchId()))
		}
		resume[id] = c.GetSeq()
	}
	w, err := s.e.WatchBatch(b.ID)
	if err != nil {
		return s.status(notFound(err, reasonBatchNotFound, "batch %s not found", req.GetBatchId()))
	}
	defer w.Close()
	out := &watchOut{stream: stream, batch: b, batched: req.GetBatched(), terminalOnly: req.GetTerminalOnly(),
		phases: make(map[uint64]jobs.Phase, b.Count), lastSeq: make(map[uint64]uint32, b.Count)}
	if err := s.watchSnapshot(out, resume); err != nil {
		return err
	}
	if out.done() {
		return nil
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-s.closing:
			cancel()
		case <-ctx.Done():
		}
	}()
	for {
		evs, err := w.Next(ctx)
		switch {
		case errors.Is(err, watch.ErrSlowWatcher):
			return s.status(err)
		case err != nil && stream.Context().Err() == nil && ctx.Err() != nil:
			return s.status(errShuttingDown)
		case err != nil:
			return s.streamEnd(err)
		}
		for _, ev := range evs {
			out.event(ev.Job, ev.Event)
		}
		if err := out.flush(); err != nil {
			return err
		}
		if out.done() {
			return nil
		}
	}
}

// watchSnapshot sends the opening state of every job of the batch. It
// first reads every job's phase (straight from the records, not decoding
// them whole), so that each snapshot
// message carries the counts of the whole batch, then sends a snapshot
// update per job, or for a resumed job its stored events after the cursor.
func (s *JobServer) watchSnapshot(out *watchOut, resume map[uint64]uint32) error {
	states, err := s.e.BatchStates(out.batch.ID)
	if err != nil {
		return s.status(notFound(err, reasonBatchNotFound, "batch %s not found", BatchID(out.batch.ID)))
	}
	for _, j := range states {
		out.phases[j.ID] = j.Phase
		out.counts[j.Phase]++
		out.lastSeq[j.ID] = j.EventSeq
		if cursor, resumed := resume[j.ID]; resumed {
			out.lastSeq[j.ID] = cursor
		}
	}
	b := out.batch
	for id := b.FirstJob; id < b.FirstJob+uint64(b.Count); id++ {
		phase, ok := out.phases[id]
		if !ok {
			continue
		}
		if cursor, resumed := resume[id]; resumed {
			evs, err := s.e.Events(id, cursor)
			if err != nil {
				return s.status(err)
			}
			for _, ev := range evs {
				out.event(id, ev)
			}
		} else {
			out.add(&leaseholdv1.JobUpdate{JobId: JobID(id), Phase: leaseholdv1.Phase(phase)})
		}
		if len(out.queue) >= maxPageSize {
			if err := out.flush(); err != nil {
				return err
			}
		}
	}
	return out.flush()
}

// watchOut is what a watch has sent: each job's phase and last event, the
// batch's counts, and the updates waiting to go out.
type watchOut struct {
	stream       leaseholdv1.JobService_WatchBatchServer
	batch        jobs.Batch
	batched      bool
	terminalOnly bool
	phases       map[uint64]jobs.Phase
	lastSeq      map[uint64]uint32
	counts       jobs.Counts
	queue        []queuedUpdate
}

// queuedUpdate is an update waiting to go out with the batch's counts right
// after it.
type queuedUpdate struct {
	u      *leaseholdv1.JobUpdate
	counts jobs.Counts
}

// event applies one committed event of job id, once, and queues it unless
// the watcher asked for terminal events only.
func (o *watchOut) event(id uint64, ev jobs.Event) {
	if _, ours := o.phases[id]; !ours || ev.Seq <= o.lastSeq[id] {
		return
	}
	o.lastSeq[id] = ev.Seq
	if ev.Phase != jobs.PhaseUnspecified {
		o.counts[o.phases[id]]--
		o.counts[ev.Phase]++
		o.phases[id] = ev.Phase
	}
	if o.terminalOnly && ev.Kind != jobs.EventSucceeded && ev.Kind != jobs.EventFailed && ev.Kind != jobs.EventCancelled {
		return
	}
	o.add(&leaseholdv1.JobUpdate{JobId: JobID(id), Phase: leaseholdv1.Phase(o.phases[id]), Event: eventToProto(ev)})
}

func (o *watchOut) add(u *leaseholdv1.JobUpdate) {
	o.queue = append(o.queue, queuedUpdate{u: u, counts: o.counts})
}

func (o *watchOut) done() bool { return o.counts.Unfinished() == 0 }

// batchAt returns the batch with counts.
func (o *watchOut) batchAt(counts jobs.Counts) *leaseholdv1.Batch {
	return batchToProto(reads.BatchView{Batch: o.batch, Counts: counts, Done: counts.Unfinished() == 0}, false)
}

// flush sends the queued updates: one message each, or up to
// maxUpdatesPerMessage per message when the watcher asked for batches.
// Each message carries the batch's counts right after its last update, not
// after everything queued, so that a follower can trust any message.
func (o *watchOut) flush() error {
	q := o.queue
	o.queue = nil
	for len(q) > 0 {
		var msg *leaseholdv1.WatchBatchResponse
		n := 1
		if o.batched {
			n = min(len(q), maxUpdatesPerMessage)
			msg = &leaseholdv1.WatchBatchResponse{}
			for _, qu := range q[:n] {
				msg.Updates = append(msg.Updates, qu.u)
			}
		} else {
			u := q[0].u
			msg = &leaseholdv1.WatchBatchResponse{JobId: u.JobId, Phase: u.Phase, Event: u.Event}
		}
		msg.Batch = o.batchAt(q[n-1].counts)
		q = q[n:]
		if err := o.stream.Send(msg); err != nil {
			return err
		}
	}
	return nil
}
