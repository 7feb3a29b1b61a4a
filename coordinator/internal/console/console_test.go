package console

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/auth"
	"github.com/leasehold/leasehold/coordinator/internal/engine"
	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	"github.com/leasehold/leasehold/coordinator/internal/server"
	"github.com/leasehold/leasehold/coordinator/internal/store"
	"github.com/leasehold/leasehold/internal/testclock"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// testBundle is a console over a real engine and the real services,
// served by httptest, and a browser-like client with a cookie jar that
// does not follow redirects.
type testBundle struct {
	st  *store.Store
	eng *engine.Engine
	srv *httptest.Server
	c   *http.Client
	// clk is the console's clock of sessions and sign-in throttling.
	clk *testclock.Clock
	// conn is the console's connection to the gRPC server.
	conn grpc.ClientConnInterface
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	clk := testclock.New(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC))
	st, err := store.Open(filepath.Join(t.TempDir(), "leasehold.db"))
	if err != nil {
		t.Fatal(err)
	}
	eng, err := engine.New(engine.Config{Store: st, OverviewEvery: time.Nanosecond})
	if err != nil {
		t.Fatal(err)
	}
	eng.Start()
	svc, err := server.New(server.Config{Engine: eng})
	if err != nil {
		t.Fatal(err)
	}
	conn, stopGRPC := serveInProcess(t, svc, auth.DevPrincipals())
	con, err := New(Config{Conn: conn, Principals: auth.DevPrincipals(), Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(con)
	jar, _ := cookiejar.New(nil)
	b := &testBundle{st: st, eng: eng, srv: srv, c: &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
	t.Cleanup(func() {
		b.c.CloseIdleConnections()
		srv.Close()
		svc.Shutdown()
		stopGRPC()
		eng.Stop()
		st.Close()
	})
	b.clk, b.conn = clk, conn
	return b
}

// do sends a request and returns the status and body.
func (b *testBundle) do(t *testing.T, method, path string, form url.Values, header map[string]string) (int, string, http.Header) {
	t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, b.srv.URL+path, body)
	if err != nil {
		t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	if h, ok := header["Host"]; ok {
		req.Host = h
	}
	resp, err := b.c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(data), resp.Header
}

// signIn signs in with token and returns the session's CSRF token.
func (b *testBundle) signIn(t *testing.T, token string) string {
	t.Helper()
	code, _, _ := b.do(t, "POST", "/console/signin", url.Values{"token": {token}}, nil)
	if code != http.StatusSeeOther {
		t.Fatalf("sign-in = %d, want 303", code)
	}
	_, page, _ := b.do(t, "GET", "/console/", nil, nil)
	m := regexp.MustCompile(`name="csrf" value="([^"]+)"`).FindStringSubmatch(page)
	if m == nil {
		t.Fatalf("no CSRF token on the overview:\n%s", page)
	}
	return m[1]
}

func TestSignIn(t *testing.T) {
	t.Parallel()

	t.Run("A page without a session sends the browser to sign in, and back", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		code, _, h := b.do(t, "GET", "/console/batches?team=alpha", nil, nil)
		if code != http.StatusSeeOther || h.Get("Location") != "/console/signin?next=%2Fconsole%2Fbatches%3Fteam%3Dalpha" {
			t.Errorf("GET without a session = %d to %q, want 303 to the sign-in", code, h.Get("Location"))
		}
		code, _, h = b.do(t, "POST", "/console/signin", url.Values{"token": {auth.DevAlphaToken}, "next": {"/console/batches?team=alpha"}}, nil)
		if code != http.StatusSeeOther || h.Get("Location") != "/console/batches?team=alpha" {
			t.Errorf("sign-in = %d to %q, want 303 back to the page", code, h.Get("Location"))
		}
	})

	t.Run("A live refresh without a session tells htmx to load the sign-in page for the whole page", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		code, page, h := b.do(t, "GET", "/console/batches/b-1?part=live&page=p2", nil, map[string]string{"HX-Request": "true"})
		want := "/console/signin?next=" + url.QueryEscape("/console/batches/b-1?page=p2")
		if code != http.StatusUnauthorized || h.Get("HX-Redirect") != want || strings.Contains(page, "<html") {
			t.Errorf("htmx refresh without a session = %d, HX-Redirect %q, want 401 and %q:\n%s", code, h.Get("HX-Redirect"), want, page)
		}
		code, _, h = b.do(t, "GET", "/console/?part=live", nil, nil)
		if code != http.StatusSeeOther || h.Get("Location") != "/console/signin?next=%2Fconsole%2F" {
			t.Errorf("a live part without a session = %d to %q, want 303 to the sign-in, back to the whole page", code, h.Get("Location"))
		}
	})

	t.Run("A form posted without a session comes back to the page that holds it", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		for referer, next := range map[string]string{
			b.srv.URL + "/console/jobs/j-1":  "/console/jobs/j-1",
			"https://evil.example/console/x": "/console/",
			"":                               "/console/",
		} {
			code, _, h := b.do(t, "POST", "/console/jobs/j-1/cancel", url.Values{"csrf": {"x"}}, map[string]string{"Referer": referer})
			if want := "/console/signin?next=" + url.QueryEscape(next); code != http.StatusSeeOther || h.Get("Location") != want {
				t.Errorf("POST with Referer %q without a session = %d to %q, want 303 to %q", referer, code, h.Get("Location"), want)
			}
		}
	})

	t.Run("An unknown token is refused and opens no session", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		code, page, h := b.do(t, "POST", "/console/signin", url.Values{"token": {"nope-nope-nope"}}, nil)
		if code != http.StatusUnauthorized || !strings.Contains(page, "Unknown token") || h.Get("Set-Cookie") != "" {
			t.Errorf("sign-in with an unknown token = %d, cookie %q", code, h.Get("Set-Cookie"))
		}
	})

	t.Run("The session cookie is HttpOnly and SameSite=Strict, and named for the listener's port", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		_, _, h := b.do(t, "POST", "/console/signin", url.Values{"token": {auth.DevOperatorToken}}, nil)
		ck := h.Get("Set-Cookie")
		port := b.srv.Listener.Addr().(*net.TCPAddr).Port
		for _, want := range []string{fmt.Sprintf("leasehold-console-%d=", port), "HttpOnly", "SameSite=Strict", "Path=/console/"} {
			if !strings.Contains(ck, want) {
				t.Errorf("Set-Cookie %q lacks %s", ck, want)
			}
		}
		if strings.Contains(ck, "Secure") {
			t.Errorf("Set-Cookie %q is Secure without TLS", ck)
		}
	})

	t.Run("Sign-in never redirects off the console", func(t *testing.T) {
		t.Parallel()
		for next, want := range map[string]string{
			"/console/jobs/j-1": "/console/jobs/j-1", "https://evil.example/": Prefix, "//evil.example/": Prefix,
			"/console/\\evil": Prefix, "": Prefix, "/metrics": Prefix,
		} {
			if got := safeNext(next); got != want {
				t.Errorf("safeNext(%q) = %q, want %q", next, got, want)
			}
		}
	})

	t.Run("Signing in again ends the session the browser had", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.signIn(t, auth.DevOperatorToken)
		u, _ := url.Parse(b.srv.URL + Prefix)
		old := b.c.Jar.Cookies(u)
		b.signIn(t, auth.DevAlphaToken)
		stale := setupSibling(t, b)
		stale.c.Jar.SetCookies(u, old)
		if code, _, _ := stale.do(t, "GET", "/console/", nil, nil); code != http.StatusSeeOther {
			t.Errorf("the first session after signing in again = %d, want 303 to the sign-in", code)
		}
	})

	t.Run("Signing out ends the session", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		csrf := b.signIn(t, auth.DevAlphaToken)
		if code, _, _ := b.do(t, "POST", "/console/signout", url.Values{"csrf": {csrf}}, nil); code != http.StatusSeeOther {
			t.Fatalf("sign-out = %d, want 303", code)
		}
		if code, _, _ := b.do(t, "GET", "/console/", nil, nil); code != http.StatusSeeOther {
			t.Errorf("the overview after signing out = %d, want 303 to the sign-in", code)
		}
	})
}

