// Package cluster is replication: the one package that uses
// hashicorp/raft (docs/replication.md says how and why). The leader's
// writer evaluates each group on its own store with every write recorded;
// the Committer proposes the recorded write set as one raft entry, and the
// FSM of every follower applies it to that node's store, with the entry's
// index, so followers run no command and any node's file is a single
// node's; the leader's FSM commits the evaluated transaction itself when
// raft hands it that entry (owngroup.go), so the leader writes each group
// once. A write set applies only onto the base it was evaluated on.
// Leadership promotes the writer once raft's barrier has applied earlier
// terms, extending live leases through the failover, and demotes it when
// raft's leadership ends; the leader's work runs on a goroutine of its own
// per leadership, off raft's notification channel. Reads are linearizable
// through VerifyLeader, or stale on request. A node that cannot store or
// apply the log stops (failStopLog, FSM.Fatal); an entry it cannot apply
// is recorded, so that it refuses to start until a release can apply it
// or the operator allows the skip; Recover is the way out of a lost
// quorum. The raft port (transport.go, inbound.go) speaks mutual TLS under
// a peer CA, or plaintext on loopback only: it proves who a connection is
// (within bounds of count, source address and time) before raft reads
// from it, and passes an RPC only when it claims the member its
// certificate names. Raft's errors become the engine's commit outcomes in
// errors.go alone. Steps run the leadership's promotion, demotion and
// VerifyLeader one at a time for a stand-in for raft behind the Raft
// interface (the simulator's consensus), and the FSM applies commands a
// stand-in commits (ApplyCommands).
package cluster
