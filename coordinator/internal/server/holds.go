package server

import (
	"context"

	"github.com/leasehold/leasehold/coordinator/internal/auth"
)

// The rules by which a long-lived stream or a long poll goes on after the
// principals file is reloaded (auth.HoldWhile): each is the handler's own
// check at the call's start, judged again against the call's new
// principal, so that a reload ends what a restart would have refused. The
// call ends with the check's refusal, PERMISSION_DENIED through the error
// table; a token removed from the file ends it UNAUTHENTICATED (package
// auth).

// holdRenderer keeps the stream or long poll of ctx while its principal
// may act as renderer id: it has the renderer role and the id is among
// those the principals file allows it.
func (c *core) holdRenderer(ctx context.Context, id string) {
	auth.HoldWhile(ctx, func(p auth.Principal) error {
		if !p.Can(auth.RoleRenderer) {
			return c.status(denied("%s no longer has the renderer role", p.Name))
		}
		if _, err := rendererFor(p, id); err != nil {
			return c.status(err)
		}
		return nil
	})
}

// holdTeam keeps the stream of ctx while its principal sees team's jobs
// as it did when the stream began (v): a submitter that is no longer one,
// or an operator whose scope no longer covers the team, loses it.
func (c *core) holdTeam(ctx context.Context, team string, v view) {
	auth.HoldWhile(ctx, func(p auth.Principal) error {
		if now, ok := access(p, team); !ok || now != v {
			return c.status(denied("%s may no longer follow team %q as this stream does", p.Name, team))
		}
		return nil
	})
}

// holdScope keeps the stream of ctx while its principal's overview scope
// for team (every team it may read when team is empty) still covers sc,
// the scope the stream shows.
func (c *core) holdScope(ctx context.Context, team string, sc teamScope) {
	auth.HoldWhile(ctx, func(p auth.Principal) error {
		now, err := scopeOf(p, team)
		if err != nil {
			return c.status(err)
		}
		if now.teams != nil && (sc.teams == nil || !now.coversAll(sc.teams)) {
			return c.status(denied("%s may no longer read every team this stream shows", p.Name))
		}
		return nil
	})
}
