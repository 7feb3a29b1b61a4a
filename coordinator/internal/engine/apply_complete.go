package engine

import (
	"context"
	"errors"

	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	"github.com/leasehold/leasehold/coordinator/internal/store"
)

// completeOne applies one completion. The returned error is a storage
// failure; the completion's own refusal is in the result's Err. A
// completion carrying text the store does not keep (CompleteRequest.text)
// is refused before it reads or writes anything.
//
// A success either carries its preview, stored under (job, token) in this
// transaction, or names the digest of a preview uploaded under this same
// lease. Whether that upload exists is judged after the fencing check, so a
// stale completion is refused (and recorded) as stale whatever it names.
func (e *Engine) completeOne(g *group, req CompleteRequest) (CompleteResult, error) {
	if err := req.text(); err != nil {
		return CompleteResult{Err: err}, nil
	}
	j, found, err := g.load(req.Job)
	if err != nil {
		return CompleteResult{}, err
	}
	if !found {
		return CompleteResult{Err: jobs.ErrNotFound}, nil
	}
	c := req.Completion
	if c.Success {
		if p := req.Preview; p != nil {
			c.Digest, c.ContentType, c.Size = p.Digest, p.ContentType, int64(len(p.Content))
		} else if c.Stored {
			tx, err := g.txn()
			if err != nil {
				return CompleteResult{}, err
			}
			c.ArtifactMissing = c.ArtifactMissing || tx.ObjectMissing(j.Team, c.Digest, req.Seen)
		} else {
			tx, err := g.txn()
			if err != nil {
				return CompleteResult{}, err
			}
			st, aerr := tx.Staged(req.Job, c.Token)
			switch {
			case errors.Is(aerr, store.ErrArtifactNotFound) || (aerr == nil && st.Digest != c.Digest):
				c.ArtifactMissing = true
			case aerr != nil:
				return CompleteResult{}, aerr
			default:
				c.ContentType, c.Size, c.Stored = st.ContentType, st.Size, st.Stored
				c.ArtifactMissing = st.Stored && tx.ObjectMissing(j.Team, c.Digest, st.Seen)
			}
		}
	}
	next, replayed, ferr := j.Complete(c, g.now, e.jitter())
	res := CompleteResult{Job: next, Replayed: replayed, Err: ferr}
	if ferr != nil {
		var fe *jobs.FenceError
		switch {
		case !errors.As(ferr, &fe):
			return res, nil
		case !jobs.RejectionRecorded(j, next):
			// A repeat, or past the job's cap: counted, nothing written.
			e.m.rejectedUnrecorded(jobs.ReasonCode(fe))
			return res, nil
		}
		return res, e.recordRejection(g, j, next, c, fe)
	}
	if replayed {
		return res, nil
	}
	if c.Success && (req.Preview != nil || c.Stored) {
		if err := storePreview(g, j, c, req.Preview); err != nil {
			return res, err
		}
	}
	if err := g.save(j, next); err != nil {
		return res, err
	}
	e.endLease(g, j, next)
	return res, nil
}

// storePreview writes what a success sets besides the job's record: an
// inline preview under (job, token), or one more reference to the stored
// object the pointer names (and no tombstone of it: the object the
// completion found is a new one).
func storePreview(g *group, j jobs.Job, c jobs.Completion, p *jobs.Preview) error {
	tx, err := g.txn()
	if err != nil {
		return err
	}
	if !c.Stored {
		return tx.PutArtifact(j.ID, c.Token, store.Artifact{Digest: p.Digest, ContentType: p.ContentType, Content: p.Content, Renderer: c.Renderer})
	}
	if _, ok := tx.Tomb(j.Team, c.Digest); ok {
		if err := tx.DeleteTomb(j.Team, c.Digest); err != nil {
			return err
		}
	}
	return tx.RefObject(j.Team, c.Digest)
}

// recordRejection persists a refused completion: the job's new history
// event and the rejections listing, once per token, renderer and reason
// and at most jobs.MaxRejectionEvents per cycle, and counts it in the
// metric exactly when it is listed. The listing, for operators, names the
// job's state at the time even when the refusal did not tell the caller
// (a renderer that never held a lease of the job).
func (e *Engine) recordRejection(g *group, before, after jobs.Job, c jobs.Completion, fe *jobs.FenceError) error {
	if err := g.save(before, after); err != nil {
		return err
	}
	tx, err := g.txn()
	if err != nil {
		return err
	}
	reason := jobs.ReasonCode(fe)
	e.m.rejected(reason)
	_, err = tx.PutRejection(jobs.Rejection{
		Job: before.ID, Team: before.Team, Token: c.Token, Renderer: c.Renderer, Reason: reason, At: g.now,
		CurrentToken: before.LastToken(), CurrentPhase: before.Phase, Outcome: c.Outcome(), Digest: c.Digest,
	})
	return err
}

// Stage stores a preview uploaded under a lease, after the same fencing
// check as a completion (the lease must be live and the caller's). It does
// not record a rejection: the completion that follows is what decides.
func (e *Engine) Stage(ctx context.Context, req StageRequest) error {
	return e.do(ctx, &stageCmd{req: req})
}

type stageCmd struct {
	base
	req StageRequest
}

func (c *stageCmd) size() int { return len(c.req.Preview.Content) }

func (c *stageCmd) text() error {
	return checkText("renderer_id", c.req.Renderer, "preview.digest", c.req.Preview.Digest,
		"metadata.content_type", c.req.Preview.ContentType)
}

func (c *stageCmd) evaluate(g *group) error {
	j, found, err := g.load(c.req.Job)
	if err != nil {
		return err
	}
	if !found {
		c.err = jobs.ErrNotFound
		return nil
	}
	if c.err = j.CheckLease(c.req.Token, c.req.Renderer, g.now); c.err != nil {
		return nil
	}
	if le := g.e.leases[j.ID]; le != nil {
		le.heard = true
	}
	tx, err := g.txn()
	if err != nil {
		return err
	}
	p := c.req.Preview
	a := store.Artifact{Digest: p.Digest, ContentType: p.ContentType, Content: p.Content, Renderer: c.req.Renderer}
	if c.req.Stored {
		a.Content, a.Stored, a.Size, a.Seen = nil, true, c.req.Size, c.req.Seen
	}
	return tx.PutArtifact(j.ID, c.req.Token, a)
}
