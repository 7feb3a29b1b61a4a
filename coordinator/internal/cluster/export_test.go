package cluster

// BatchEntries is how many entries a follower's batch holds at most.
const BatchEntries = batchEntries

// HoldBatches makes f the state machine of a follower whose batch stays
// open across calls until Flush, Lead, Snapshot or its bound commits it.
func (f *FSM) HoldBatches() { f.HoldBatchesUntilFlush(func() bool { return false }) }

// SetMetrics gives f the metrics a running node's state machine has.
func (f *FSM) SetMetrics(m *Metrics) { f.metrics = m }

// OnOwnTaken has f called each time a state machine took an own group
// for a command, before it ends it, until the test ends.
func OnOwnTaken(t interface{ Cleanup(func()) }, f func()) {
	ownTaken = f
	t.Cleanup(func() { ownTaken = func() {} })
}

// OnBatchCommitted has f called each time a state machine's batch
// committed, before the state machine takes its state, until the test ends.
func OnBatchCommitted(t interface{ Cleanup(func()) }, f func()) {
	batchCommitted = f
	t.Cleanup(func() { batchCommitted = func() {} })
}

// LastGroup returns the index of the last write set f's store committed.
func (f *FSM) LastGroup() uint64 {
	rs, err := f.st.ReplicaState()
	if err != nil {
		panic(err)
	}
	return rs.Group
}
