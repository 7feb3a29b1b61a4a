package coordinator

import (
	"fmt"
	"net/http"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/leasehold/leasehold/coordinator/internal/server"
)

// Health over HTTP, on the metrics address, for probes that cannot ask
// grpc.health.v1: a kubelet's grpc probe speaks plaintext only, so it
// cannot reach a coordinator that serves TLS, while its httpGet probe can
// (with scheme HTTPS it does not verify the certificate). The answers are
// the gRPC health service's own entries, read at each request:
//
//   - /healthz is leasehold.v1.JobService (liveness): NOT_SERVING once a
//     commit failed and at shutdown, whatever the cluster's leadership, so
//     that a node of a cluster without a leader is not restarted over and
//     over for what a restart cannot mend;
//   - /readyz is the server entry "" (readiness): the same, and in a
//     cluster NOT_SERVING too while this node knows no leader. It is not
//     the dispatch entry, so a paused coordinator stays ready, nor the
//     Leader entry: followers are ready, and clients find the leader
//     themselves.
//
// On a single node the two answer alike. Each answers 200 with "SERVING",
// or 503 with the status.
const (
	healthzPath = "/healthz"
	readyzPath  = "/readyz"
)

// handleHealth adds the health endpoints to the metrics address's mux.
func (c *Coordinator) handleHealth(mux *http.ServeMux) {
	mux.Handle("GET "+healthzPath, c.healthEntry(server.JobServiceName))
	mux.Handle("GET "+readyzPath, c.healthEntry(""))
}

// healthEntry answers with the status of one health entry.
func (c *Coordinator) healthEntry(service string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		st := healthpb.HealthCheckResponse_SERVICE_UNKNOWN
		if resp, err := c.health.Check(r.Context(), &healthpb.HealthCheckRequest{Service: service}); err == nil {
			st = resp.GetStatus()
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		if st != healthpb.HealthCheckResponse_SERVING {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		fmt.Fprintln(w, st)
	}
}
