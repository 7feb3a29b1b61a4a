package reads

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	"github.com/leasehold/leasehold/coordinator/internal/store"
)

// Reader reads the store: jobs, batches, listings, previews and backups.
// Any goroutine may call it; each read is one short read transaction.
type Reader struct {
	st  *store.Store
	now func() time.Time
}

// NewReader returns a reader of st; now stamps a backup's time.
func NewReader(st *store.Store, now func() time.Time) *Reader { return &Reader{st: st, now: now} }

// ScanBudget bounds the job records one listing page examines, so that a
// page costs the same however many jobs are stored; a page that runs out of
// budget returns what it found with a cursor to continue from.
const ScanBudget = 5000

// Job reads a job with its history; jobs.ErrNotFound when there is none.
func (r *Reader) Job(id uint64) (jobs.Job, error) {
	var j jobs.Job
	err := r.st.View(func(tx *store.Tx) error {
		var found bool
		var err error
		j, found, err = tx.JobWithHistory(id)
		if err == nil && !found {
			err = jobs.ErrNotFound
		}
		return err
	})
	return j, err
}

// Record reads a job's record without its history; jobs.ErrNotFound when
// there is none. The renderer service reads it, off the writer, for the
// team a preview of the job is stored under.
func (r *Reader) Record(id uint64) (jobs.Job, error) {
	var j jobs.Job
	err := r.st.View(func(tx *store.Tx) error {
		var found bool
		var err error
		j, found, err = tx.Job(id)
		if err == nil && !found {
			err = jobs.ErrNotFound
		}
		return err
	})
	return j, err
}

// ObjectRefs lists the artifact store's objects that pointers name, with
// how many pointers name each (backup, check).
func (r *Reader) ObjectRefs() ([]store.ObjectRef, error) {
	var out []store.ObjectRef
	err := r.st.View(func(tx *store.Tx) error {
		out = tx.ObjectRefsList()
		return nil
	})
	return out, err
}

// Tombs lists the tombstones of objects the sweep doomed.
func (r *Reader) Tombs() ([]store.TombEntry, error) {
	var out []store.TombEntry
	err := r.st.View(func(tx *store.Tx) error {
		out = tx.Tombs()
		return nil
	})
	return out, err
}

// ObjectClock reads the object clock (store.Tx.ObjectClock): a caller
// reads it before it checks or puts an object of the artifact store, and
// hands the reading to the writer with the completion or upload that names
// the object.
func (r *Reader) ObjectClock() (uint64, error) {
	var n uint64
	err := r.st.View(func(tx *store.Tx) error {
		n = tx.ObjectClock()
		return nil
	})
	return n, err
}

// Events returns a job's events with seq above after, oldest first.
func (r *Reader) Events(id uint64, after uint32) ([]jobs.Event, error) {
	var evs []jobs.Event
	err := r.st.View(func(tx *store.Tx) error {
		var err error
		evs, err = tx.Events(id, uint64(after))
		return err
	})
	return evs, err
}

// Artifact reads the preview of a SUCCEEDED job: the one stored under the
// lease whose completion set its artifact reference.
func (r *Reader) Artifact(j jobs.Job) (jobs.Preview, error) {
	var p jobs.Preview
	err := r.st.View(func(tx *store.Tx) error {
		a, err := tx.Artifact(j.ID, j.Artifact.Token)
		if errors.Is(err, store.ErrArtifactNotFound) {
			return fmt.Errorf("%w: %w", jobs.ErrArtifactNotFound, err)
		}
		p = jobs.Preview{Digest: a.Digest, ContentType: a.ContentType, Content: a.Content}
		return err
	})
	return p, err
}

