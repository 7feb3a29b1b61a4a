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
//	    {"name": "render-pool", "token": "…", "roles": ["renderer"]},
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
package auth
