package store

import (
	"bytes"
	"fmt"

	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	storagev1 "github.com/leasehold/leasehold/gen/leasehold/storage/v1"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// PutJob writes a job's record. The record never carries the history: the
// caller appends new events with PutEvents.
func (t *Tx) PutJob(j jobs.Job) error {
	_, err := t.putJob(j)
	return err
}

// PutJobAsRead writes a job's record as PutJob does and returns the job as
// Job reads the record back (no history, times in UTC without a monotonic
// reading), built from the record without decoding it: a writer that keeps
// what it wrote can later judge exactly what a read would have given it.
func (t *Tx) PutJobAsRead(j jobs.Job) (jobs.Job, error) {
	r, err := t.putJob(j)
	if err != nil {
		return jobs.Job{}, err
	}
	return jobFromRecord(r), nil
}

func (t *Tx) putJob(j jobs.Job) (*storagev1.JobRecord, error) {
	if t.jobRec == nil {
		t.jobRec = &storagev1.JobRecord{}
	}
	r := t.jobRec
	fillJobRecord(r, j)
	b, err := t.encode(r)
	if err != nil {
		return nil, fmt.Errorf("encoding job %d: %w", j.ID, err)
	}
	return r, t.put(bucketJobs, itob(j.ID), b)
}

// Job reads a job's record without its history (Events is nil); ok is
// false when there is none. This is what the writer reads.
func (t *Tx) Job(id uint64) (j jobs.Job, ok bool, err error) {
	v := t.tx.Bucket(bucketJobs).Get(itob(id))
	if v == nil {
		return jobs.Job{}, false, nil
	}
	j, err = decodeJob(id, v)
	return j, err == nil, err
}

// JobWithHistory reads a job's record and its whole history (Job.History).
func (t *Tx) JobWithHistory(id uint64) (jobs.Job, bool, error) {
	j, ok, err := t.Job(id)
	if !ok || err != nil {
		return j, ok, err
	}
	j.History, err = t.Events(id, 0)
	return j, true, err
}

func decodeJob(id uint64, v []byte) (jobs.Job, error) {
	var r storagev1.JobRecord
	if err := proto.Unmarshal(v, &r); err != nil {
		return jobs.Job{}, fmt.Errorf("decoding job %d: %w", id, err)
	}
	return jobFromRecord(&r), nil
}

// ForEachJob calls fn for every job with id > after in id order, without
// its history, until fn returns false or an error.
func (t *Tx) ForEachJob(after uint64, fn func(jobs.Job) (bool, error)) error {
	c := t.tx.Bucket(bucketJobs).Cursor()
	for k, v := c.Seek(itob(after + 1)); k != nil; k, v = c.Next() {
		j, err := decodeJob(btoi(k), v)
		if err != nil {
			return err
		}
		more, err := fn(j)
		if err != nil || !more {
			return err
		}
	}
	return nil
}

// PutEvents appends a job's new events, each under (job, seq).
func (t *Tx) PutEvents(job uint64, evs []jobs.Event) error {
	for _, ev := range evs {
		v, err := t.encode(eventToRecord(ev))
		if err != nil {
			return fmt.Errorf("encoding event %d of job %d: %w", ev.Seq, job, err)
		}
		if err := t.put(bucketEvents, eventKey(job, ev.Seq), v); err != nil {
			return err
		}
	}
	return nil
}

func eventKey(job uint64, seq uint32) []byte {
	k := make([]byte, 12)
	copy(k, itob(job))
	k[8], k[9], k[10], k[11] = byte(seq>>24), byte(seq>>16), byte(seq>>8), byte(seq)
	return k
}

// Events returns a job's events with seq > after, oldest first.
func (t *Tx) Events(job, after uint64) ([]jobs.Event, error) {
	var out []jobs.Event
	prefix := itob(job)
	c := t.tx.Bucket(bucketEvents).Cursor()
	for k, v := c.Seek(eventKey(job, uint32(min(after+1, 1<<32-1)))); k != nil && bytes.HasPrefix(k, prefix); k, v = c.Next() {
		var r storagev1.Event
		if err := proto.Unmarshal(v, &r); err != nil {
			return nil, fmt.Errorf("decoding an event of job %d: %w", job, err)
		}
		if uint64(r.Seq) <= after {
			continue
		}
		out = append(out, eventFromRecord(&r))
	}
	return out, nil
}

// PutDocument writes a job's inline content, once, at submission.
func (t *Tx) PutDocument(id uint64, content []byte) error {
	return t.put(bucketDocuments, itob(id), content)
}

// DeleteDocument drops a job's inline content, if it has any; a delete of
// nothing leaves the transaction clean.
func (t *Tx) DeleteDocument(id uint64) error {
	key := itob(id)
	c := t.tx.Bucket(bucketDocuments).Cursor()
	if k, _ := c.Seek(key); !bytes.Equal(k, key) {
		return nil
	}
	if t.fault != nil {
		if err := t.fault(string(bucketDocuments)); err != nil {
			return err
		}
	}
	t.dirty = true
	if t.rec != nil {
		t.recordDelete(bucketDocuments, key)
	}
	return c.Delete()
}

// Document returns a copy of a job's inline content (nil when none).
func (t *Tx) Document(id uint64) []byte {
	v := t.tx.Bucket(bucketDocuments).Get(itob(id))
	if v == nil {
		return nil
	}
	return bytes.Clone(v)
}

// SetUnfinished adds a job to, or removes it from, the index of unfinished
// jobs that start-up reads.
func (t *Tx) SetUnfinished(id uint64, unfinished bool) error {
	if unfinished {
		return t.put(bucketUnfinished, itob(id), nil)
	}
	return t.del(bucketUnfinished, itob(id))
}

// QueuedJob is what a ready queue needs of a QUEUED job.
type QueuedJob struct {
	ID   uint64
	Team string
	// EnqueuedAt is when the job entered its queue, in Unix nanoseconds.
	EnqueuedAt int64
}

// Job record field numbers read by ForEachUnfinished.
const (
	fieldTeam       = 3
	fieldEnqueuedAt = 42
)

// maxSteps is how many records ForEachUnfinished steps over before it
// seeks instead.
const maxSteps = 16

// ForEachUnfinished calls queued for every unfinished QUEUED job and other
// for every other unfinished job, in id order. A QUEUED job is read
// straight from its encoded record (phase, team, enqueue time), without
// decoding the rest: start-up reads every unfinished job, and most of a
// large backlog is QUEUED. Equal team names share one string.
func (t *Tx) ForEachUnfinished(queued func(QueuedJob) error, other func(jobs.Job) error) error {
	// Both buckets are in id order: the job cursor steps forward to the
	// next unfinished id, a few records at most, and seeks past a longer
	// run of finished jobs.
	jc := t.tx.Bucket(bucketJobs).Cursor()
	jk, v := jc.First()
	teams := make(map[string]string)
	c := t.tx.Bucket(bucketUnfinished).Cursor()
	for k, _ := c.First(); k != nil; k, _ = c.Next() {
		for steps := 0; jk != nil && bytes.Compare(jk, k) < 0; steps++ {
			if steps == maxSteps {
				jk, v = jc.Seek(k)
				break
			}
			jk, v = jc.Next()
		}
		if jk == nil || !bytes.Equal(jk, k) {
			return fmt.Errorf("unfinished job %d has no record", btoi(k))
		}
		q, isQueued, err := scanQueued(btoi(k), v, teams)
		if err != nil {
			return err
		}
		if isQueued {
			if err := queued(q); err != nil {
				return err
			}
			continue
		}
		j, err := decodeJob(btoi(k), v)
		if err != nil {
			return err
		}
		if err := other(j); err != nil {
			return err
		}
	}
	return nil
}

// scanQueued reads the phase, team and enqueue time of an encoded job
// record, and reports whether it is QUEUED. teams interns team names.
func scanQueued(id uint64, v []byte, teams map[string]string) (QueuedJob, bool, error) {
	q := QueuedJob{ID: id}
	var phase jobs.Phase
	for b := v; len(b) > 0; {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return q, false, fmt.Errorf("decoding job %d: %w", id, protowire.ParseError(n))
		}
		b = b[n:]
		switch {
		case typ == protowire.VarintType && (num == fieldPhase || num == fieldEnqueuedAt):
			x, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return q, false, fmt.Errorf("decoding job %d: %w", id, protowire.ParseError(n))
			}
			b = b[n:]
			if num == fieldPhase {
				phase = jobs.Phase(int32(x))
			} else {
				q.EnqueuedAt = int64(x)
			}
		case typ == protowire.BytesType && num == fieldTeam:
			name, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return q, false, fmt.Errorf("decoding job %d: %w", id, protowire.ParseError(n))
			}
			b = b[n:]
			team, ok := teams[string(name)]
			if !ok {
				team = string(name)
				teams[team] = team
			}
			q.Team = team
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return q, false, fmt.Errorf("decoding job %d: %w", id, protowire.ParseError(n))
			}
			b = b[n:]
		}
	}
	return q, phase == jobs.PhaseQueued, nil
}

