package engine

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"

	"github.com/leasehold/leasehold/client/reason"
	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	"github.com/leasehold/leasehold/coordinator/internal/reads"
)

// Submit stores a batch, all or nothing. The batch is validated against the
// limits before it reaches the writer; the writer checks the request id and
// the team's queue depth, then writes every job, its document, its
// ready-queue entry and its indexes in the one transaction that answers the
// caller. A renderer waiting for work is granted in that same transaction.
func (e *Engine) Submit(ctx context.Context, req SubmitRequest) (SubmitResult, error) {
	c, err := e.newSubmitCmd(req)
	if err != nil {
		return SubmitResult{}, err
	}
	return call(ctx, e, c)
}

// newSubmitCmd validates req against the limits and builds its command,
// off the writer goroutine.
func (e *Engine) newSubmitCmd(req SubmitRequest) (*submitCmd, error) {
	if err := jobs.ValidateBatch(req.Team, req.RequestID, req.Docs, req.Policy, e.cfg.Limits); err != nil {
		return nil, err
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
		c.bytes += len(d.Content)
	}
	return c, nil
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
	bytes  int
	res    SubmitResult
}

func (c *submitCmd) result() SubmitResult { return c.res }

func (c *submitCmd) text() error {
	if err := checkText("team", c.req.Team, "request_id", c.req.RequestID, "trace_parent", c.req.TraceParent); err != nil {
		return err
	}
	// The stored documents: req.Docs's, with the size and digest filled in.
	for i, d := range c.docs {
		for _, f := range [...]struct{ name, s string }{
			{"name", d.Name}, {"content_type", d.ContentType}, {"source_uri", d.SourceURI}, {"content_sha256", d.ContentSHA256},
		} {
			if !storable(f.s) {
				return badText(fmt.Sprintf("documents[%d].%s", i, f.name))
			}
		}
	}
	return nil
}

func (c *submitCmd) size() int { return c.bytes }

func (c *submitCmd) evaluate(g *group) error {
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
			c.err = &jobs.ValidationError{Err: jobs.ErrRequestIDReused, Reason: reason.RequestIDReused, Violations: []jobs.Violation{{
				Field: "request_id", Reason: reason.RequestIDReused, Description: "request id " + c.req.RequestID + " was used for a different batch",
			}}}
			return nil
		}
		counts, err := tx.BatchCounts(prev.ID)
		if err != nil {
			return err
		}
		if d := g.batchDelta[prev.ID]; d != nil {
			counts.Add(*d)
		}
		c.res = SubmitResult{Batch: reads.BatchView{Batch: prev, Counts: counts, Done: counts.Unfinished() == 0}, Replayed: true}
		return nil
	}
	limit := e.cfg.Limits.MaxTeamQueue
	used := 0
	if tc := e.teamCounts[c.req.Team]; tc != nil {
		used = int(tc.Unfinished())
	}
	if used+len(c.docs) > limit {
		c.err = &jobs.ValidationError{Err: jobs.ErrTeamQueueFull, Reason: reason.TeamQueueFull, Limit: limit, Used: used,
			Violations: []jobs.Violation{{Field: "team", Reason: reason.TeamQueueFull, Description: "team " + c.req.Team + " has too many unfinished jobs"}}}
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
	var counts jobs.Counts
	for i, doc := range c.docs {
		j := jobs.New(first+uint64(i), batchID, b.Team, doc, c.policy, e.cfg.Unsupported.Unsupported(doc), g.now)
		content := c.req.Docs[i].Content
		j.ContentBytes = int64(len(content))
		j.TraceParent = c.req.TraceParent
		if err := g.save(jobs.Job{}, j); err != nil {
			return err
		}
		if err := tx.IndexTeamJob(j.Team, j.ID); err != nil {
			return err
		}
		if len(content) > 0 && j.Phase == jobs.PhaseQueued {
			if err := tx.PutDocument(j.ID, content); err != nil {
				return err
			}
		}
		counts[j.Phase]++
		if j.Phase == jobs.PhaseQueued {
			e.sched.Push(j.Team, j.ID)
			g.work = true
		}
	}
	c.res = SubmitResult{Batch: reads.BatchView{Batch: b, Counts: counts, Done: counts.Unfinished() == 0}}
	return nil
}
