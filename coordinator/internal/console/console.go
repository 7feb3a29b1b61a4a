package console

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"embed"
	"encoding/base64"
	"errors"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/auth"
	"github.com/leasehold/leasehold/coordinator/internal/server"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Prefix is the path the console is served under.
const Prefix = "/console/"

// Defaults for Config.
const (
	// DefaultSessionTTL is how long a session lasts after sign-in.
	DefaultSessionTTL = 12 * time.Hour
	// MaxSessions bounds the sessions held at once; signing in past it
	// ends the oldest.
	MaxSessions = 10_000
)

//go:embed assets templates
var files embed.FS

// Config configures a Console.
type Config struct {
	// Services are the coordinator's service implementations; every page
	// calls them in process.
	Services *server.Services
	// Principals are the bearer tokens sign-in accepts.
	Principals *auth.Set
	// Secure says the console is served over TLS: the session cookie is
	// then Secure, with the __Host- prefix.
	Secure bool
	// SessionTTL is how long a session lasts; zero means DefaultSessionTTL.
	SessionTTL time.Duration
	Logger     *slog.Logger
	// Now is the clock of session expiry; nil means time.Now.
	Now func() time.Time
}

// Console serves the web console. It is safe for concurrent use.
type Console struct {
	cfg      Config
	svc      *server.Services
	log      *slog.Logger
	pages    *templates
	sessions *sessions
	handler  http.Handler
}

// New returns the console over cfg.Services.
func New(cfg Config) (*Console, error) {
	if cfg.Services == nil || cfg.Principals == nil {
		return nil, errors.New("console: Config.Services and Config.Principals are required")
	}
	if cfg.SessionTTL <= 0 {
		cfg.SessionTTL = DefaultSessionTTL
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	pages, err := parseTemplates()
	if err != nil {
		return nil, err
	}
	c := &Console{cfg: cfg, svc: cfg.Services, log: cfg.Logger, pages: pages,
		sessions: newSessions(cfg.SessionTTL, cfg.Now)}
	c.handler = c.routes()
	return c, nil
}

// ServeHTTP implements http.Handler for paths under Prefix.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) { c.handler.ServeHTTP(w, r) }

// routes builds the console's mux behind the cross-origin check and the
// security headers.
func (c *Console) routes() http.Handler {
	mux := http.NewServeMux()
	assets, _ := fs.Sub(files, "assets")
	mux.Handle("GET /console/assets/", http.StripPrefix("/console/assets/", cacheAssets(http.FileServerFS(assets))))
	mux.HandleFunc("GET /console/signin", c.signInPage)
	mux.HandleFunc("POST /console/signin", c.signIn)
	mux.HandleFunc("POST /console/signout", c.action(c.signOut))

	mux.HandleFunc("GET /console/{$}", c.page(c.overview))
	mux.HandleFunc("GET /console/batches", c.page(c.batches))
	mux.HandleFunc("GET /console/batches/{id}", c.page(c.batch))
	mux.HandleFunc("POST /console/batches/{id}/cancel", c.action(c.cancelBatch))
	mux.HandleFunc("GET /console/jobs/{id}", c.page(c.job))
	mux.HandleFunc("GET /console/jobs/{id}/preview", c.page(c.preview))
	mux.HandleFunc("POST /console/jobs/{id}/cancel", c.action(c.cancelJob))
	mux.HandleFunc("GET /console/renderers", c.page(c.renderers))
	mux.HandleFunc("GET /console/rejections", c.page(c.rejections))
	mux.HandleFunc("GET /console/audit", c.page(c.audit))
	mux.HandleFunc("GET /console/replay", c.page(c.replayForm))
	mux.HandleFunc("POST /console/replay", c.action(c.replay))
	mux.HandleFunc("POST /console/dispatch/pause", c.action(c.pause))
	mux.HandleFunc("POST /console/dispatch/resume", c.action(c.resume))
	mux.HandleFunc("/console/", func(w http.ResponseWriter, r *http.Request) {
		c.render(w, r, http.StatusNotFound, "error", nil, errorView{Title: "Not found", Message: "There is no such page."})
	})

	cop := http.NewCrossOriginProtection()
	cop.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.log.Info("console: refused a cross-origin request", "method", r.Method, "path", r.URL.Path,
			"origin", r.Header.Get("Origin"), "sec_fetch_site", r.Header.Get("Sec-Fetch-Site"))
		c.render(w, r, http.StatusForbidden, "error", nil, errorView{Title: "Refused", Message: "The request came from another site."})
	}))
	return securityHeaders(cop.Handler(mux))
}

// securityHeaders sets the headers every console response carries: no
// script, style or frame from anywhere else, no caching of pages that show
// job state, no referrer leaving the console.
func securityHeaders(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hd := w.Header()
		hd.Set("Content-Security-Policy", "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; "+
			"connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'; object-src 'none'")
		hd.Set("X-Content-Type-Options", "nosniff")
		hd.Set("X-Frame-Options", "DENY")
		hd.Set("Referrer-Policy", "same-origin")
		if !strings.HasPrefix(r.URL.Path, "/console/assets/") {
			hd.Set("Cache-Control", "no-store")
		}
		h.ServeHTTP(w, r)
	})
}

