package leaderdial

import (
	"time"
)

// answer is one replica's answer to one poll of HealthService.
type answer int

const (
	// silent: no answer within the poll's deadline, or no connection.
	silent answer = iota
	// notServing: the replica answered, and does not lead.
	notServing
	// serving: the replica answered that it leads.
	serving
)

// follow is the pure part of the leader discovery: from each round of
// answers it decides which replica calls go to, and when a channel's
// streams and attempts must leave the replica they went to. It does no
// I/O and reads no clock; now is an argument.
//
// Two things are kept apart, because a frozen leader and a slow one look
// alike for a moment:
//
//   - routing: calls go to the replica that answered SERVING in the last
//     round, and to none when no replica did; a replica silent for one
//     round takes no new call, which then waits (or fails fast, as the
//     caller asked) until a leader answers.
//   - leaving: the current leader is left, and the epoch advances (ending
//     the streams and attempts made under it), only on evidence: another
//     replica answers SERVING while it does not, it answers NOT_SERVING
//     itself, or it stays silent for longer than silence, well past an
//     election. A leader merely slow to answer is not left.
type follow struct {
	// silence is how long the current leader may stay silent before it is
	// left without evidence of another.
	silence time.Duration

	// leader is the address of the current leader, "" when none is
	// known; routed is set while it answered SERVING in the last round.
	leader string
	routed bool
	// silentSince is when the current leader first failed to answer, zero
	// while it answers.
	silentSince time.Time
	// epoch counts the leaders left.
	epoch uint64
}

// observe takes in one round of answers by address and reports whether the
// routing changed and whether the current leader was left (the epoch
// advanced).
func (f *follow) observe(answers map[string]answer, order []string, now time.Time) (rerouted, left bool) {
	before, wasRouted := f.leader, f.routed
	cur, known := answers[f.leader]
	other := ""
	for _, a := range order {
		if a != f.leader && answers[a] == serving {
			other = a
			break
		}
	}
	switch {
	case f.leader != "" && known && cur == serving:
		f.routed, f.silentSince = true, time.Time{}
	case other != "":
		// Another replica leads: leave the current one, if any, for it.
		left = f.leader != ""
		f.take(other)
	case f.leader != "" && known && cur == notServing:
		// The leader says it no longer leads.
		left = true
		f.take("")
	case f.leader != "":
		// Silent, or no longer among the addresses (a dns target that
		// resolved to others): no call goes there, and past the silence
		// bound it is left.
		f.routed = false
		if f.silentSince.IsZero() {
			f.silentSince = now
		}
		if now.Sub(f.silentSince) > f.silence {
			left = true
			f.take("")
		}
	}
	if left {
		f.epoch++
	}
	return f.leader != before || f.routed != wasRouted, left
}

// take makes addr the current leader, routed, or knows none when addr is
// empty.
func (f *follow) take(addr string) {
	f.leader, f.routed, f.silentSince = addr, addr != "", time.Time{}
}

// route returns the address calls go to, "" for none.
func (f *follow) route() string {
	if f.routed {
		return f.leader
	}
	return ""
}
