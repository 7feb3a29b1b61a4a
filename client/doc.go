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
// WithToken's bearer token goes without TLS only to a coordinator on
// loopback: Dial refuses another host with ErrPlaintextToken unless WithTLS
// (mutual TLS with a client certificate in its tls.Config) or, where the
// network encrypts on its own, WithInsecurePlaintext. WithTracerProvider
// traces the calls and sends their trace context, which the coordinator
// hands on to the renderers of a submission's jobs.
//
// The package depends only on the generated API (leaseholdv1), gRPC,
// protobuf and the OpenTelemetry trace API, never on the coordinator's
// internals.
package client
