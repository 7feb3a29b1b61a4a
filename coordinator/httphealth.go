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
//   - /healthz is the server entry "" (liveness): NOT_SERVING once a
//     commit failed and at shutdown;
//   - /readyz is leasehold.v1.JobService (readiness): the same, and not
//     the dispatch entry, so a paused coordinator stays ready.
//
// Each answers 200 with "SERVING", or 503 with the status.
const (
	healthzPath = "/healthz"
	readyzPath  = "/readyz"
)

// handleHealth adds the health endpoints to the metrics address's mux.
func (c *Coordinator) handleHealth(mux *http.ServeMux) {
	mux.Handle("GET "+healthzPath, c.healthEntry(""))
	mux.Handle("GET "+readyzPath, c.healthEntry(server.JobServiceName))
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
