package console

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"net"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/auth"
)

// session is one signed-in browser.
type session struct {
	id        string
	principal auth.Principal
	// token is the bearer token the session signed in with. Every call the
	// console makes for the session carries it, so the coordinator's
	// authentication resolves the principal as for any gRPC caller: a token
	// revoked since sign-in stops working at the next page. It lives in
	// memory only and never leaves the server.
	token string
	// csrf is the token every form of this session carries.
	csrf string
	// expires is the end of the session however active it is; lastSeen is
	// the last request that counts as activity (see sessions.get).
	expires  time.Time
	lastSeen time.Time
}

// sessions holds the signed-in sessions in memory. Each principal has at
// most MaxSessionsPerPrincipal: signing in past it ends that principal's
// oldest session, and no one else's. As principals are the finite set of
// a principals file, so is the memory sessions take.
type sessions struct {
	ttl  time.Duration
	idle time.Duration
	now  func() time.Time

	mu   sync.Mutex
	byID map[string]*session
	// byPrincipal lists each principal's sessions, oldest first.
	byPrincipal map[string][]*session
}

func newSessions(ttl, idle time.Duration, now func() time.Time) *sessions {
	return &sessions{ttl: ttl, idle: idle, now: now, byID: make(map[string]*session), byPrincipal: make(map[string][]*session)}
}

// randomToken returns 32 random bytes, base64url.
func randomToken() string {
	var b [32]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// open starts a session for p, signed in with token. It first drops p's
// sessions that have ended, then, when p still has
// MaxSessionsPerPrincipal, ends p's oldest.
func (s *sessions) open(p auth.Principal, token string) *session {
	now := s.now()
	sess := &session{id: randomToken(), principal: p, token: token, csrf: randomToken(), expires: now.Add(s.ttl), lastSeen: now}
	s.mu.Lock()
	defer s.mu.Unlock()
	mine := slices.DeleteFunc(s.byPrincipal[p.Name], func(o *session) bool {
		if s.live(o, now) {
			return false
		}
		delete(s.byID, o.id)
		return true
	})
	for len(mine) >= MaxSessionsPerPrincipal {
		delete(s.byID, mine[0].id)
		mine = slices.Delete(mine, 0, 1)
	}
	s.byPrincipal[p.Name] = append(mine, sess)
	s.byID[sess.id] = sess
	return sess
}

// live reports whether sess has neither expired nor been idle too long at
// now. s.mu must be held.
func (s *sessions) live(sess *session, now time.Time) bool {
	return sess.expires.After(now) && sess.lastSeen.Add(s.idle).After(now)
}

// get returns the live session r's cookie names, or nil; a session that
// has ended is dropped. When active is set the request counts as activity
// and postpones the idle timeout; the console's own periodic refreshes of
// a page's live part do not, so that an unattended tab left open still
// signs out.
func (s *sessions) get(r *http.Request, cookie string, active bool) *session {
	ck, err := r.Cookie(cookie)
	if err != nil || ck.Value == "" {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	sess := s.byID[ck.Value]
	if sess == nil {
		return nil
	}
	now := s.now()
	if !s.live(sess, now) {
		s.closeLocked(sess)
		return nil
	}
	if active {
		sess.lastSeen = now
	}
	return sess
}

// close ends a session.
func (s *sessions) close(sess *session) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closeLocked(sess)
}

// closeLocked ends a session; s.mu must be held.
func (s *sessions) closeLocked(sess *session) {
	delete(s.byID, sess.id)
	name := sess.principal.Name
	s.byPrincipal[name] = slices.DeleteFunc(s.byPrincipal[name], func(o *session) bool { return o == sess })
	if len(s.byPrincipal[name]) == 0 {
		delete(s.byPrincipal, name)
	}
}

// Sign-in throttling.
const (
	// MaxFailedSignIns is how many failed sign-ins one remote address,
	// and one presented token, may make within SignInWindow; past it, a
	// wrong token from that address, or that wrong token from anywhere, is
	// refused 429 until the window has passed. A right token is never.
	MaxFailedSignIns = 10
	// SignInWindow is the window MaxFailedSignIns counts in, from the
	// first failure.
	SignInWindow = 10 * time.Minute
	// maxThrottled bounds the keys one throttle remembers; past it the one
	// whose window started first is forgotten. Addresses and tokens have a
	// throttle each, so that a flood of distinct wrong tokens cannot push
	// an address's failures out.
	maxThrottled = 10_000
)

// throttle counts failed sign-ins per key: a remote address (its IP; a
// proxy in front of the console is one address for all its users), or the
// SHA-256 of a presented token.
type throttle struct {
	now func() time.Time

	mu    sync.Mutex
	byKey map[string]*failures
}

// failures are one key's failed sign-ins in the window that started at
// start.
type failures struct {
	start time.Time
	n     int
}

func newThrottle(now func() time.Time) *throttle {
	return &throttle{now: now, byKey: make(map[string]*failures)}
}

// remoteIP is the address the throttle counts r under.
func remoteIP(r *http.Request) string {
	if host, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		return host
	}
	return r.RemoteAddr
}

// tokenKey is the key a presented token is counted under: its SHA-256,
// so that the throttle holds no token.
func tokenKey(token string) string {
	d := sha256.Sum256([]byte(token))
	return hex.EncodeToString(d[:])
}

// blocked reports whether key has used up its failed sign-ins, and if so
// for how much longer.
func (t *throttle) blocked(key string) (time.Duration, bool) {
	now := t.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	f := t.byKey[key]
	if f == nil {
		return 0, false
	}
	left := f.start.Add(SignInWindow).Sub(now)
	if left <= 0 {
		delete(t.byKey, key)
		return 0, false
	}
	return left, f.n >= MaxFailedSignIns
}

// fail counts a failed sign-in under key.
func (t *throttle) fail(key string) {
	now := t.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	f := t.byKey[key]
	if f != nil && !f.start.Add(SignInWindow).After(now) {
		f = nil
	}
	if f == nil {
		if len(t.byKey) >= maxThrottled {
			t.forgetLocked(now)
		}
		f = &failures{start: now}
		t.byKey[key] = f
	}
	f.n++
}

// forgetLocked drops the keys whose window has passed, or, when none has,
// the one whose window started first. t.mu must be held.
func (t *throttle) forgetLocked(now time.Time) {
	var oldest string
	for k, f := range t.byKey {
		if !f.start.Add(SignInWindow).After(now) {
			delete(t.byKey, k)
		} else if oldest == "" || f.start.Before(t.byKey[oldest].start) {
			oldest = k
		}
	}
	if len(t.byKey) >= maxThrottled && oldest != "" {
		delete(t.byKey, oldest)
	}
}
