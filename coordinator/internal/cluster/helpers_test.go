package cluster_test

import (
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	"github.com/leasehold/leasehold/coordinator/internal/store"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// putJob writes a queued job of id, as a submission does.
func putJob(tx *store.Tx, id uint64) error {
	if _, err := tx.NextJobIDs(1); err != nil {
		return err
	}
	j := jobs.Job{ID: id, BatchID: 1, Team: "alpha", Phase: jobs.PhaseQueued, CreatedAt: t0}
	if err := tx.PutJob(j); err != nil {
		return err
	}
	return tx.SetUnfinished(id, true)
}
