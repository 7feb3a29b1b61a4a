package engine

import (
	"errors"
	"io"
	"slices"
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	"github.com/leasehold/leasehold/coordinator/internal/store"
)

// ScanBudget bounds the job records one listing page examines, so that a
// page costs the same however many jobs are stored; a page that runs out of
// budget returns what it found with a cursor to continue from.
const ScanBudget = 5000

// Job reads a job with its history; ErrNotFound when there is none.
func (e *Engine) Job(id uint64) (jobs.Job, error) {
	var j jobs.Job
	err := e.st.View(func(tx *store.Tx) error {
		var found bool
		var err error
		j, found, err = tx.JobWithHistory(id)
		if err == nil && !found {
			err = ErrNotFound
		}
		return err
	})
	return j, err
}

// Events returns a job's events with seq above after, oldest first.
func (e *Engine) Events(id uint64, after uint32) ([]jobs.Event, error) {
	var evs []jobs.Event
	err := e.st.View(func(tx *store.Tx) error {
		var err error
		evs, err = tx.Events(id, uint64(after))
		return err
	})
	return evs, err
}

// Artifact reads the preview of a SUCCEEDED job: the one stored under the
// lease whose completion set its artifact reference.
func (e *Engine) Artifact(j jobs.Job) (store.Artifact, error) {
	var a store.Artifact
	err := e.st.View(func(tx *store.Tx) error {
		var err error
		a, err = tx.Artifact(j.ID, j.Artifact.Token)
		return err
	})
	return a, err
}

// Batch reads a batch and its counts per phase.
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
		c, err := tx.BatchCounts(id)
		v = BatchView{Batch: b, Counts: c, Done: c.Unfinished() == 0}
		return err
	})
	return v, err
}

// BatchStates returns the phase and last event seq of every job of a batch,
// in id order, read from the records without decoding them whole: what a
// watch needs to open.
func (e *Engine) BatchStates(id uint64) ([]store.JobState, error) {
	var out []store.JobState
	err := e.st.View(func(tx *store.Tx) error {
		b, found, err := tx.Batch(id)
		if err != nil {
			return err
		}
		if !found {
			return ErrNotFound
		}
		out, err = tx.JobStates(b.FirstJob, int(b.Count))
		return err
	})
	return out, err
}

// ListJobs returns one page of the jobs with ids above f.After that match
// f, in id order. It walks the narrowest index for the filter (the batch's
// id range, the teams' job indexes, the unfinished-jobs index for a live
// phase) and examines at most ScanBudget records.
func (e *Engine) ListJobs(f JobFilter) (JobPage, error) {
	if f.Limit <= 0 {
		f.Limit = 100
	}
	var page JobPage
	err := e.st.View(func(tx *store.Tx) error {
		ids, more, err := candidates(tx, f)
		if err != nil {
			return err
		}
		for i, id := range ids {
			var j jobs.Job
			var found bool
			if f.History {
				j, found, err = tx.JobWithHistory(id)
			} else {
				j, found, err = tx.Job(id)
			}
			if err != nil {
				return err
			}
			if found && (f.Teams == nil || slices.Contains(f.Teams, j.Team)) && (f.Phase == jobs.PhaseUnspecified || f.Phase == j.Phase) {
				page.Jobs = append(page.Jobs, j)
			}
			if len(page.Jobs) == f.Limit {
				if i < len(ids)-1 || more {
					page.Next = id
				}
				return nil
			}
		}
		if more && len(ids) > 0 {
			page.Next = ids[len(ids)-1]
		}
		return nil
	})
	return page, err
}

