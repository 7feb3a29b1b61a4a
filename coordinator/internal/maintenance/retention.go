package maintenance

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/engine"
)

// Defaults of RetentionConfig.
const (
	// RetentionIntervalDefault is how often retention looks for what is due.
	RetentionIntervalDefault = time.Minute
	// RetentionPauseDefault separates two steps of one run.
	RetentionPauseDefault = 50 * time.Millisecond
)

// RetentionConfig configures a Retention.
type RetentionConfig struct {
	// Purge runs one bounded purge step through the writer (engine.Purge).
	Purge func(context.Context) (engine.PurgeResult, error)
	// Interval is how often a run starts; Pause separates two steps of one
	// run, so that a large backlog is deleted without holding the writer.
	Interval, Pause time.Duration
	Logger          *slog.Logger
}

// Retention deletes the records retention has made due: each Interval one
// run of purge steps until nothing is due, Pause apart. A step deletes at
// most engine.DefaultPurgeStep jobs (and as many rejections and audit
// records) in one writer group; the pause lets the commands queued
// meanwhile commit without one, so a backlog is worked off at a bounded
// share of the writer's time.
type Retention struct {
	service
	cfg RetentionConfig
}

// NewRetention returns a Retention; Start starts it.
func NewRetention(cfg RetentionConfig) *Retention {
	cfg.Interval = cmp.Or(cfg.Interval, RetentionIntervalDefault)
	cfg.Pause = cmp.Or(cfg.Pause, RetentionPauseDefault)
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Retention{service: newService(), cfg: cfg}
}

// Start starts the loop; calling it again does nothing.
func (r *Retention) Start() {
	r.start(func(stopC <-chan struct{}) {
		t := time.NewTicker(r.cfg.Interval)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				r.runOnce(stopC)
			case <-stopC:
				return
			}
		}
	})
}

// Stop stops the loop and waits for it.
func (r *Retention) Stop() { r.stop() }

// RunOnce makes one run now, on the caller's goroutine, as the loop does
// each Interval: what it deleted.
func (r *Retention) RunOnce() engine.PurgeResult { return r.runOnce(r.stopC) }

// runOnce purges until nothing more is due, the writer refuses, or stopC
// closes, and logs what it deleted. It returns the sum.
func (r *Retention) runOnce(stopC <-chan struct{}) engine.PurgeResult {
	var sum engine.PurgeResult
	defer func() {
		if sum != (engine.PurgeResult{}) {
			r.cfg.Logger.Info("retention purged expired records", "jobs", sum.Jobs, "batches", sum.Batches,
				"rejections", sum.Rejections, "audit_records", sum.Audit, "jobs_indexed", sum.Indexed)
		}
	}()
	for {
		res, err := r.cfg.Purge(context.Background())
		if err != nil {
			// A follower purges nothing itself: the leader's purges reach it
			// as write sets. A stopped writer is the coordinator's to tell.
			if !errors.Is(err, engine.ErrStopped) && !errors.Is(err, engine.ErrStorageFailed) &&
				!errors.Is(err, engine.ErrNotLeader) && !errors.Is(err, engine.ErrOutcomeUnknown) {
				r.cfg.Logger.Error("retention step failed", "err", err)
			}
			return sum
		}
		sum.Jobs, sum.Batches, sum.Rejections, sum.Audit, sum.Indexed = sum.Jobs+res.Jobs, sum.Batches+res.Batches,
			sum.Rejections+res.Rejections, sum.Audit+res.Audit, sum.Indexed+res.Indexed
		if !res.More {
			return sum
		}
		t := time.NewTimer(r.cfg.Pause)
		select {
		case <-t.C:
		case <-stopC:
			t.Stop()
			return sum
		}
	}
}
