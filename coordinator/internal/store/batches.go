package store

import (
	"fmt"

	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	storagev1 "github.com/leasehold/leasehold/gen/leasehold/storage/v1"
	"google.golang.org/protobuf/proto"
)

func requestKey(team, requestID string) []byte {
	return []byte(team + "\x00" + requestID)
}

// PutBatch writes a batch record and indexes it under its team and its
// request id.
func (t *Tx) PutBatch(b jobs.Batch) error {
	v, err := proto.Marshal(batchToRecord(b))
	if err != nil {
		return fmt.Errorf("encoding batch %d: %w", b.ID, err)
	}
	if err := t.put(bucketBatches, itob(b.ID), v); err != nil {
		return err
	}
	if err := t.put(bucketTeamBatches, teamKey(b.Team, b.ID), nil); err != nil {
		return err
	}
	return t.put(bucketRequests, requestKey(b.Team, b.RequestID), itob(b.ID))
}

// Batch reads a batch record.
func (t *Tx) Batch(id uint64) (jobs.Batch, bool, error) {
	v := t.tx.Bucket(bucketBatches).Get(itob(id))
	if v == nil {
		return jobs.Batch{}, false, nil
	}
	var r storagev1.BatchRecord
	if err := proto.Unmarshal(v, &r); err != nil {
		return jobs.Batch{}, false, fmt.Errorf("decoding batch %d: %w", id, err)
	}
	return batchFromRecord(&r), true, nil
}

// BatchByRequest finds the batch a team submitted with requestID.
func (t *Tx) BatchByRequest(team, requestID string) (jobs.Batch, bool, error) {
	v := t.tx.Bucket(bucketRequests).Get(requestKey(team, requestID))
	if v == nil {
		return jobs.Batch{}, false, nil
	}
	return t.Batch(btoi(v))
}

// BatchesBefore returns up to limit batch ids below before (0 for the
// newest), newest first, over every team. It decodes nothing.
func (t *Tx) BatchesBefore(before uint64, limit int) []uint64 {
	var out []uint64
	_ = reverse(t.tx.Bucket(bucketBatches).Cursor(), before, func(k, _ []byte) (bool, error) {
		out = append(out, btoi(k))
		return len(out) < limit, nil
	})
	return out
}
