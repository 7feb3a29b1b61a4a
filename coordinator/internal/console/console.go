package console

import (
	"context"
	"crypto/subtle"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/leasehold/leasehold/client/reason"
	"github.com/leasehold/leasehold/coordinator/internal/auth"
	"github.com/leasehold/leasehold/coordinator/internal/hostcheck"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// Prefix is the path the console is served under.
const Prefix = "/console/"

// Defaults for Config.
const (
	// DefaultSessionTTL is how long a session lasts after sign-in.
	DefaultSessionTTL = 12 * time.Hour
	// DefaultIdleTimeout ends a session after this long without a request
	// of its browser (the live parts' own refreshes do not count).
	DefaultIdleTimeout = time.Hour
	// MaxSessionsPerPrincipal bounds one principal's sessions; signing in
	// past it ends that principal's oldest session.
	MaxSessionsPerPrincipal = 32
)

//go:embed assets templates
var files embed.FS

// Config configures a Console.
type Config struct {
	// Conn is a connection to the coordinator's own gRPC server; every page
	// and action is a call on it with the signed-in caller's bearer token,
	// through the server's whole interceptor chain.
	Conn grpc.ClientConnInterface
	// Principals are the bearer tokens sign-in accepts.
	Principals *auth.Set
	// Hosts are the names, besides localhost and the listener's own
	// address, that the console answers to (see package hostcheck): a host
	// name or address, with a port or without one.
	Hosts []string
	// Secure says the console is served over TLS: the session cookie is
	// then Secure, with the __Host- prefix.
	Secure bool
	// SessionTTL is how long a session lasts; zero means DefaultSessionTTL.
	SessionTTL time.Duration
	// IdleTimeout ends a session its browser has not used for this long;
	// zero means DefaultIdleTimeout.
	IdleTimeout time.Duration
	Logger      *slog.Logger
	// Now is the clock of session expiry and of sign-in throttling; nil
	// means time.Now.
	Now func() time.Time
}

// Console serves the web console. It is safe for concurrent use.
type Console struct {
	cfg      Config
	svc      clients
	log      *slog.Logger
	pages    *templates
	hosts    *hostcheck.Guard
	sessions *sessions
	// byAddr and byToken count failed sign-ins per remote address and per
	// presented token.
	byAddr, byToken *throttle
	handler         http.Handler
}

// New returns the console over cfg.Conn.
func New(cfg Config) (*Console, error) {
	if cfg.Conn == nil || cfg.Principals == nil {
		return nil, errors.New("console: Config.Conn and Config.Principals are required")
	}
	hosts, err := hostcheck.New(cfg.Hosts, "console", cfg.Logger)
	if err != nil {
		return nil, err
	}
	if cfg.SessionTTL <= 0 {
		cfg.SessionTTL = DefaultSessionTTL
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = DefaultIdleTimeout
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
	c := &Console{cfg: cfg, svc: newClients(cfg.Conn), log: cfg.Logger, pages: pages, hosts: hosts,
		sessions: newSessions(cfg.SessionTTL, cfg.IdleTimeout, cfg.Now), byAddr: newThrottle(cfg.Now), byToken: newThrottle(cfg.Now)}
	c.handler = c.routes()
	return c, nil
}

// ServeHTTP implements http.Handler for paths under Prefix, and for "/",
// which it redirects to Prefix.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) { c.handler.ServeHTTP(w, r) }

// routes builds the console's mux behind the host check, the cross-origin
// check and the security headers.
func (c *Console) routes() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /{$}", http.RedirectHandler(Prefix, http.StatusFound))
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
	return c.hosts.Handler(securityHeaders(cop.Handler(mux)))
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

// request is one signed-in request: the session and the context of its
// calls, which carries the session's bearer token as outgoing metadata.
type request struct {
	*http.Request
	sess *session
	ctx  context.Context
}

// page wraps a GET handler: it needs a session (else it sends the browser
// to sign in), a browser on this machine when the session's token is only
// for development, and a request whose text is UTF-8; it renders what the
// handler returns. A session whose token the coordinator no longer
// accepts ends.
func (c *Console) page(h func(w http.ResponseWriter, r *request) error) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		live := r.URL.Query().Get("part") == "live"
		sess := c.sessions.get(r, c.cookieName(r), !live)
		if sess != nil && sess.principal.LoopbackOnly && !auth.LocalHostPort(r.RemoteAddr) {
			c.log.Info("console: refused a development token's session from another machine", "principal", sess.principal.Name, "remote", r.RemoteAddr)
			c.sessions.close(sess)
			sess = nil
		}
		if sess == nil {
			c.toSignIn(w, r)
			return
		}
		if err := r.ParseForm(); err != nil {
			c.fail(w, r, sess, errBadForm)
			return
		}
		if !validText(r) {
			c.log.Info("console: refused a request that is not UTF-8", "method", r.Method, "path", r.URL.Path, "principal", sess.principal.Name)
			c.fail(w, r, sess, errNotUTF8)
			return
		}
		ctx := metadata.AppendToOutgoingContext(r.Context(), "authorization", "Bearer "+sess.token)
		err := h(w, &request{Request: r, sess: sess, ctx: ctx})
		if status.Code(err) == codes.Unauthenticated {
			c.sessions.close(sess)
			c.setCookie(w, r, nil)
			sess = nil
		}
		if err != nil {
			c.fail(w, r, sess, err)
		}
	}
}

