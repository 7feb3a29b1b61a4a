// Package edge holds the coordinator's gRPC edge concerns that sit in front
// of the services and know nothing of jobs: a server codec that turns
// undecodable requests into INVALID_ARGUMENT, per-principal caps on
// long-lived streams, and counting and rate-limited logging of refused
// calls.
//
// # Malformed requests
//
// grpc-go decodes a request before any interceptor runs and answers every
// decoding failure INTERNAL (rpc_util.go recv), which blames the server for
// a client's bytes: a string field with invalid UTF-8 (proto3 validates
// strings) or plain garbage. ServerCodec, installed with
// grpc.ForceServerCodecV2, wraps the proto codec: when decoding fails it
// does not fail but resets the message and marks it with an unknown field
// of the highest field number that carries a per-process nonce, the path of
// the offending field and the decoder's error. A client cannot forge the
// mark, since it does not know the nonce. MalformedUnaryInterceptor and
// MalformedStreamInterceptor refuse a marked message with INVALID_ARGUMENT.
// A well-formed message has no unknown fields, so the check costs a length
// test of an empty slice.
//
// # Stream caps
//
// StreamCaps bounds the concurrent streams one principal holds on a group
// of methods (WatchBatch: 64; Session, Heartbeat and UploadArtifact
// together: 256). It runs after authentication, which puts the principal in
// the context; calls without a principal (health, reflection) are not
// counted.
//
// # Refusals
//
// Refusals counts every refused call (see Refused) in
// leasehold_refused_calls_total{code}, and its Logger, given to the
// go-grpc-middleware logging interceptor, lets through at most
// RefusalsConfig.LinesPerSecond "finished call" lines per second for each
// refusal code; the rest are counted and summarised once per window in one
// "suppressed refused calls" line. Other lines pass unchanged. Early
// does the same for a call the authentication tap refused before any
// interceptor ran.
//
// # Connections
//
// The listeners' connection limits are package connlimit's. Calls are
// capped per principal by the stream caps, and a call without a known
// token never reaches the server's handlers (auth.Set.InTapHandle).
//
// # Errors
//
// Every refusal of this package carries google.rpc.ErrorInfo with domain
// leasehold.v1:
//
//	condition                          code                reason             details
//	request the codec could not decode INVALID_ARGUMENT    MALFORMED_REQUEST  BadRequest (field path, decoder error)
//	principal over a stream cap        RESOURCE_EXHAUSTED  TOO_MANY_STREAMS   QuotaFailure (principal, cap, limit)
package edge
