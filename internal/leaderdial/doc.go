// Package leaderdial turns a coordinator address into the gRPC target and
// dial options that reach the coordinator's leader. The client library, the
// CLI and the renderer share it, so that they all read an address the same
// way, and find and leave a leader the same way.
//
// An address is one of:
//
//   - one host:port, or any gRPC target that names a single server
//     (passthrough:///..., unix:...): dialled as it always was, with no
//     polling, so that a single node behaves as before;
//   - a comma-separated list of host:port, one per replica ("a:7070,
//     b:7070,c:7070");
//   - a dns:/// target whose name resolves to every replica, such as a
//     Kubernetes headless Service.
//
// # Finding the leader
//
// With a list or a dns target, a channel to the leader (Target.Leader)
// polls the health entry HealthService, which only the leader reports
// SERVING, on every replica: a Check with a deadline (DefaultPollTimeout)
// every DefaultPollEvery, over a connection of its own to each. Calls go
// to the replica that answered SERVING in the last round, and to none
// while no replica did: a replica that does not answer within the
// deadline takes no new call. A health stream (gRPC's client-side health
// checking) would not do: a frozen process keeps its TCP connections, and
// its stream never says NOT_SERVING.
//
// A stream, or an attempt of a call, made under one leader ends with
// ErrLeaderMoved (UNAVAILABLE) once that leader is left, which needs
// evidence rather than one slow answer: another replica answers SERVING
// while it does not, it answers NOT_SERVING, or it stays silent for
// DefaultSilence, well past an election. So a watch or a renderer's
// session on a frozen leader moves to the new leader within a poll of its
// election, and one on a leader merely slow stays.
//
// The listed addresses come from the package's own resolvers for the one
// channel (no global registration), each with its own host as the TLS
// server name, so that every replica's certificate is verified against
// the name it was listed under. A dns target is resolved by the package
// (again every 30 s) and verified against the name it resolves, which
// every replica's certificate must then carry.
package leaderdial
