package auth

import (
	"context"
	"crypto/sha256"
	"fmt"
	"slices"
	"sync"

	middleware "github.com/grpc-ecosystem/go-grpc-middleware/v2"
	"github.com/leasehold/leasehold/client/reason"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// A hold is one authenticated stream or long poll in progress: what it
// authenticated with, and the rule that says whether a principal may go
// on holding it. Set.Replace judges every hold against the new principals
// and ends the ones whose credential is gone or no longer may.
type hold struct {
	digest    [sha256.Size]byte
	principal Principal
	end       context.CancelCauseFunc

	mu sync.Mutex
	// may says whether a principal may go on holding the stream; nil is
	// keepsRoles.
	may func(Principal) error
}

// holds are a Set's streams and long polls in progress.
type holds struct {
	mu sync.Mutex
	m  map[*hold]struct{}
}

// revoked is the cause of a stream or long poll ended by a reload,
// carrying the status the call ends with.
type revoked struct{ err error }

func (r *revoked) Error() string { return r.err.Error() }

// errCredentialRemoved ends a stream or long poll whose token the
// principals file no longer holds.
var errCredentialRemoved = unauthenticated("the token of this call was removed from the principals file; the call is over")

// keepsRoles is the rule of a stream whose handler named none: the
// principal still holds every role it held when the stream began.
func keepsRoles(was Principal) func(Principal) error {
	return func(p Principal) error {
		for _, r := range was.Roles {
			if !p.Can(r) {
				return PermissionDenied(fmt.Sprintf("%s no longer has the %s role; the call is over", p.Name, r))
			}
		}
		return nil
	}
}

// PermissionDenied returns the PERMISSION_DENIED status error with
// ErrorInfo reason PERMISSION_DENIED, as the error table words it.
func PermissionDenied(msg string) error {
	st := status.New(codes.PermissionDenied, msg)
	if d, err := st.WithDetails(&errdetails.ErrorInfo{Reason: string(reason.PermissionDenied), Domain: ErrorDomain}); err == nil {
		st = d
	}
	return st.Err()
}

// holdKey is the context key of a stream's hold.
type holdKey struct{}

// HoldWhile sets the rule by which the stream or long poll (see longPolls)
// of ctx may go on after the principals are replaced (a reload of the
// principals file): may returns nil while the new principal of the call's
// token may hold it, or the status error the call ends with
// (PERMISSION_DENIED, through the error table). A call that sets none ends
// when its principal lost a role it had. The rule is judged at once too,
// against the principals in force now, so that a reload between the
// call's start and HoldWhile is not missed. Handlers of long-lived streams and long polls call it once they
// know what the call needs (a renderer id, a team); outside a held call it
// does nothing.
func HoldWhile(ctx context.Context, may func(Principal) error) {
	h, _ := ctx.Value(holdKey{}).(*hold)
	if h == nil {
		return
	}
	h.mu.Lock()
	h.may = may
	h.mu.Unlock()
	if s, _ := ctx.Value(setKey{}).(*Set); s != nil {
		s.judge(h, s.load())
	}
}

// setKey is the context key of the Set that holds a stream.
type setKey struct{}

// judge ends h, and reports so, when the principals in entries no longer
// let it go on.
func (s *Set) judge(h *hold, entries []entry) bool {
	i := slices.IndexFunc(entries, func(e entry) bool { return e.digest == h.digest })
	if i < 0 {
		h.end(&revoked{errCredentialRemoved})
		return true
	}
	h.mu.Lock()
	may := h.may
	h.mu.Unlock()
	if may == nil {
		may = keepsRoles(h.principal)
	}
	if err := may(entries[i].principal); err != nil {
		h.end(&revoked{err})
		return true
	}
	return false
}

// judgeAll judges every stream in progress against entries and returns
// how many it ended.
func (s *Set) judgeAll(entries []entry) int {
	s.holds.mu.Lock()
	live := make([]*hold, 0, len(s.holds.m))
	for h := range s.holds.m {
		live = append(live, h)
	}
	s.holds.mu.Unlock()
	ended := 0
	for _, h := range live {
		if s.judge(h, entries) {
			ended++
		}
	}
	return ended
}

// holdStream runs an authenticated stream's handler as a hold of s, on a
// context that a reload ends: its handler sees the context done, and the
// stream ends with the reload's status (UNAUTHENTICATED, or
// PERMISSION_DENIED from the stream's rule) whatever the handler returns.
// A stream without a principal (health, reflection) runs as it is.
func (s *Set) holdStream(srv any, ss grpc.ServerStream, handler grpc.StreamHandler) error {
	ctx, release, ok := s.hold(ss.Context())
	if !ok {
		return handler(srv, ss)
	}
	defer release()
	ws := middleware.WrapServerStream(ss)
	ws.WrappedContext = ctx
	err := handler(srv, ws)
	if r, ok := context.Cause(ctx).(*revoked); ok {
		return r.err
	}
	return err
}

// longPolls are the unary methods a reload ends as it ends streams: they
// may wait long (Acquire, up to a minute) on the principal they started
// with. Their handlers hand back what the call took when its context
// ends. Other unary calls end within moments, and are left to finish.
var longPolls = map[string]bool{
	leaseholdv1.RendererService_Acquire_FullMethodName: true,
}

// holdUnary runs an authenticated long poll's handler as a hold of s, as
// holdStream runs a stream's: a reload ends its context, and a call that
// then fails ends with the reload's status (UNAUTHENTICATED, or
// PERMISSION_DENIED from the call's rule). A call that answered keeps its
// answer: what it took was taken under the principal it authenticated as.
func (s *Set) holdUnary(ctx context.Context, req any, handler grpc.UnaryHandler) (any, error) {
	hctx, release, ok := s.hold(ctx)
	if !ok {
		return handler(ctx, req)
	}
	defer release()
	resp, err := handler(hctx, req)
	if r, ok := context.Cause(hctx).(*revoked); ok && err != nil {
		return nil, r.err
	}
	return resp, err
}

// hold registers the stream or long poll of ctx, authenticated by
// AuthFunc, and returns the context its handler runs in, which a reload
// ends, and the function that forgets the call when it is over. It
// reports false for a context without a principal.
func (s *Set) hold(ctx context.Context) (context.Context, func(), bool) {
	p, ok := FromContext(ctx)
	d, dok := ctx.Value(digestKey{}).([sha256.Size]byte)
	if !ok || !dok {
		return ctx, nil, false
	}
	ctx, end := context.WithCancelCause(ctx)
	h := &hold{digest: d, principal: p, end: end}
	s.holds.mu.Lock()
	if s.holds.m == nil {
		s.holds.m = make(map[*hold]struct{})
	}
	s.holds.m[h] = struct{}{}
	s.holds.mu.Unlock()
	// A reload between the authentication and the registration above
	// did not see this call: judge it against what is in force now.
	s.judge(h, s.load())
	release := func() {
		s.holds.mu.Lock()
		delete(s.holds.m, h)
		s.holds.mu.Unlock()
		end(nil)
	}
	return context.WithValue(context.WithValue(ctx, holdKey{}, h), setKey{}, s), release, true
}
