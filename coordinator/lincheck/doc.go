// Package lincheck checks that a coordinator's answers, as its clients saw
// them over gRPC, are linearizable against the job lifecycle of DESIGN.md
// and the proto comments of leasehold.v1, in the manner of etcd's
// robustness suite: record a concurrent history, then let porcupine search
// for an order of the operations that the sequential specification accepts.
//
// # What is recorded
//
// A Record is one RPC as a client saw it: who called, when it was invoked
// and when it returned (both from one monotonic clock, time.Since of one
// base), what it asked and what it got back. A call that ended with a
// transport error or a timeout is Pending: it may or may not have taken
// effect, so its return time is infinite and the model lets it do either.
//
// # The model
//
// The history is partitioned by job id (Operations splits a SubmitBatch
// into one operation per job and an Acquire into one per granted lease).
// Per job the state is the phase, the attempt, the current lease's token
// and holder, the terminal reason, the artifact reference and every applied
// completion. Model checks, for each operation, that the answer it got is
// one the specification allows from the state the earlier operations left:
//
//   - SubmitBatch creates the job QUEUED, or FAILED (UNSUPPORTED_FORMAT)
//     when its format is known unsupported; a replayed request id creates
//     nothing.
//   - Acquire grants only a QUEUED job (a RETRY_WAIT job whose backoff has
//     elapsed counts as QUEUED), with a token larger than every token the
//     job had before and the attempt one higher, never past the maximum.
//   - Complete with the current token from the holder is applied exactly
//     once: success ends SUCCEEDED with the artifact of that token;
//     permanent failures end FAILED with their reason; a transient failure
//     waits in RETRY_WAIT, or ends FAILED (ATTEMPTS_EXHAUSTED) after the
//     last attempt. A replay of an applied completion (same token, same
//     outcome) is OK replayed and changes nothing; the same token with
//     another outcome is ABORTED OUTCOME_MISMATCH. Any other token is
//     ABORTED with the reason the situation calls for: JOB_CANCELLED for
//     the revoked lease of a cancelled job, STALE_LEASE otherwise
//     (JOB_CANCELLED is also accepted for older tokens of a cancelled job),
//     NOT_LEASE_HOLDER for the current token from another renderer.
//   - UploadArtifact succeeds only under the current lease and is refused
//     ABORTED otherwise.
//   - CancelJob of a QUEUED, RETRY_WAIT or LEASED job wins if the writer
//     applies it first (a LEASED one names the holder as still running);
//     of a CANCELLED job it is OK again (already_cancelled); of a SUCCEEDED
//     or FAILED job it is FAILED_PRECONDITION ALREADY_TERMINAL.
//   - GetJob, and the job returned by an applied Complete or CancelJob,
//     must show exactly the model's phase, attempt, lease, terminal reason,
//     artifact and cancellation.
//   - Get and Cancel by a submitter of another team are NOT_FOUND and
//     change nothing.
//
// The writer also moves jobs on its own; the model is nondeterministic
// where it does (porcupine's power-set construction): before any operation
// a RETRY_WAIT job may already be QUEUED again, and a lease granted by an
// Acquire whose answer was lost may already have been handed back (QUEUED,
// attempt not counted). Lease expiry is not modelled: the run uses a lease
// TTL far longer than the run, so LEASE_EXPIRED is never a legal answer.
//
// Porcupine cannot see across partitions, so CheckHistory adds the
// cross-job rules: fencing tokens are never reused, and a grant that
// returned before another was invoked has the smaller token.
//
// # Pending Acquires
//
// An Acquire whose answer was lost may have leased any QUEUED job under an
// unknown token. Adding it to every job's partition would be sound but
// costly; instead it is added to the partitions of the jobs whose later
// answers show a lease (or a revoked lease) held by that renderer under a
// token no answered Acquire gave it. A lost grant that no answer ever
// shows changes nothing the model can see (a hand-back restores the
// attempt; a lease left in place shows in every later GetJob, CancelJob or
// replay of that job), so leaving it out of the other partitions loses no
// violation.
//
// # Running
//
// The tests start a coordinator in-process on a loopback TCP port with a
// data directory under t.TempDir and the development tokens, with a lease
// TTL of an hour, three attempts and millisecond backoffs. Twelve clients
// (three submitters, an operator, eight renderers) call it over gRPC;
// about 2% of calls get a deadline of a few milliseconds so that some
// answers are lost. Renderers upload each preview with UploadArtifact and
// complete with its digest, a path that stays valid when Complete also
// takes the preview inline. Lost completions and submissions are repeated
// (the repeat is a replay; a submission's repeat, with the same request
// id, reveals its job ids).
//
//	go test ./coordinator/lincheck                          # 2,000 calls
//	go test ./coordinator/lincheck -run Linearizable -long  # 50,000 calls
//	LEASEHOLD_LINCHECK_OPS=200000 go test ./coordinator/lincheck -run Linearizable -timeout 1h
//
// TestLinearizableCluster (with -cluster) runs the same workload against
// three coordinator processes while their leader is killed, cut off from
// its peers and paused; clients find the leader as the client library
// does and also read every node directly, linearizable and stale. A call
// refused UNAVAILABLE NOT_LEADER was not applied, and the model lets it
// change nothing; an OUTCOME_UNKNOWN or a cut connection is Pending.
// Stale reads are left out of the model: CheckStaleReads checks that they
// show nothing from the future. docs/linearizability.md describes it.
//
//	go test ./coordinator/lincheck -run Cluster -cluster        # 3,000 calls, 1 kill
//	go test ./coordinator/lincheck -run Cluster -cluster -long  # 50,000 calls, 10 kills, 2 isolations, 2 pauses
//	go test ./coordinator/lincheck -tags lincheckmutation -run StaleReadMutant
//
// The workload also completes current leases under another renderer's id
// now and then (LEASEHOLD_LINCHECK_WRONG_HOLDER=0 turns that off). When a check fails, the failing jobs are
// logged and porcupine's visualisation is written (with go test -artifacts
// -outputdir DIR, into the test's artifact directory).
package lincheck
