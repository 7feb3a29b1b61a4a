// Package coordinator wires the Leasehold coordinator together: the bbolt
// store and artifact directory, the single-writer engine, the three gRPC
// services behind authentication, logging, recovery and Prometheus
// interceptors, gRPC reflection, grpc.health.v1, and a /metrics endpoint.
//
// It holds no logic of its own. New opens everything, Serve serves gRPC on
// a listener until Close, and Close stops gracefully: in-flight unary calls
// finish, long polls answer at once, heartbeat and watch streams end with
// UNAVAILABLE so that clients reconnect, then the writer and the store
// close.
//
// # Health
//
// The health service reports SERVING for "" and for each of
// leasehold.v1.JobService, RendererService and OperatorService while the
// writer accepts commands. It turns NOT_SERVING when a commit fails (the
// writer fail-stops and acknowledges nothing more) and when the coordinator
// shuts down. Pausing dispatch does not change health: a paused coordinator
// still accepts submissions, heartbeats and fenced completions, so marking
// it unhealthy would make load balancers drop traffic it should take.
// Instead the pause has a health entry of its own, "leasehold.v1.Dispatch",
// NOT_SERVING while paused, and shows as the leasehold_dispatch_paused
// gauge and in every AcquireResponse (dispatch_paused).
//
// # Development tokens
//
// Without a principals file the coordinator uses the public development
// tokens of auth.DevPrincipals, and only on a loopback (or non-network)
// listener; on any other address it refuses to start.
package coordinator
