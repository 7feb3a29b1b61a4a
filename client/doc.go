// Package client is the typed Go client for the Leasehold coordinator.
//
// Dial connects to a coordinator and returns a Client whose Jobs and Operator
// fields are the generated gRPC stubs; the methods on Client wrap the common
// calls, follow pagination, verify downloaded artifacts and convert every RPC
// error into an *Error. Callers test errors with errors.Is against the
// sentinels in this package (ErrNotFound, ErrStaleLease, ...), never by
// comparing strings:
//
//	job, err := c.GetJob(ctx, "j-12")
//	if errors.Is(err, client.ErrNotFound) { ... }
//
// Where one sentinel covers several causes, the ErrorInfo reason tells
// them apart: package reason lists every reason the coordinator gives, as
// in client.Reason(err) == string(reason.InvalidName). Package limits holds
// the API's bounds and the coordinator's default batch limits.
//
// SubmitDocuments and SubmitFiles split a submission into batches within
// the coordinator's limits (500 documents, 16 MiB inline, 200 MiB declared
// by default; see WithBatchLimits) and send batch i as "<request id>-i", so
// a retry after a partial failure stores nothing twice. FollowBatch follows
// a batch to its end across coordinator restarts, resuming from the last
// event seen of each job:
//
//	for u, err := range c.FollowBatch(ctx, batchID, client.FollowOptions{}) {
//		if err != nil { ... }
//		fmt.Println(u.JobID, u.Phase)
//	}
//
// The examples (FollowBatch, CancelJob, CancelBatch, SubmitDocuments) run
// against a coordinator, and where they need one a renderer, started in
// their own process on loopback with the development tokens; go test
// checks their output.
//
// # Against a cluster
//
// A replicated coordinator has one leader, which alone takes writes. Dial
// every replica, comma-separated, or a dns:/// name that resolves to all
// of them:
//
//	c, err := client.Dial("coord-0:7070,coord-1:7070,coord-2:7070", client.WithTLS(cfg))
//
// The client polls each replica's health entry leasehold.v1.Leader (a
// Check every 250 ms, each within 250 ms) and sends calls only to the one
// that answered SERVING; when leadership moves, calls follow it, from a
// leader that stopped answering too (a frozen process, whose connections
// stay open). Each attempt of a call has its own deadline, a third of
// what is left of the call's (MinAttemptTimeout at least,
// DefaultAttemptTimeout without one), and ends sooner once the client
// leaves the leader it went to. A unary call that the move interrupted is
// sent again, for up to
// DefaultFailoverWait (WithFailoverWait), so that a failover is latency,
// not an error; it is safe because every write is idempotent. What
// surfaces:
//
//   - after the wait, the last failover error: ErrNotLeader (a replica
//     refused the call as a follower; its Metadata may name leader_addr),
//     ErrOutcomeUnknown (leadership was lost with the write proposed:
//     sending it again is safe), or ErrUnavailable (no replica reported
//     itself the leader);
//   - at once, every other error, including ErrStorageFull and
//     ErrStorageUnavailable;
//   - for streams, which are never retried, the failover error that ended
//     them (ErrUnavailable for a stream the client ended itself because
//     its leader was left); FollowBatch watches again by itself, from the
//     last event seen.
//
// Reads are served by the leader and linearizable. WithStaleReads lets
// those a follower can answer from its own store go to any replica, which
// keeps them working during an election at the price of possibly missing
// the latest writes. A single address is dialled as it always was: no
// polling, no retries.
//
// # Transport security
//
// WithToken's bearer token goes without TLS only to a coordinator on
// loopback (every replica, for a cluster): Dial refuses another host with
// ErrPlaintextToken unless WithTLS (mutual TLS with a client certificate
// in its tls.Config) or, where the network encrypts on its own,
// WithInsecurePlaintext. Over TLS each listed replica is verified against
// its own host, unless the tls.Config's ServerName names one for all.
// WithTracerProvider
// traces the calls and sends their trace context, which the coordinator
// hands on to the renderers of a submission's jobs.
//
// The package depends only on the generated API (leaseholdv1), gRPC,
// protobuf and the OpenTelemetry trace API, never on the coordinator's
// internals.
package client
