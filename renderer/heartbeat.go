package renderer

import (
	"cmp"
	"context"
	"errors"
	"io"
	"slices"
	"strings"
	"time"

	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
)

// heartbeatLoop keeps one Heartbeat stream open until ctx is done, reopening
// it with backoff whenever it breaks.
func (w *Worker) heartbeatLoop(ctx context.Context, client leaseholdv1.RendererServiceClient) {
	bo := w.newBackoff()
	for {
		err := w.heartbeatSession(ctx, client, bo)
		if ctx.Err() != nil {
			return
		}
		d := bo.next()
		w.log.Warn("heartbeat stream ended", "err", err, "retry_in", d)
		if !sleepCtx(ctx, d) {
			return
		}
	}
}

// heartbeatSession runs one Heartbeat stream: a receive goroutine applies the
// responses, and this goroutine sends at every interval and whenever cancel
// acks are waiting. It returns when the stream breaks or, after closing the
// stream, when ctx is done.
func (w *Worker) heartbeatSession(ctx context.Context, client leaseholdv1.RendererServiceClient, bo *backoff) error {
	// The stream outlives ctx by up to closeGrace so that it can be
	// half-closed cleanly; after that it is cut, even under a blocked Send.
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	stopWatch := context.AfterFunc(ctx, func() {
		t := time.NewTimer(closeGrace)
		defer t.Stop()
		select {
		case <-t.C:
			cancel()
		case <-sctx.Done():
		}
	})
	defer stopWatch()
	stream, err := client.Heartbeat(sctx)
	if err != nil {
		return err
	}
	recvDone := make(chan struct{})
	var recvErr error
	go func() {
		defer close(recvDone)
		for {
			resp, err := stream.Recv()
			if err != nil {
				recvErr = err
				return
			}
			bo.reset()
			w.handleHeartbeat(resp)
		}
	}()
	defer func() {
		cancel()
		<-recvDone
	}()

	timer := time.NewTimer(0) // the first message goes out at once
	defer timer.Stop()
	for {
		var tick bool
		select {
		case <-ctx.Done():
			_ = stream.CloseSend()
			<-recvDone
			return nil
		case <-recvDone:
			return cmp.Or(recvErr, io.EOF)
		case <-timer.C:
			tick = true
		case <-w.wakeHeartbeat:
		}
		if err := w.sendHeartbeat(stream); err != nil {
			if errors.Is(err, io.EOF) {
				// The stream is gone; the receive side has the status.
				<-recvDone
				return cmp.Or(recvErr, err)
			}
			return err
		}
		if tick {
			timer.Reset(time.Duration(w.interval.Load()))
		}
	}
}

// heartbeatStream is the sending half of a Heartbeat stream.
type heartbeatStream interface {
	Send(*leaseholdv1.HeartbeatRequest) error
}

// sendHeartbeat sends the held leases and the pending cancel acks. Acks that
// could not be sent stay pending for the next stream.
func (w *Worker) sendHeartbeat(stream heartbeatStream) error {
	w.mu.Lock()
	refs := make([]*leaseholdv1.LeaseRef, 0, len(w.leases))
	for k, l := range w.leases {
		if !l.lost && !l.paused {
			refs = append(refs, k.ref())
		}
	}
	acks := w.acks
	w.acks = nil
	w.mu.Unlock()
	slices.SortFunc(refs, func(a, b *leaseholdv1.LeaseRef) int {
		return cmp.Or(strings.Compare(a.GetJobId(), b.GetJobId()), cmp.Compare(a.GetToken(), b.GetToken()))
	})
	err := stream.Send(&leaseholdv1.HeartbeatRequest{
		RendererId: w.cfg.ID,
		Capacity:   uint32(w.cfg.Capacity),
		Leases:     refs,
		CancelAcks: acks,
	})
	if err != nil {
		w.mu.Lock()
		w.acks = append(acks, w.acks...)
		w.mu.Unlock()
		return err
	}
	for _, a := range acks {
		w.log.Info("cancel acknowledged", "job", a.GetJobId(), "token", a.GetToken())
	}
	return nil
}

// handleHeartbeat applies one HeartbeatResponse. It runs on the receive
// goroutine and never blocks.
func (w *Worker) handleHeartbeat(resp *leaseholdv1.HeartbeatResponse) {
	for _, st := range resp.GetLeases() {
		if st.GetState() == leaseholdv1.LeaseState_LEASE_STATE_LOST {
			w.lose(st, false)
		}
	}
	for _, st := range resp.GetRevoked() {
		w.lose(st, true)
	}
}

// lose stops the work of a lease the coordinator says is no longer ours. A
// revoked lease is acknowledged once its goroutine has ended, or at once when
// no work is running for it.
func (w *Worker) lose(st *leaseholdv1.LeaseStatus, revoked bool) {
	key := leaseKey{jobID: st.GetJobId(), token: st.GetToken()}
	reason := cmp.Or(st.GetReason(), "UNKNOWN")
	w.mu.Lock()
	l := w.leases[key]
	if l == nil {
		if revoked {
			w.acks = append(w.acks, key.ref())
		}
		w.mu.Unlock()
		w.log.Debug("lost lease not running", "job", key.jobID, "token", key.token, "reason", reason, "revoked", revoked)
		if revoked {
			w.wake()
		}
		return
	}
	first := !l.lost
	l.lost = true
	l.revoked = l.revoked || revoked
	completing := l.completing
	w.mu.Unlock()
	if !first {
		return
	}
	if completing && !revoked {
		// The answer to the completion in flight decides; a LOST here is
		// usually that completion having been applied.
		w.log.Debug("lease lost while completing", "job", key.jobID, "token", key.token, "reason", reason)
	} else {
		w.log.Info("lease lost", "job", key.jobID, "token", key.token, "reason", reason)
	}
	l.cancel(errLeaseLost)
}