// UnfinishedAfter returns up to limit ids of unfinished jobs above after,
// in id order.
func (t *Tx) UnfinishedAfter(after uint64, limit int) []uint64 {
	var out []uint64
	c := t.tx.Bucket(bucketUnfinished).Cursor()
	for k, _ := c.Seek(itob(after + 1)); k != nil && len(out) < limit; k, _ = c.Next() {
		out = append(out, btoi(k))
	}
	return out
}

func teamKey(team string, id uint64) []byte {
	k := make([]byte, 0, len(team)+9)
	k = append(k, team...)
	k = append(k, 0)
	return append(k, itob(id)...)
}

// IndexTeamJob records that job id belongs to team, for listings by team.
func (t *Tx) IndexTeamJob(team string, id uint64) error {
	return t.put(bucketTeamJobs, teamKey(team, id), nil)
}

// TeamJobsAfter returns up to limit job ids of team above after, in id order.
func (t *Tx) TeamJobsAfter(team string, after uint64, limit int) []uint64 {
	return t.teamIDs(bucketTeamJobs, team, after, limit)
}

// TeamBatchesBefore returns up to limit batch ids of team below before (0
// for the newest), newest first.
func (t *Tx) TeamBatchesBefore(team string, before uint64, limit int) []uint64 {
	prefix := append([]byte(team), 0)
	if before == 0 {
		before = ^uint64(0)
	}
	c := t.tx.Bucket(bucketTeamBatches).Cursor()
	k, _ := c.Seek(teamKey(team, before))
	if k == nil {
		k, _ = c.Last()
	}
	var out []uint64
	for ; k != nil && len(out) < limit; k, _ = c.Prev() {
		if !bytes.HasPrefix(k, prefix) {
			if bytes.Compare(k, prefix) < 0 {
				break
			}
			continue // the seek landed past the team's keys
		}
		if id := btoi(k[len(prefix):]); id < before {
			out = append(out, id)
		}
	}
	return out
}

