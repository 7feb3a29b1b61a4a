package auth

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/leasehold/leasehold/client/reason"
	"github.com/leasehold/leasehold/coordinator/internal/jobs"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors"
	grpcauth "github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/auth"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/selector"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Role is what a principal may do.
type Role string

// The roles.
const (
	// RoleSubmitter submits batches for its team and follows and cancels them.
	RoleSubmitter Role = "submitter"
	// RoleRenderer leases jobs, heartbeats, uploads artifacts and completes.
	RoleRenderer Role = "renderer"
	// RoleOperator lists, cancels and replays jobs of the teams in its scope
	// and pauses dispatch; it never sees document data.
	RoleOperator Role = "operator"
	// RoleBackup downloads a copy of the whole database
	// (OperatorService.Backup): every team's jobs, documents and previews.
	// It is a capability of its own, which no operator scope implies, and
	// no development principal holds it.
	RoleBackup Role = "backup"
)

// AllTeams in an operator's scope means every team.
const AllTeams = "*"

// AnyRendererID in a renderer principal's renderer_ids lets it use every
// renderer id.
const AnyRendererID = "*"

// DefaultMaxCapacity is the most live capacity one renderer credential may
// declare when the principals file does not say (max_capacity).
const DefaultMaxCapacity = 1024

// minTokenBytes is the shortest token a principals file may give in the
// clear.
const minTokenBytes = 16

// DigestPrefix starts a token given in a principals file as the SHA-256
// of the token rather than the token itself: "sha256:" and 64 hex digits.
const DigestPrefix = "sha256:"

// Principal is an authenticated caller. A submitter acts for its one Team;
// an operator acts on the teams of its Scope. The two never mix: an
// operator's scope does not let it submit, and a submitter's team does not
// widen an operator's scope.
type Principal struct {
	// Name identifies the principal in histories and the audit trail.
	Name string
	// Team is the one team a submitter submits for and follows.
	Team string
	// Scope lists the teams an operator acts on; "*" means all.
	Scope []string
	// Roles lists what the principal may do.
	Roles []Role
	// RendererIDs lists the renderer ids a renderer may name itself with;
	// AnyRendererID ("*") allows every id. See MayUseRendererID.
	RendererIDs []string
	// RendererIDPrefix, when not empty, allows every renderer id that
	// starts with it, in addition to RendererIDs.
	RendererIDPrefix string
	// MaxCapacity is the most live capacity (slots) that all the streams of
	// this credential may declare together. Every renderer principal of a
	// Set has one of at least 1 (DefaultMaxCapacity unless the file says);
	// it is 0 for the other roles. It stops one credential from opening
	// many streams that each declare a large capacity and so defeating the
	// team share cap.
	MaxCapacity int
	// LoopbackOnly marks a principal whose token is public (the
	// development tokens): AuthFunc accepts it only on a call from this
	// machine (LocalPeer), and the console only from a loopback browser.
	LoopbackOnly bool
}

// Can reports whether p holds role.
func (p Principal) Can(role Role) bool {
	return slices.Contains(p.Roles, role)
}

// SubmitterOf reports whether p is a submitter for team.
func (p Principal) SubmitterOf(team string) bool {
	return p.Can(RoleSubmitter) && p.Team != "" && p.Team == team
}

// InScope reports whether p is an operator whose scope covers team.
func (p Principal) InScope(team string) bool {
	return p.Can(RoleOperator) && (slices.Contains(p.Scope, AllTeams) || slices.Contains(p.Scope, team))
}

// AllScope reports whether p is an operator whose scope is every team.
func (p Principal) AllScope() bool {
	return p.Can(RoleOperator) && slices.Contains(p.Scope, AllTeams)
}

// MayUseRendererID reports whether p may name itself id as a renderer: p
// holds the renderer role and id is listed in RendererIDs, RendererIDs
// holds AnyRendererID, or id starts with a non-empty RendererIDPrefix. An
// empty id is never allowed. The handlers call it on every call that
// carries a renderer id, and refuse any other id with PERMISSION_DENIED
// RENDERER_ID_NOT_ALLOWED.
func (p Principal) MayUseRendererID(id string) bool {
	if id == "" || !p.Can(RoleRenderer) {
		return false
	}
	if slices.Contains(p.RendererIDs, AnyRendererID) || slices.Contains(p.RendererIDs, id) {
		return true
	}
	return p.RendererIDPrefix != "" && strings.HasPrefix(id, p.RendererIDPrefix)
}