func TestSecureCookie(t *testing.T) {
	t.Parallel()
	con := &Console{cfg: Config{Secure: true}}
	rec := httptest.NewRecorder()
	req := httptest.NewRequest("GET", "https://127.0.0.1:7071/console/", nil)
	req = req.WithContext(context.WithValue(req.Context(), http.LocalAddrContextKey, &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 7071}))
	con.setCookie(rec, req, &session{id: "abc", expires: time.Now().Add(time.Hour)})
	ck := rec.Header().Get("Set-Cookie")
	for _, want := range []string{"__Host-leasehold-console-7071=abc", "Path=/", "Secure", "HttpOnly", "SameSite=Strict"} {
		if !strings.Contains(ck, want) {
			t.Errorf("Set-Cookie %q lacks %s", ck, want)
		}
	}
}

// TestActions checks what guards a state change: the session's CSRF
// token, the cross-origin check, and the services' own authorization.
func TestActions(t *testing.T) {
	t.Parallel()

	t.Run("A form without the session's CSRF token changes nothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.signIn(t, auth.DevOperatorToken)
		for _, csrf := range []string{"", "forged"} {
			code, page, _ := b.do(t, "POST", "/console/dispatch/pause", url.Values{"csrf": {csrf}, "reason": {"x"}}, nil)
			if code != http.StatusForbidden || !strings.Contains(page, "stale") {
				t.Errorf("pause with csrf %q = %d, want 403", csrf, code)
			}
		}
		if b.eng.DispatchState().Paused {
			t.Error("dispatch paused by a forged form")
		}
	})

	t.Run("A request from another site is refused before the CSRF check", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		csrf := b.signIn(t, auth.DevOperatorToken)
		for _, h := range []map[string]string{{"Sec-Fetch-Site": "cross-site"}, {"Origin": "https://evil.example"}} {
			code, _, _ := b.do(t, "POST", "/console/dispatch/pause", url.Values{"csrf": {csrf}, "reason": {"x"}}, h)
			if code != http.StatusForbidden {
				t.Errorf("pause with %v = %d, want 403", h, code)
			}
		}
		if b.eng.DispatchState().Paused {
			t.Error("dispatch paused by a cross-site request")
		}
		code, _, _ := b.do(t, "POST", "/console/dispatch/pause", url.Values{"csrf": {csrf}, "reason": {"rollout"}}, map[string]string{"Sec-Fetch-Site": "same-origin"})
		if code != http.StatusSeeOther || !b.eng.DispatchState().Paused {
			t.Errorf("a same-origin pause = %d, paused %v; want 303 and paused", code, b.eng.DispatchState().Paused)
		}
	})

	t.Run("The services decide: a submitter may not pause, an unknown job is not found", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		csrf := b.signIn(t, auth.DevAlphaToken)
		code, page, _ := b.do(t, "POST", "/console/dispatch/pause", url.Values{"csrf": {csrf}, "reason": {"x"}}, nil)
		if code != http.StatusForbidden || !strings.Contains(page, "PERMISSION_DENIED") {
			t.Errorf("a submitter's pause = %d, want 403 PERMISSION_DENIED:\n%s", code, page)
		}
		code, page, _ = b.do(t, "GET", "/console/jobs/j-42", nil, nil)
		if code != http.StatusNotFound || !strings.Contains(page, "JOB_NOT_FOUND") {
			t.Errorf("an unknown job = %d, want 404 JOB_NOT_FOUND", code)
		}
		code, page, _ = b.do(t, "GET", "/console/rejections", nil, nil)
		if code != http.StatusForbidden {
			t.Errorf("a submitter's rejections page = %d, want 403", code)
		}
		if strings.Contains(page, `href="/console/audit"`) {
			t.Errorf("a submitter is offered the audit log")
		}
	})

	t.Run("A submitter cancels its job and an operator of another team cannot see it", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		res, err := b.eng.Submit(context.Background(), engine.SubmitRequest{Team: "beta", RequestID: "r", Docs: []jobs.DocInput{
			{Document: jobs.Document{Name: "b.pdf", ContentType: "application/pdf"}, Content: []byte("pdf")}}})
		if err != nil {
			t.Fatal(err)
		}
		job := server.JobID(res.Batch.Batch.FirstJob)
		csrf := b.signIn(t, auth.DevOperatorAlphaToken)
		if code, _, _ := b.do(t, "GET", "/console/jobs/"+job, nil, nil); code != http.StatusNotFound {
			t.Errorf("dev-operator-alpha sees beta's job: %d", code)
		}
		if code, _, _ := b.do(t, "POST", "/console/jobs/"+job+"/cancel", url.Values{"csrf": {csrf}}, nil); code != http.StatusNotFound {
			t.Errorf("dev-operator-alpha's cancel of beta's job = %d, want 404", code)
		}
		b2 := setupSibling(t, b)
		csrf = b2.signIn(t, auth.DevBetaToken)
		if code, _, _ := b2.do(t, "POST", "/console/jobs/"+job+"/cancel", url.Values{"csrf": {csrf}, "reason": {"mine"}}, nil); code != http.StatusSeeOther {
			t.Errorf("beta's cancel of its job = %d, want 303", code)
		}
		if code, page, _ := b2.do(t, "GET", "/console/jobs/"+job, nil, nil); code != http.StatusOK || !strings.Contains(page, "CANCELLED") {
			t.Errorf("the job page after the cancel = %d without CANCELLED", code)
		}
	})

	t.Run("A replay narrowed to an unknown terminal reason is refused, not widened to every reason", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		res, err := b.eng.Submit(context.Background(), engine.SubmitRequest{Team: "alpha", RequestID: "r", Docs: []jobs.DocInput{
			{Document: jobs.Document{Name: "a.pdf", ContentType: "application/pdf"}, Content: []byte("pdf")}}})
		if err != nil {
			t.Fatal(err)
		}
		csrf := b.signIn(t, auth.DevOperatorToken)
		for _, action := range []string{"plan", "run"} {
			code, page, _ := b.do(t, "POST", "/console/replay", url.Values{"csrf": {csrf}, "action": {action}, "batch": {server.BatchID(res.Batch.Batch.ID)},
				"terminal_reason": {"NO_SUCH_REASON"}, "reason": {"retry"}, "request_id": {"console-1"}}, nil)
			if code != http.StatusBadRequest || !strings.Contains(page, "INVALID_TERMINAL_REASON") {
				t.Errorf("%s with an unknown terminal reason = %d, want 400 INVALID_TERMINAL_REASON", action, code)
			}
		}
	})

	t.Run("A failed live refresh shows the error in the live part", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.signIn(t, auth.DevAlphaToken)
		code, page, _ := b.do(t, "GET", "/console/jobs/j-42?part=live", nil, map[string]string{"HX-Request": "true"})
		if code != http.StatusNotFound || strings.Contains(page, "<html") || !strings.Contains(page, `role="alert"`) || !strings.Contains(page, "JOB_NOT_FOUND") {
			t.Errorf("live part of an unknown job = %d, want 404 with the error alone:\n%s", code, page)
		}
	})

	t.Run("Live parts render alone for htmx", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.signIn(t, auth.DevOperatorToken)
		code, page, h := b.do(t, "GET", "/console/?part=live", nil, nil)
		if code != http.StatusOK || strings.Contains(page, "<html") || !strings.Contains(page, `id="summary"`) {
			t.Errorf("live part = %d:\n%s", code, page)
		}
		if csp := h.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") || h.Get("Cache-Control") != "no-store" {
			t.Errorf("headers: CSP %q, Cache-Control %q", csp, h.Get("Cache-Control"))
		}
	})
}

