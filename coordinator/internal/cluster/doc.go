// Package cluster is replication: everything of hashicorp/raft the
// coordinator uses, and nothing else of the coordinator uses raft.
package cluster
