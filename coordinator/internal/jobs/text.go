package jobs

import (
	"errors"
	"unicode/utf8"

	"github.com/leasehold/leasehold/client/limits"
	"github.com/leasehold/leasehold/client/reason"
)

// Caller text.
//
// Every string a caller sends that the coordinator keeps (team, request
// id, document name, content type and source URI, cancel, pause, resume and
// replay reasons, a renderer's failure message and preview media type) is
// checked against one character rule, ValidText, before anything is
// stored, wherever the call came from: the field's own check (its length,
// its reason) in ValidateBatch or in the server's handlers, and the writer's
// last check of every command (the engine refuses INVALID_TEXT). Stored
// text is shown in the console, printed by the CLI and written to logs, so
// the rule is the same for every field; teams and renderer ids are
// narrower still.

// ErrInvalidText is the sentinel of a *ValidationError that refuses a
// string which is not valid text (ValidText) or is too long.
var ErrInvalidText = errors.New("invalid text")

// ValidText reports whether s is text the coordinator stores: well-formed
// UTF-8 (no invalid bytes, overlong encodings or surrogate halves), with no
// control character (C0 U+0000–U+001F, tab and line breaks included, DEL
// U+007F, C1 U+0080–U+009F) and no bidirectional embedding, override or
// isolate control (U+202A–U+202E, U+2066–U+2069), which would make a name
// or a reason read as something it is not. The empty string is valid.
func ValidText(s string) bool {
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c < 0x20 || c == 0x7f {
				return false
			}
			i++
			continue
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n == 1 || r <= 0x9f || isBidiControl(r) {
			return false
		}
		i += n
	}
	return true
}

// isBidiControl reports whether r embeds, overrides or isolates a
// direction (LRE, RLE, PDF, LRO, RLO, LRI, RLI, FSI, PDI). The marks U+200E,
// U+200F and U+061C change no run and are allowed.
func isBidiControl(r rune) bool {
	return r >= 0x202a && r <= 0x202e || r >= 0x2066 && r <= 0x2069
}

// MaxRequestIDBytes bounds a request id (idempotency key).
const MaxRequestIDBytes = limits.MaxRequestIDBytes

// ValidRequestID reports whether id is a well-formed request id
// (idempotency key): 1 to MaxRequestIDBytes bytes of text (ValidText).
func ValidRequestID(id string) bool {
	return id != "" && len(id) <= MaxRequestIDBytes && ValidText(id)
}

// TextError returns the refusal of field, whose value is not valid text
// or is too long, with r (the field's own, or INVALID_TEXT) and
// description.
func TextError(field string, r reason.Reason, description string) *ValidationError {
	return &ValidationError{Err: ErrInvalidText, Reason: r,
		Violations: []Violation{{Field: field, Reason: r, Description: description}}}
}