// cacheAssets lets browsers keep the embedded assets for an hour.
func cacheAssets(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "public, max-age=3600")
		h.ServeHTTP(w, r)
	})
}

// request is one signed-in request: the session and the context carrying
// its principal, as the auth interceptor would put it there.
type request struct {
	*http.Request
	sess *session
	ctx  context.Context
}

// page wraps a GET handler: it needs a session (else it sends the browser
// to sign in) and renders what the handler returns.
func (c *Console) page(h func(w http.ResponseWriter, r *request) error) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		sess := c.sessions.get(r, c.cookieName())
		if sess == nil {
			c.toSignIn(w, r)
			return
		}
		if err := h(w, &request{Request: r, sess: sess, ctx: auth.NewContext(r.Context(), sess.principal)}); err != nil {
			c.fail(w, r, sess, err)
		}
	}
}

// toSignIn sends a browser without a live session to sign in, and back
// afterwards to the whole page it was on. A refresh htmx makes
// (HX-Request) would follow a redirect and swap the sign-in page into the
// live region, so htmx is told to load the sign-in page itself
// (HX-Redirect). A form posted after the session expired comes back to
// the page that holds the form (its same-origin Referer), not to the
// action's path, which has no page.
func (c *Console) toSignIn(w http.ResponseWriter, r *http.Request) {
	u := r.URL
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		u = &url.URL{Path: Prefix}
		if ref, err := url.Parse(r.Referer()); err == nil && ref.Host == r.Host {
			u = ref
		}
	}
	q := u.Query()
	q.Del("part")
	next := u.Path
	if len(q) > 0 {
		next += "?" + q.Encode()
	}
	loc := "/console/signin?next=" + url.QueryEscape(safeNext(next))
	if r.Header.Get("HX-Request") == "true" {
		w.Header().Set("HX-Redirect", loc)
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	http.Redirect(w, r, loc, http.StatusSeeOther)
}

// action wraps a POST handler: it needs a session and the session's CSRF
// token in the form (the cross-origin check has already run).
func (c *Console) action(h func(w http.ResponseWriter, r *request) error) http.HandlerFunc {
	return c.page(func(w http.ResponseWriter, r *request) error {
		if err := r.ParseForm(); err != nil {
			return errBadForm
		}
		if subtle.ConstantTimeCompare([]byte(r.PostFormValue("csrf")), []byte(r.sess.csrf)) != 1 {
			c.log.Info("console: refused a form without its session's CSRF token", "path", r.URL.Path, "principal", r.sess.principal.Name)
			return errCSRF
		}
		return h(w, r)
	})
}

// Console errors that are not the services'.
var (
	errBadForm = errors.New("the form could not be read")
	errCSRF    = errors.New("the form is stale or was not sent from this console; reload the page and try again")
)

// errorView is what the error page shows.
type errorView struct {
	Title   string
	Message string
	// Code and Reason are the gRPC code and ErrorInfo reason, when the
	// error came from a service.
	Code   string
	Reason string
}

// httpStatus maps a gRPC code to the HTTP status of the page that shows
// it, as grpc-gateway does.
var httpStatus = map[codes.Code]int{
	codes.InvalidArgument:    http.StatusBadRequest,
	codes.NotFound:           http.StatusNotFound,
	codes.PermissionDenied:   http.StatusForbidden,
	codes.Unauthenticated:    http.StatusUnauthorized,
	codes.FailedPrecondition: http.StatusConflict,
	codes.Aborted:            http.StatusConflict,
	codes.AlreadyExists:      http.StatusConflict,
	codes.ResourceExhausted:  http.StatusTooManyRequests,
	codes.Unavailable:        http.StatusServiceUnavailable,
	codes.DeadlineExceeded:   http.StatusGatewayTimeout,
	codes.Canceled:           499,
}

// fail renders err: a service's status as the error table made it (code,
// reason and message), or one of the console's own refusals.
func (c *Console) fail(w http.ResponseWriter, r *http.Request, sess *session, err error) {
	switch {
	case errors.Is(err, errCSRF):
		c.render(w, r, http.StatusForbidden, "error", sess, errorView{Title: "Refused", Message: err.Error()})
		return
	case errors.Is(err, errBadForm):
		c.render(w, r, http.StatusBadRequest, "error", sess, errorView{Title: "Bad request", Message: err.Error()})
		return
	}
	st, ok := status.FromError(err)
	if !ok {
		c.log.Error("console: internal error", "path", r.URL.Path, "err", err)
		c.render(w, r, http.StatusInternalServerError, "error", sess, errorView{Title: "Internal error", Message: "internal error"})
		return
	}
	v := errorView{Title: titleOf(st.Code()), Message: st.Message(), Code: codeName(st.Code())}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			v.Reason = info.GetReason()
		}
	}
	code, ok := httpStatus[st.Code()]
	if !ok {
		code = http.StatusInternalServerError
	}
	c.render(w, r, code, "error", sess, v)
}

