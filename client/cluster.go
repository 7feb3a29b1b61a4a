package client

import (
	"context"
	"errors"
	"slices"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/leasehold/leasehold/client/reason"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"github.com/leasehold/leasehold/internal/leaderdial"
)

// DefaultFailoverWait is how long a call to a cluster keeps being retried
// while the coordinator's leadership moves; see WithFailoverWait.
const DefaultFailoverWait = 5 * time.Second

// The read-consistency metadata of a replicated coordinator.
const (
	// ReadModeKey is the request metadata that asks for a stale read with
	// the value ReadStale; WithStaleReads sends it.
	ReadModeKey = "leasehold-read"
	ReadStale   = "stale"
	// AppliedIndexKey is the response header of a stale read: the index of
	// the last replicated log entry the serving node had applied. Read it
	// with grpc.Header on a call made through the stubs.
	AppliedIndexKey = "leasehold-applied-index"
)

// Pauses between the attempts of a call retried across a failover: the
// first retry waits firstRetryPause, each next one twice the last, at most
// maxRetryPause. They matter only while a replica that no longer leads
// still looks healthy; otherwise the retry waits for the new leader's
// health instead.
const (
	firstRetryPause = 10 * time.Millisecond
	maxRetryPause   = 250 * time.Millisecond
)

// WithFailoverWait sets how long, at most, a unary call to a cluster
// (several addresses or a dns target) is retried while no replica leads or
// leadership moves: DefaultFailoverWait unless set, and 0 turns retrying
// off. Only failures that a leader change explains are retried, which is
// safe because every write of the API is idempotent (SubmitBatch and
// ReplayJobs by request id, cancels, completions by job and token):
//
//   - UNAVAILABLE NOT_LEADER (a follower, or a leader that just stepped
//     down, refused the call);
//   - UNAVAILABLE OUTCOME_UNKNOWN (leadership was lost with the write
//     proposed: it may or may not have been applied);
//   - UNAVAILABLE from the transport itself (no leader reported healthy,
//     or the connection to it broke).
//
// Each attempt has its own deadline (a third of what is left of ctx's, at
// least MinAttemptTimeout, DefaultAttemptTimeout without one) and ends
// sooner when the client leaves the leader it went to: a call in flight on
// a leader that froze is answered by the new leader, not when the old one
// wakes. An attempt ended either way counts as UNAVAILABLE from the
// transport. The first attempt is sent as the caller asked; the retries
// wait for a replica to answer as the leader (gRPC's WaitForReady), until
// the wait runs out or ctx ends. Then the last of these errors is returned
// (ErrNotLeader, ErrOutcomeUnknown or ErrUnavailable), or ctx's. Every
// other error, UNAVAILABLE STORAGE_FULL and STORAGE_UNAVAILABLE included,
// is returned at once. Streams (WatchBatch, WatchOverview, GetArtifact,
// Backup) are never retried: a failover ends them with UNAVAILABLE
// NOT_LEADER, and FollowBatch watches again by itself. A single address
// is never retried, as before.
func WithFailoverWait(d time.Duration) Option {
	return func(c *dialConfig) { c.failoverWait = d }
}

// WithStaleReads lets the reads that any replica of a cluster can answer
// from its own copy of the store be served that way: GetJob, ListJobs,
// GetBatch, GetArtifact, ListRejectedCompletions, GetAudit, ListBatches and
// Backup carry "leasehold-read: stale" and, with several addresses, go to
// any replica that is up, leader or not. Such a read may miss the latest
// writes (a follower applies them a little after the leader) and keeps
// working while the cluster elects a leader. Every other call still goes
// to the leader, and a read that only the leader can serve (WatchBatch,
// GetOverview, WatchOverview, ListRenderers) is unchanged. Without it,
// reads are linearizable: served by the leader.
func WithStaleReads() Option {
	return func(c *dialConfig) { c.staleReads = true }
}

// staleMethods are the reads WithStaleReads sends to any replica: those a
// follower serves from its own store.
var staleMethods = map[string]bool{
	leaseholdv1.JobService_GetJob_FullMethodName:                       true,
	leaseholdv1.JobService_ListJobs_FullMethodName:                     true,
	leaseholdv1.JobService_GetBatch_FullMethodName:                     true,
	leaseholdv1.JobService_GetArtifact_FullMethodName:                  true,
	leaseholdv1.OperatorService_ListRejectedCompletions_FullMethodName: true,
	leaseholdv1.OperatorService_GetAudit_FullMethodName:                true,
	leaseholdv1.OperatorService_Backup_FullMethodName:                  true,
	leaseholdv1.OverviewService_ListBatches_FullMethodName:             true,
}

// staleRouter sends the calls of staleMethods, with the stale-read
// metadata, over the any-replica channel and every other call over the
// leader's.
type staleRouter struct {
	leader, any grpc.ClientConnInterface
}

// Invoke implements grpc.ClientConnInterface.
func (r staleRouter) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	if staleMethods[method] {
		return r.any.Invoke(staleContext(ctx), method, args, reply, opts...)
	}
	return r.leader.Invoke(ctx, method, args, reply, opts...)
}

// NewStream implements grpc.ClientConnInterface.
func (r staleRouter) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	if staleMethods[method] {
		return r.any.NewStream(staleContext(ctx), desc, method, opts...)
	}
	return r.leader.NewStream(ctx, desc, method, opts...)
}

