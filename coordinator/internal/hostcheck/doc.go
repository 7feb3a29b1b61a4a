// Package hostcheck refuses HTTP requests whose Host header does not name
// the server they reached, against DNS rebinding: a web page whose own
// name an attacker resolves to 127.0.0.1 (or to a pod's address) gets its
// requests answered under its own origin, where the same-origin policy
// and SameSite cookies see no other site. The coordinator's metrics
// address (metrics, health, profiles and the console) answers only to:
//
//   - localhost, 127.0.0.1 and [::1], with the port of the listener the
//     request came in on;
//   - the address the request came in on (the bound address, or the
//     interface's address under a wildcard bind, which is how a kubelet
//     probes and Prometheus scrapes a pod): an IP address cannot be
//     rebound;
//   - the names configured (the coordinator's --console-host), with the
//     port given there, or with the listener's port or none when none was
//     given (a proxy in front on the scheme's default port).
//
// Any other Host is answered 421 Misdirected Request, with no page, no
// cookie and no redirect.
package hostcheck
