// Package shadow is a test helper: a committer (engine.Committer) that
// proves the write-set scheme of replication without consensus. It
// commits each group in place as a single node does, applies the group's
// recorded write set to a second store, and compares the two stores, so
// that a write that bypasses the recorder, or a write set that does not
// reproduce its group, shows at once. The engine's tests and the
// simulator use it; no coordinator does.
package shadow
