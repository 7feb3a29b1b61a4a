// Package auth maps bearer tokens to principals and guards the coordinator's
// gRPC services with them.
//
// A principal has a name, roles, a team and a scope. A submitter acts for
// its one team; an operator acts on the teams of its scope ("*" for every
// team); a renderer needs neither. The token that identifies a principal is
// a shared secret: it is compared in constant time and never logged or
// returned.
//
// # Principals file
//
// The coordinator reads its principals from a JSON file:
//
//	{
//	  "principals": [
//	    {"name": "alpha-svc", "token": "…", "team": "alpha", "roles": ["submitter"]},
//	    {"name": "render-pool", "token": "…", "roles": ["renderer"], "renderer_id_prefix": "pool-a-"},
//	    {"name": "render-ab", "token": "…", "roles": ["renderer"], "renderer_ids": ["r-1", "r-2"], "max_capacity": 64},
//	    {"name": "ops", "token": "…", "roles": ["operator"], "scope": ["alpha", "beta"]},
//	    {"name": "nightly-backup", "token": "sha256:9f86d0…", "roles": ["backup"]}
//	  ]
//	}
//
// name is the principal's identity in job histories and the audit trail;
// token is the secret callers send as "authorization: Bearer <token>" (at
// least 16 bytes, unique in the file), or "sha256:" and the 64 hex digits
// of its SHA-256, so that the file need not hold the secret itself (the
// length of a token given so cannot be checked: make it long); team is a
// submitter's one team; scope lists an operator's teams, "*" meaning all;
// roles is any of submitter, renderer, operator and backup. The team
// serves only the submitter role and the scope only the operator role.
//
// The backup role downloads a copy of the whole database, every team's
// documents and previews included, which an operator never sees; so no
// scope implies it, and it must be named in the file.
//
// OpenFile warns when the file's permissions let other users read it;
// File.Reload reads it again (the coordinator does so on SIGHUP) and
// swaps the principals at once, keeping the old ones if the new file is
// invalid.
//
// # Streams and reloads
//
// A stream outlives the call that authenticated it, so the stream
// interceptor holds every authenticated stream in its Set for as long as
// it runs; the unary interceptor holds the long polls (Acquire, which may
// wait a minute) the same way. When the principals are replaced, a
// stream or long poll whose token the new set lacks ends UNAUTHENTICATED,
// and one whose new principal fails the call's rule ends with the rule's
// refusal: the handler states the rule with HoldWhile (may this principal
// still use this renderer id, see this team, ...); a call without one
// ends when its principal lost a role it had. The handler sees its
// context done; a stream's status is the reload's whatever the handler
// returns, and a long poll's unless it answered.
//
// # Renderer identity
//
// A renderer names itself with a renderer id on every call, and the id is
// bound to its credential: a renderer principal must say which ids it may
// use, with renderer_ids (a list of exact ids), renderer_id_prefix (every id
// that starts with it), or both. A renderer principal with neither is
// refused when the file is loaded, so that forgetting the keys can never
// allow every id. Allowing every id is spelt out, as for an operator's
// scope: "renderer_ids": ["*"], with "*" alone in the list. An empty
// renderer_id_prefix is refused rather than read as "every id": a template
// whose variable came out empty must not widen a credential. The keys serve
// only the renderer role.
//
// max_capacity (default 1024, at least 1) bounds the live capacity that all
// the streams of one renderer credential may declare together, so that many
// streams declaring a large capacity each cannot defeat the team share cap.
//
// Principal.MayUseRendererID decides whether a principal may use an id and
// Principal.MaxCapacity carries the bound; the service handlers enforce
// both. The development renderer (dev-renderer, loopback only) may use any
// id, with the default max_capacity.
package auth
