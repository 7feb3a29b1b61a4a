package cluster

import "time"

// BatchEntries is how many entries a follower's batch holds at most.
const BatchEntries = batchEntries

// HoldBatches makes f the state machine of a follower whose batch stays
// open across calls until Flush, Lead, Snapshot or its bound commits it:
// its timer waits an hour.
func (f *FSM) HoldBatches() { f.holdBatches(func() bool { return false }, time.Hour, time.Hour) }

// Abandon rolls the open batch back, as the process's death would.
func (f *FSM) Abandon() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.batch == nil {
		return nil
	}
	if f.timer != nil {
		f.timer.Stop()
	}
	b := f.batch
	f.batch = nil
	f.pending.Store(0)
	return b.Rollback()
}

// SetMetrics gives f the metrics a running node's state machine has.
func (f *FSM) SetMetrics(m *Metrics) { f.metrics = m }