func staleContext(ctx context.Context) context.Context {
	return metadata.AppendToOutgoingContext(ctx, ReadModeKey, ReadStale)
}

// errFailoverWaitOver cancels a retry still waiting for a leader when the
// failover wait runs out.
var errFailoverWaitOver = errors.New("failover wait over")

// failoverInterceptor sends each attempt of a unary call with its own
// deadline and moves it off a leader the client has left (attempt), and
// retries calls that failed because leadership moved, as WithFailoverWait
// describes, for at most wait.
func failoverInterceptor(leader *leaderdial.Leader, wait time.Duration) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := attempt(ctx, leader, method, req, reply, cc, invoker, opts...)
		if !failoverError(err) {
			return err
		}
		waitCtx, cancel := context.WithTimeout(ctx, wait)
		defer cancel()
		retryOpts := append(slices.Clip(opts), grpc.WaitForReady(true))
		pause := firstRetryPause
		for {
			if !sleepCtx(waitCtx, pause) {
				return err
			}
			pause = min(2*pause, maxRetryPause)
			// The retry waits for a leader, but not beyond the failover
			// wait: once it is over, a call still waiting (the channel is
			// not ready) is cancelled. One already sent to a leader runs
			// on under ctx and its own deadline.
			attemptCtx, cancelAttempt := context.WithCancelCause(ctx)
			stop := context.AfterFunc(waitCtx, func() {
				if ctx.Err() == nil && cc.GetState() != connectivity.Ready {
					cancelAttempt(errFailoverWaitOver)
				}
			})
			attemptErr := attempt(attemptCtx, leader, method, req, reply, cc, invoker, retryOpts...)
			stop()
			over := errors.Is(context.Cause(attemptCtx), errFailoverWaitOver)
			cancelAttempt(nil)
			if over && status.Code(attemptErr) == codes.Canceled {
				return err // the wait ran out before a leader took the call
			}
			err = attemptErr
			if !failoverError(err) {
				return err
			}
		}
	}
}

// The deadline of one attempt of a call to a cluster: a third of what is
// left of the call's own, so that two more attempts fit after one that
// went to a leader that stopped answering, but at least
// MinAttemptTimeout; DefaultAttemptTimeout for a call with no deadline.
// An attempt also ends, sooner, as soon as the client leaves the leader it
// went to (another replica answers as the leader, that one says it is
// not, or it stays silent for 3 s).
const (
	MinAttemptTimeout     = time.Second
	DefaultAttemptTimeout = 10 * time.Second
)

// errAttemptOver ends an attempt at its own deadline.
var errAttemptOver = errors.New("attempt deadline")

// attemptTimeout returns the deadline of an attempt made under ctx.
func attemptTimeout(ctx context.Context) time.Duration {
	dl, ok := ctx.Deadline()
	if !ok {
		return DefaultAttemptTimeout
	}
	return max(time.Until(dl)/3, MinAttemptTimeout)
}

// attempt sends one attempt of a call under a context of its own, which
// ends at the attempt's deadline or when the client leaves the leader it
// went to. Either is answered UNAVAILABLE (without a coordinator's
// reason), which the failover retries; ctx's own end is returned as it
// came.
func attempt(ctx context.Context, leader *leaderdial.Leader, method string, req, reply any, cc *grpc.ClientConn,
	invoker grpc.UnaryInvoker, opts ...grpc.CallOption,
) error {
	actx, release := leader.Attempt(ctx)
	defer release()
	d := attemptTimeout(ctx)
	actx, cancel := context.WithTimeoutCause(actx, d, errAttemptOver)
	defer cancel()
	err := invoker(actx, method, req, reply, cc, opts...)
	switch {
	case err == nil || ctx.Err() != nil:
		return err
	case status.Code(err) == codes.DeadlineExceeded && attemptShorter(ctx, actx):
		// The attempt's deadline, not the call's: the server may answer
		// DEADLINE_EXCEEDED (it enforces the deadline the call carried)
		// just before this side's own timer ends actx.
		return status.Errorf(codes.Unavailable, "no answer from the coordinator (%s) within the attempt's %v", leader.Describe(), d.Round(time.Millisecond))
	}
	return leaderdial.Moved(actx, err)
}

// attemptShorter reports whether the attempt's context actx ends before
// the call's own ctx: then a DEADLINE_EXCEEDED is the attempt's.
func attemptShorter(ctx, actx context.Context) bool {
	adl, _ := actx.Deadline()
	dl, ok := ctx.Deadline()
	return !ok || adl.Before(dl)
}

// failoverError reports whether err is one a leader change explains:
// UNAVAILABLE with the reason NOT_LEADER or OUTCOME_UNKNOWN, or with no
// reason of the coordinator's (the transport's own).
func failoverError(err error) bool {
	st, ok := status.FromError(err)
	if err == nil || !ok || st.Code() != codes.Unavailable {
		return false
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == ErrorDomain {
			r := reason.Reason(info.GetReason())
			return r == reason.NotLeader || r == reason.OutcomeUnknown
		}
	}
	return true
}

// sleepCtx waits for d and reports whether it did; it returns false as
// soon as ctx is done.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
