package engine

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"slices"
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	"github.com/leasehold/leasehold/coordinator/internal/store"
)

// Submit stores a batch, all or nothing. The batch is validated against the
// limits before it reaches the writer; the writer checks the request id and
// the team's queue depth, then writes every job, its document and its
// ready-queue entry in the one transaction that answers the caller.
func (e *Engine) Submit(ctx context.Context, req SubmitRequest) (SubmitResult, error) {
	if err := jobs.ValidateBatch(req.Team, req.RequestID, req.Docs, req.Policy, e.cfg.Limits); err != nil {
		return SubmitResult{}, err
	}
	c := &submitCmd{req: req, hash: requestHash(req), policy: req.Policy.Policy(e.cfg.Retry)}
	c.docs = make([]jobs.Document, len(req.Docs))
	for i, d := range req.Docs {
		doc := d.Document
		doc.SizeBytes = max(doc.SizeBytes, int64(len(d.Content)))
		if len(d.Content) > 0 {
			sum := sha256.Sum256(d.Content)
			doc.ContentSHA256 = hex.EncodeToString(sum[:])
		}
		c.docs[i] = doc
	}
	return call(ctx, e, c)
}

// requestHash identifies a request's content for idempotency checks.
func requestHash(req SubmitRequest) []byte {
	h := sha256.New()
	field := func(b []byte) {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(b)))
		h.Write(n[:])
		h.Write(b)
	}
	field([]byte(req.Team))
	for _, d := range req.Docs {
		field([]byte(d.Name))
		field([]byte(d.ContentType))
		field(binary.BigEndian.AppendUint64(nil, uint64(d.SizeBytes)))
		field([]byte(d.SourceURI))
		field(d.Content)
	}
	field(binary.BigEndian.AppendUint64(nil, uint64(req.Policy.MaxAttempts)))
	field(binary.BigEndian.AppendUint64(nil, uint64(req.Policy.BackoffBase)))
	field(binary.BigEndian.AppendUint64(nil, uint64(req.Policy.BackoffCap)))
	return h.Sum(nil)
}

type submitCmd struct {
	base
	req    SubmitRequest
	docs   []jobs.Document
	hash   []byte
	policy jobs.RetryPolicy
	res    SubmitResult
}

func (c *submitCmd) result() SubmitResult { return c.res }

func (c *submitCmd) apply(g *group) error {
	e := g.e
	tx, err := g.txn()
	if err != nil {
		return err
	}
	prev, found, err := tx.BatchByRequest(c.req.Team, c.req.RequestID)
	if err != nil {
		return err
	}
	if found {
		if !bytes.Equal(prev.RequestHash, c.hash) {
			c.err = &jobs.ValidationError{Err: jobs.ErrRequestIDReused, Reason: "REQUEST_ID_REUSED", Violations: []jobs.Violation{{
				Field: "request_id", Reason: "REQUEST_ID_REUSED", Description: "request id " + c.req.RequestID + " was used for a different batch",
			}}}
			return nil
		}
		c.res = SubmitResult{Batch: prev, Replayed: true}
		return nil
	}
	limit := e.cfg.Limits.MaxTeamQueue
	if used := e.active[c.req.Team]; used+len(c.docs) > limit {
		c.err = &jobs.ValidationError{Err: jobs.ErrTeamQueueFull, Reason: "TEAM_QUEUE_FULL", Limit: limit, Used: used,
			Violations: []jobs.Violation{{Field: "team", Reason: "TEAM_QUEUE_FULL", Description: "team " + c.req.Team + " has too many unfinished jobs"}}}
		return nil
	}
	batchID, err := tx.NextBatchID()
	if err != nil {
		return err
	}
	first, err := tx.NextJobIDs(len(c.docs))
	if err != nil {
		return err
	}
	b := jobs.Batch{ID: batchID, Team: c.req.Team, RequestID: c.req.RequestID, CreatedAt: g.now, FirstJob: first,
		Count: uint32(len(c.docs)), Policy: c.policy, RequestHash: c.hash}
	if err := tx.PutBatch(b); err != nil {
		return err
	}
	for i, doc := range c.docs {
		j := jobs.New(first+uint64(i), batchID, b.Team, doc, c.policy, e.cfg.Unsupported.Unsupported(doc), g.now)
		if err := g.save(jobs.Job{}, j); err != nil {
			return err
		}
		if content := c.req.Docs[i].Content; len(content) > 0 {
			if err := tx.PutDocument(j.ID, content); err != nil {
				return err
			}
		}
		if j.Phase == jobs.PhaseQueued {
			e.sched.Push(j.Team, j.ID)
			e.active[j.Team]++
			g.work = true
		}
	}
	c.res = SubmitResult{Batch: b}
	return nil
}

