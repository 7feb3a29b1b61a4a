package console

import (
	"crypto/rand"
	"encoding/base64"
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
	// MaxFailedSignIns is how many failed sign-ins one remote address may
	// make within SignInWindow; past it, sign-in from that address is
	// refused, whatever token it sends, until the window has passed.
	MaxFailedSignIns = 10
	// SignInWindow is the window MaxFailedSignIns counts in, from the
	// first failure.
	SignInWindow = 10 * time.Minute
	// maxThrottled bounds the addresses the throttle remembers; past it
	// the one whose window started first is forgotten.
	maxThrottled = 10_000
)

// throttle counts failed sign-ins per remote address (its IP; a proxy in
// front of the console is one address for all its users).
type throttle struct {
	now func() time.Time

	mu     sync.Mutex
	byAddr map[string]*failures
}

// failures are one address's failed sign-ins in the window that started
// at start.
type failures struct {
	start time.Time
	n     int
}

func newThrottle(now func() time.Time) *throttle {
	return &throttle{now: now, byAddr: make(map[string]*failures)}
}

// remoteIP is the address the throttle counts r under.
func remoteIP(r *http.Request) string {
	if host, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		return host
	}
	return r.RemoteAddr
}

// blocked reports whether addr has used up its failed sign-ins, and if so
// for how much longer.
func (t *throttle) blocked(addr string) (time.Duration, bool) {
	now := t.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	f := t.byAddr[addr]
	if f == nil {
		return 0, false
	}
	left := f.start.Add(SignInWindow).Sub(now)
	if left <= 0 {
		delete(t.byAddr, addr)
		return 0, false
	}
	return left, f.n >= MaxFailedSignIns
}

// fail counts a failed sign-in from addr.
func (t *throttle) fail(addr string) {
	now := t.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	f := t.byAddr[addr]
	if f != nil && !f.start.Add(SignInWindow).After(now) {
		f = nil
	}
	if f == nil {
		if len(t.byAddr) >= maxThrottled {
			t.forgetLocked(now)
		}
		f = &failures{start: now}
		t.byAddr[addr] = f
	}
	f.n++
}

// forgetLocked drops the addresses whose window has passed, or, when none
// has, the one whose window started first. t.mu must be held.
func (t *throttle) forgetLocked(now time.Time) {
	var oldest string
	for a, f := range t.byAddr {
		if !f.start.Add(SignInWindow).After(now) {
			delete(t.byAddr, a)
		} else if oldest == "" || f.start.Before(t.byAddr[oldest].start) {
			oldest = a
		}
	}
	if len(t.byAddr) >= maxThrottled && oldest != "" {
		delete(t.byAddr, oldest)
	}
}