// candidates returns, in id order, up to ScanBudget ids of jobs above
// f.After that may match f, and whether the index has more past them.
func candidates(tx *store.Tx, f JobFilter) ([]uint64, bool, error) {
	switch {
	case f.Batch != 0:
		b, found, err := tx.Batch(f.Batch)
		if err != nil {
			return nil, false, err
		}
		if !found {
			return nil, false, ErrNotFound
		}
		var ids []uint64
		for id := max(f.After+1, b.FirstJob); id < b.FirstJob+uint64(b.Count) && len(ids) < ScanBudget; id++ {
			ids = append(ids, id)
		}
		return ids, len(ids) > 0 && ids[len(ids)-1] < b.FirstJob+uint64(b.Count)-1, nil
	case f.Teams != nil:
		var ids []uint64
		more := false
		for _, t := range f.Teams {
			got := tx.TeamJobsAfter(t, f.After, ScanBudget)
			more = more || len(got) == ScanBudget
			ids = append(ids, got...)
		}
		slices.Sort(ids)
		ids = slices.Compact(ids)
		if len(ids) > ScanBudget {
			ids, more = ids[:ScanBudget], true
		}
		return ids, more, nil
	case f.Phase == jobs.PhaseQueued || f.Phase == jobs.PhaseLeased || f.Phase == jobs.PhaseRetryWait:
		ids := tx.UnfinishedAfter(f.After, ScanBudget)
		return ids, len(ids) == ScanBudget, nil
	default:
		var ids []uint64
		err := tx.ForEachJobID(f.After, func(id uint64) bool {
			ids = append(ids, id)
			return len(ids) < ScanBudget
		})
		return ids, len(ids) == ScanBudget, err
	}
}

// ListRejections returns one page of rejected completions below f.Before
// that match f, newest first, examining at most ScanBudget records; Next is
// the id to continue below, or 0 at the end.
func (e *Engine) ListRejections(f RejectionFilter) (RejectionPage, error) {
	if f.Limit <= 0 {
		f.Limit = 100
	}
	var page RejectionPage
	err := e.st.View(func(tx *store.Tx) error {
		examined := 0
		return tx.ForEachRejection(f.Before, func(r jobs.Rejection) (bool, error) {
			if !f.Since.IsZero() && r.At.Before(f.Since) {
				return false, nil
			}
			examined++
			ok := (f.Job == 0 || r.Job == f.Job) && (f.Renderer == "" || r.Renderer == f.Renderer) &&
				(f.Until.IsZero() || r.At.Before(f.Until)) && (f.Teams == nil || slices.Contains(f.Teams, r.Team))
			if ok {
				page.Rejections = append(page.Rejections, r)
			}
			if len(page.Rejections) == f.Limit || examined == ScanBudget {
				page.Next = r.ID
				return false, nil
			}
			return true, nil
		})
	})
	if err == nil && page.Next == 1 {
		page.Next = 0
	}
	return page, err
}

// ListAudit returns one page of audit records below f.Before that
// f.Visible allows, newest first, examining at most ScanBudget records;
// Next is the id to continue below, or 0 at the end.
func (e *Engine) ListAudit(f AuditFilter) (AuditPage, error) {
	if f.Limit <= 0 {
		f.Limit = 100
	}
	var page AuditPage
	err := e.st.View(func(tx *store.Tx) error {
		examined := 0
		return tx.ForEachAudit(f.Before, func(a jobs.AuditRecord) (bool, error) {
			examined++
			if f.Visible == nil || f.Visible(a.Teams) {
				page.Records = append(page.Records, a)
			}
			if len(page.Records) == f.Limit || examined == ScanBudget {
				page.Next = a.ID
				return false, nil
			}
			return true, nil
		})
	})
	if err == nil && page.Next == 1 {
		page.Next = 0
	}
	return page, err
}

// IsNotFound reports whether err says a job or batch does not exist.
func IsNotFound(err error) bool { return errors.Is(err, ErrNotFound) }

// BackupInfo describes a backup as it starts; TakenAt is the writer's
// wall clock then.
type BackupInfo struct {
	store.BackupInfo
	TakenAt time.Time
}

// Backup writes a consistent copy of the whole database to w, from one
// read transaction, calling start first with what it is about to write
// (see store.WriteBackup). It does not go through the writer, which goes
// on meanwhile.
func (e *Engine) Backup(w io.Writer, start func(BackupInfo) error) (int64, error) {
	return e.st.WriteBackup(w, func(info store.BackupInfo) error {
		return start(BackupInfo{BackupInfo: info, TakenAt: e.cfg.Now()})
	})
}
