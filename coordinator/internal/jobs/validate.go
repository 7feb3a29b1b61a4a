package jobs

import (
	"errors"
	"fmt"
	"mime"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/leasehold/leasehold/client/limits"
	"github.com/leasehold/leasehold/client/reason"
)

// Limits bound what one SubmitBatch may carry. The zero value of a field
// means its default.
type Limits struct {
	// MaxDocuments is the most documents in one batch (default 500).
	MaxDocuments int
	// MaxDocumentBytes is the largest declared document size (default 25 MiB).
	MaxDocumentBytes int64
	// MaxBatchBytes is the largest sum of declared sizes (default 200 MiB).
	MaxBatchBytes int64
	// MaxInlineBytes is the most inline content per document (default 256 KiB).
	MaxInlineBytes int
	// MaxBatchInlineBytes is the most inline content in one batch (default
	// 16 MiB). The coordinator's gRPC receive limit is derived from it.
	MaxBatchInlineBytes int64
	// MaxNameBytes is the longest document name (default 255).
	MaxNameBytes int
	// MaxTeamQueue is the most non-terminal jobs one team may have (default 100000).
	MaxTeamQueue int
	// MaxAttempts bounds a batch's retry policy override (default 20).
	MaxAttempts uint32
}

// Default limits.
const (
	DefaultMaxDocuments     = limits.DefaultMaxBatchDocuments
	DefaultMaxDocumentBytes = 25 << 20
	DefaultMaxBatchBytes    = limits.DefaultMaxBatchDeclaredBytes
	DefaultMaxInlineBytes   = limits.DefaultMaxDocumentInlineBytes
	DefaultMaxBatchInline   = limits.DefaultMaxBatchInlineBytes
	DefaultMaxNameBytes     = 255
	DefaultMaxTeamQueue     = 100_000
	DefaultMaxAttemptsBound = 20
	maxTeamBytes            = 64
	maxURIBytes             = 2048
	maxContentTypeBytes     = 255
)

// WithDefaults returns l with every zero field set to its default.
func (l Limits) WithDefaults() Limits {
	if l.MaxDocuments <= 0 {
		l.MaxDocuments = DefaultMaxDocuments
	}
	if l.MaxDocumentBytes <= 0 {
		l.MaxDocumentBytes = DefaultMaxDocumentBytes
	}
	if l.MaxBatchBytes <= 0 {
		l.MaxBatchBytes = DefaultMaxBatchBytes
	}
	if l.MaxInlineBytes <= 0 {
		l.MaxInlineBytes = DefaultMaxInlineBytes
	}
	if l.MaxBatchInlineBytes <= 0 {
		l.MaxBatchInlineBytes = DefaultMaxBatchInline
	}
	if l.MaxNameBytes <= 0 {
		l.MaxNameBytes = DefaultMaxNameBytes
	}
	if l.MaxTeamQueue <= 0 {
		l.MaxTeamQueue = DefaultMaxTeamQueue
	}
	if l.MaxAttempts == 0 {
		l.MaxAttempts = DefaultMaxAttemptsBound
	}
	return l
}

// Validation failures of a whole batch.
var (
	// ErrInvalidBatch is returned when a batch breaks a rule or a limit; the
	// *ValidationError carries the reason and every violation.
	ErrInvalidBatch = errors.New("invalid batch")
	// ErrTeamQueueFull is returned when accepting a batch would take its team
	// past its queue depth.
	ErrTeamQueueFull = errors.New("team queue full")
	// ErrRequestIDReused is returned when a request id is submitted again
	// with different documents.
	ErrRequestIDReused = errors.New("request id reused for a different batch")
)

// Violation names one offending field.
type Violation struct {
	// Field is a path such as "documents[3].size_bytes".
	Field string
	// Reason is the stable reason, such as DOCUMENT_TOO_LARGE.
	Reason      reason.Reason
	Description string
}

// ValidationError is a refused batch: Reason is the first violation's
// reason and Violations lists all of them.
type ValidationError struct {
	Err        error
	Reason     reason.Reason
	Violations []Violation
	// Limit and Used describe a quota failure (TEAM_QUEUE_FULL).
	Limit, Used int
}

// Error implements error.
func (e *ValidationError) Error() string {
	msg := fmt.Sprintf("%v: %s", e.Err, e.Reason)
	if len(e.Violations) > 0 {
		msg += ": " + e.Violations[0].Description
		if n := len(e.Violations) - 1; n > 0 {
			msg += fmt.Sprintf(" (and %d more)", n)
		}
	}
	return msg
}

// Unwrap returns the sentinel.
func (e *ValidationError) Unwrap() error { return e.Err }

// DocInput is one document as submitted, with its inline content.
type DocInput struct {
	Document
	Content []byte
}

// PolicyInput is a batch's retry-policy override; zero fields take defaults.
type PolicyInput struct {
	MaxAttempts uint32
	BackoffBase time.Duration
	BackoffCap  time.Duration
}

// Bounds on retry-policy overrides.
const (
	minBackoffBase = time.Millisecond
	maxBackoffCap  = 24 * time.Hour
)

