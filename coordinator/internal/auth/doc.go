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
//	    {"name": "ops", "token": "…", "roles": ["operator"], "scope": ["alpha", "beta"]}
//	  ]
//	}
//
// name is the principal's identity in job histories and the audit trail;
// token is the secret callers send as "authorization: Bearer <token>" (at
// least 8 bytes, unique in the file); team is a submitter's one team; scope
// lists an operator's teams, "*" meaning all; roles is any of submitter,
// renderer and operator. The team serves only the submitter role and the
// scope only the operator role.
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
