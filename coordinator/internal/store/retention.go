package store

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	storagev1 "github.com/leasehold/leasehold/gen/leasehold/storage/v1"
	"google.golang.org/protobuf/proto"
)

// Retention: what has ended is deleted once it is older than its retention
// period, in bounded steps that the engine's writer applies. Terminal jobs
// are found through the "finished" index, keyed by (finish time, job id),
// so a step reads only what it deletes; rejections and audit records are
// appended in id order, roughly their time order, and are deleted from the
// oldest.
//
// A file written before the index existed is indexed in steps as well
// (BackfillFinished), from a cursor kept in the meta bucket.

// finishedKey is the "finished" index key of a job that ended at t.
func finishedKey(t time.Time, id uint64) []byte {
	k := make([]byte, 16)
	binary.BigEndian.PutUint64(k, uint64(max(t.UnixNano(), 0)))
	binary.BigEndian.PutUint64(k[8:], id)
	return k
}

// FinishTime is when a terminal job ended, as retention measures it: its
// finish time, or for a record without one (written by schema 1) its last
// update, or its creation.
func FinishTime(j jobs.Job) time.Time {
	switch {
	case !j.FinishedAt.IsZero():
		return j.FinishedAt
	case !j.UpdatedAt.IsZero():
		return j.UpdatedAt
	}
	return j.CreatedAt
}

// IndexFinished records that terminal job j ended, for retention. The
// writer calls it in the transaction that makes j terminal.
func (t *Tx) IndexFinished(j jobs.Job) error {
	return t.put(bucketFinished, finishedKey(FinishTime(j), j.ID), nil)
}

// UnindexFinished removes j's retention entry: a replay made it live again.
// j is the record as it was while terminal.
func (t *Tx) UnindexFinished(j jobs.Job) error {
	return t.del(bucketFinished, finishedKey(FinishTime(j), j.ID))
}

// Finished names an entry of the finished-jobs index.
type Finished struct {
	Job uint64
	At  time.Time
}

// FinishedBefore returns up to limit entries of the finished-jobs index
// that ended before cutoff, oldest first.
func (t *Tx) FinishedBefore(cutoff time.Time, limit int) []Finished {
	end := uint64(max(cutoff.UnixNano(), 0))
	var out []Finished
	c := t.tx.Bucket(bucketFinished).Cursor()
	for k, _ := c.First(); k != nil && len(out) < limit; k, _ = c.Next() {
		at := binary.BigEndian.Uint64(k)
		if at >= end {
			break
		}
		out = append(out, Finished{Job: btoi(k[8:]), At: time.Unix(0, int64(at)).UTC()})
	}
	return out
}

// DropFinished deletes one entry of the finished-jobs index, one that no
// longer names a terminal job ending then.
func (t *Tx) DropFinished(f Finished) error {
	return t.del(bucketFinished, finishedKey(f.At, f.Job))
}

// PurgeJob deletes terminal job j and everything that is only its: the
// record, its history, its document, its previews, and its entries in the
// team and finished-jobs indexes, and counts it in its batch's Purged, so
// that a check can tell the batch's deleted jobs from lost ones. jobs.Counts
// per phase are the caller's: the writer moves them with the job. The
// batch stays until DeleteBatch.
func (t *Tx) PurgeJob(j jobs.Job) error {
	if !j.Phase.Terminal() {
		return fmt.Errorf("purging job %d: it is %v, not terminal", j.ID, j.Phase)
	}
	b, found, err := t.Batch(j.BatchID)
	if err != nil {
		return err
	}
	if found {
		b.Purged++
		if err := t.PutBatch(b); err != nil {
			return err
		}
	}
	if err := t.deletePrefix(bucketEvents, itob(j.ID)); err != nil {
		return err
	}
	if err := t.DeleteArtifacts(j.ID, 0); err != nil {
		return err
	}
	// Pointers go before objects: the object is the sweep's to delete once
	// no pointer of the team names it.
	if j.Phase == jobs.PhaseSucceeded && j.Artifact.Stored {
		if err := t.UnrefObject(j.Team, j.Artifact.Digest); err != nil {
			return err
		}
	}
	if err := t.DeleteDocument(j.ID); err != nil {
		return err
	}
	for _, d := range []struct{ bucket, key []byte }{
		{bucketTeamJobs, teamKey(j.Team, j.ID)},
		{bucketFinished, finishedKey(FinishTime(j), j.ID)},
		{bucketJobs, itob(j.ID)},
	} {
		if err := t.del(d.bucket, d.key); err != nil {
			return err
		}
	}
	return nil
}

// deletePrefix deletes every key of bucket that starts with prefix.
func (t *Tx) deletePrefix(bucket, prefix []byte) error {
	c := t.tx.Bucket(bucket).Cursor()
	var doomed [][]byte
	for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
		doomed = append(doomed, bytes.Clone(k))
	}
	for _, k := range doomed {
		if err := t.del(bucket, k); err != nil {
			return err
		}
	}
	return nil
}

// BatchHasJobs reports whether any job of b is still stored.
func (t *Tx) BatchHasJobs(b jobs.Batch) bool {
	k, _ := t.tx.Bucket(bucketJobs).Cursor().Seek(itob(b.FirstJob))
	return k != nil && btoi(k) < b.FirstJob+uint64(b.Count)
}