// Batch reads a batch and its counts per phase.
func (r *Reader) Batch(id uint64) (BatchView, error) {
	var v BatchView
	err := r.st.View(func(tx *store.Tx) error {
		b, found, err := tx.Batch(id)
		if err != nil {
			return err
		}
		if !found {
			return jobs.ErrNotFound
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
func (r *Reader) BatchStates(id uint64) ([]jobs.State, error) {
	var out []jobs.State
	err := r.st.View(func(tx *store.Tx) error {
		b, found, err := tx.Batch(id)
		if err != nil {
			return err
		}
		if !found {
			return jobs.ErrNotFound
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
func (r *Reader) ListJobs(f JobFilter) (JobPage, error) {
	if f.Limit <= 0 {
		f.Limit = 100
	}
	var page JobPage
	err := r.st.View(func(tx *store.Tx) error {
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
			return nil, false, jobs.ErrNotFound
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
func (r *Reader) ListRejections(f RejectionFilter) (RejectionPage, error) {
	var page RejectionPage
	err := r.st.View(func(tx *store.Tx) (err error) {
		page.Rejections, page.Next, err = newestFirst(tx.ForEachRejection, f.Before, f.Limit,
			func(r jobs.Rejection) uint64 { return r.ID },
			func(r jobs.Rejection) (keep, stop bool) {
				if !f.Since.IsZero() && r.At.Before(f.Since) {
					return false, true
				}
				return (f.Job == 0 || r.Job == f.Job) && (f.Renderer == "" || r.Renderer == f.Renderer) &&
					(f.Until.IsZero() || r.At.Before(f.Until)) && (f.Teams == nil || slices.Contains(f.Teams, r.Team)), false
			})
		return err
	})
	return page, err
}

// ListAudit returns one page of audit records below f.Before that
// f.Visible allows, newest first, examining at most ScanBudget records;
// Next is the id to continue below, or 0 at the end.
func (r *Reader) ListAudit(f AuditFilter) (AuditPage, error) {
	var page AuditPage
	err := r.st.View(func(tx *store.Tx) (err error) {
		page.Records, page.Next, err = newestFirst(tx.ForEachAudit, f.Before, f.Limit,
			func(a jobs.AuditRecord) uint64 { return a.ID },
			func(a jobs.AuditRecord) (keep, stop bool) { return f.Visible == nil || f.Visible(a.Teams), false })
		return err
	})
	return page, err
}

// newestFirst pages an append-only log newest first: up to limit (0: 100)
// records below before that keep accepts, examining at most ScanBudget, and
// stopping early where keep says so. next is the id to continue below, or
// 0 when the log has nothing more to examine.
func newestFirst[T any](forEach func(uint64, func(T) (bool, error)) error, before uint64, limit int,
	id func(T) uint64, keep func(T) (keep, stop bool)) (out []T, next uint64, err error) {
	if limit <= 0 {
		limit = 100
	}
	examined := 0
	err = forEach(before, func(r T) (bool, error) {
		ok, stop := keep(r)
		if stop {
			return false, nil
		}
		examined++
		if ok {
			out = append(out, r)
		}
		if len(out) == limit || examined == ScanBudget {
			next = id(r)
			return false, nil
		}
		return true, nil
	})
	if next == 1 {
		next = 0 // ids start at 1: nothing lies below
	}
	return out, next, err
}

// ListBatches returns one page of the batches below f.Before that match f,
// newest first, each with its counts per phase from the batch_counts
// bucket. It walks the batches by id (the team_batches index when f.Teams
// is set, merged across the teams) and examines at most ScanBudget
// batches; a page that runs out of budget returns what it found with a
// cursor. Batch ids follow the order the writer stored the batches in, so
// the listing ends at the first batch created before f.CreatedAfter.
func (r *Reader) ListBatches(f BatchFilter) (BatchPage, error) {
	if f.Limit <= 0 {
		f.Limit = 100
	}
	var page BatchPage
	err := r.st.View(func(tx *store.Tx) error {
		var ids []uint64
		if f.Teams == nil {
			ids = tx.BatchesBefore(f.Before, ScanBudget)
		} else {
			for _, t := range f.Teams {
				ids = append(ids, tx.TeamBatchesBefore(t, f.Before, ScanBudget)...)
			}
			slices.SortFunc(ids, func(a, b uint64) int { return cmp.Compare(b, a) })
			ids = slices.Compact(ids)
			ids = ids[:min(len(ids), ScanBudget)]
		}
		for _, id := range ids {
			b, found, err := tx.Batch(id)
			if err != nil {
				return err
			}
			if !found {
				continue
			}
			if !f.CreatedAfter.IsZero() && b.CreatedAt.Before(f.CreatedAfter) {
				return nil
			}
			c, err := tx.BatchCounts(id)
			if err != nil {
				return err
			}
			v := BatchView{Batch: b, Counts: c, Done: c.Unfinished() == 0}
			ok := (f.CreatedBefore.IsZero() || b.CreatedAt.Before(f.CreatedBefore)) &&
				(f.State == BatchAny || (f.State == BatchDone) == v.Done)
			if ok {
				page.Batches = append(page.Batches, v)
			}
			if len(page.Batches) == f.Limit {
				page.Next = id
				return nil
			}
		}
		if len(ids) == ScanBudget {
			page.Next = ids[len(ids)-1]
		}
		return nil
	})
	if err == nil && page.Next == 1 {
		page.Next = 0
	}
	return page, err
}

// IsNotFound reports whether err says a job or batch does not exist.
func IsNotFound(err error) bool { return errors.Is(err, jobs.ErrNotFound) }

// BackupInfo describes a backup as it starts; TakenAt is the writer's
// wall clock then.
type BackupInfo struct {
	store.BackupInfo
	TakenAt time.Time
}

// ErrBackupSpace is returned by Backup when the database's file system
// has no room for the copy it takes first (store.ErrBackupSpace).
var ErrBackupSpace = store.ErrBackupSpace

// Backup writes a consistent copy of the whole database to w, calling
// start first with what it is about to write. The copy is taken from one
// short read transaction into a temporary file beside the database, and w
// is fed from the file, so a slow w holds no transaction (see
// store.WriteBackup). It does not go through the writer, which goes on
// meanwhile.
func (r *Reader) Backup(w io.Writer, start func(BackupInfo) error) (int64, error) {
	return r.st.WriteBackup(w, func(info store.BackupInfo) error {
		return start(BackupInfo{BackupInfo: info, TakenAt: r.now()})
	})
}

// JobFilter selects jobs for ListJobs.
type JobFilter struct {
	Batch uint64
	// Teams limits the listing to these teams; nil means every team.
	Teams []string
	Phase jobs.Phase
	// After is the last id of the previous page.
	After uint64
	Limit int
	// History loads each job's events too.
	History bool
}

// JobPage is one page of ListJobs. Next is the id to continue after, or 0
// at the end; a page may hold fewer than Limit jobs and still have a Next
// when its scan budget ran out.
type JobPage struct {
	Jobs []jobs.Job
	Next uint64
}

// RejectionFilter selects rejected completions, newest first.
type RejectionFilter struct {
	Job      uint64
	Renderer string
	Since    time.Time
	Until    time.Time
	// Before is the last id of the previous page (0 for the first).
	Before uint64
	Limit  int
	// Teams limits the listing to these teams; nil means every team.
	Teams []string
}

// RejectionPage is one page of ListRejections; Next is the id to continue
// below, or 0 at the end.
type RejectionPage struct {
	Rejections []jobs.Rejection
	Next       uint64
}

// AuditPage is one page of ListAudit; Next is the id to continue below, or
// 0 at the end.
type AuditPage struct {
	Records []jobs.AuditRecord
	Next    uint64
}

// AuditFilter selects audit records, newest first.
type AuditFilter struct {
	Before uint64
	Limit  int
	// Visible reports whether the caller may see a record touching teams
	// (none for dispatch-wide actions); nil shows every record.
	Visible func(teams []string) bool
}

// BatchState selects batches by whether every job of theirs is terminal.
type BatchState int

// BatchFilter selects batches for ListBatches, newest first.
type BatchFilter struct {
	// Teams limits the listing to these teams; nil means every team.
	Teams []string
	State BatchState
	// CreatedAfter and CreatedBefore bound the creation time (either may be
	// zero): after is inclusive, before exclusive.
	CreatedAfter  time.Time
	CreatedBefore time.Time
	// Before is the last id of the previous page (0 for the first).
	Before uint64
	Limit  int
}

// BatchPage is one page of ListBatches; Next is the id to continue below,
// or 0 at the end.
type BatchPage struct {
	Batches []BatchView
	Next    uint64
}

// BatchView is a batch with its job counts per phase.
type BatchView struct {
	Batch  jobs.Batch
	Counts jobs.Counts
	Done   bool
}

// The batch states ListBatches filters on.
const (
	// BatchAny selects every batch.
	BatchAny BatchState = iota
	// BatchRunning selects batches with a job not yet terminal.
	BatchRunning
	// BatchDone selects batches whose jobs are all terminal.
	BatchDone
)
