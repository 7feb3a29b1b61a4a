package coordinator

import (
	"context"
	"errors"
	"fmt"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/leasehold/leasehold/coordinator/internal/artifacts"
	"github.com/leasehold/leasehold/coordinator/internal/maintenance"
	"github.com/leasehold/leasehold/coordinator/internal/server"
	"github.com/prometheus/client_golang/prometheus"
)

// ArtifactConfig chooses and tunes the artifact store.
type ArtifactConfig struct {
	// Store is the --artifact-store URL: empty for the directory beside
	// the data file (<DataDir>/artifact-store), file:///path for another
	// directory, s3://bucket?endpoint=…&region=… for an S3-compatible
	// store, whose credentials come from the standard AWS environment and
	// files. A directory serves a single node only: a cluster with one
	// keeps previews inline, up to InlineCap.
	Store string
	// InlineBytes is the inline threshold: larger previews go to the
	// store (default server.DefaultStoreAbove).
	InlineBytes int
	// InlineCap bounds a preview of a cluster without a shared store
	// (default DefaultClusterInlineCap); larger ones are refused
	// ARTIFACT_STORE_REQUIRED.
	InlineCap int
	// SweepGrace is how old an object no pointer names must be before the
	// sweep deletes it (default maintenance.SweepGraceDefault);
	// SweepInterval how often the sweep runs.
	SweepGrace, SweepInterval time.Duration
}

// DefaultClusterInlineCap bounds the previews a cluster without a shared
// artifact store keeps inline in its replicated records.
const DefaultClusterInlineCap = 256 << 10

// storeCheckTimeout bounds the start-up check of the artifact store.
const storeCheckTimeout = 10 * time.Second

// openArtifacts opens the artifact store and checks that it answers to
// the coordinator's credentials; one that does not refuses the start. A
// cluster whose store is not shared (a directory) keeps previews inline,
// bounded, and says so.
func (c *Coordinator) openArtifacts(reg prometheus.Registerer) (server.Previews, error) {
	ac := c.cfg.Artifacts
	// The gauge is exported without a store too (0: nothing failed), so
	// that an alert on it reads one series whatever the deployment.
	c.storeHealth = server.NewStoreHealth(reg)
	ctx, cancel := context.WithTimeout(context.Background(), storeCheckTimeout)
	defer cancel()
	st, err := artifacts.Open(ctx, ac.Store, c.cfg.DataDir)
	if err != nil {
		return server.Previews{}, err
	}
	if err := st.Check(ctx); err != nil {
		return server.Previews{}, fmt.Errorf("artifact store %s: %w", st, err)
	}
	if c.cfg.wrapStore != nil {
		st = c.cfg.wrapStore(st)
	}
	if c.cfg.Cluster != nil && !st.Shared() {
		limit := ac.InlineCap
		if limit == 0 {
			limit = DefaultClusterInlineCap
		}
		c.log.Warn("this cluster has no shared artifact store: previews stay inline in the replicated records, "+
			"larger ones are refused ARTIFACT_STORE_REQUIRED; configure --artifact-store s3://… to take them",
			"max_inline_bytes", limit)
		return server.Previews{InlineCap: limit}, nil
	}
	c.artifacts = st
	c.log.Info("artifact store", "store", st.String(), "inline_bytes", max(ac.InlineBytes, 0), "shared", st.Shared())
	return server.Previews{Store: st, StoreAbove: ac.InlineBytes, Health: c.storeHealth.Observe}, nil
}

// ArtifactStoreHealthName is the health entry that reports the artifact
// store, present when previews go to one: SERVING while the store answered
// its last call, NOT_SERVING while it is degraded (a call failed for want
// of an answer, or took longer than its timeout). Completions that name a
// stored preview are answered UNAVAILABLE ARTIFACT_STORE_UNAVAILABLE
// meanwhile; the services themselves stay SERVING.
const ArtifactStoreHealthName = "leasehold.v1.ArtifactStore"

// reportStoreHealth keeps ArtifactStoreHealthName in step with the
// store's health.
func (c *Coordinator) reportStoreHealth() {
	if c.artifacts == nil {
		return
	}
	started := false
	c.storeHealth.OnChange(func(err error) {
		st := healthpb.HealthCheckResponse_SERVING
		switch {
		case err != nil:
			st = healthpb.HealthCheckResponse_NOT_SERVING
			c.log.Warn("the artifact store is degraded: completions of stored previews answer UNAVAILABLE until it answers again", "err", err)
		case started:
			c.log.Info("the artifact store answers again")
		}
		started = true
		c.health.SetServingStatus(ArtifactStoreHealthName, st)
	})
}

// storeProbe asks the artifact store every few seconds whether it answers
// (Store.Check), so that health and the degraded gauge follow the store
// without waiting for a completion: renderers that upload with presigned
// URLs meet an outage first, and a store that is back clears them.
type storeProbe struct {
	st       artifacts.Store
	health   *server.StoreHealth
	interval time.Duration
	stopC    chan struct{}
	doneC    chan struct{}
}

// storeProbeInterval is how often the store is asked.
const storeProbeInterval = 5 * time.Second

func newStoreProbe(st artifacts.Store, h *server.StoreHealth) *storeProbe {
	return &storeProbe{st: st, health: h, interval: storeProbeInterval, stopC: make(chan struct{}), doneC: make(chan struct{})}
}

// Start starts the probe's goroutine.
func (p *storeProbe) Start() {
	go func() {
		defer close(p.doneC)
		t := time.NewTicker(p.interval)
		defer t.Stop()
		for {
			select {
			case <-p.stopC:
				return
			case <-t.C:
				p.probe()
			}
		}
	}()
}

// probe asks the store once, within the probe interval.
func (p *storeProbe) probe() {
	ctx, cancel := context.WithTimeout(context.Background(), p.interval)
	defer cancel()
	err := p.st.Check(ctx)
	if errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, artifacts.ErrUnavailable) {
		err = fmt.Errorf("%w: %w", artifacts.ErrUnavailable, err)
	}
	p.health.Observe(err)
}

// Stop stops the probe and waits for it; it must follow Start.
func (p *storeProbe) Stop() {
	close(p.stopC)
	<-p.doneC
}

// newSweep returns the sweep of the artifact store, nil without one.
func (c *Coordinator) newSweep(p server.Previews) *maintenance.Sweep {
	if p.Store == nil {
		return nil
	}
	c.sweep = maintenance.NewSweep(maintenance.SweepConfig{
		Store: p.Store, Doom: c.eng.DoomObjects, Bury: c.eng.BuryObjects, Forget: c.eng.ForgetTombs, Tombs: c.eng.Tombs,
		Leading: c.eng.Leading, Grace: c.cfg.Artifacts.SweepGrace, Interval: c.cfg.Artifacts.SweepInterval,
		Now: c.cfg.Now, Logger: c.log.With("component", "sweep"),
	})
	return c.sweep
}
