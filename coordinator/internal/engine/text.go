package engine

import (
	"fmt"

	"github.com/leasehold/leasehold/client/reason"
	"github.com/leasehold/leasehold/coordinator/internal/jobs"
)

// maxTextBytes bounds every string a command carries: above every field's
// own bound (the longest, a failure message, is 4 KiB), and low enough that
// a key built from two of them (a replay's principal and request id) fits
// bbolt's 32 KiB.
const maxTextBytes = 8 << 10

// storable reports whether s may go into a record: jobs.ValidText, at most
// maxTextBytes.
func storable(s string) bool { return len(s) <= maxTextBytes && jobs.ValidText(s) }

// badText is the refusal of a command whose field is not storable:
// INVALID_ARGUMENT INVALID_TEXT, naming the field. A request that passed
// its handler's checks never meets it: those refuse the same strings
// earlier, with the field's own reason.
func badText(field string) error {
	return jobs.TextError(field, reason.InvalidText, fmt.Sprintf(
		"%s must be at most %d bytes of UTF-8 text without control or bidirectional formatting characters", field, maxTextBytes))
}

// checkText returns badText of the first field whose value is not
// storable; pairs alternate field names and values.
func checkText(pairs ...string) error {
	for i := 0; i+1 < len(pairs); i += 2 {
		if !storable(pairs[i+1]) {
			return badText(pairs[i])
		}
	}
	return nil
}

// noText is embedded by commands that carry no string into a record.
type noText struct{}

func (noText) text() error { return nil }

// text checks the renderer a command acts as.
func (r Renderer) text() error {
	return checkText("renderer_id", r.ID, "principal", r.Principal)
}

// text checks what a completion can write: the renderer, the digest and
// media type of its preview, its failure message. completeOne asks it of
// every completion, a session's too, before the completion touches
// anything.
func (r CompleteRequest) text() error {
	if err := checkText("renderer_id", r.Renderer, "success.artifact_digest", r.Digest,
		"success.content_type", r.ContentType, "failure.message", r.Message); err != nil {
		return err
	}
	if p := r.Preview; p != nil {
		return checkText("preview.digest", p.Digest, "preview.content_type", p.ContentType)
	}
	return nil
}
