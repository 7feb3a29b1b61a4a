package shadow

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/store"
)

// ErrMismatch is recorded when the shadow store's digest differs from the
// primary's after a group.
var ErrMismatch = errors.New("shadow store differs from the primary")

// Shadow is a committer (engine.Committer), for tests, that commits each
// group in place, then applies its write set to a second store and checks
// that both stores now hold the same value for every key the group wrote;
// Compare compares the whole stores' digests, at a cost that follows their
// size, for callers to run as often as they can afford. A failure to
// replicate is recorded (Err), never returned: the group is committed by
// then, and the writer must go on as the single node it is.
type Shadow struct {
	primary, replica *store.Store
	// index is the entry index of the last write set applied to replica.
	index uint64

	mu     sync.Mutex
	groups int
	err    error
}

// New returns a shadow committer for the writer of primary, applying
// to replica. Both must hold the same records: replica a store that has
// shadowed primary since both were new, or a copy of it.
func New(primary, replica *store.Store) (*Shadow, error) {
	rs, err := replica.ReplicaState()
	if err != nil {
		return nil, err
	}
	s := &Shadow{primary: primary, replica: replica, index: rs.Applied}
	if err := s.compare(); err != nil {
		return nil, err
	}
	return s, nil
}

// Record implements engine.Committer: a shadow needs the write sets.
func (s *Shadow) Record() bool { return true }

// Commit implements engine.Committer.
func (s *Shadow) Commit(tx *store.Tx, wall time.Time) error {
	ws := tx.WriteSet(s.index, wall)
	if err := tx.Commit(); err != nil {
		return err
	}
	s.index++
	err := s.replica.ApplyWriteSet(s.index, ws)
	if err == nil {
		var same bool
		if same, err = s.primary.SameAsFor(s.replica, ws); err == nil && !same {
			err = fmt.Errorf("%w: a key the group wrote reads differently", ErrMismatch)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.groups++
	if err != nil && s.err == nil {
		s.err = fmt.Errorf("group %d: %w", s.index, err)
	}
	return nil
}

// compare returns ErrMismatch when the two stores' digests differ.
func (s *Shadow) compare() error {
	want, err := s.primary.Digest()
	if err != nil {
		return err
	}
	got, err := s.replica.Digest()
	if err != nil {
		return err
	}
	if got != want {
		return fmt.Errorf("%w: digest %x, primary %x", ErrMismatch, got, want)
	}
	return nil
}

// Compare compares the two stores' digests, records a difference as
// Err does, and returns it.
func (s *Shadow) Compare() error {
	err := s.compare()
	if err != nil {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.err == nil {
			s.err = fmt.Errorf("after group %d: %w", s.index, err)
		}
	}
	return err
}

// Err returns the first failure to replicate a group, or nil.
func (s *Shadow) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// Groups returns how many groups were committed and shadowed.
func (s *Shadow) Groups() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.groups
}
