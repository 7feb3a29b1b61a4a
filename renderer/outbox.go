package renderer

import (
	"cmp"
	"slices"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
)

// outbox holds what the coordinator is to answer: completions and
// hand-backs. Each is pending (not yet sent on the current session) or sent
// on it; its answer names its lease, so the answers are matched by (job id,
// token), in whatever order they come. Those sent and unanswered when a
// session ends are pending again, first and in their order, for the next
// one: completion is idempotent for the same token and outcome, and a
// hand-back for the same token. It belongs to the loop.
type outbox struct {
	// pending is in the order to send.
	pending []*outgoing
	// sent holds those sent on the current session, by lease.
	sent map[leaseKey]*outgoing
	// seq numbers the items as they are added.
	seq uint64
}

// outgoing is one item of the outbox.
type outgoing struct {
	key leaseKey
	// seq is the item's place in the order of sending.
	seq uint64
	// completion is the outcome to send; nil for a hand-back.
	completion *completion
}

// add queues a completion, or with c nil a hand-back, of key.
func (o *outbox) add(key leaseKey, c *completion) {
	o.seq++
	o.pending = append(o.pending, &outgoing{key: key, seq: o.seq, completion: c})
}

// empty reports whether everything has been answered.
func (o *outbox) empty() bool {
	return len(o.pending) == 0 && len(o.sent) == 0
}

// take moves pending items into req, in order, while they fit z.
func (o *outbox) take(z *sizer, req *leaseholdv1.SessionRequest) {
	n := 0
	for _, it := range o.pending {
		if c := it.completion; c != nil {
			if len(req.Completions) >= z.items || !z.take(c.msg) {
				break
			}
			req.Completions = append(req.Completions, c.msg)
		} else {
			ref := it.key.ref()
			if len(req.HandBacks) >= z.items || !z.take(ref) {
				break
			}
			req.HandBacks = append(req.HandBacks, ref)
		}
		o.sent[it.key] = it
		n++
	}
	o.pending = slices.Delete(o.pending, 0, n)
}

// answerCompletion removes the sent completion of key and returns it; nil
// when no completion of key was sent.
func (o *outbox) answerCompletion(key leaseKey) *completion {
	it := o.sent[key]
	if it == nil || it.completion == nil {
		return nil
	}
	delete(o.sent, key)
	return it.completion
}

// answerHandBack removes the sent hand-back of key and reports whether
// there was one.
func (o *outbox) answerHandBack(key leaseKey) bool {
	it := o.sent[key]
	if it == nil || it.completion != nil {
		return false
	}
	delete(o.sent, key)
	return true
}

// dropPending removes the pending completion of key, not yet sent, and
// returns it; nil when there is none.
func (o *outbox) dropPending(key leaseKey) *completion {
	i := slices.IndexFunc(o.pending, func(it *outgoing) bool { return it.key == key && it.completion != nil })
	if i < 0 {
		return nil
	}
	c := o.pending[i].completion
	o.pending = slices.Delete(o.pending, i, i+1)
	return c
}

// resend makes the sent items pending again, ahead of the others and in the
// order they were first queued: the session they were sent on ended.
func (o *outbox) resend() {
	if len(o.sent) == 0 {
		return
	}
	again := make([]*outgoing, 0, len(o.sent)+len(o.pending))
	for _, it := range o.sent {
		again = append(again, it)
	}
	slices.SortFunc(again, func(a, b *outgoing) int { return cmp.Compare(a.seq, b.seq) })
	o.pending = append(again, o.pending...)
	clear(o.sent)
}

// sizer adds up the encoded size of a request's repeated fields against a
// budget, and bounds each list to items elements: the coordinator refuses
// a message one of whose lists names more leases than the renderer's
// capacity (TOO_MANY_LEASE_REFS), and what is left waits for the next.
type sizer struct{ used, budget, items int }

// take counts m as one more element of a repeated field and reports whether
// it fits. The first element always fits, so that a request makes progress.
func (z *sizer) take(m proto.Message) bool {
	n := 1 + protowire.SizeBytes(proto.Size(m))
	if z.used > 0 && z.used+n > z.budget {
		return false
	}
	z.used += n
	return true
}

// takeRefs splits refs into those that fit and the rest.
func (z *sizer) takeRefs(refs []*leaseholdv1.LeaseRef) (taken, rest []*leaseholdv1.LeaseRef) {
	i := 0
	for i < len(refs) && i < z.items && z.take(refs[i]) {
		i++
	}
	if i == len(refs) {
		return refs, nil
	}
	return refs[:i:i], refs[i:]
}
