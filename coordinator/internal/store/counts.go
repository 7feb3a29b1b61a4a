package store

import (
	"fmt"

	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	storagev1 "github.com/leasehold/leasehold/gen/leasehold/storage/v1"
	"google.golang.org/protobuf/proto"
)

// Counts is a number of jobs per phase, indexed by jobs.Phase.
type Counts [jobs.PhaseCancelled + 1]int64

// Add adds d to c.
func (c *Counts) Add(d Counts) {
	for i := range c {
		c[i] += d[i]
	}
}

// Total returns the number of jobs counted.
func (c Counts) Total() int64 {
	var n int64
	for _, v := range c {
		n += v
	}
	return n
}

// Unfinished returns the number of jobs not in a terminal phase.
func (c Counts) Unfinished() int64 {
	return c[jobs.PhaseQueued] + c[jobs.PhaseLeased] + c[jobs.PhaseRetryWait]
}

// BatchCounts returns a batch's counts per phase.
func (t *Tx) BatchCounts(batch uint64) (Counts, error) {
	return t.counts(bucketBatchCounts, itob(batch))
}

// TeamCounts returns a team's counts per phase.
func (t *Tx) TeamCounts(team string) (Counts, error) {
	return t.counts(bucketTeamCounts, []byte(team))
}

// ForEachTeamCounts calls fn for every team that ever had a job.
func (t *Tx) ForEachTeamCounts(fn func(team string, c Counts) error) error {
	return t.tx.Bucket(bucketTeamCounts).ForEach(func(k, v []byte) error {
		c, err := decodeCounts(v)
		if err != nil {
			return fmt.Errorf("decoding the counts of team %s: %w", k, err)
		}
		return fn(string(k), c)
	})
}

// AddBatchCounts adds d to a batch's counts.
func (t *Tx) AddBatchCounts(batch uint64, d Counts) error {
	return t.addCounts(bucketBatchCounts, itob(batch), d)
}

// AddTeamCounts adds d to a team's counts.
func (t *Tx) AddTeamCounts(team string, d Counts) error {
	return t.addCounts(bucketTeamCounts, []byte(team), d)
}

func (t *Tx) counts(bucket, key []byte) (Counts, error) {
	v := t.tx.Bucket(bucket).Get(key)
	if v == nil {
		return Counts{}, nil
	}
	return decodeCounts(v)
}

func (t *Tx) addCounts(bucket, key []byte, d Counts) error {
	c, err := t.counts(bucket, key)
	if err != nil {
		return err
	}
	c.Add(d)
	return t.putCounts(bucket, key, c)
}

func (t *Tx) putCounts(bucket, key []byte, c Counts) error {
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

func decodeCounts(v []byte) (Counts, error) {
	var r storagev1.PhaseCounts
	if err := proto.Unmarshal(v, &r); err != nil {
		return Counts{}, err
	}
	var c Counts
	for i, n := range r.Counts {
		if i < len(c) {
			c[i] = int64(n)
		}
	}
	return c, nil
}