// Set is a set of principals indexed by token. It is safe for concurrent
// use. Its principals change only all at once, by Replace (a principals
// file reloaded): a lookup sees the old set or the new one, never a mix.
// A Set must not be copied once used.
type Set struct {
	entries atomic.Pointer[[]entry]
	// holds are the authenticated streams in progress, which Replace
	// judges against the new principals.
	holds holds
}

// entry is one principal with the SHA-256 of its token, so that lookups
// compare fixed-length digests in constant time.
type entry struct {
	digest    [sha256.Size]byte
	principal Principal
}

// Lookup returns the principal whose token is token. Every entry is
// compared, in constant time, whether or not an earlier one matched.
func (s *Set) Lookup(token string) (Principal, bool) {
	if s == nil || token == "" {
		return Principal{}, false
	}
	return s.lookup(sha256.Sum256([]byte(token)))
}

// lookup returns the principal whose token's digest is d, comparing every
// entry in constant time.
func (s *Set) lookup(d [sha256.Size]byte) (Principal, bool) {
	entries := s.load()
	found := -1
	for i := range entries {
		if subtle.ConstantTimeCompare(d[:], entries[i].digest[:]) == 1 {
			found = i
		}
	}
	if found < 0 {
		return Principal{}, false
	}
	return entries[found].principal, true
}

// Len returns the number of principals.
func (s *Set) Len() int {
	if s == nil {
		return 0
	}
	return len(s.load())
}

// Replace gives s the principals of from, at once: a token only s knew
// stops working at its next call, a token only from knows starts working.
// Unary calls already authenticated keep the principal they were given,
// except long polls; a stream or long poll in progress (see
// StreamServerInterceptor, UnaryServerInterceptor) whose token from does
// not hold ends UNAUTHENTICATED, and one whose new principal may no longer
// hold it (see HoldWhile) ends with the rule's refusal. It returns how many
// calls it ended.
func (s *Set) Replace(from *Set) int {
	e := from.load()
	s.entries.Store(&e)
	return s.judgeAll(e)
}

// load returns the current entries.
func (s *Set) load() []entry {
	if e := s.entries.Load(); e != nil {
		return *e
	}
	return nil
}

// maxNameBytes bounds a principal's name.
const maxNameBytes = 128

// fileFormat is the JSON layout of a principals file.
type fileFormat struct {
	Principals []filePrincipal `json:"principals"`
}

// filePrincipal is one principal as written in the file. The pointers tell
// a key that is absent from one given with its zero value.
type filePrincipal struct {
	Name             string   `json:"name"`
	Token            string   `json:"token"`
	Team             string   `json:"team"`
	Scope            []string `json:"scope"`
	Roles            []Role   `json:"roles"`
	RendererIDs      []string `json:"renderer_ids"`
	RendererIDPrefix *string  `json:"renderer_id_prefix"`
	MaxCapacity      *int     `json:"max_capacity"`
}

