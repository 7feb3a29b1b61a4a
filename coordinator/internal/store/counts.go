package store

import (
	"fmt"

	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	storagev1 "github.com/leasehold/leasehold/gen/leasehold/storage/v1"
	"google.golang.org/protobuf/proto"
)

// BatchCounts returns a batch's counts per phase.
func (t *Tx) BatchCounts(batch uint64) (jobs.Counts, error) {
	return t.counts(bucketBatchCounts, itob(batch))
}

// TeamCounts returns a team's counts per phase.
func (t *Tx) TeamCounts(team string) (jobs.Counts, error) {
	return t.counts(bucketTeamCounts, []byte(team))
}

// ForEachTeamCounts calls fn for every team that ever had a job.
func (t *Tx) ForEachTeamCounts(fn func(team string, c jobs.Counts) error) error {
	return t.tx.Bucket(bucketTeamCounts).ForEach(func(k, v []byte) error {
		c, err := decodeCounts(v)
		if err != nil {
			return fmt.Errorf("decoding the counts of team %s: %w", k, err)
		}
		return fn(string(k), c)
	})
}

// AddBatchCounts adds d to a batch's counts.
func (t *Tx) AddBatchCounts(batch uint64, d jobs.Counts) error {
	return t.addCounts(bucketBatchCounts, itob(batch), d)
}

// AddTeamCounts adds d to a team's counts.
func (t *Tx) AddTeamCounts(team string, d jobs.Counts) error {
	return t.addCounts(bucketTeamCounts, []byte(team), d)
}

func (t *Tx) counts(bucket, key []byte) (jobs.Counts, error) {
	v := t.tx.Bucket(bucket).Get(key)
	if v == nil {
		return jobs.Counts{}, nil
	}
	return decodeCounts(v)
}

func (t *Tx) addCounts(bucket, key []byte, d jobs.Counts) error {
	c, err := t.counts(bucket, key)
	if err != nil {
		return err
	}
	c.Add(d)
	return t.putCounts(bucket, key, c)
}

func (t *Tx) putCounts(bucket, key []byte, c jobs.Counts) error {
	r := &storagev1.PhaseCounts{Counts: make([]uint64, len(c))}
	for i, v := range c {
		r.Counts[i] = uint64(max(v, 0))
	}
	v, err := proto.Marshal(r)
	if err != nil {
		return err
	}
	return t.put(bucket, key, v)
}

func decodeCounts(v []byte) (jobs.Counts, error) {
	var r storagev1.PhaseCounts
	if err := proto.Unmarshal(v, &r); err != nil {
		return jobs.Counts{}, err
	}
	var c jobs.Counts
	for i, n := range r.Counts {
		if i < len(c) {
			c[i] = int64(n)
		}
	}
	return c, nil
}
