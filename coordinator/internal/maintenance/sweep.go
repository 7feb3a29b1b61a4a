package maintenance

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/artifacts"
	"github.com/leasehold/leasehold/coordinator/internal/engine"
	"github.com/leasehold/leasehold/coordinator/internal/store"
)

// Defaults of SweepConfig.
const (
	// SweepGraceDefault is how old an object no pointer names must be
	// before the sweep deletes it: longer than any render's upload-to-
	// completion, so that an upload is not taken for an orphan while its
	// completion is on its way.
	SweepGraceDefault = time.Hour
	// SweepIntervalDefault is how often the sweep runs.
	SweepIntervalDefault = 10 * time.Minute
	// sweepBatch is how many objects one writer command dooms.
	sweepBatch = 256
)

// SweepConfig configures a Sweep.
type SweepConfig struct {
	Store artifacts.Store
	// Doom, Bury and Forget are the writer's commands (engine.DoomObjects,
	// BuryObjects, ForgetTombs); Tombs reads the tombstones.
	Doom   func(context.Context, []engine.ObjectKey) ([]engine.ObjectKey, error)
	Bury   func(context.Context, []engine.ObjectKey) error
	Forget func(context.Context, time.Duration) (int, error)
	Tombs  func() ([]store.TombEntry, error)
	// Leading reports whether this node's writer takes commands; a
	// follower does not sweep. nil: always.
	Leading func() bool
	// Grace is how old an unreferenced object must be to be deleted
	// (SweepGraceDefault); Interval how often a run starts.
	Grace, Interval time.Duration
	// Now is the clock objects' ages are measured on (time.Now).
	Now    func() time.Time
	Logger *slog.Logger
}

// Sweep deletes the artifact store's objects that no pointer names once
// they are older than the grace period: uploads whose completion never
// came or was refused (a late worker's), and objects whose last pointer
// retention dropped. Each object is first doomed through the writer (a
// tombstone, written only while no pointer names it), then deleted, then
// buried, so that a completion that found the object before the deletion
// never sets a pointer to it after.
type Sweep struct {
	service
	cfg SweepConfig
}

// SweepResult is what one run did.
type SweepResult struct {
	// Deleted objects; Kept unreferenced ones still within the grace period.
	Deleted, Kept int
}

// NewSweep returns a Sweep; Start starts it.
func NewSweep(cfg SweepConfig) *Sweep {
	cfg.Grace = cmp.Or(cfg.Grace, SweepGraceDefault)
	cfg.Interval = cmp.Or(cfg.Interval, SweepIntervalDefault)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Sweep{service: newService(), cfg: cfg}
}

// Start starts the loop; calling it again does nothing.
func (s *Sweep) Start() {
	s.start(func(stopC <-chan struct{}) {
		ctx, cancel := context.WithCancel(context.Background())
		go func() { <-stopC; cancel() }()
		t := time.NewTicker(s.cfg.Interval)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				if _, err := s.RunOnce(ctx); err != nil && ctx.Err() == nil && !quiet(err) {
					s.cfg.Logger.Warn("artifact sweep failed", "err", err)
				}
			case <-stopC:
				return
			}
		}
	})
}

// Stop stops the loop and waits for it.
func (s *Sweep) Stop() { s.stop() }

// quiet reports errors a follower or a stopping writer answers, which are
// not the sweep's to tell.
func quiet(err error) bool {
	return errors.Is(err, engine.ErrStopped) || errors.Is(err, engine.ErrStorageFailed) ||
		errors.Is(err, engine.ErrNotLeader) || errors.Is(err, engine.ErrOutcomeUnknown)
}

// RunOnce makes one run now, on the caller's goroutine: it finishes the
// deletions a crash interrupted, deletes the orphans past the grace
// period, and forgets the tombstones no completion can still race.
func (s *Sweep) RunOnce(ctx context.Context) (SweepResult, error) {
	var res SweepResult
	if s.cfg.Leading != nil && !s.cfg.Leading() {
		return res, nil
	}
	if err := s.finishInterrupted(ctx); err != nil {
		return res, err
	}
	cutoff := s.cfg.Now().Add(-s.cfg.Grace)
	var batch []engine.ObjectKey
	flush := func() error {
		n, err := s.delete(ctx, batch)
		res.Deleted += n
		batch = batch[:0]
		return err
	}
	err := s.cfg.Store.List(ctx, func(o artifacts.Object) error {
		if !o.Modified.Before(cutoff) {
			res.Kept++
			return nil
		}
		batch = append(batch, engine.ObjectKey{Team: o.Team, Digest: o.Digest})
		if len(batch) == sweepBatch {
			return flush()
		}
		return nil
	})
	if err == nil && len(batch) > 0 {
		err = flush()
	}
	if err != nil {
		return res, err
	}
	if _, err := s.cfg.Forget(ctx, s.cfg.Grace); err != nil {
		return res, err
	}
	if res.Deleted > 0 {
		s.cfg.Logger.Info("artifact sweep deleted unreferenced objects", "objects", res.Deleted, "grace", s.cfg.Grace)
	}
	return res, nil
}

// delete dooms keys through the writer and deletes those it doomed (no
// pointer names them), then buries them: how many it deleted.
func (s *Sweep) delete(ctx context.Context, keys []engine.ObjectKey) (int, error) {
	doomed, err := s.cfg.Doom(ctx, keys)
	if err != nil || len(doomed) == 0 {
		return 0, err
	}
	return len(doomed), s.deleteDoomed(ctx, doomed)
}

// deleteDoomed deletes doomed objects from the store and buries them.
func (s *Sweep) deleteDoomed(ctx context.Context, doomed []engine.ObjectKey) error {
	for _, k := range doomed {
		if err := s.cfg.Store.Delete(ctx, artifacts.Key{Team: k.Team, Digest: k.Digest}); err != nil {
			return err
		}
	}
	return s.cfg.Bury(ctx, doomed)
}

// finishInterrupted deletes and buries the objects a run doomed but did
// not bury (it stopped, or the node did, in between).
func (s *Sweep) finishInterrupted(ctx context.Context) error {
	tombs, err := s.cfg.Tombs()
	if err != nil {
		return err
	}
	var open []engine.ObjectKey
	for _, t := range tombs {
		if t.Buried == 0 {
			open = append(open, engine.ObjectKey{Team: t.Team, Digest: t.Digest})
		}
	}
	if len(open) == 0 {
		return nil
	}
	return s.deleteDoomed(ctx, open)
}
