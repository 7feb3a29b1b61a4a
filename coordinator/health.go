package coordinator

import (
	"github.com/leasehold/leasehold/coordinator/internal/server"
	"github.com/leasehold/leasehold/internal/leaderdial"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// serviceNames are the names the health service reports on.
var serviceNames = []string{"", server.JobServiceName, server.RendererServiceName, server.OperatorServiceName, server.OverviewServiceName,
	server.ClusterServiceName}

// DispatchHealthName is the health entry that reports dispatch: SERVING
// while leases are granted, NOT_SERVING while an operator has paused
// dispatch or after the writer fail-stopped. The services themselves stay
// SERVING during a pause.
const DispatchHealthName = "leasehold.v1.Dispatch"

// initHealth sets every health entry as a coordinator starts: the
// services SERVING; the Leader entry SERVING on a single node, which
// always leads, and NOT_SERVING on a replica until it is promoted, whose
// server entry waits for a known leader too; the dispatch switch as the
// store holds it.
func (c *Coordinator) initHealth() {
	for _, name := range serviceNames {
		c.health.SetServingStatus(name, healthpb.HealthCheckResponse_SERVING)
	}
	leader := healthpb.HealthCheckResponse_SERVING
	if c.replica != nil {
		leader = healthpb.HealthCheckResponse_NOT_SERVING
		c.health.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	}
	c.health.SetServingStatus(leaderdial.HealthService, leader)
	c.setDispatchHealth(c.eng.DispatchState().Paused)
	c.reportStoreHealth()
}

// setDispatchHealth reports the dispatch switch on DispatchHealthName. It
// runs on the writer goroutine (OnDispatch) and in New; once the writer
// has fail-stopped the entry stays NOT_SERVING.
func (c *Coordinator) setDispatchHealth(paused bool) {
	st := healthpb.HealthCheckResponse_SERVING
	if paused || c.failed.Load() {
		st = healthpb.HealthCheckResponse_NOT_SERVING
	}
	c.health.SetServingStatus(DispatchHealthName, st)
}

// writerFailed reports a fail-stopped writer: every health entry turns
// NOT_SERVING and stays so until a restart.
func (c *Coordinator) writerFailed() {
	c.log.Error("storage commit failed: the writer stopped; reporting NOT_SERVING")
	c.failed.Store(true)
	for _, name := range append(serviceNames, DispatchHealthName, leaderdial.HealthService) {
		c.health.SetServingStatus(name, healthpb.HealthCheckResponse_NOT_SERVING)
	}
}

// writerStopped is the value of leasehold_writer_stopped: 1 once the
// writer has fail-stopped (see watchFailure), else 0. An alert on it tells
// an operator what health tells Kubernetes, and why writes are refused.
func (c *Coordinator) writerStopped() float64 {
	if c.failed.Load() {
		return 1
	}
	return 0
}

// replicaHealth is where the replica reports leadership: the health
// service's Leader and server ("") entries.
type replicaHealth struct{ c *Coordinator }

// SetLeading implements cluster.Health: a writer just promoted has
// rebuilt the dispatch switch from the store, which its health entry
// then reports.
func (h replicaHealth) SetLeading(leading bool) {
	c := h.c
	if !leading {
		c.health.SetServingStatus(leaderdial.HealthService, healthpb.HealthCheckResponse_NOT_SERVING)
		return
	}
	c.health.SetServingStatus(leaderdial.HealthService, healthpb.HealthCheckResponse_SERVING)
	c.setDispatchHealth(c.eng.DispatchState().Paused)
}

// SetLeaderKnown implements cluster.Health: a replicated coordinator is
// SERVING while it is part of a cluster that has a leader.
func (h replicaHealth) SetLeaderKnown(known bool) {
	if h.c.failed.Load() {
		return
	}
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if known {
		st = healthpb.HealthCheckResponse_SERVING
	}
	h.c.health.SetServingStatus("", st)
}
