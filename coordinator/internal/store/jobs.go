package store

import (
	"fmt"

	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	storagev1 "github.com/leasehold/leasehold/gen/leasehold/storage/v1"
	"google.golang.org/protobuf/proto"
)

// PutJob writes a job record.
func (t *Tx) PutJob(j jobs.Job) error {
	b, err := proto.Marshal(jobToRecord(j))
	if err != nil {
		return fmt.Errorf("encoding job %d: %w", j.ID, err)
	}
	return t.put(bucketJobs, itob(j.ID), b)
}

// Job reads a job record; ok is false when there is none.
func (t *Tx) Job(id uint64) (j jobs.Job, ok bool, err error) {
	v := t.tx.Bucket(bucketJobs).Get(itob(id))
	if v == nil {
		return jobs.Job{}, false, nil
	}
	var r storagev1.JobRecord
	if err := proto.Unmarshal(v, &r); err != nil {
		return jobs.Job{}, false, fmt.Errorf("decoding job %d: %w", id, err)
	}
	return jobFromRecord(&r), true, nil
}

// ForEachJob calls fn for every job with id > after in id order until fn
// returns false or an error.
func (t *Tx) ForEachJob(after uint64, fn func(jobs.Job) (bool, error)) error {
	c := t.tx.Bucket(bucketJobs).Cursor()
	for k, v := c.Seek(itob(after + 1)); k != nil; k, v = c.Next() {
		var r storagev1.JobRecord
		if err := proto.Unmarshal(v, &r); err != nil {
			return fmt.Errorf("decoding job %d: %w", btoi(k), err)
		}
		more, err := fn(jobFromRecord(&r))
		if err != nil || !more {
			return err
		}
	}
	return nil
}

// PutDocument writes a job's inline content, once, at submission.
func (t *Tx) PutDocument(id uint64, content []byte) error {
	b, err := proto.Marshal(&storagev1.DocumentRecord{Content: content})
	if err != nil {
		return err
	}
	return t.put(bucketDocuments, itob(id), b)
}

// Document returns a copy of a job's inline content (nil when none).
func (t *Tx) Document(id uint64) ([]byte, error) {
	v := t.tx.Bucket(bucketDocuments).Get(itob(id))
	if v == nil {
		return nil, nil
	}
	var r storagev1.DocumentRecord
	if err := proto.Unmarshal(v, &r); err != nil {
		return nil, fmt.Errorf("decoding document %d: %w", id, err)
	}
	return r.Content, nil
}