// Parse decodes and validates the JSON of a principals file. Unknown fields
// are refused so that a misspelt key does not silently widen or narrow a
// principal.
func Parse(data []byte) (*Set, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var f fileFormat
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("decoding JSON: %w", err)
	}
	if len(f.Principals) == 0 {
		return nil, errors.New("no principals")
	}
	names := make(map[string]bool)
	digests := make(map[[sha256.Size]byte]bool)
	var entries []entry
	for i, fp := range f.Principals {
		where := fmt.Sprintf("principal %d (%q)", i, fp.Name)
		if fp.Name == "" {
			return nil, fmt.Errorf("principal %d: name is required", i)
		}
		// The name is written into audit records and rejections, and a team
		// names records and keys: text the store would refuse would make
		// every write of the principal fail.
		if len(fp.Name) > maxNameBytes || !jobs.ValidText(fp.Name) {
			return nil, fmt.Errorf("principal %d: name must be 1 to %d bytes of text without control or bidirectional formatting characters", i, maxNameBytes)
		}
		if names[fp.Name] {
			return nil, fmt.Errorf("%s: name repeats an earlier principal", where)
		}
		names[fp.Name] = true
		digest, err := tokenDigest(fp.Token)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", where, err)
		}
		if digests[digest] {
			return nil, fmt.Errorf("%s: token repeats an earlier principal's", where)
		}
		digests[digest] = true
		if len(fp.Roles) == 0 {
			return nil, fmt.Errorf("%s: at least one role is required", where)
		}
		p := Principal{Name: fp.Name}
		for _, r := range fp.Roles {
			switch r {
			case RoleSubmitter, RoleRenderer, RoleOperator, RoleBackup:
			default:
				return nil, fmt.Errorf("%s: unknown role %q (want submitter, renderer, operator or backup)", where, r)
			}
			if !slices.Contains(p.Roles, r) {
				p.Roles = append(p.Roles, r)
			}
		}
		if fp.Team == AllTeams {
			return nil, fmt.Errorf("%s: team must name one team; use scope for operators", where)
		}
		if fp.Team != "" && !jobs.ValidTeam(fp.Team) {
			return nil, fmt.Errorf("%s: team %q is not a team name (1 to 64 bytes of [a-z0-9_-])", where, fp.Team)
		}
		p.Team = fp.Team
		for _, t := range fp.Scope {
			if strings.TrimSpace(t) == "" {
				return nil, fmt.Errorf("%s: scope has an empty team", where)
			}
			if t != AllTeams && !jobs.ValidTeam(t) {
				return nil, fmt.Errorf("%s: scope team %q is not a team name (1 to 64 bytes of [a-z0-9_-])", where, t)
			}
			if !slices.Contains(p.Scope, t) {
				p.Scope = append(p.Scope, t)
			}
		}
		if p.Can(RoleSubmitter) && fp.Team == "" {
			return nil, fmt.Errorf("%s: a submitter needs a team", where)
		}
		if p.Can(RoleOperator) && len(fp.Scope) == 0 {
			return nil, fmt.Errorf("%s: an operator needs a scope (\"*\" for all teams)", where)
		}
		if err := parseRenderer(fp, &p); err != nil {
			return nil, fmt.Errorf("%s: %w", where, err)
		}
		entries = append(entries, entry{digest: digest, principal: p})
	}
	s := &Set{}
	s.entries.Store(&entries)
	return s, nil
}

// tokenDigest returns the SHA-256 that identifies a principals file's
// token: the digest written after DigestPrefix, or the digest of a token
// given in the clear, which must be at least minTokenBytes long without
// surrounding spaces. The length of a token given as a digest cannot be
// checked.
func tokenDigest(token string) ([sha256.Size]byte, error) {
	var d [sha256.Size]byte
	if hexDigest, ok := strings.CutPrefix(token, DigestPrefix); ok {
		b, err := hex.DecodeString(hexDigest)
		if err != nil || len(b) != sha256.Size {
			return d, fmt.Errorf("token %s… must be %s and the %d hex digits of the token's SHA-256", DigestPrefix, DigestPrefix, 2*sha256.Size)
		}
		copy(d[:], b)
		return d, nil
	}
	if len(token) < minTokenBytes || strings.TrimSpace(token) != token {
		return d, fmt.Errorf("token must be at least %d bytes without surrounding spaces (or %s and the hex SHA-256 of the token)", minTokenBytes, DigestPrefix)
	}
	return sha256.Sum256([]byte(token)), nil
}

