package client

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"

	"github.com/leasehold/leasehold/client/limits"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
)

// The coordinator's default limits on one SubmitBatch request. A batch over
// any of them is refused whole with ErrBatchTooLarge.
const (
	// DefaultMaxBatchDocuments is the most documents in one batch.
	DefaultMaxBatchDocuments = limits.DefaultMaxBatchDocuments
	// DefaultMaxBatchInlineBytes is the most inline content (the sum of
	// Document.content) in one batch.
	DefaultMaxBatchInlineBytes = limits.DefaultMaxBatchInlineBytes
	// DefaultMaxBatchDeclaredBytes is the most declared bytes (the sum of
	// Document.size_bytes) in one batch.
	DefaultMaxBatchDeclaredBytes = limits.DefaultMaxBatchDeclaredBytes
)

// ErrInvalidRequestID is returned by SubmitDocuments and SubmitFiles, before
// anything is sent, when the request id is empty or too long to carry the
// batch suffix ("-<i>") within the coordinator's 128 bytes. It is decided by
// the client, not by a status code.
var ErrInvalidRequestID = errors.New("invalid request id")

// BatchLimits bounds every SubmitBatch request that SubmitDocuments and
// SubmitFiles build. A zero field takes its default (DefaultMaxBatch...).
//
// The limits must not exceed the coordinator's: a batch within them and
// over the coordinator's is refused whole with ErrBatchTooLarge. Lower
// values only make more, smaller batches.
type BatchLimits struct {
	// MaxDocuments is the most documents per batch.
	MaxDocuments int
	// MaxInlineBytes is the most inline content per batch.
	MaxInlineBytes int64
	// MaxDeclaredBytes is the most declared bytes (size_bytes) per batch.
	MaxDeclaredBytes int64
}

// Validate reports a negative limit.
func (l BatchLimits) Validate() error {
	switch {
	case l.MaxDocuments < 0:
		return fmt.Errorf("batch limits: MaxDocuments %d is negative", l.MaxDocuments)
	case l.MaxInlineBytes < 0:
		return fmt.Errorf("batch limits: MaxInlineBytes %d is negative", l.MaxInlineBytes)
	case l.MaxDeclaredBytes < 0:
		return fmt.Errorf("batch limits: MaxDeclaredBytes %d is negative", l.MaxDeclaredBytes)
	}
	return nil
}

// withDefaults returns l with every zero field set to its default.
func (l BatchLimits) withDefaults() BatchLimits {
	if l.MaxDocuments == 0 {
		l.MaxDocuments = DefaultMaxBatchDocuments
	}
	if l.MaxInlineBytes == 0 {
		l.MaxInlineBytes = DefaultMaxBatchInlineBytes
	}
	if l.MaxDeclaredBytes == 0 {
		l.MaxDeclaredBytes = DefaultMaxBatchDeclaredBytes
	}
	return l
}

// documentOverheadBytes bounds what one document adds to a request besides
// its inline content: its name (at most 255 bytes), content type, source
// URI (a path, at most 4 KiB on Linux) and field tags.
const documentOverheadBytes = 8 << 10

// requestBytes bounds the encoded size of the largest request a split
// within l can build.
func (l BatchLimits) requestBytes() int64 {
	l = l.withDefaults()
	return l.MaxInlineBytes + int64(l.MaxDocuments)*documentOverheadBytes + 1<<20
}

// split cuts n items, in order, into consecutive ranges [start, end) within
// the limits, where cost(i) is item i's inline and declared bytes. Every
// range holds at least one item: an item over a byte limit on its own is a
// batch of its own, for the coordinator to refuse naming that document.
func (l BatchLimits) split(n int, cost func(i int) (inline, declared int64)) [][2]int {
	l = l.withDefaults()
	var (
		ranges           [][2]int
		start            int
		inline, declared int64
	)
	for i := range n {
		in, decl := cost(i)
		if i > start && (i-start == l.MaxDocuments || inline+in > l.MaxInlineBytes || declared+decl > l.MaxDeclaredBytes) {
			ranges = append(ranges, [2]int{start, i})
			start, inline, declared = i, 0, 0
		}
		inline += in
		declared += decl
	}
	if n > start {
		ranges = append(ranges, [2]int{start, n})
	}
	return ranges
}