// validText reports whether r's path and form values (query and body, as
// ParseForm left them) are UTF-8. Protobuf strings must be, so a call could
// not even be encoded with anything else: the console refuses the request
// as the coordinator's codec refuses such a message from a gRPC client.
func validText(r *http.Request) bool {
	if !utf8.ValidString(r.URL.Path) {
		return false
	}
	for k, vs := range r.Form {
		if !utf8.ValidString(k) {
			return false
		}
		for _, v := range vs {
			if !utf8.ValidString(v) {
				return false
			}
		}
	}
	return true
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
	// errNotUTF8 is answered as the coordinator answers a message with a
	// string that is not UTF-8: INVALID_ARGUMENT MALFORMED_REQUEST.
	errNotUTF8 = status.Error(codes.InvalidArgument, "the request holds text that is not UTF-8")
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
	if errors.Is(err, errNotUTF8) {
		v.Reason = string(reason.MalformedRequest)
	}
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

// cookieName is the session cookie's name: with the __Host- prefix under
// TLS, which binds it to this host and path "/" and requires Secure. It
// ends in the port of the listener r came in on: browsers keep cookies per
// host, not per port, so two coordinators on one machine would otherwise
// overwrite each other's sessions.
func (c *Console) cookieName(r *http.Request) string {
	name := "leasehold-console"
	if c.cfg.Secure {
		name = "__Host-" + name
	}
	if local, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok {
		if port := hostcheck.Port(local); port != "" {
			name += "-" + port
		}
	}
	return name
}

// setCookie sets (or, with a nil session, clears) the session cookie.
func (c *Console) setCookie(w http.ResponseWriter, r *http.Request, sess *session) {
	ck := &http.Cookie{Name: c.cookieName(r), Path: Prefix, HttpOnly: true, Secure: c.cfg.Secure, SameSite: http.SameSiteStrictMode}
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
//
// Failed sign-ins are counted per remote address and per presented token
// (its SHA-256): past MaxFailedSignIns in SignInWindow, a wrong token from
// that address, or that wrong token from any address, is refused 429
// until the window has passed. A right token signs in whatever others
// failed from its address (a proxy's, or this machine's, which every local
// process shares): the throttle keeps wrong tokens' refusals cheap and
// quiet, and a token's length (at least 16 bytes) is what makes guessing
// one hopeless. A development token (LoopbackOnly) signs in only from a
// browser on this machine, and counts as a failure from elsewhere.
func (c *Console) signIn(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		c.render(w, r, http.StatusBadRequest, "signin", nil, signInView{Error: "The form could not be read."})
		return
	}
	next := safeNext(r.PostFormValue("next"))
	token := strings.TrimSpace(r.PostFormValue("token"))
	p, ok := c.cfg.Principals.Lookup(token)
	notHere := ok && p.LoopbackOnly && !auth.LocalHostPort(r.RemoteAddr)
	if !ok || notHere {
		c.signInFailed(w, r, token, next, p, notHere)
		return
	}
	if old := c.sessions.get(r, c.cookieName(r), false); old != nil {
		c.sessions.close(old)
	}
	sess := c.sessions.open(p, token)
	c.setCookie(w, r, sess)
	c.log.Info("console: signed in", "principal", p.Name)
	http.Redirect(w, r, next, http.StatusSeeOther)
}

// signInFailed answers a sign-in with an unknown token, or with a
// development token from another machine (notHere, p its principal):
// 429 while the address or the token has used up its failures, else 401;
// the failure is counted under both.
func (c *Console) signInFailed(w http.ResponseWriter, r *http.Request, token, next string, p auth.Principal, notHere bool) {
	addr, key := remoteIP(r), tokenKey(token)
	leftAddr, addrBlocked := c.byAddr.blocked(addr)
	leftToken, tokenBlocked := c.byToken.blocked(key)
	c.byAddr.fail(addr)
	c.byToken.fail(key)
	if addrBlocked || tokenBlocked {
		left := max(leftAddr, leftToken)
		w.Header().Set("Retry-After", fmt.Sprint(int(left.Round(time.Second).Seconds())))
		c.render(w, r, http.StatusTooManyRequests, "signin", nil, signInView{Next: next,
			Error: fmt.Sprintf("Too many failed sign-ins; try again in %s.", roundDuration(left))})
		return
	}
	if notHere {
		c.log.Info("console: refused a development token from another machine", "principal", p.Name, "remote", r.RemoteAddr)
		c.render(w, r, http.StatusUnauthorized, "signin", nil, signInView{Next: next,
			Error: "That is a public development token: it signs in only from a browser on the coordinator's machine."})
		return
	}
	c.log.Info("console: sign-in with an unknown token", "remote", r.RemoteAddr)
	c.render(w, r, http.StatusUnauthorized, "signin", nil, signInView{Next: next, Error: "Unknown token."})
}

// signOut ends the session.
func (c *Console) signOut(w http.ResponseWriter, r *request) error {
	c.sessions.close(r.sess)
	c.setCookie(w, r.Request, nil)
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