// DeleteBatch deletes batch b, whose jobs are all purged: its record, its
// counts, its entry in the team index and its request id, which a later
// submission may then use again.
func (t *Tx) DeleteBatch(b jobs.Batch) error {
	if t.BatchHasJobs(b) {
		return fmt.Errorf("deleting batch %d: it still has jobs", b.ID)
	}
	dels := []struct{ bucket, key []byte }{
		{bucketBatches, itob(b.ID)},
		{bucketBatchCounts, itob(b.ID)},
		{bucketTeamBatches, teamKey(b.Team, b.ID)},
	}
	// The request id names this batch unless something went wrong long
	// ago; never delete another batch's entry.
	if v := t.tx.Bucket(bucketRequests).Get(requestKey(b.Team, b.RequestID)); v != nil && btoi(v) == b.ID {
		dels = append(dels, struct{ bucket, key []byte }{bucketRequests, requestKey(b.Team, b.RequestID)})
	}
	for _, d := range dels {
		if err := t.del(d.bucket, d.key); err != nil {
			return err
		}
	}
	return nil
}

// PurgeRejections deletes up to limit of the oldest rejected completions
// recorded before cutoff and returns how many it deleted. It walks in id
// order and stops at the first record within retention.
func (t *Tx) PurgeRejections(cutoff time.Time, limit int) (int, error) {
	return t.purgeLog(bucketRejections, limit, func(k, v []byte) (bool, error) {
		var r storagev1.RejectionRecord
		if err := proto.Unmarshal(v, &r); err != nil {
			return false, fmt.Errorf("decoding rejection %d: %w", btoi(k), err)
		}
		return tm(r.At).Before(cutoff), nil
	})
}

// PurgeAudit deletes up to limit of the oldest audit records written
// before cutoff, with the request-id entries of the replays among them
// (the same request id then replays again), and returns how many it
// deleted. It walks in id order and stops at the first record within
// retention.
func (t *Tx) PurgeAudit(cutoff time.Time, limit int) (int, error) {
	var replays [][]byte
	n, err := t.purgeLog(bucketAudit, limit, func(k, v []byte) (bool, error) {
		var r storagev1.AuditRecord
		if err := proto.Unmarshal(v, &r); err != nil {
			return false, fmt.Errorf("decoding audit %d: %w", btoi(k), err)
		}
		if !tm(r.At).Before(cutoff) {
			return false, nil
		}
		if r.Action == jobs.AuditReplay && r.RequestId != "" {
			rk := replayKey(r.Principal, r.RequestId)
			if idx := t.tx.Bucket(bucketReplays).Get(rk); idx != nil && bytes.Equal(idx, k) {
				replays = append(replays, rk)
			}
		}
		return true, nil
	})
	if err != nil {
		return n, err
	}
	for _, k := range replays {
		if err := t.del(bucketReplays, k); err != nil {
			return n, err
		}
	}
	return n, nil
}

// purgeLog deletes keys of an append-only bucket from the first while old
// says so, at most limit of them.
func (t *Tx) purgeLog(bucket []byte, limit int, old func(k, v []byte) (bool, error)) (int, error) {
	var doomed [][]byte
	c := t.tx.Bucket(bucket).Cursor()
	for k, v := c.First(); k != nil && len(doomed) < limit; k, v = c.Next() {
		ok, err := old(k, v)
		if err != nil {
			return 0, err
		}
		if !ok {
			break
		}
		doomed = append(doomed, bytes.Clone(k))
	}
	for _, k := range doomed {
		if err := t.del(bucket, k); err != nil {
			return 0, err
		}
	}
	return len(doomed), nil
}

// BackfillPending reports whether jobs that ended before the finished-jobs
// index existed are still being indexed.
func (t *Tx) BackfillPending() bool {
	return t.tx.Bucket(bucketMeta).Get(keyFinishedBackfill) != nil
}

// BackfillFinished indexes, for retention, the terminal jobs among the next
// limit job records of a file written before the finished-jobs index
// existed, and moves the cursor on; at the end it drops the cursor. It
// returns how many records it read and whether the backfill is done.
// Indexing a job twice writes the same key, so it is safe beside jobs the
// writer indexes as they end.
func (t *Tx) BackfillFinished(limit int) (int, bool, error) {
	meta := t.tx.Bucket(bucketMeta)
	v := meta.Get(keyFinishedBackfill)
	if v == nil {
		return 0, true, nil
	}
	after := btoi(v)
	n := 0
	var last uint64
	done := true
	err := t.ForEachJob(after, func(j jobs.Job) (bool, error) {
		if n == limit {
			done = false
			return false, nil
		}
		n++
		last = j.ID
		if j.Phase.Terminal() {
			return true, t.IndexFinished(j)
		}
		return true, nil
	})
	if err != nil {
		return n, false, err
	}
	if done {
		return n, true, t.del(bucketMeta, keyFinishedBackfill)
	}
	return n, false, t.put(bucketMeta, keyFinishedBackfill, itob(last))
}