// documentCost is a document's inline and declared bytes as the
// coordinator counts them against the batch limits.
func documentCost(d *leaseholdv1.Document) (inline, declared int64) {
	inline = int64(len(d.GetContent()))
	return inline, max(d.GetSizeBytes(), inline)
}

// SplitDocuments cuts docs, in order, into consecutive batches within l
// (zero fields: the defaults). Every batch holds at least one document; a
// document over a byte limit on its own is a batch of its own. The result
// shares docs' backing array.
func SplitDocuments(docs []*leaseholdv1.Document, l BatchLimits) [][]*leaseholdv1.Document {
	var batches [][]*leaseholdv1.Document
	for _, r := range l.split(len(docs), func(i int) (int64, int64) { return documentCost(docs[i]) }) {
		batches = append(batches, docs[r[0]:r[1]:r[1]])
	}
	return batches
}

// BatchRequestID is the request id that batch i of a submission with
// requestID is sent with: "<requestID>-<i>", also for a single batch.
// Submitting the same documents again with the same requestID and the same
// limits therefore sends the same ids, and the coordinator answers every
// batch it already accepted with Replayed set instead of storing it twice.
func BatchRequestID(requestID string, i int) string {
	return requestID + "-" + strconv.Itoa(i)
}

// SubmitOptions tunes SubmitDocuments and SubmitFiles. The zero value uses
// the coordinator's default retry policy and reports nothing per batch.
type SubmitOptions struct {
	// RetryPolicy applies to every batch; nil takes the coordinator's defaults.
	RetryPolicy *leaseholdv1.RetryPolicy
	// OnBatch, if set, is called on the calling goroutine after batch i of
	// n was accepted, before the next is sent. An error from it stops the
	// submission and is returned, wrapped in a *SubmitError.
	OnBatch func(i, n int, resp *leaseholdv1.SubmitBatchResponse) error
}

// SubmitError reports a submission that stopped at batch Batch of Batches.
// The first Accepted batches were accepted (their responses are returned
// with the error); the rest were not sent. Submitting again with the same
// request id resumes without duplicates (see BatchRequestID).
type SubmitError struct {
	// RequestID is the submission's request id, without the batch suffix.
	RequestID string
	// Batch is the index of the batch at which the submission stopped.
	Batch int
	// Accepted is how many batches the coordinator accepted: Batch, or
	// Batch+1 when OnBatch failed after batch Batch was accepted.
	Accepted int
	// Batches is how many batches the submission was split into.
	Batches int
	// Err is the cause: an *Error from the coordinator, a file that could
	// not be read, or OnBatch's error.
	Err error
}

// Error names the failed batch and its request id, then the cause.
func (e *SubmitError) Error() string {
	return fmt.Sprintf("submitting batch %d of %d (request id %s): %v", e.Batch+1, e.Batches, BatchRequestID(e.RequestID, e.Batch), e.Err)
}

// Unwrap returns the cause, so errors.Is sees the coordinator's sentinel.
func (e *SubmitError) Unwrap() error { return e.Err }

// SubmitBatch submits documents as one batch for team, exactly as given:
// it neither splits nor renames. requestID is the idempotency key:
// submitting again with the same id returns the original batch with
// Replayed set. policy may be nil for the coordinator's defaults. A batch
// over the coordinator's limits is refused whole with ErrBatchTooLarge (or,
// per document, ErrInvalidArgument); SubmitDocuments splits instead.
func (c *Client) SubmitBatch(ctx context.Context, team, requestID string, docs []*leaseholdv1.Document, policy *leaseholdv1.RetryPolicy) (*leaseholdv1.SubmitBatchResponse, error) {
	resp, err := c.Jobs.SubmitBatch(ctx, &leaseholdv1.SubmitBatchRequest{
		Team:        team,
		RequestId:   requestID,
		Documents:   docs,
		RetryPolicy: policy,
	})
	return resp, wrapError(err)
}

