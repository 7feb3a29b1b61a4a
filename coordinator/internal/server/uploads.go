package server

import (
	"sync"

	"github.com/leasehold/leasehold/coordinator/internal/engine"
	"google.golang.org/grpc/codes"
)

// DefaultMaxUploadBufferBytes bounds the bytes every upload in progress
// buffers together: 32 previews of the default largest size.
const DefaultMaxUploadBufferBytes = 256 << 20

// uploads tracks the uploads in progress: at most one per lease, and all of
// them buffering at most limit bytes together, so that one renderer
// credential cannot make the coordinator hold --max-artifact-bytes for every
// stream it may open. It is safe for concurrent use.
type uploads struct {
	mu    sync.Mutex
	limit int64
	used  int64
	live  map[engine.LeaseRef]struct{}
}

func newUploads(limit int64) *uploads {
	return &uploads{limit: limit, live: make(map[engine.LeaseRef]struct{})}
}

// Refusals of an upload that the coordinator cannot take now. Both are
// RESOURCE_EXHAUSTED (a quota, in gRPC's words; retry later, with backoff),
// not ABORTED, which this API keeps for "the lease is not yours any more".
var (
	errUploadInProgress = &requestError{code: codes.ResourceExhausted, reason: reasonUploadInProgress,
		msg: "another upload for this lease is in progress; one upload per lease at a time"}
	errUploadBudget = &requestError{code: codes.ResourceExhausted, reason: reasonUploadBudget,
		msg: "the coordinator is buffering as many upload bytes as it may; retry later"}
)

// begin starts the upload for ref, refusing UPLOAD_IN_PROGRESS while
// another is in progress for the same lease. The caller ends it.
func (u *uploads) begin(ref engine.LeaseRef) (*uploadBuffer, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if _, busy := u.live[ref]; busy {
		return nil, errUploadInProgress
	}
	u.live[ref] = struct{}{}
	return &uploadBuffer{u: u, ref: ref}, nil
}

// reserve takes n bytes of the budget, or refuses.
func (u *uploads) reserve(n int64) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.used+n > u.limit {
		return false
	}
	u.used += n
	return true
}

// inUse reports the bytes reserved now.
func (u *uploads) inUse() int64 {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.used
}

// uploadBuffer is one upload's bytes, charged to the budget by the capacity
// it allocates.
type uploadBuffer struct {
	u        *uploads
	ref      engine.LeaseRef
	content  []byte
	reserved int64
}

// add appends chunk. The buffer grows (to twice its capacity, at most
// limit bytes, at least what chunk needs) only once the budget granted the
// growth: UPLOAD_BUDGET_EXHAUSTED when it did not. The caller has checked
// that the upload stays within limit.
func (b *uploadBuffer) add(chunk []byte, limit int64) error {
	need := int64(len(b.content) + len(chunk))
	if have := int64(cap(b.content)); need > have {
		target := max(need, min(2*have, limit))
		if !b.u.reserve(target - have) {
			return errUploadBudget
		}
		b.reserved += target - have
		grown := make([]byte, len(b.content), target)
		copy(grown, b.content)
		b.content = grown
	}
	b.content = append(b.content, chunk...)
	return nil
}

// end releases the lease and the bytes; the content must no longer be
// used by the caller.
func (b *uploadBuffer) end() {
	b.u.mu.Lock()
	defer b.u.mu.Unlock()
	delete(b.u.live, b.ref)
	b.u.used -= b.reserved
	b.reserved = 0
	b.content = nil
}
