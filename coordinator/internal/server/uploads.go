package server

import (
	"sync"

	"github.com/leasehold/leasehold/coordinator/internal/engine"
	"google.golang.org/grpc/codes"
)

// DefaultMaxUploadBufferBytes bounds the bytes every upload in progress
// buffers together: 32 previews of the default largest size.
const DefaultMaxUploadBufferBytes = 256 << 20

// uploads tracks the uploads in progress: at most one per lease, all of
// them buffering at most limit bytes together, so that one renderer
// credential cannot make the coordinator hold --max-artifact-bytes for every
// stream it may open, and the uploads of one credential at most share of
// them, so that one credential cannot keep every other at
// UPLOAD_BUDGET_EXHAUSTED. It is safe for concurrent use.
type uploads struct {
	mu    sync.Mutex
	limit int64
	share int64
	used  int64
	// usedBy is what each credential's uploads hold, by principal name.
	usedBy map[string]int64
	live   map[engine.LeaseRef]struct{}
}

// newUploads returns the uploads of a coordinator that buffers at most
// limit bytes, of which one credential may hold half, or maxUpload when
// that is more: one upload of the largest preview always fits a
// credential's share.
func newUploads(limit, maxUpload int64) *uploads {
	return &uploads{limit: limit, share: max(limit/2, maxUpload), usedBy: make(map[string]int64), live: make(map[engine.LeaseRef]struct{})}
}

// Refusals of an upload that the coordinator cannot take now. Both are
// RESOURCE_EXHAUSTED (a quota, in gRPC's words; retry later, with backoff),
// not ABORTED, which this API keeps for "the lease is not yours any more".
var (
	errUploadInProgress = &requestError{code: codes.ResourceExhausted, reason: reasonUploadInProgress,
		msg: "another upload for this lease is in progress; one upload per lease at a time"}
	errUploadBudget = &requestError{code: codes.ResourceExhausted, reason: reasonUploadBudget,
		msg: "the coordinator is buffering as many upload bytes as it may; retry later"}
	errUploadShare = &requestError{code: codes.ResourceExhausted, reason: reasonUploadBudget,
		msg: "this credential's uploads in progress hold its share of the coordinator's upload buffer; retry later"}
)

// begin starts the upload for ref of the credential principal, refusing
// UPLOAD_IN_PROGRESS while another is in progress for the same lease. The
// caller ends it.
func (u *uploads) begin(ref engine.LeaseRef, principal string) (*uploadBuffer, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if _, busy := u.live[ref]; busy {
		return nil, errUploadInProgress
	}
	u.live[ref] = struct{}{}
	return &uploadBuffer{u: u, ref: ref, principal: principal}, nil
}

// reserve takes n bytes of the budget for principal, or refuses with the
// limit it would pass: the credential's share or the whole budget.
func (u *uploads) reserve(n int64, principal string) error {
	u.mu.Lock()
	defer u.mu.Unlock()
	switch {
	case u.usedBy[principal]+n > u.share:
		return errUploadShare
	case u.used+n > u.limit:
		return errUploadBudget
	}
	u.used += n
	u.usedBy[principal] += n
	return nil
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
	u         *uploads
	ref       engine.LeaseRef
	principal string
	content   []byte
	reserved  int64
}

// add appends chunk. The buffer grows (to twice its capacity, at most
// limit bytes, at least what chunk needs) only once the budget and the
// credential's share granted the growth: UPLOAD_BUDGET_EXHAUSTED when they
// did not. The caller has checked that the upload stays within limit.
func (b *uploadBuffer) add(chunk []byte, limit int64) error {
	need := int64(len(b.content) + len(chunk))
	if have := int64(cap(b.content)); need > have {
		target := max(need, min(2*have, limit))
		if err := b.u.reserve(target-have, b.principal); err != nil {
			return err
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
	if b.u.usedBy[b.principal] -= b.reserved; b.u.usedBy[b.principal] <= 0 {
		delete(b.u.usedBy, b.principal)
	}
	b.reserved = 0
	b.content = nil
}