// parseRenderer validates the renderer keys of fp (renderer_ids,
// renderer_id_prefix, max_capacity) and sets them on p. A renderer must say
// which ids it may use, so that a file cannot allow every id by leaving the
// keys out; the other roles must not carry the keys at all.
func parseRenderer(fp filePrincipal, p *Principal) error {
	if !p.Can(RoleRenderer) {
		if fp.RendererIDs != nil || fp.RendererIDPrefix != nil || fp.MaxCapacity != nil {
			return errors.New("renderer_ids, renderer_id_prefix and max_capacity serve only the renderer role")
		}
		return nil
	}
	for _, id := range fp.RendererIDs {
		if id == "" || strings.TrimSpace(id) != id {
			return fmt.Errorf("renderer_ids has %q: an id must be non-empty without surrounding spaces", id)
		}
		if id == AnyRendererID && len(fp.RendererIDs) > 1 {
			return fmt.Errorf("renderer_ids: %q allows every id and must be listed alone", AnyRendererID)
		}
		if !slices.Contains(p.RendererIDs, id) {
			p.RendererIDs = append(p.RendererIDs, id)
		}
	}
	if fp.RendererIDPrefix != nil {
		prefix := *fp.RendererIDPrefix
		if prefix == "" || strings.TrimSpace(prefix) != prefix {
			return fmt.Errorf("renderer_id_prefix %q must be non-empty without surrounding spaces "+
				"(to allow every id, write \"renderer_ids\": [%q])", prefix, AnyRendererID)
		}
		p.RendererIDPrefix = prefix
	}
	if len(p.RendererIDs) == 0 && p.RendererIDPrefix == "" {
		return fmt.Errorf("a renderer needs renderer_ids or renderer_id_prefix to say which renderer ids it may use "+
			"(\"renderer_ids\": [%q] allows every id)", AnyRendererID)
	}
	p.MaxCapacity = DefaultMaxCapacity
	if fp.MaxCapacity != nil {
		if *fp.MaxCapacity < 1 {
			return fmt.Errorf("max_capacity must be at least 1, got %d", *fp.MaxCapacity)
		}
		p.MaxCapacity = *fp.MaxCapacity
	}
	return nil
}

// NewSet returns a set from tokens to principals, for tests and embedding.
// A renderer principal without a MaxCapacity gets DefaultMaxCapacity; its
// renderer ids are taken as given (none means it may use no id).
func NewSet(byToken map[string]Principal) *Set {
	keys := make([]string, 0, len(byToken))
	for k := range byToken {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	entries := make([]entry, 0, len(keys))
	for _, k := range keys {
		p := byToken[k]
		if p.Can(RoleRenderer) && p.MaxCapacity <= 0 {
			p.MaxCapacity = DefaultMaxCapacity
		}
		entries = append(entries, entry{digest: sha256.Sum256([]byte(k)), principal: p})
	}
	s := &Set{}
	s.entries.Store(&entries)
	return s
}

// The development tokens of DevPrincipals.
const (
	DevAlphaToken         = "dev-alpha"
	DevBetaToken          = "dev-beta"
	DevRendererToken      = "dev-renderer"
	DevOperatorToken      = "dev-operator"
	DevOperatorAlphaToken = "dev-operator-alpha"
)

// DevPrincipals returns the well-known principals of a local development
// stack: dev-alpha and dev-beta submit for teams alpha and beta,
// dev-renderer renders under any renderer id with DefaultMaxCapacity,
// dev-operator operates on every team and
// dev-operator-alpha on team alpha only. None holds RoleBackup: a backup
// needs a principals file. The tokens are public; the coordinator uses
// them only on a loopback address.
func DevPrincipals() *Set {
	return NewSet(map[string]Principal{
		DevAlphaToken:         {Name: "dev-alpha", Team: "alpha", Roles: []Role{RoleSubmitter}, LoopbackOnly: true},
		DevBetaToken:          {Name: "dev-beta", Team: "beta", Roles: []Role{RoleSubmitter}, LoopbackOnly: true},
		DevRendererToken:      {Name: "dev-renderer", Roles: []Role{RoleRenderer}, RendererIDs: []string{AnyRendererID}, MaxCapacity: DefaultMaxCapacity, LoopbackOnly: true},
		DevOperatorToken:      {Name: "dev-operator", Scope: []string{AllTeams}, Roles: []Role{RoleOperator}, LoopbackOnly: true},
		DevOperatorAlphaToken: {Name: "dev-operator-alpha", Scope: []string{"alpha"}, Roles: []Role{RoleOperator}, LoopbackOnly: true},
	})
}

// principalKey is the context key of the authenticated principal.
type principalKey struct{}

// NewContext returns ctx carrying p.
func NewContext(ctx context.Context, p Principal) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

// FromContext returns the principal the interceptors put in ctx.
func FromContext(ctx context.Context) (Principal, bool) {
	p, ok := ctx.Value(principalKey{}).(Principal)
	return p, ok
}

// ErrorDomain is the google.rpc.ErrorInfo domain of every error the
// coordinator returns; packages server and edge refuse under it too.
const ErrorDomain = reason.Domain

// unauthenticated returns the UNAUTHENTICATED status error with ErrorInfo
// reason UNAUTHENTICATED.
func unauthenticated(msg string) error {
	st := status.New(codes.Unauthenticated, msg)
	if d, err := st.WithDetails(&errdetails.ErrorInfo{Reason: string(reason.Unauthenticated), Domain: ErrorDomain}); err == nil {
		st = d
	}
	return st.Err()
}

// AuthFunc authenticates the bearer token in ctx's metadata and returns ctx
// carrying the principal, or an UNAUTHENTICATED error. A LoopbackOnly
// principal's token is refused unless ctx's peer is on this machine
// (LocalPeer), whatever address the server listens on. It also records the
// principal in ctx's Caller, if any.
func (s *Set) AuthFunc(ctx context.Context) (context.Context, error) {
	token, err := grpcauth.AuthFromMD(ctx, "bearer")
	if err != nil {
		return nil, unauthenticated("missing bearer token: send \"authorization: Bearer <token>\"")
	}
	d := sha256.Sum256([]byte(token))
	p, ok := s.lookup(d)
	if token == "" || !ok {
		return nil, unauthenticated("unknown bearer token")
	}
	if p.LoopbackOnly && !fromThisMachine(ctx) {
		return nil, errNotLocal
	}
	record(ctx, p)
	return context.WithValue(NewContext(ctx, p), digestKey{}, d), nil
}

// digestKey is the context key of the SHA-256 of the token a call
// authenticated with, by which a reload finds the call's new principal.
type digestKey struct{}

// Exempt reports whether a method needs no token: the health and
// reflection services, which load balancers and grpcurl call without one.
func Exempt(fullMethod string) bool {
	return strings.HasPrefix(fullMethod, "/grpc.health.v1.Health/") ||
		strings.HasPrefix(fullMethod, "/grpc.reflection.")
}

var needsAuth = selector.MatchFunc(func(_ context.Context, c interceptors.CallMeta) bool {
	return !Exempt(c.FullMethod())
})

// UnaryServerInterceptor authenticates every unary call except the exempt
// ones and puts the principal in the handler's context. A long poll
// (Acquire) then runs as long as its credential lets it, as a stream does.
func (s *Set) UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	authn := selector.UnaryServerInterceptor(grpcauth.UnaryServerInterceptor(s.AuthFunc), needsAuth)
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if !longPolls[info.FullMethod] {
			return authn(ctx, req, info, handler)
		}
		return authn(ctx, req, info, func(ctx context.Context, req any) (any, error) {
			return s.holdUnary(ctx, req, handler)
		})
	}
}

