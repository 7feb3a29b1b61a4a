package engine

import (
	"slices"

	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	"github.com/leasehold/leasehold/coordinator/internal/store"
)

// Job reads a job; ErrNotFound when there is none.
func (e *Engine) Job(id uint64) (jobs.Job, error) {
	var j jobs.Job
	err := e.st.View(func(tx *store.Tx) error {
		var found bool
		var err error
		j, found, err = tx.Job(id)
		if err == nil && !found {
			err = ErrNotFound
		}
		return err
	})
	return j, err
}

// Document reads a job's inline content (nil when it had none).
func (e *Engine) Document(id uint64) ([]byte, error) {
	var b []byte
	err := e.st.View(func(tx *store.Tx) error {
		var err error
		b, err = tx.Document(id)
		return err
	})
	return b, err
}

// Batch reads a batch and counts its jobs per phase.
func (e *Engine) Batch(id uint64) (BatchView, error) {
	var v BatchView
	err := e.st.View(func(tx *store.Tx) error {
		b, found, err := tx.Batch(id)
		if err != nil {
			return err
		}
		if !found {
			return ErrNotFound
		}
		v = BatchView{Batch: b, Counts: make(map[jobs.Phase]int), Done: true}
		return tx.ForEachJob(b.FirstJob-1, func(j jobs.Job) (bool, error) {
			if j.ID >= b.FirstJob+uint64(b.Count) {
				return false, nil
			}
			v.Counts[j.Phase]++
			if !j.Phase.Terminal() {
				v.Done = false
			}
			return true, nil
		})
	})
	return v, err
}

// ListJobs returns up to f.Limit jobs with ids above f.After that match f,
// in id order.
func (e *Engine) ListJobs(f JobFilter) ([]jobs.Job, error) {
	if f.Limit <= 0 {
		f.Limit = 100
	}
	var out []jobs.Job
	err := e.st.View(func(tx *store.Tx) error {
		after, end := f.After, uint64(0)
		if f.Batch != 0 {
			b, found, err := tx.Batch(f.Batch)
			if err != nil {
				return err
			}
			if !found {
				return ErrNotFound
			}
			after = max(after, b.FirstJob-1)
			end = b.FirstJob + uint64(b.Count)
		}
		return tx.ForEachJob(after, func(j jobs.Job) (bool, error) {
			if end != 0 && j.ID >= end {
				return false, nil
			}
			if (f.Teams == nil || slices.Contains(f.Teams, j.Team)) && (f.Phase == jobs.PhaseUnspecified || f.Phase == j.Phase) {
				out = append(out, j)
			}
			return len(out) < f.Limit, nil
		})
	})
	return out, err
}

// ListRejections returns up to f.Limit rejected completions, newest first.
func (e *Engine) ListRejections(f RejectionFilter) ([]jobs.Rejection, error) {
	if f.Limit <= 0 {
		f.Limit = 100
	}
	var out []jobs.Rejection
	err := e.st.View(func(tx *store.Tx) error {
		return tx.ForEachRejection(f.Before, func(r jobs.Rejection) (bool, error) {
			if !f.Since.IsZero() && r.At.Before(f.Since) {
				return false, nil
			}
			ok := (f.Job == 0 || r.Job == f.Job) && (f.Renderer == "" || r.Renderer == f.Renderer) &&
				(f.Until.IsZero() || r.At.Before(f.Until)) && (f.Teams == nil || slices.Contains(f.Teams, r.Team))
			if ok {
				out = append(out, r)
			}
			return len(out) < f.Limit, nil
		})
	})
	return out, err
}

// ListAudit returns up to limit audit records below before, newest first.
func (e *Engine) ListAudit(before uint64, limit int) ([]jobs.AuditRecord, error) {
	if limit <= 0 {
		limit = 100
	}
	var out []jobs.AuditRecord
	err := e.st.View(func(tx *store.Tx) error {
		return tx.ForEachAudit(before, func(a jobs.AuditRecord) (bool, error) {
			out = append(out, a)
			return len(out) < limit, nil
		})
	})
	return out, err
}
