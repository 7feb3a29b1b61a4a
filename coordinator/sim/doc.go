// Package sim is a deterministic simulator of the coordinator's core: the
// real state machine (package jobs), dispatch, timers and group-commit
// writer (package engine) over a real bbolt file, driven from one
// goroutine by a seeded scheduler on a simulated clock.
//
// Around the writer it plays every actor: submitters (batches, retries and
// duplicates of one request id, a request id reused for other documents),
// session renderers (open, replace, close, credits, receipts, heartbeats,
// completions with the preview inline, cancel acknowledgements, drains
// with hand-backs, pauses past their leases, crashes without a word, late,
// stale and replayed completions, other renderers' tokens), a renderer on
// the unary path, and an operator (cancel a job or a batch, replay failed
// jobs, pause and resume dispatch). Between them and the writer is a
// network that delays, loses and reorders messages (a stream keeps its
// order and breaks instead). The coordinator crashes with commands
// queued, and after a commit before its answers leave, and fail-stops when
// a write of a group fails; a restart reopens the file and rebuilds the
// writer from what was committed. The writer's group boundaries are drawn
// by the scheduler too (engine.Stepper).
//
// After every writer group the checker tests every invariant of the
// design on what the group committed (each event against the job's past,
// each touched record against its events, the writer's indexes against
// the store) and on every answer leaving the coordinator; every few
// hundred groups, after each restart and at the end, it checks the whole
// store (store.VerifySince). A quiescent phase without faults must then
// end every job. A failure names its seed, and the same seed replays the
// run step for step.
//
// # Cluster mode
//
// With Config.Cluster (-cluster) the coordinator is three nodes, each over
// its own bbolt file. hashicorp/raft cannot run inside the simulator (it
// starts goroutines and reads real timers), so a seeded consensus oracle
// stands in for it and produces every outcome raft allows; raft's own
// test suites cover the algorithm, the simulator covers the coordinator's
// half of replication. The node that leads runs the real writer through
// a Stepper whose committer rolls the evaluated group back and proposes
// its write set to the oracle, which commits it (applied with
// store.ApplyWriteSets, as the FSM applies it: at once on the leader, after
// a lag on each follower), refuses it (NOT_LEADER), or leaves its outcome
// unknown (OUTCOME_UNKNOWN: the entry reached some followers, then the
// leader died, was cut off, or a follower's election timer fired; it
// commits if the next leader holds it, or is cut from every log). The
// oracle also kills, stops (SIGSTOP) and cuts off leaders and followers,
// delays followers, hands leadership over, and now and then has a second
// proposer slip a write set of a past base into the log. An election
// picks a node with the most up-to-date log among a reachable quorum
// (raft's election restriction), truncates divergent tails and commits
// the winner's log; the new leader's coordinator commits and applies
// every entry before its barrier, then promotes the writer with the
// failover's lease extension and the store's wall floor, as package
// cluster's leadership does. Clients and renderers send to a node whose
// Leader health entry they last saw SERVING (a stopped leader's stays
// so); renderer sessions belong to one process of one node, end with
// NOT_LEADER when its writer is demoted, and renderers reopen them with
// the leases they hold wherever the writer leads. A stopped process runs
// what reached it when it resumes, before it hears from its peers.
//
// On top of every check above, a cluster run checks that stores at an
// equal applied index have equal digests (checkpoints taken at the full
// checks, compared as each node reaches them), that no grant reaches a
// renderer before its entry is committed, that the base guard
// (ErrStaleBase) refuses exactly the second proposer's entries, that a
// read served by a node that verified its leadership sees every
// submission answered before it was sent, that no lease live at a
// promotion expires before a TTL and the extension from it, that a
// quiescent cluster has a leader within ten TTLs, and at the end that
// every node, caught up, holds the leader's store record for record.
// Acknowledged submissions must survive every failover, tokens grow
// across terms, and no job ends twice, as across a single node's
// restarts.
//
// # Running it
//
//	go test ./coordinator/sim -seeds 20            twenty seeds from a random one
//	go test ./coordinator/sim -seed 42 -seeds 1 -trace   replay seed 42 step by step
//	go test ./coordinator/sim -cluster -seeds 20   the same, in cluster mode
//	scripts/sim [-budget 10m] [-sync] [-cluster]   seeds for a wall-clock budget
//	go test -tags simmutation -run TestMutationsAreCaught ./coordinator/sim
//
// The last switches on deliberate bugs and fails unless the simulator
// catches each: on a single node, the state machine's (the fencing check
// removed; a cancel that leaves the lease in force); in cluster mode,
// replication's (effects published before the commit returns; the
// writer's in-memory state kept across terms; fencing tokens from a
// counter in memory; no lease extension on promotion; a promotion without
// the barrier; reads served on raft's own belief that the node leads).
//
// # What it does not cover
//
// Everything below the bbolt API is real but not attacked: power loss,
// torn or reordered writes, a kernel or file system that loses an fsync,
// disk corruption and a full disk cannot be produced by closing and
// reopening a file in one process, and are not simulated. By default the
// file is opened with bbolt's NoSync, since a restart here never needs
// the fsync; Config.Sync keeps it. The gRPC layer (package server: the
// error table, authentication, the wire codec, message limits) is not in
// the loop: actors call the engine as the handlers do, and the
// end-to-end and linearizability tests cover that edge. Fair dispatch is
// exercised but its bound is not checked here (package dispatch has its
// own model tests), nor are wall-clock steps, watches, listings, uploads
// outside a completion, or long polls that wait. In cluster mode the
// consensus itself is the oracle's, not raft's: message-level raft
// behaviour (pre-vote, log replication order, snapshots and their
// installation, membership changes) is not simulated, nor are clock skew
// between nodes or a wiped node rejoining by snapshot.
package sim