// setupSibling returns a second browser on the same console.
func setupSibling(t *testing.T, b *testBundle) *testBundle {
	t.Helper()
	jar, _ := cookiejar.New(nil)
	s := &testBundle{eng: b.eng, srv: b.srv, c: &http.Client{Jar: jar, CheckRedirect: b.c.CheckRedirect}, clk: b.clk}
	t.Cleanup(s.c.CloseIdleConnections)
	return s
}

func TestAssetsAreEmbedded(t *testing.T) {
	t.Parallel()
	b := setup(t)
	code, body, h := b.do(t, "GET", "/console/assets/htmx.min.js", nil, nil)
	if code != http.StatusOK || !strings.HasPrefix(body, "/*! htmx 4.0.1") || !strings.Contains(h.Get("Content-Type"), "javascript") {
		t.Errorf("htmx = %d %q, %q", code, body[:min(len(body), 40)], h.Get("Content-Type"))
	}
}

// TestPagesAreLabelled renders every page with data and checks what a
// screen reader needs: each table is named (a caption, or aria-labelledby
// an element of the page), and each form control has a label or an
// aria-label.
func TestPagesAreLabelled(t *testing.T) {
	t.Parallel()
	b := setup(t)
	res, err := b.eng.Submit(context.Background(), engine.SubmitRequest{Team: "alpha", RequestID: "r", Docs: []jobs.DocInput{
		{Document: jobs.Document{Name: "a.pdf", ContentType: "application/pdf"}, Content: []byte("pdf")}}})
	if err != nil {
		t.Fatal(err)
	}
	batch, job := server.BatchID(res.Batch.Batch.ID), server.JobID(res.Batch.Batch.FirstJob)
	pages := map[string]string{}
	_, pages["sign-in"], _ = b.do(t, "GET", "/console/signin", nil, nil)
	csrf := b.signIn(t, auth.DevOperatorToken)
	for _, path := range []string{"/console/", "/console/batches", "/console/batches/" + batch, "/console/jobs/" + job,
		"/console/renderers", "/console/rejections", "/console/audit", "/console/replay"} {
		code, page, _ := b.do(t, "GET", path, nil, nil)
		if code != http.StatusOK {
			t.Fatalf("GET %s = %d", path, code)
		}
		pages[path] = page
	}
	code, page, _ := b.do(t, "POST", "/console/replay", url.Values{"csrf": {csrf}, "action": {"plan"}, "batch": {batch}, "reason": {"retry"}}, nil)
	if code != http.StatusOK {
		t.Fatalf("replay plan = %d:\n%s", code, page)
	}
	pages["replay plan"] = page
	code, page, _ = b.do(t, "POST", "/console/replay", url.Values{"csrf": {csrf}, "action": {"run"}, "batch": {batch}, "reason": {"retry"}, "request_id": {"console-r"}}, nil)
	if code != http.StatusOK {
		t.Fatalf("replay run = %d:\n%s", code, page)
	}
	pages["replay result"] = page

	table := regexp.MustCompile(`<table[^>]*>\s*(<caption)?`)
	labelledBy := regexp.MustCompile(`aria-labelledby="([^"]+)"`)
	control := regexp.MustCompile(`<(input|select|textarea)\b[^>]*>`)
	for name, page := range pages {
		for _, m := range table.FindAllStringSubmatch(page, -1) {
			if m[1] != "" {
				continue
			}
			l := labelledBy.FindStringSubmatch(m[0])
			if l == nil || !strings.Contains(page, `id="`+l[1]+`"`) {
				t.Errorf("%s: table without a caption or a name: %s", name, m[0])
			}
		}
		for _, c := range control.FindAllString(page, -1) {
			if strings.Contains(c, `type="hidden"`) || strings.Contains(c, "aria-label=") {
				continue
			}
			id := regexp.MustCompile(`\bid="([^"]+)"`).FindStringSubmatch(c)
			if id == nil || !strings.Contains(page, `<label for="`+id[1]+`"`) {
				t.Errorf("%s: form control without a label: %s", name, c)
			}
		}
	}
}