// Acquire grants up to req.Max leases to a renderer, chosen fairly across
// teams, each under a fresh fencing token persisted in the same
// transaction. It never waits: callers long-poll with WorkAvailable.
//
// Document content is read after the commit, in a read transaction on the
// caller's goroutine: it never changes once stored, and copying it is no
// work for the writer.
func (e *Engine) Acquire(ctx context.Context, req AcquireRequest) (AcquireResult, error) {
	res, err := call(ctx, e, &acquireCmd{req: req})
	if err != nil || len(res.Grants) == 0 {
		return res, err
	}
	err = e.st.View(func(tx *store.Tx) error {
		for i := range res.Grants {
			content, err := tx.Document(res.Grants[i].Job.ID)
			if err != nil {
				return err
			}
			res.Grants[i].Content = content
		}
		return nil
	})
	return res, err
}

type acquireCmd struct {
	base
	req AcquireRequest
	res AcquireResult
}

func (c *acquireCmd) result() AcquireResult { return c.res }

func (c *acquireCmd) apply(g *group) error {
	e := g.e
	e.seen(c.req.Renderer, c.req.Capacity, g.now)
	if e.dispatchSt.Paused {
		c.res.Paused = true
		return nil
	}
	live := e.liveCapacity(g.now)
	for len(c.res.Grants) < c.req.Max {
		team, id, ok := e.sched.Next(live)
		if !ok {
			break
		}
		j, found, err := g.job(id)
		if err != nil {
			return err
		}
		if !found || j.Phase != jobs.PhaseQueued {
			e.log.Error("ready queue disagrees with the store", "job", id, "team", team, "found", found, "phase", j.Phase)
			e.sched.Release(team)
			continue
		}
		tx, _ := g.txn()
		token, err := tx.NextToken()
		if err != nil {
			return err
		}
		next, err := j.Grant(token, c.req.Renderer, g.now, e.cfg.LeaseTTL)
		if err != nil {
			return err
		}
		if err := g.save(j, next); err != nil {
			return err
		}
		e.trackLease(next)
		e.m.queueWait(team, g.now.Sub(j.EnqueuedAt))
		c.res.Grants = append(c.res.Grants, Grant{Job: next})
	}
	return nil
}

// Release returns granted leases that could not be delivered to their
// renderer (its Acquire call ended first) to their ready queues, without
// counting the attempt. A lease that has meanwhile moved on is left alone.
func (e *Engine) Release(ctx context.Context, leases []LeaseRef) error {
	return e.do(ctx, &releaseCmd{leases: leases})
}

type releaseCmd struct {
	base
	leases []LeaseRef
}

func (c *releaseCmd) apply(g *group) error {
	e := g.e
	for _, ref := range c.leases {
		j, found, err := g.job(ref.Job)
		if err != nil {
			return err
		}
		if !found {
			continue
		}
		next, err := j.Release(ref.Token, g.now)
		if err != nil {
			continue
		}
		if err := g.save(j, next); err != nil {
			return err
		}
		delete(e.leases, j.ID)
		e.sched.Release(j.Team)
		e.sched.Push(next.Team, next.ID)
		g.work = true
	}
	return nil
}