// StreamServerInterceptor authenticates every streaming call except the
// exempt ones and puts the principal in the stream's context. The stream
// then runs as long as its credential lets it: Replace ends it when its
// token is gone or its new principal may no longer hold it (HoldWhile).
func (s *Set) StreamServerInterceptor() grpc.StreamServerInterceptor {
	authn := selector.StreamServerInterceptor(grpcauth.StreamServerInterceptor(s.AuthFunc), needsAuth)
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		return authn(srv, ss, info, func(srv any, ss grpc.ServerStream) error {
			return s.holdStream(srv, ss, handler)
		})
	}
}

// The authorization predicates: every handler enforces these rules, and the
// console asks them to decide what to offer.

// CanSee reports whether p may see and act on team's jobs and batches
// (read, cancel): a submitter of the team, or an operator whose scope
// covers it.
func (p Principal) CanSee(team string) bool { return p.SubmitterOf(team) || p.InScope(team) }

// CanOperate reports whether p holds the operator role, which
// OperatorService requires (rejections, replay, audit).
func (p Principal) CanOperate() bool { return p.Can(RoleOperator) }

// CanPause reports whether p may pause and resume dispatch: an operator
// whose scope is every team, as PauseDispatch and ResumeDispatch require.
func (p Principal) CanPause() bool { return p.AllScope() }

// CanReadArtifact reports whether p may read the previews of team's jobs:
// only a submitter of the team, as GetArtifact requires; operators never
// see document data.
func (p Principal) CanReadArtifact(team string) bool { return p.SubmitterOf(team) }
