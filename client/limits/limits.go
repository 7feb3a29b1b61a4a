// Package limits holds the bounds of the leasehold.v1 API that more than
// one program applies: the coordinator refuses a request over them, and
// the client library, the CLI and the renderer check or size their
// requests by the same constants before sending.
//
// The batch limits are the coordinator's defaults; an operator may set
// others (coordinator --max-documents, --max-batch-inline-bytes,
// --max-batch-bytes). The rest are fixed by the API.
//
// The package imports nothing, so that every layer, the coordinator's pure
// state machine included, can use it.
package limits

// Defaults of the coordinator's batch limits, which the client library
// also splits submissions by.
const (
	// DefaultMaxBatchDocuments is the most documents in one batch.
	DefaultMaxBatchDocuments = 500
	// DefaultMaxBatchInlineBytes is the most inline content (the sum of
	// Document.content) in one batch.
	DefaultMaxBatchInlineBytes = 16 << 20
	// DefaultMaxBatchDeclaredBytes is the most declared bytes (the sum of
	// Document.size_bytes) in one batch.
	DefaultMaxBatchDeclaredBytes = 200 << 20
	// DefaultMaxDocumentInlineBytes is the most inline content of one
	// document.
	DefaultMaxDocumentInlineBytes = 256 << 10
)

// Bounds fixed by the API.
const (
	// MaxRequestIDBytes bounds a request id (idempotency key) of a submit
	// or a replay, suffix included when the client splits a submission.
	MaxRequestIDBytes = 128
	// MaxPageSize is the largest page a listing returns.
	MaxPageSize = 1000
	// MaxRendererIDBytes bounds a renderer id ([A-Za-z0-9._-]).
	MaxRendererIDBytes = 128
	// MaxInstanceIDBytes bounds a renderer process's instance id
	// ([A-Za-z0-9._-]).
	MaxInstanceIDBytes = 64
	// MaxRendererCapacity is the largest capacity one renderer session or
	// stream may declare.
	MaxRendererCapacity = 4096
)
