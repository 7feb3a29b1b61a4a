package renderer

import (
	"cmp"
	"slices"
	"strings"
	"time"

	"github.com/leasehold/leasehold/client/reason"
)

// reasonStoreUnavailable answers a completion whose preview the
// coordinator's artifact store did not take or confirm: nothing changed.
var reasonStoreUnavailable = reason.ArtifactStoreUnavailable.String()

// A completion answered UNAVAILABLE ARTIFACT_STORE_UNAVAILABLE changed
// nothing: the coordinator could not reach its artifact store to put or
// find the preview. The loop keeps the lease (it heartbeats it and names
// it holding when a session opens again) and sends the same completion
// again after a backoff, for as long as the coordinator says the lease
// lives; a lease answered lost ends the wait. The preview itself is kept
// in the completion (inline) or already in the store (uploaded), so the
// retry costs no render.

// storeWait is a completion waiting to be sent again.
type storeWait struct {
	c   *completion
	due time.Time
}

// waitForStore holds c, answered ARTIFACT_STORE_UNAVAILABLE, until its
// backoff passes.
func (l *loop) waitForStore(key leaseKey, c *completion) {
	if c.storeBackoff == nil {
		c.storeBackoff = l.w.newBackoff()
	}
	d := c.storeBackoff.next()
	if l.storeWaits == nil {
		l.storeWaits = make(map[leaseKey]*storeWait)
	}
	l.storeWaits[key] = &storeWait{c: c, due: time.Now().Add(d)}
	l.w.metrics.storeRetries.Inc()
	l.w.log.Warn("the coordinator's artifact store is unavailable; keeping the lease", "job", key.jobID, "token", key.token, "retry_in", d)
	l.armStoreWait()
}

// armStoreWait sets the timer for the earliest wait to end.
func (l *loop) armStoreWait() {
	l.storeTimer = stopTimer(l.storeTimer)
	var next time.Time
	for _, sw := range l.storeWaits {
		if next.IsZero() || sw.due.Before(next) {
			next = sw.due
		}
	}
	if !next.IsZero() {
		l.storeTimer = time.NewTimer(time.Until(next))
	}
}

// storeWaitsDue queues again, in lease order, the completions whose wait
// is over.
func (l *loop) storeWaitsDue() {
	now := time.Now()
	var due []leaseKey
	for key, sw := range l.storeWaits {
		if !sw.due.After(now) {
			due = append(due, key)
		}
	}
	slices.SortFunc(due, compareKeys)
	for _, key := range due {
		l.outbox.add(key, l.storeWaits[key].c)
		delete(l.storeWaits, key)
	}
	l.armStoreWait()
}

// dropStoreWait ends the wait of key, whose lease is gone, and reports
// whether there was one.
func (l *loop) dropStoreWait(key leaseKey) bool {
	sw := l.storeWaits[key]
	if sw == nil {
		return false
	}
	delete(l.storeWaits, key)
	endDropped(sw.c.span, errLeaseLost)
	l.armStoreWait()
	return true
}

// handBackStoreWaits hands back the leases whose completion waits for the
// store (the drain's time is up) and returns how many.
func (l *loop) handBackStoreWaits() int {
	keys := make([]leaseKey, 0, len(l.storeWaits))
	for key := range l.storeWaits {
		keys = append(keys, key)
	}
	slices.SortFunc(keys, compareKeys)
	for _, key := range keys {
		delete(l.storeWaits, key)
		l.handBack(key)
		l.w.log.Info("lease handed back", "job", key.jobID, "token", key.token, "why", "drain timeout, artifact store unavailable")
	}
	l.armStoreWait()
	return len(keys)
}

// compareKeys orders leases by job id, then token.
func compareKeys(a, b leaseKey) int {
	return cmp.Or(strings.Compare(a.jobID, b.jobID), cmp.Compare(a.token, b.token))
}