// ValidateBatch checks a batch against the limits, before anything is
// stored. It returns nil or a *ValidationError listing every violation.
func ValidateBatch(team, requestID string, docs []DocInput, policy PolicyInput, l Limits) error {
	l = l.WithDefaults()
	var vs []Violation
	add := func(field string, r reason.Reason, format string, args ...any) {
		vs = append(vs, Violation{Field: field, Reason: r, Description: fmt.Sprintf(format, args...)})
	}
	if !ValidTeam(team) {
		add("team", reason.InvalidTeam, "team must be 1 to %d bytes of [a-z0-9_-]", maxTeamBytes)
	}
	if requestID == "" {
		add("request_id", reason.MissingRequestID, "request_id is required")
	} else if !ValidRequestID(requestID) {
		add("request_id", reason.InvalidRequestID, "request_id must be 1 to %d bytes of UTF-8 text without control or bidirectional formatting characters", MaxRequestIDBytes)
	}
	switch {
	case len(docs) == 0:
		add("documents", reason.EmptyBatch, "a batch needs at least one document")
	case len(docs) > l.MaxDocuments:
		add("documents", reason.BatchTooLarge, "%d documents, at most %d per batch", len(docs), l.MaxDocuments)
	}
	if policy.MaxAttempts > l.MaxAttempts {
		add("retry_policy.max_attempts", reason.InvalidRetryPolicy, "max_attempts %d is over the bound %d", policy.MaxAttempts, l.MaxAttempts)
	}
	if policy.BackoffBase != 0 && (policy.BackoffBase < minBackoffBase || policy.BackoffBase > maxBackoffCap) {
		add("retry_policy.backoff_base", reason.InvalidRetryPolicy, "backoff_base must be within [%v, %v]", minBackoffBase, maxBackoffCap)
	}
	if policy.BackoffCap != 0 && (policy.BackoffCap < minBackoffBase || policy.BackoffCap > maxBackoffCap || (policy.BackoffBase != 0 && policy.BackoffCap < policy.BackoffBase)) {
		add("retry_policy.backoff_cap", reason.InvalidRetryPolicy, "backoff_cap must be within [backoff_base, %v]", maxBackoffCap)
	}
	var total, inline int64
	seen := make(map[string]int, len(docs))
	for i, d := range docs {
		vs = validateDocument(vs, i, d, seen, l)
		total += max(d.SizeBytes, int64(len(d.Content)))
		inline += int64(len(d.Content))
	}
	if total > l.MaxBatchBytes {
		add("documents", reason.BatchTooLarge, "batch declares %d bytes, at most %d", total, l.MaxBatchBytes)
	}
	if inline > l.MaxBatchInlineBytes {
		add("documents", reason.BatchTooLarge, "batch carries %d bytes inline, at most %d", inline, l.MaxBatchInlineBytes)
	}
	if len(vs) == 0 {
		return nil
	}
	return &ValidationError{Err: ErrInvalidBatch, Reason: vs[0].Reason, Violations: vs}
}

// validateDocument appends the violations of document i to vs. seen maps
// the names of earlier documents to their index.
func validateDocument(vs []Violation, i int, d DocInput, seen map[string]int, l Limits) []Violation {
	add := func(field string, r reason.Reason, format string, args ...any) {
		vs = append(vs, Violation{Field: fmt.Sprintf("documents[%d].%s", i, field), Reason: r, Description: fmt.Sprintf(format, args...)})
	}
	switch {
	case d.Name == "":
		add("name", reason.InvalidName, "document %d has no name", i)
	case len(d.Name) > l.MaxNameBytes:
		add("name", reason.InvalidName, "document %d name is %d bytes, at most %d", i, len(d.Name), l.MaxNameBytes)
	case !ValidText(d.Name):
		add("name", reason.InvalidName, "document %d name must be UTF-8 text without control or bidirectional formatting characters", i)
	default:
		if prev, dup := seen[d.Name]; dup {
			add("name", reason.DuplicateName, "document %d name %q repeats document %d", i, d.Name, prev)
		} else {
			seen[d.Name] = i
		}
	}
	if d.SizeBytes < 0 {
		add("size_bytes", reason.InvalidSize, "document %q has a negative size", d.Name)
	}
	size := max(d.SizeBytes, int64(len(d.Content)))
	if d.SizeBytes > 0 && d.SizeBytes < int64(len(d.Content)) {
		add("size_bytes", reason.InvalidSize, "document %q declares %d bytes but carries %d inline", d.Name, d.SizeBytes, len(d.Content))
	}
	if size > l.MaxDocumentBytes {
		add("size_bytes", reason.DocumentTooLarge, "document %q is %d bytes, at most %d", d.Name, size, l.MaxDocumentBytes)
	}
	if len(d.Content) > l.MaxInlineBytes {
		add("content", reason.ContentTooLarge, "document %q has %d bytes inline, at most %d", d.Name, len(d.Content), l.MaxInlineBytes)
	}
	if len(d.Content) == 0 && d.SourceURI == "" {
		add("content", reason.MissingContent, "document %q has neither content nor source_uri", d.Name)
	}
	if len(d.SourceURI) > maxURIBytes || !ValidText(d.SourceURI) {
		add("source_uri", reason.InvalidSourceURI, "document %d source_uri must be at most %d bytes of UTF-8 text without control or bidirectional formatting characters", i, maxURIBytes)
	}
	if len(d.ContentType) > maxContentTypeBytes || !ValidText(d.ContentType) {
		add("content_type", reason.InvalidContentType, "document %d content_type must be at most %d bytes of UTF-8 text without control or bidirectional formatting characters", i, maxContentTypeBytes)
	}
	return vs
}

