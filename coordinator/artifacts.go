package coordinator

import (
	"context"
	"fmt"
	"time"

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
	c.storeHealth = server.NewStoreHealth(reg)
	c.artifacts = st
	c.log.Info("artifact store", "store", st.String(), "inline_bytes", max(ac.InlineBytes, 0), "shared", st.Shared())
	return server.Previews{Store: st, StoreAbove: ac.InlineBytes, Health: c.storeHealth.Observe}, nil
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
