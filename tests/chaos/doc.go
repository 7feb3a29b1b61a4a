// Package chaos puts the coordinator's guarantees under faults, with real
// processes, real bbolt files and real fsync, and checks them afterwards
// from what every client was told and from the store. Its test is the
// crash campaign; the rest of the package is the campaign's harness, load
// and invariant checker.
//
// Usage, from the repository root:
//
//	go test -v ./tests/chaos                      # 20 crash cycles, as scripts/test runs it
//	go test -v ./tests/chaos -cycles 200          # the long run
//	go test -v ./tests/chaos -seed N -keep        # the same schedule again, keeping data and logs
//	go test -v ./tests/chaos -raft -cycles 6 -failpoint-every 2   # on raft, crashing inside the apply
//
// The flags after the package are the campaign's (go test -v ./tests/chaos
// -args -h lists them): -cycles, -seed, -keep, -min-uptime, -max-uptime,
// -failpoint-every, -fire-timeout, -drain-timeout, -renderers, -lease-ttl,
// -tmp and -raft. A run of more than a few hundred cycles needs go test's
// -timeout raised above its 10 minutes. -v shows the report of a run that
// passes; one that fails shows it anyway. With -short the campaign is
// skipped.
//
// # The crash campaign
//
// It builds the coordinator with the failpoints build tag (see
// coordinator/internal/engine/failpoints.go) into a temporary directory,
// unless $LEASEHOLD_BIN holds one built so, and takes the renderer from
// $LEASEHOLD_BIN or builds it there too. Then it starts a coordinator on
// a fresh data directory (lease TTL 2 s, 3 attempts, backoff 20 to
// 200 ms), two renderers on the
// session path (8 slots each, 2 to 22 ms a render, 15% transient failures,
// each appending every grant it receives to its --record file) and a load
// generator built on the client library: three submitters keeping up to 40
// batches of 1 to 12 documents in flight (8% of the documents fail for
// good when rendered, 2% are refused at submission as an unsupported
// format), each batch followed to its end with FollowBatch; a canceller
// cancelling a random job in flight every 25 ms; an operator replaying
// failed jobs every 100 ms, each job at most twice. Every call is sent again
// with the same request id until it is answered, so that a crash leaves no
// call unanswered, and every answer is logged (journal.jsonl).
//
// Then, -cycles times, the coordinator is crashed; with it down, its data
// file is checked ("coordinator check": bbolt's consistency check, then the
// records' agreement: unfinished-job index, batches whole, counts per
// phase, lease tokens); and a new coordinator is started on it, timed from
// exec to the first SERVING answer of grpc.health.v1 (polled every 5 ms).
// A crash is a SIGKILL at a random moment 50 to 500 ms after SERVING,
// except every fourth (-failpoint-every), which arms one of the writer's
// failpoints instead, in turn, to panic after a random number of passes:
//
//   - beforeCommit: a group's commands applied and its grants made in the
//     open transaction, nothing committed;
//   - grantsUnpublished: a group that granted leases committed, no renderer
//     told (the lease is recovered, never heard from, and re-queued
//     uncounted);
//   - afterCommit: a group committed and published, no caller answered (the
//     callers send again and are answered from the store);
//   - replayMidway: an operator replay has re-queued a job in the open
//     transaction, the rest of its jobs and its audit record not yet.
//
// With -raft the coordinator is a raft cluster of one voter: every group
// is an entry of its raft log, which its state machine applies to the
// store, as on every node of a cluster. The replicated apply's failpoints
// (coordinator/internal/cluster and store, failpoints.go) are then armed
// first, in turn:
//
//   - beforeApply: entries committed in the raft log, none applied to the
//     store (on this leader, also the group it evaluated for its own
//     entry, not yet committed: the restart applies the entry's write
//     set from the log);
//   - applyBeforeCommit: the entries' writes and their applied index made
//     in the store's open transaction, nothing committed;
//   - applyCommitted: the entries committed to the store, raft not told
//     (raft applies them again after the restart, and the store skips
//     them).
//
// A restart must apply what the crash left unapplied and skip what was
// applied: a process that stops on its own log replay (exit 3) ends the
// run.
//
// After the last crash a coordinator is started and left running: the load
// stops submitting, cancelling and replaying, the calls under way are
// answered, and every batch is followed to its end (-drain-timeout). The
// renderers stop, the final state is read (every job with its history, the
// audit trail, the renderers' grants), the coordinator is stopped with
// SIGTERM and its file checked once more. Then it checks that:
//
//   - every acknowledged batch is stored whole and as acknowledged, and no
//     job is stored that no answer announced (lost jobs: 0);
//   - no fencing token is granted twice, in the store's histories or among
//     the grants the renderers received;
//   - tokens only grow across restarts: every grant's token is above the
//     token counter the previous process left and at most the one its own
//     left (on raft, the one the next process left: the store of a stopped
//     process may lag its log), and the counter never goes down;
//   - every grant a renderer received is in the store: nothing is published
//     before it is durable;
//   - no job cycle has two terminal events (a replay starts a new cycle);
//   - no job is left unfinished after the drain;
//   - attempts, and uncounted re-queues of leases never heard from, stay
//     within the maximum;
//   - what was answered or published stands: watched terminal events are in
//     the histories, jobs answered cancelled are CANCELLED, every
//     acknowledged replay is in the re-queued jobs' histories and once in
//     the audit trail;
//   - every check of the data file, one after each process, found nothing.
//
// The test fails on any violation, on a refusal the load did not expect,
// and when an armed failpoint never fired. It logs a line per crash, then
// the report: crash cycles, what was acknowledged, each count above, and
// the restart time's p50 and p99; and a FIGURE line that sums it up. Its
// directory (data, process logs, journal) is kept when it fails, or with
// -keep. -seed repeats the kill
// schedule, the failpoints' counts and the documents; the timing of the
// processes makes every run different all the same.
//
// # What it does not cover
//
// SIGKILL ends the process, not the machine. Whatever the process wrote,
// fsynced or not, is in the kernel's page cache and reaches the file, so
// these crashes prove the coordinator's ordering (commit before answer,
// the token counter persisted with the grant, a group committed whole or
// not at all) and bbolt's recovery from an interrupted process, but a
// missing fsync would go unnoticed. Power loss, where unsynced writes are
// lost and a disk may reorder or tear them, cannot be simulated on these
// machines: that needs a block device or file system that drops unsynced
// writes (device-mapper's flakey target, a FUSE layer), which an
// unprivileged build does not have. For that the coordinator relies on
// bbolt's fsync discipline (a commit syncs before it returns; the writer
// answers after) and bbolt's own power-failure tests.
//
// Not covered here either: a full or failing disk (the store and engine
// tests inject those faults), renderer crashes (the end-to-end tests) and
// frozen renderers (scripts/paused-worker); nor more than one coordinator
// (tests/failover crashes a cluster's followers inside the apply), network
// partitions or clock steps.
package chaos
