// Package jobs is the pure state machine of a render job: records, phases,
// the transitions between them, the one fencing predicate and the sentinel
// errors that name every refusal.
//
// Nothing here does I/O, reads a clock or starts a goroutine. Every
// transition takes the current time (and, where the design calls for
// randomness, a jitter value) as arguments and returns the next record, so
// the coordinator's single writer can apply commands in order and tests can
// replay any sequence exactly. A transition never mutates its receiver: a
// refused command leaves the caller's record untouched.
package jobs