// titleOf is the heading of an error page.
func titleOf(c codes.Code) string {
	switch c {
	case codes.NotFound:
		return "Not found"
	case codes.PermissionDenied:
		return "Not allowed"
	case codes.InvalidArgument:
		return "Not accepted"
	case codes.FailedPrecondition, codes.Aborted:
		return "Not possible now"
	case codes.Unavailable:
		return "Unavailable"
	}
	return "Error"
}

// session is one signed-in browser.
type session struct {
	id        string
	principal auth.Principal
	// csrf is the token every form of this session carries.
	csrf    string
	expires time.Time
}

// sessions holds the signed-in sessions in memory.
type sessions struct {
	ttl time.Duration
	now func() time.Time

	mu   sync.Mutex
	byID map[string]*session
}

func newSessions(ttl time.Duration, now func() time.Time) *sessions {
	return &sessions{ttl: ttl, now: now, byID: make(map[string]*session)}
}

// randomToken returns 32 random bytes, base64url.
func randomToken() string {
	var b [32]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// open starts a session for p, ending the one that expires first when
// MaxSessions are open.
func (s *sessions) open(p auth.Principal) *session {
	now := s.now()
	sess := &session{id: randomToken(), principal: p, csrf: randomToken(), expires: now.Add(s.ttl)}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.byID) >= MaxSessions {
		var first *session
		for _, o := range s.byID {
			if !o.expires.After(now) {
				delete(s.byID, o.id)
			} else if first == nil || o.expires.Before(first.expires) {
				first = o
			}
		}
		if len(s.byID) >= MaxSessions && first != nil {
			delete(s.byID, first.id)
		}
	}
	s.byID[sess.id] = sess
	return sess
}

// get returns the live session r's cookie names, or nil.
func (s *sessions) get(r *http.Request, cookie string) *session {
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
	if !sess.expires.After(s.now()) {
		delete(s.byID, sess.id)
		return nil
	}
	return sess
}

// close ends a session.
func (s *sessions) close(sess *session) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.byID, sess.id)
}

// cookieName is the session cookie's name: with the __Host- prefix under
// TLS, which binds it to this host and path "/" and requires Secure.
func (c *Console) cookieName() string {
	if c.cfg.Secure {
		return "__Host-leasehold-console"
	}
	return "leasehold-console"
}

// setCookie sets (or, with a nil session, clears) the session cookie.
func (c *Console) setCookie(w http.ResponseWriter, sess *session) {
	ck := &http.Cookie{Name: c.cookieName(), Path: Prefix, HttpOnly: true, Secure: c.cfg.Secure, SameSite: http.SameSiteStrictMode}
	if c.cfg.Secure {
		ck.Path = "/"
	}
	if sess == nil {
		ck.MaxAge = -1
	} else {
		ck.Value = sess.id
		ck.Expires = sess.expires
	}
	http.SetCookie(w, ck)
}

// signInPage shows the sign-in form.
func (c *Console) signInPage(w http.ResponseWriter, r *http.Request) {
	c.render(w, r, http.StatusOK, "signin", nil, signInView{Next: safeNext(r.URL.Query().Get("next"))})
}

// signInView is the sign-in form.
type signInView struct {
	Next  string
	Error string
}

// signIn looks the posted token up in the principals set and opens a
// session for its principal. A session the browser already had ends: its
// id must not stay valid after its cookie is replaced, under whatever
// principal it was.
func (c *Console) signIn(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		c.render(w, r, http.StatusBadRequest, "signin", nil, signInView{Error: "The form could not be read."})
		return
	}
	next := safeNext(r.PostFormValue("next"))
	p, ok := c.cfg.Principals.Lookup(strings.TrimSpace(r.PostFormValue("token")))
	if !ok {
		c.log.Info("console: sign-in with an unknown token", "remote", r.RemoteAddr)
		c.render(w, r, http.StatusUnauthorized, "signin", nil, signInView{Next: next, Error: "Unknown token."})
		return
	}
	if old := c.sessions.get(r, c.cookieName()); old != nil {
		c.sessions.close(old)
	}
	sess := c.sessions.open(p)
	c.setCookie(w, sess)
	c.log.Info("console: signed in", "principal", p.Name)
	http.Redirect(w, r, next, http.StatusSeeOther)
}

// signOut ends the session.
func (c *Console) signOut(w http.ResponseWriter, r *request) error {
	c.sessions.close(r.sess)
	c.setCookie(w, nil)
	http.Redirect(w, r.Request, "/console/signin", http.StatusSeeOther)
	return nil
}

// safeNext returns next when it is a path of the console, so that sign-in
// never redirects off the console; otherwise the overview.
func safeNext(next string) string {
	if strings.HasPrefix(next, Prefix) && !strings.HasPrefix(next, "//") && !strings.ContainsAny(next, "\\\r\n") {
		return next
	}
	return Prefix
}
