package store

import "sync"

// writeLock is the store's one read-write transaction, taken before
// bbolt's own lock by every writer of the store (Begin, BeginBatch,
// update, ReplaceFile, Close), so that bbolt's is never waited for.
//
// Its holder may make it yieldable (Tx.Yieldable): a transaction that is
// only waiting, such as a replicated leader's evaluated group waiting for
// raft to commit its entry, can then be ended by whoever else needs the
// store. A writer that arrives while the lock is held yieldable calls the
// holder's yield, which ends the transaction (and so frees the lock),
// instead of waiting for it: a raft state machine applying another
// leader's entries never waits for a proposal that waits for raft.
type writeLock struct {
	mu   sync.Mutex
	cond sync.Cond
	held bool
	// waiting counts the writers waiting for the lock.
	waiting int
	// yield, while the lock is held yieldable, ends the holder's
	// transaction; it is called at most once, without mu.
	yield func()
}

// lock takes the lock, ending a yieldable holder's transaction.
func (l *writeLock) lock() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.cond.L == nil {
		l.cond.L = &l.mu
	}
	l.waiting++
	defer func() { l.waiting-- }()
	for l.held {
		if y := l.yield; y != nil {
			l.yield = nil
			l.mu.Unlock()
			y()
			l.mu.Lock()
			continue
		}
		l.cond.Wait()
	}
	l.held = true
}

// unlock lets the lock go.
func (l *writeLock) unlock() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.held, l.yield = false, nil
	if l.cond.L != nil {
		l.cond.Broadcast()
	}
}

// yieldTo makes the held lock yieldable: the next writer to arrive calls
// yield, which must end the holder's transaction.
func (l *writeLock) yieldTo(yield func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.held {
		l.yield = yield
	}
	if l.cond.L != nil {
		// A writer already waiting takes the lock now.
		l.cond.Broadcast()
	}
}

// WritersWaiting reports how many writers of the store wait for its one
// read-write transaction.
func (s *Store) WritersWaiting() int {
	s.wl.mu.Lock()
	defer s.wl.mu.Unlock()
	return s.wl.waiting
}