// seen records that a renderer is alive with the given capacity.
func (e *Engine) seen(renderer string, capacity int, now time.Time) {
	r := e.renderers[renderer]
	if r == nil {
		r = &rendererState{}
		e.renderers[renderer] = r
	}
	if capacity > 0 {
		r.capacity = capacity
	}
	r.lastSeen = now
}

// liveCapacity sums the capacity of renderers that hold a heartbeat stream
// or acquired recently, forgetting the rest.
func (e *Engine) liveCapacity(now time.Time) int {
	total := 0
	for id, r := range e.renderers {
		if r.streams == 0 && now.Sub(r.lastSeen) > e.cfg.RendererTimeout {
			delete(e.renderers, id)
			continue
		}
		total += max(r.capacity, 1)
	}
	return total
}

// Heartbeat extends the leases a renderer holds and records its
// acknowledgements of revocations. Each lease is answered HELD with its new
// deadline or LOST with the fencing reason.
func (e *Engine) Heartbeat(ctx context.Context, req HeartbeatRequest) ([]LeaseStatus, error) {
	c := &heartbeatCmd{req: req}
	return call(ctx, e, c)
}

type heartbeatCmd struct {
	base
	req HeartbeatRequest
	res []LeaseStatus
}

func (c *heartbeatCmd) result() []LeaseStatus { return c.res }

func (c *heartbeatCmd) apply(g *group) error {
	e := g.e
	e.seen(c.req.Renderer, c.req.Capacity, g.now)
	for _, ref := range c.req.Leases {
		j, found, err := g.job(ref.Job)
		if err != nil {
			return err
		}
		if !found {
			c.res = append(c.res, LeaseStatus{Job: ref.Job, Token: ref.Token, Reason: "JOB_NOT_FOUND"})
			continue
		}
		next, err := j.Heartbeat(ref.Token, g.now, e.cfg.LeaseTTL)
		if err != nil {
			c.res = append(c.res, lost(ref, j, err))
			continue
		}
		if err := g.save(j, next); err != nil {
			return err
		}
		e.trackLease(next)
		c.res = append(c.res, LeaseStatus{Job: ref.Job, Token: ref.Token, Held: true, Deadline: next.Lease.Deadline,
			CurrentToken: next.Lease.Token, CurrentPhase: next.Phase})
	}
	for _, ref := range c.req.Acks {
		j, found, err := g.job(ref.Job)
		if err != nil || !found {
			if err != nil {
				return err
			}
			continue
		}
		if next, changed := j.AckCancel(ref.Token, g.now); changed {
			if err := g.save(j, next); err != nil {
				return err
			}
		}
	}
	return nil
}

func lost(ref LeaseRef, j jobs.Job, err error) LeaseStatus {
	return LeaseStatus{Job: ref.Job, Token: ref.Token, Reason: jobs.ReasonCode(err), CurrentToken: j.LastToken(), CurrentPhase: j.Phase}
}

// RendererConnected counts an open heartbeat stream of renderer, whose
// capacity then stays live until RendererGone.
func (e *Engine) RendererConnected(ctx context.Context, renderer string, capacity int) error {
	return e.do(ctx, &streamCmd{renderer: renderer, capacity: capacity, delta: 1})
}

// RendererGone records that a heartbeat stream of renderer closed; its
// capacity leaves the live total once it has no stream and stops acquiring.
func (e *Engine) RendererGone(renderer string) {
	// Use a fresh context: the stream's own context is already done.
	_ = e.do(context.Background(), &streamCmd{renderer: renderer, delta: -1})
}

type streamCmd struct {
	base
	renderer string
	capacity int
	delta    int
}

