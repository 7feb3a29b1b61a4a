// Package connlimit bounds the connections of a listener, so that one
// peer cannot hold every connection whatever it sends: the coordinator's
// gRPC listener and metrics address, and the renderer's HTTP endpoints.
//
// Conns limits the connections of the listeners it wraps (Conns.Listen):
// at most Limits.Max open at once (DefaultMaxConnections for the
// coordinator's gRPC listener) and at most Limits.PerAddress from one
// source address (an IPv4 address, or an IPv6 /64; an eighth of Max by
// default). A connection past either is accepted from the kernel and
// closed at once. With Limits.AuthTimeout, a connection for which
// Conns.Authenticated is not called in time (the coordinator calls it
// from the authentication tap when a call carries a known token) is
// closed too. Each refusal is reported with its cause (CauseTotal,
// CausePerAddress, CauseUnauthenticated) to Limits.Refused, which counts
// and logs it.
package connlimit
