package engine

import (
	"fmt"

	"github.com/leasehold/leasehold/coordinator/internal/jobs"
)

// ReasonInvalidText is the reason of the writer's own refusal of a command
// carrying a string it may not store (see checkText). A request that passed
// its handler's checks never meets it: those refuse the same strings
// earlier, with the field's own reason.
const ReasonInvalidText = "INVALID_TEXT"

// maxTextBytes bounds every string a command carries: above every field's
// own bound (the longest, a failure message, is 4 KiB), and low enough that
// a key built from two of them (a replay's principal and request id) fits
// bbolt's 32 KiB.
const maxTextBytes = 8 << 10

// storable reports whether s may go into a record: jobs.ValidText, at most
// maxTextBytes.
func storable(s string) bool { return len(s) <= maxTextBytes && jobs.ValidText(s) }

// badText is the refusal of a command whose field is not storable:
// INVALID_ARGUMENT INVALID_TEXT, naming the field.
func badText(field string) error {
	return jobs.TextError(field, ReasonInvalidText, fmt.Sprintf(
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

func (c *submitCmd) text() error {
	if err := checkText("team", c.req.Team, "request_id", c.req.RequestID, "trace_parent", c.req.TraceParent); err != nil {
		return err
	}
	// The stored documents: req.Docs's, with the size and digest filled in.
	for i, d := range c.docs {
		for _, f := range [...]struct{ name, s string }{
			{"name", d.Name}, {"content_type", d.ContentType}, {"source_uri", d.SourceURI}, {"content_sha256", d.ContentSHA256},
		} {
			if !storable(f.s) {
				return badText(fmt.Sprintf("documents[%d].%s", i, f.name))
			}
		}
	}
	return nil
}

func (c *cancelCmd) text() error {
	return checkText("principal", c.req.Principal, "reason", c.req.Reason)
}

func (c *replayCmd) text() error {
	return checkText("principal", c.req.Principal, "request_id", c.req.RequestID, "reason", c.req.Reason)
}

func (c *pauseCmd) text() error {
	return checkText("principal", c.principal, "reason", c.reason)
}

func (c *auditCmd) text() error {
	if err := checkText("principal", c.rec.Principal, "action", c.rec.Action, "reason", c.rec.Reason,
		"request_id", c.rec.RequestID); err != nil {
		return err
	}
	for i, team := range c.rec.Teams {
		if !storable(team) {
			return badText(fmt.Sprintf("teams[%d]", i))
		}
	}
	return nil
}

func (c *completeCmd) text() error { return c.req.text() }

func (c *stageCmd) text() error {
	return checkText("renderer_id", c.req.Renderer, "digest", c.req.Preview.Digest,
		"metadata.content_type", c.req.Preview.ContentType)
}

func (c *acquireCmd) text() error { return c.req.Renderer.text() }

func (c *releaseCmd) text() error { return checkText("renderer_id", c.renderer) }

func (c *openCmd) text() error {
	if err := c.req.Renderer.text(); err != nil {
		return err
	}
	return checkText("instance_id", c.req.Instance)
}

func (c *heartbeatCmd) text() error { return c.req.Renderer.text() }

// text of a session message: its renderer was checked when the session
// opened, and each completion is checked on its own by completeOne, so
// that one bad completion is answered alone and the others apply.
func (c *sessionCmd) text() error { return nil }
