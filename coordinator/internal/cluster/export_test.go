package cluster

import (
	"github.com/hashicorp/raft"
	storagev1 "github.com/leasehold/leasehold/gen/leasehold/storage/v1"
	"google.golang.org/protobuf/proto"
)

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

// finishedBucket is the finished-jobs index's number in the write set
// format (store's bucketIDs, which never renumber).
const finishedBucket = 17

// FinishedJobs counts the jobs the write sets of logs finish: their puts
// into the finished index.
func FinishedJobs(logs []*raft.Log) int {
	n := 0
	for _, l := range logs {
		ws, err := decodeEntry(l.Data)
		if l.Type != raft.LogCommand || err != nil {
			continue
		}
		var m storagev1.WriteSet
		if proto.Unmarshal(ws, &m) != nil {
			continue
		}
		for _, op := range m.GetOps() {
			if op.GetBucket() == finishedBucket && op.GetKind() == storagev1.WriteOp_KIND_PUT {
				n++
			}
		}
	}
	return n
}
