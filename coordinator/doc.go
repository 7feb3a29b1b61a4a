// Package coordinator wires the Leasehold coordinator together: the bbolt
// store and artifact directory, the single-writer engine, the gRPC
// services behind authentication, logging, recovery and Prometheus
// interceptors, gRPC reflection, grpc.health.v1, and an HTTP listener with
// /metrics, the same health as /healthz and /readyz and, with
// Config.Console, the web console under /console/; with Config.Cluster,
// this node's member of a replicated cluster (package cluster holds all
// of replication, leadership included: the wiring starts it and hands it
// the engine and the health entries).
//
// It holds no logic of its own. New opens everything (and, when it fails,
// closes what it opened, the database's file lock included), Serve serves
// gRPC on a listener until Close, and Close stops gracefully: in-flight
// unary calls finish, long polls answer at once, heartbeat and watch
// streams end with UNAVAILABLE so that clients reconnect, then the writer
// and the store close.
//
// # Health
//
// The health service reports SERVING for "" and for each of
// leasehold.v1.JobService, RendererService, OperatorService and
// OverviewService while the
// writer accepts commands. It turns NOT_SERVING when a commit fails (the
// writer fail-stops and acknowledges nothing more) and when the coordinator
// shuts down. Pausing dispatch does not change health: a paused coordinator
// still accepts submissions, heartbeats and fenced completions, so marking
// it unhealthy would make load balancers drop traffic it should take.
// Instead the pause has a health entry of its own, "leasehold.v1.Dispatch",
// NOT_SERVING while paused, and shows as the leasehold_dispatch_paused
// gauge and in every AcquireResponse (dispatch_paused). A failed commit
// turns the dispatch entry NOT_SERVING too, for good: nothing is granted
// after it; the leasehold_writer_stopped gauge turns 1 at the same time,
// for alerts, and stays 1 until the process restarts.
//
// The metrics address answers the same health over HTTP (HTTPS with TLS),
// for probes that cannot ask gRPC over TLS, as a kubelet's grpc probe
// cannot: /healthz (liveness) is leasehold.v1.JobService, /readyz
// (readiness) the server entry "", which in a cluster also says whether
// this node knows a leader; each answers 200 with "SERVING" or 503 with
// the status.
//
// # The gRPC edge
//
// In front of the services (see package edge): requests that do not decode
// are INVALID_ARGUMENT MALFORMED_REQUEST, not INTERNAL; each principal may
// hold at most 64 WatchBatch, 16 WatchOverview and 256 renderer streams (RESOURCE_EXHAUSTED
// TOO_MANY_STREAMS); refused calls are counted in
// leasehold_refused_calls_total{code} and logged at most 10 lines per
// second per code, with a summary of the rest. The transport accepts
// messages up to Config.MaxRecvMsgSize (derived from the batch limits),
// 1000 concurrent streams per connection, and pings an idle connection
// after 10 s, dropping it 5 s later if unanswered.
//
// # Transport, logs and traces
//
// With Config.TLS the server speaks TLS only, so no bearer token is read
// off a plaintext connection; with client CAs it requires mutual TLS.
// Every call writes one "finished call" line: method, code, duration
// (grpc.time_ms), and the principal and team authentication found (Debug
// for successes, Info for refusals, Error for server faults); tokens and
// document content never appear. With Config.TracerProvider every call but
// health and reflection is traced, continuing the caller's trace, and each
// job keeps its SubmitBatch span context to send in its grants.
//
// # Development tokens
//
// Without a principals file the coordinator uses the public development
// tokens of auth.DevPrincipals, and only on a loopback (or non-network)
// listener; on any other address it refuses to start.
//
// # The console
//
// The console signs in with bearer tokens, so it is served only on a
// loopback metrics address unless Config.HTTPTLS is set, in which case the
// whole HTTP listener serves TLS and the session cookie is Secure.
package coordinator