func (c *streamCmd) apply(g *group) error {
	e := g.e
	e.seen(c.renderer, c.capacity, g.now)
	r := e.renderers[c.renderer]
	r.streams = max(r.streams+c.delta, 0)
	if r.streams == 0 && c.delta < 0 {
		delete(e.renderers, c.renderer)
	}
	g.work = true
	return nil
}

// Complete applies a renderer's completion under the fencing check. A
// refused completion is recorded (history event, rejections listing,
// metric) and returned as a *jobs.FenceError.
func (e *Engine) Complete(ctx context.Context, req CompleteRequest) (CompleteResult, error) {
	c := &completeCmd{req: req}
	return call(ctx, e, c)
}

type completeCmd struct {
	base
	req CompleteRequest
	res CompleteResult
}

func (c *completeCmd) result() CompleteResult { return c.res }

func (c *completeCmd) apply(g *group) error {
	e := g.e
	j, found, err := g.job(c.req.Job)
	if err != nil {
		return err
	}
	if !found {
		c.err = ErrNotFound
		return nil
	}
	next, replayed, ferr := j.Complete(c.req.Completion, g.now, e.jitter())
	c.res = CompleteResult{Job: next, Replayed: replayed}
	if ferr != nil {
		c.err = ferr
		var fe *jobs.FenceError
		if !errors.As(ferr, &fe) {
			return nil
		}
		e.m.rejected(jobs.ReasonCode(ferr))
		if !jobs.RejectionRecorded(j, next) {
			return nil
		}
		if err := g.save(j, next); err != nil {
			return err
		}
		tx, _ := g.txn()
		_, err := tx.PutRejection(jobs.Rejection{
			Job: j.ID, Team: j.Team, Token: c.req.Token, Renderer: c.req.Renderer, Reason: jobs.ReasonCode(ferr), At: g.now,
			CurrentToken: fe.CurrentToken, CurrentPhase: fe.CurrentPhase, Outcome: c.req.Outcome(), Digest: c.req.Digest,
		})
		return err
	}
	if replayed {
		return nil
	}
	if err := g.save(j, next); err != nil {
		return err
	}
	e.endLease(g, j, next)
	return nil
}

// Cancel cancels one job (req.Job) or every unfinished job of a batch
// (req.Batch). The caller has checked that the principal may.
func (e *Engine) Cancel(ctx context.Context, req CancelRequest) (CancelResult, error) {
	c := &cancelCmd{req: req}
	return call(ctx, e, c)
}

type cancelCmd struct {
	base
	req CancelRequest
	res CancelResult
}

func (c *cancelCmd) result() CancelResult { return c.res }

func (c *cancelCmd) apply(g *group) error {
	e := g.e
	ids := []uint64{c.req.Job}
	if c.req.Batch != 0 {
		tx, err := g.txn()
		if err != nil {
			return err
		}
		b, found, err := tx.Batch(c.req.Batch)
		if err != nil {
			return err
		}
		if !found {
			c.err = ErrNotFound
			return nil
		}
		ids = b.JobIDs()
	}
	var touched []uint64
	for _, id := range ids {
		j, found, err := g.job(id)
		if err != nil {
			return err
		}
		if !found {
			c.err = ErrNotFound
			return nil
		}
		next, res, cerr := j.Cancel(c.req.Principal, c.req.Reason, g.now, e.cfg.RunningCancel)
		if c.req.Batch == 0 {
			c.res.Job, c.res.Result, c.err = next, res, cerr
		}
		if cerr != nil {
			switch {
			case errors.Is(cerr, jobs.ErrRunningCancelDisabled):
				c.res.SkippedRunning++
			case j.Phase == jobs.PhaseSucceeded:
				c.res.AlreadySucceeded++
			case j.Phase == jobs.PhaseFailed:
				c.res.AlreadyFailed++
			}
			if len(next.Events) != len(j.Events) {
				if err := g.save(j, next); err != nil {
					return err
				}
			}
			continue
		}
		switch res {
		case jobs.AlreadyCancelled:
			c.res.AlreadyCancelled++
			continue
		case jobs.CancelledQueued:
			c.res.CancelledQueued++
			if j.Phase == jobs.PhaseQueued {
				e.sched.Remove(j.Team, j.ID)
			}
			delete(e.retryAt, j.ID)
			e.active[j.Team]--
		case jobs.CancelledRunning:
			c.res.CancelledRunning++
			c.res.Running = append(c.res.Running, next)
			e.endLease(g, j, next)
			g.revoke(j.Lease.Renderer, LeaseStatus{Job: j.ID, Token: j.Lease.Token, Reason: "JOB_CANCELLED", CurrentToken: next.LastToken(), CurrentPhase: next.Phase})
		}
		if err := g.save(j, next); err != nil {
			return err
		}
		touched = append(touched, id)
	}
	if c.req.Operator {
		action := jobs.AuditCancelJob
		switch {
		case c.req.Batch != 0:
			action = jobs.AuditCancelBatch
		case c.err != nil:
			action = jobs.AuditCancelRefused
		}
		tx, _ := g.txn()
		if _, err := tx.PutAudit(jobs.AuditRecord{At: g.now, Principal: c.req.Principal, Action: action, Reason: c.req.Reason,
			JobIDs: touched, Batch: c.req.Batch}); err != nil {
			return err
		}
	}
	return nil
}

