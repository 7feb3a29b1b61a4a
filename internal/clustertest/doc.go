// Package clustertest runs a replicated coordinator cluster as real
// processes on loopback, for tests that put it under faults. It is a
// layer on package stack, which lays out the nodes and starts their
// processes; it starts n coordinator processes with the cluster flags (--node-id, --listen,
// --raft-listen, --peers, --data-dir; bbolt and the raft log fsync as in
// production), finds the leader from the gRPC health service
// leasehold.v1.Leader, and kills (SIGKILL), pauses (SIGSTOP and SIGCONT),
// isolates, restarts and wipes nodes. Renderers run as real processes
// too, given every node's address.
//
// Isolation needs no privileges: the peers list names, for each node, a
// TCP proxy in front of its raft listener, and the proxy tells which node
// dialled from the sender's raft address in the first request (see
// partition). Isolating a node closes every raft connection from or to
// it and refuses new ones; its gRPC listener stays reachable, so that
// clients and renderers still talk to a deposed leader.
//
// With Options.GRPCProxies each node's gRPC listener sits behind a TCP
// proxy (package tcpproxy), which clients and renderers dial, so that
// Blackhole can stall the path to one node's API both ways while its raft
// traffic flows; the cluster's own health checks go to the listeners
// directly. Options.DataDirs puts the nodes' data on directories of the
// test's choosing, such as filesystems it can freeze (package frozenfs).
//
// A stopped node's store is read with "coordinator check --json": its
// consistency, its digest over every record and the raft index it
// applied, so that a test can compare the nodes' stores once the cluster
// is quiet.
//
// It is imported by tests only. Methods that fail the test they were
// started with must be called from its goroutine; Isolate, Heal,
// Blackhole, Unblackhole, Check, Leader, AwaitLeader and AwaitServing may
// be called from any.
package clustertest