// ValidTeam reports whether team is a well-formed team name.
func ValidTeam(team string) bool {
	if team == "" || len(team) > maxTeamBytes {
		return false
	}
	for _, r := range team {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return false
		}
	}
	return true
}

// Policy returns the retry policy for a batch: the override's non-zero
// fields over the coordinator's defaults.
func (p PolicyInput) Policy(def RetryPolicy) RetryPolicy {
	if p.MaxAttempts != 0 {
		def.MaxAttempts = p.MaxAttempts
	}
	if p.BackoffBase != 0 {
		def.BackoffBase = p.BackoffBase
	}
	if p.BackoffCap != 0 {
		def.BackoffCap = p.BackoffCap
	}
	if def.BackoffCap < def.BackoffBase {
		def.BackoffCap = def.BackoffBase
	}
	return def
}

// Formats is a set of formats the coordinator knows are unsupported: file
// extensions (".docm") and MIME types, lower case.
type Formats map[string]bool

// DefaultUnsupported lists macro-enabled Office files and executables.
var DefaultUnsupported = []string{
	".docm", ".dotm", ".xlsm", ".xltm", ".xlam", ".pptm", ".potm", ".ppsm",
	".exe", ".dll", ".bat", ".cmd", ".com", ".scr", ".msi", ".js", ".vbs", ".ps1",
	"application/vnd.ms-word.document.macroenabled.12",
	"application/vnd.ms-excel.sheet.macroenabled.12",
	"application/vnd.ms-powerpoint.presentation.macroenabled.12",
	"application/x-msdownload", "application/x-msdos-program",
}

// NewFormats returns the set of the given formats.
func NewFormats(list []string) Formats {
	f := make(Formats, len(list))
	for _, s := range list {
		if s = strings.ToLower(strings.TrimSpace(s)); s != "" {
			f[s] = true
		}
	}
	return f
}

// Unsupported reports whether d's content type or name extension is in the set.
func (f Formats) Unsupported(d Document) bool {
	ct := strings.ToLower(strings.TrimSpace(d.ContentType))
	if f[ct] {
		return true
	}
	ext := strings.ToLower(path.Ext(d.Name))
	return ext != "" && f[ext]
}

// ErrPreviewType is returned by PreviewMediaType for a media type that is
// not one of the preview types.
var ErrPreviewType = errors.New("preview media type not allowed")

// PreviewTypes are the media types a preview may have: raster images,
// which a browser shows and never runs. SVG, HTML and everything else are
// refused, because the console serves a preview under its stored type on
// its own origin.
var PreviewTypes = []string{"image/png", "image/jpeg", "image/gif", "image/webp"}

// PreviewMediaType parses a preview's media type (RFC 2045, as
// mime.ParseMediaType reads it) and returns it normalised: lower case,
// without parameters, one of PreviewTypes. Anything else (a type that does
// not parse, a list of types, a parameter that does not parse, a type
// outside the list, more than 255 bytes) is an error wrapping
// ErrPreviewType. Every path that stores a preview calls it, and the
// console and GetArtifact judge a stored type with it, so a type stored by
// an earlier release that would fail it is never served as an image.
func PreviewMediaType(ct string) (string, error) {
	if len(ct) > maxContentTypeBytes {
		return "", fmt.Errorf("%w: %d bytes, at most %d", ErrPreviewType, len(ct), maxContentTypeBytes)
	}
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		return "", fmt.Errorf("%w: %q is not one media type: %v", ErrPreviewType, ct, err)
	}
	if !slices.Contains(PreviewTypes, mt) {
		return "", fmt.Errorf("%w: %s is not one of %s", ErrPreviewType, mt, strings.Join(PreviewTypes, ", "))
	}
	return mt, nil
}

// OpaquePreviewType is the media type a stored preview type that
// PreviewMediaType refuses is reported and served as: bytes to download,
// never to show.
const OpaquePreviewType = "application/octet-stream"

// ServedPreviewType returns the media type a stored preview is reported and
// served under: its normalised type when PreviewMediaType accepts it, else
// OpaquePreviewType. Every preview stored by this release passes; a type
// stored by an earlier one may not.
func ServedPreviewType(stored string) string {
	if mt, err := PreviewMediaType(stored); err == nil {
		return mt
	}
	return OpaquePreviewType
}