// Replay re-queues FAILED jobs for an operator: dry-run first, bounded,
// scoped, idempotent per request id and audited.
func (e *Engine) Replay(ctx context.Context, req ReplayRequest) (ReplayResult, error) {
	if req.InScope == nil {
		req.InScope = func(string) bool { return true }
	}
	c := &replayCmd{req: req}
	return call(ctx, e, c)
}

type replayCmd struct {
	base
	req ReplayRequest
	res ReplayResult
}

func (c *replayCmd) result() ReplayResult { return c.res }

func (c *replayCmd) apply(g *group) error {
	e := g.e
	tx, err := g.txn()
	if err != nil {
		return err
	}
	c.res = ReplayResult{DryRun: c.req.DryRun, Limit: e.cfg.ReplayLimit}
	if !c.req.DryRun {
		prev, found, err := tx.ReplayByRequest(c.req.Principal, c.req.RequestID)
		if err != nil {
			return err
		}
		if found {
			c.res.Previous = prev.Response
			c.res.AuditID = prev.ID
			return nil
		}
	}
	var candidates []jobs.Job
	var missing []uint64
	if c.req.Batch != 0 {
		b, found, err := tx.Batch(c.req.Batch)
		if err != nil {
			return err
		}
		if !found {
			c.err = ErrNotFound
			return nil
		}
		for _, id := range b.JobIDs() {
			j, _, err := tx.Job(id)
			if err != nil {
				return err
			}
			if j.Phase == jobs.PhaseFailed && (c.req.TerminalReason == jobs.ReasonUnspecified || j.TerminalReason == c.req.TerminalReason) {
				candidates = append(candidates, j)
			}
		}
	} else {
		ids := slices.Clone(c.req.JobIDs)
		slices.Sort(ids)
		for _, id := range slices.Compact(ids) {
			j, found, err := tx.Job(id)
			if err != nil {
				return err
			}
			if !found {
				missing = append(missing, id)
				continue
			}
			candidates = append(candidates, j)
		}
	}
	var inScope []jobs.Job
	for _, j := range candidates {
		if c.req.InScope(j.Team) {
			inScope = append(inScope, j)
		} else {
			c.res.OutOfScope++
		}
	}
	c.res.Selected = len(inScope) + len(missing)
	for _, id := range missing {
		c.res.Items = append(c.res.Items, ReplayItem{ID: id, SkipReason: "JOB_NOT_FOUND"})
		c.res.Skipped++
	}
	// The limit bounds the jobs a call touches: skipped jobs are listed
	// but do not use it up, so a batch's retryable failures are reachable
	// behind any number of permanent ones.
	var requeued []uint64
	for _, j := range inScope {
		item := ReplayItem{Job: j, ID: j.ID}
		if err := j.CanReplay(c.req.IncludePermanent); err != nil {
			item.SkipReason = jobs.ReasonCode(err)
			c.res.Skipped++
			c.res.Items = append(c.res.Items, item)
			continue
		}
		if c.res.Requeued == c.res.Limit {
			c.res.Truncated = true
			continue
		}
		item.Requeue = true
		c.res.Requeued++
		if !c.req.DryRun {
			next, err := j.Replay(c.req.Principal, c.req.Reason, c.req.IncludePermanent, g.now)
			if err != nil {
				return err
			}
			if err := g.save(j, next); err != nil {
				return err
			}
			e.sched.Push(next.Team, next.ID)
			e.active[next.Team]++
			g.work = true
			item.Job = next
			requeued = append(requeued, j.ID)
		}
		c.res.Items = append(c.res.Items, item)
	}
	if c.req.DryRun {
		return nil
	}
	rec := jobs.AuditRecord{At: g.now, Principal: c.req.Principal, Action: jobs.AuditReplay, Reason: c.req.Reason,
		RequestID: c.req.RequestID, JobIDs: requeued, IncludePermanent: c.req.IncludePermanent, Skipped: uint32(c.res.Skipped),
		OutOfScope: uint32(c.res.OutOfScope), Batch: c.req.Batch, TerminalReason: c.req.TerminalReason}
	rec, err = tx.PutAudit(rec)
	if err != nil {
		return err
	}
	c.res.AuditID = rec.ID
	if c.req.Encode != nil {
		rec.Response = c.req.Encode(c.res)
		if _, err := tx.PutAudit(rec); err != nil {
			return err
		}
	}
	return nil
}