func (t *Tx) teamIDs(bucket []byte, team string, after uint64, limit int) []uint64 {
	prefix := teamKey(team, 0)[:len(team)+1]
	var out []uint64
	c := t.tx.Bucket(bucket).Cursor()
	for k, _ := c.Seek(teamKey(team, after+1)); k != nil && bytes.HasPrefix(k, prefix) && len(out) < limit; k, _ = c.Next() {
		if len(k) == len(prefix)+8 {
			out = append(out, btoi(k[len(prefix):]))
		}
	}
	return out
}

// ForEachJobID calls fn with the id of every job above after, in id order,
// until fn returns false; it decodes nothing.
func (t *Tx) ForEachJobID(after uint64, fn func(uint64) bool) error {
	c := t.tx.Bucket(bucketJobs).Cursor()
	for k, _ := c.Seek(itob(after + 1)); k != nil; k, _ = c.Next() {
		if !fn(btoi(k)) {
			return nil
		}
	}
	return nil
}

// Job record field numbers read by JobStates (leasehold.storage.v1.JobRecord).
const (
	fieldPhase    = 9
	fieldEventSeq = 43
)

// JobStates returns the phase and last event seq of the jobs first to
// first+n-1, in id order, skipping ids without a record. It reads those two
// fields straight from the encoded records, without decoding the rest.
func (t *Tx) JobStates(first uint64, n int) ([]jobs.State, error) {
	out := make([]jobs.State, 0, n)
	c := t.tx.Bucket(bucketJobs).Cursor()
	end := first + uint64(n)
	for k, v := c.Seek(itob(first)); k != nil && btoi(k) < end; k, v = c.Next() {
		st, err := scanState(btoi(k), v)
		if err != nil {
			return nil, err
		}
		out = append(out, st)
	}
	return out, nil
}

// scanState reads the phase and event sequence of an encoded job record.
func scanState(id uint64, v []byte) (jobs.State, error) {
	st := jobs.State{ID: id}
	for b := v; len(b) > 0; {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return st, fmt.Errorf("decoding job %d: %w", id, protowire.ParseError(n))
		}
		b = b[n:]
		if typ == protowire.VarintType && (num == fieldPhase || num == fieldEventSeq) {
			x, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return st, fmt.Errorf("decoding job %d: %w", id, protowire.ParseError(n))
			}
			b = b[n:]
			if num == fieldPhase {
				st.Phase = jobs.Phase(int32(x))
			} else {
				st.EventSeq = uint32(x)
			}
			continue
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return st, fmt.Errorf("decoding job %d: %w", id, protowire.ParseError(n))
		}
		b = b[n:]
	}
	return st, nil
}
