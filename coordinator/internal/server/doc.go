// Package server implements the coordinator's gRPC services,
// leasehold.v1.JobService, RendererService, OperatorService and the
// read-only OverviewService, over the single-writer engine.
//
// Handlers are thin: they authorize the caller (the principal the auth
// interceptor put in the context), validate and convert the request, call
// the engine, and convert the answer back. Every error leaves through one
// table, toStatus, which picks the gRPC code and the google.rpc.ErrorInfo
// reason. Operators are shown job metadata only: never document content or
// source locations, and never previews.
//
// Streams follow one shape: a goroutine receives, the handler's goroutine
// selects on received messages, engine notifications and the stream's
// context, and is the only one that sends.
package server