// SetPaused pauses or resumes dispatch. The switch is persisted and
// audited; while paused no lease is granted, and everything else works.
func (e *Engine) SetPaused(ctx context.Context, paused bool, principal, reason string) (jobs.DispatchState, error) {
	c := &pauseCmd{paused: paused, principal: principal, reason: reason}
	return call(ctx, e, c)
}

type pauseCmd struct {
	base
	paused    bool
	principal string
	reason    string
	res       jobs.DispatchState
}

func (c *pauseCmd) result() jobs.DispatchState { return c.res }

func (c *pauseCmd) apply(g *group) error {
	e := g.e
	tx, err := g.txn()
	if err != nil {
		return err
	}
	st := e.dispatchSt
	if st.Paused != c.paused {
		st = jobs.DispatchState{Paused: c.paused, Since: g.now, Principal: c.principal, Reason: c.reason}
		if err := tx.PutDispatchState(st); err != nil {
			return err
		}
		g.dispatch = true
	}
	action := jobs.AuditPause
	if !c.paused {
		action = jobs.AuditResume
		g.work = true
	}
	if _, err := tx.PutAudit(jobs.AuditRecord{At: g.now, Principal: c.principal, Action: action, Reason: c.reason}); err != nil {
		return err
	}
	e.dispatchMu.Lock()
	e.dispatchSt = st
	e.dispatchMu.Unlock()
	c.res = st
	return nil
}

// RecordAudit appends an audit record, such as an operator's refused
// attempt on a team outside its scope.
func (e *Engine) RecordAudit(ctx context.Context, rec jobs.AuditRecord) error {
	return e.do(ctx, &auditCmd{rec: rec})
}

type auditCmd struct {
	base
	rec jobs.AuditRecord
}

func (c *auditCmd) apply(g *group) error {
	tx, err := g.txn()
	if err != nil {
		return err
	}
	c.rec.ID = 0
	if c.rec.At.IsZero() {
		c.rec.At = g.now
	}
	_, err = tx.PutAudit(c.rec)
	return err
}