// SubmitDocuments submits docs for team split into batches within the
// client's BatchLimits (see WithBatchLimits and SplitDocuments), one after
// another, batch i with request id BatchRequestID(requestID, i). It returns
// the responses in batch order.
//
// If a batch fails, the batches before it stay accepted: SubmitDocuments
// returns their responses and a *SubmitError wrapping the cause. Calling it
// again with the same requestID and documents sends the accepted batches
// again, which the coordinator answers as replayed, and then the rest.
// An empty or overlong requestID is ErrInvalidRequestID and nothing is sent;
// no documents at all are sent as one empty batch, for the coordinator to
// refuse.
func (c *Client) SubmitDocuments(ctx context.Context, team, requestID string, docs []*leaseholdv1.Document, opts SubmitOptions) ([]*leaseholdv1.SubmitBatchResponse, error) {
	batches := SplitDocuments(docs, c.limits)
	if len(batches) == 0 {
		batches = [][]*leaseholdv1.Document{nil}
	}
	return c.submitSplit(ctx, team, requestID, len(batches), func(i int) ([]*leaseholdv1.Document, error) { return batches[i], nil }, opts)
}

// SubmitFiles submits the files at paths for team as SubmitDocuments does.
// It plans the batches from the files' sizes, counting a file of at most
// InlineLimit bytes as inline content, and reads each batch's files (see
// ReadDocuments) only when that batch is sent, so memory holds one batch at
// a time. A file that cannot be read stops the submission at its batch with
// a *SubmitError. Callers that retry after an error must pass the same
// paths in the same order, so that the same batches get the same ids.
func (c *Client) SubmitFiles(ctx context.Context, team, requestID string, paths []string, opts SubmitOptions) ([]*leaseholdv1.SubmitBatchResponse, error) {
	sizes := make([]int64, len(paths))
	for i, p := range paths {
		info, err := os.Stat(p)
		if err != nil {
			return nil, fmt.Errorf("reading document: %w", err)
		}
		sizes[i] = info.Size()
	}
	ranges := c.limits.split(len(paths), func(i int) (int64, int64) {
		if sizes[i] <= InlineLimit {
			return sizes[i], sizes[i]
		}
		return 0, sizes[i]
	})
	if len(ranges) == 0 {
		ranges = [][2]int{{0, 0}}
	}
	return c.submitSplit(ctx, team, requestID, len(ranges), func(i int) ([]*leaseholdv1.Document, error) {
		return ReadDocuments(paths[ranges[i][0]:ranges[i][1]])
	}, opts)
}

// submitSplit sends n batches in order, batch i built by docs(i).
func (c *Client) submitSplit(ctx context.Context, team, requestID string, n int, docs func(i int) ([]*leaseholdv1.Document, error), opts SubmitOptions) ([]*leaseholdv1.SubmitBatchResponse, error) {
	if requestID == "" {
		return nil, fmt.Errorf("%w: empty", ErrInvalidRequestID)
	}
	if last := BatchRequestID(requestID, n-1); len(last) > limits.MaxRequestIDBytes {
		return nil, fmt.Errorf("%w: %q is %d bytes, at most %d with the batch suffix", ErrInvalidRequestID, last, len(last), limits.MaxRequestIDBytes)
	}
	resps := make([]*leaseholdv1.SubmitBatchResponse, 0, n)
	for i := range n {
		fail := func(err error) ([]*leaseholdv1.SubmitBatchResponse, error) {
			return resps, &SubmitError{RequestID: requestID, Batch: i, Accepted: len(resps), Batches: n, Err: err}
		}
		batch, err := docs(i)
		if err != nil {
			return fail(err)
		}
		resp, err := c.SubmitBatch(ctx, team, BatchRequestID(requestID, i), batch, opts.RetryPolicy)
		if err != nil {
			return fail(err)
		}
		resps = append(resps, resp)
		if opts.OnBatch != nil {
			if err := opts.OnBatch(i, n, resp); err != nil {
				return fail(err)
			}
		}
	}
	return resps, nil
}
