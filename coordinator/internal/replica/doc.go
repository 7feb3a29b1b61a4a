// Package replica applies writer groups' write sets onto stores other than
// the one they were evaluated on: the state machine side of replication.
//
// The writer (package engine) evaluates each group against its own store
// with every write recorded (store.Tx.Record); a committer hands the
// recorded write set on. Shadow, here, is the committer that proves the
// scheme without consensus: it commits in place as a single node does,
// applies each write set to a second store, and compares the two stores'
// digests after every group, so that a write that bypasses the recorder,
// or a write set that does not reproduce its group, shows at once.
package replica
