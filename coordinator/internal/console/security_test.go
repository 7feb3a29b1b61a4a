package console

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/auth"
	"github.com/leasehold/leasehold/coordinator/internal/engine"
	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	"github.com/leasehold/leasehold/coordinator/internal/server"
)

// port is the console's port in b.
func (b *testBundle) port() int { return b.srv.Listener.Addr().(*net.TCPAddr).Port }

// serve sends req to b's console without the network, as its listener
// would hand it over from remote: the listener's address is b's.
func (b *testBundle) serve(req *http.Request, remote string) *httptest.ResponseRecorder {
	req = req.WithContext(context.WithValue(req.Context(), http.LocalAddrContextKey, b.srv.Listener.Addr()))
	req.RemoteAddr = remote
	req.Host = fmt.Sprintf("127.0.0.1:%d", b.port())
	rec := httptest.NewRecorder()
	b.srv.Config.Handler.ServeHTTP(rec, req)
	return rec
}

// signInRequest is a sign-in form post with token.
func signInRequest(token string) *http.Request {
	req := httptest.NewRequest("POST", "/console/signin", strings.NewReader(url.Values{"token": {token}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	return req
}

// sessionCookie returns the session cookie a response set, or nil.
func sessionCookie(rec *httptest.ResponseRecorder) *http.Cookie {
	for _, ck := range rec.Result().Cookies() {
		if strings.HasPrefix(ck.Name, "leasehold-console") && ck.MaxAge >= 0 {
			return ck
		}
	}
	return nil
}

// TestHostCheck checks the console against DNS rebinding: a page on
// another site whose name resolves to 127.0.0.1 reaches the console with
// its own name in Host, and must get neither a session nor a page.
func TestHostCheck(t *testing.T) {
	t.Parallel()

	t.Run("A sign-in for another host is refused 421 and opens no session", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		host := fmt.Sprintf("rebind.attacker.example:%d", b.port())
		code, page, h := b.do(t, "POST", "/console/signin", url.Values{"token": {auth.DevOperatorToken}}, map[string]string{"Host": host})
		if code != http.StatusMisdirectedRequest || h.Get("Set-Cookie") != "" || strings.Contains(page, "<html") {
			t.Errorf("sign-in with Host %s = %d, Set-Cookie %q; want 421 and no cookie:\n%s", host, code, h.Get("Set-Cookie"), page)
		}
	})

	t.Run("A signed-in browser gets no page under another host", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.signIn(t, auth.DevOperatorToken)
		for _, path := range []string{"/console/", "/console/audit", "/console/assets/htmx.min.js", "/"} {
			code, page, _ := b.do(t, "GET", path, nil, map[string]string{"Host": fmt.Sprintf("rebind.attacker.example:%d", b.port())})
			if code != http.StatusMisdirectedRequest || strings.Contains(page, "Overview") {
				t.Errorf("GET %s under another host = %d, want 421 without the page", path, code)
			}
		}
	})

	t.Run("Loopback names and the listener's address are answered with its port, and nothing else", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		p := b.port()
		for host, want := range map[string]int{
			fmt.Sprintf("localhost:%d", p):                  http.StatusSeeOther,
			fmt.Sprintf("LocalHost:%d", p):                  http.StatusSeeOther,
			fmt.Sprintf("127.0.0.1:%d", p):                  http.StatusSeeOther,
			fmt.Sprintf("[::1]:%d", p):                      http.StatusSeeOther,
			fmt.Sprintf("localhost:%d", p+1):                http.StatusMisdirectedRequest,
			"localhost":                                     http.StatusMisdirectedRequest,
			fmt.Sprintf("127.0.0.2:%d", p):                  http.StatusMisdirectedRequest,
			fmt.Sprintf("localhost.attacker.example:%d", p): http.StatusMisdirectedRequest,
			fmt.Sprintf("localhost.:%d", p):                 http.StatusMisdirectedRequest,
		} {
			if code, _, _ := b.do(t, "POST", "/console/signin", url.Values{"token": {auth.DevOperatorToken}}, map[string]string{"Host": host}); code != want {
				t.Errorf("sign-in with Host %q = %d, want %d", host, code, want)
			}
		}
	})

	t.Run("A configured host is answered, with its port or the listener's or none", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		con, err := New(Config{Conn: b.conn, Principals: auth.DevPrincipals(), Hosts: []string{"Console.Example", "proxy.example:8443"}})
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(con)
		defer srv.Close()
		c := &http.Client{CheckRedirect: b.c.CheckRedirect}
		defer c.CloseIdleConnections()
		p := srv.Listener.Addr().(*net.TCPAddr).Port
		for host, want := range map[string]int{
			"console.example":                        http.StatusSeeOther,
			fmt.Sprintf("console.example:%d", p):     http.StatusSeeOther,
			"console.example:8080":                   http.StatusMisdirectedRequest,
			"proxy.example:8443":                     http.StatusSeeOther,
			"proxy.example":                          http.StatusMisdirectedRequest,
			fmt.Sprintf("proxy.example:%d", p):       http.StatusMisdirectedRequest,
			fmt.Sprintf("other.example:%d", p):       http.StatusMisdirectedRequest,
			fmt.Sprintf("sub.console.example:%d", p): http.StatusMisdirectedRequest,
		} {
			req, _ := http.NewRequest("POST", srv.URL+"/console/signin", strings.NewReader("token="+auth.DevOperatorToken))
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			req.Host = host
			resp, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != want {
				t.Errorf("sign-in with Host %q = %d, want %d", host, resp.StatusCode, want)
			}
		}
	})

}

// TestSessionsPerPrincipal checks that sign-ins evict only their own
// principal's sessions.
func TestSessionsPerPrincipal(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.signIn(t, auth.DevOperatorToken)

	// The first of alpha's sessions, in a browser of its own.
	alpha := setupSibling(t, b)
	alpha.signIn(t, auth.DevAlphaToken)
	// 10,000 sign-ins with alpha's token, as another browser would make.
	for i := range 10_000 {
		rec := b.serve(signInRequest(auth.DevAlphaToken), "127.0.0.1:40000")
		if rec.Code != http.StatusSeeOther {
			t.Fatalf("sign-in %d = %d, want 303", i, rec.Code)
		}
	}
	if code, _, _ := b.do(t, "GET", "/console/", nil, nil); code != http.StatusOK {
		t.Errorf("the operator's overview after 10,000 sign-ins of another principal = %d, want 200", code)
	}
	if code, _, _ := alpha.do(t, "GET", "/console/", nil, nil); code != http.StatusSeeOther {
		t.Errorf("alpha's first session after %d more of its own = %d, want 303 to the sign-in", MaxSessionsPerPrincipal, code)
	}

	t.Run("The newest sessions of a principal stay", func(t *testing.T) {
		var last []*http.Cookie
		for range MaxSessionsPerPrincipal {
			rec := b.serve(signInRequest(auth.DevBetaToken), "127.0.0.1:40000")
			last = append(last, sessionCookie(rec))
		}
		for i, ck := range last {
			req := httptest.NewRequest("GET", "/console/", nil)
			req.AddCookie(ck)
			if rec := b.serve(req, "127.0.0.1:40000"); rec.Code != http.StatusOK {
				t.Errorf("beta's session %d of the last %d = %d, want 200", i, MaxSessionsPerPrincipal, rec.Code)
			}
		}
	})
}

// TestIdleTimeout checks that a session ends after DefaultIdleTimeout
// without its browser's requests, however often its live parts refresh,
// and after DefaultSessionTTL however active it is.
func TestIdleTimeout(t *testing.T) {
	t.Parallel()

	t.Run("Requests keep a session; live refreshes alone do not", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.signIn(t, auth.DevOperatorToken)
		step := DefaultIdleTimeout - time.Minute
		b.clk.Advance(step)
		if code, _, _ := b.do(t, "GET", "/console/batches", nil, nil); code != http.StatusOK {
			t.Fatalf("a page %v after sign-in = %d, want 200", step, code)
		}
		b.clk.Advance(step)
		if code, _, _ := b.do(t, "GET", "/console/?part=live", nil, map[string]string{"HX-Request": "true"}); code != http.StatusOK {
			t.Fatalf("a live refresh %v after the last page = %d, want 200", step, code)
		}
		b.clk.Advance(2 * time.Minute)
		code, _, h := b.do(t, "GET", "/console/?part=live", nil, map[string]string{"HX-Request": "true"})
		if code != http.StatusUnauthorized || h.Get("HX-Redirect") == "" {
			t.Errorf("a live refresh %v after the last page = %d, want 401 with HX-Redirect to the sign-in", step+2*time.Minute, code)
		}
		if code, _, _ := b.do(t, "GET", "/console/batches", nil, nil); code != http.StatusSeeOther {
			t.Errorf("a page after the idle timeout = %d, want 303 to the sign-in", code)
		}
	})

	t.Run("A session ends after its TTL however active", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.signIn(t, auth.DevOperatorToken)
		for elapsed := time.Duration(0); elapsed+30*time.Minute < DefaultSessionTTL; elapsed += 30 * time.Minute {
			b.clk.Advance(30 * time.Minute)
			if code, _, _ := b.do(t, "GET", "/console/batches", nil, nil); code != http.StatusOK {
				t.Fatalf("a page %v after sign-in = %d, want 200", elapsed+30*time.Minute, code)
			}
		}
		b.clk.Advance(30 * time.Minute)
		if code, _, _ := b.do(t, "GET", "/console/batches", nil, nil); code != http.StatusSeeOther {
			t.Errorf("a page past the session's TTL = %d, want 303 to the sign-in", code)
		}
	})
}

// TestSignInThrottle checks that failed sign-ins are limited per remote
// address and per presented token, with the injected clock, and that a
// right token signs in whatever others failed from its address.
func TestSignInThrottle(t *testing.T) {
	t.Parallel()

	t.Run("Wrong tokens past the limit from one address are refused 429 until the window passes; a right token is not", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		const shared = "127.0.0.7:40000" // a proxy, or this machine: many users
		for i := range MaxFailedSignIns {
			if rec := b.serve(signInRequest(fmt.Sprintf("guess-%d", i)), shared); rec.Code != http.StatusUnauthorized {
				t.Fatalf("failed sign-in %d = %d, want 401", i, rec.Code)
			}
		}
		rec := b.serve(signInRequest("guess-more"), shared)
		if rec.Code != http.StatusTooManyRequests || sessionCookie(rec) != nil || rec.Header().Get("Retry-After") != "600" {
			t.Errorf("a wrong token after %d failures = %d, Retry-After %q, cookie %v; want 429, 600 and none",
				MaxFailedSignIns, rec.Code, rec.Header().Get("Retry-After"), sessionCookie(rec))
		}
		if rec := b.serve(signInRequest(auth.DevOperatorToken), shared); rec.Code != http.StatusSeeOther || sessionCookie(rec) == nil {
			t.Errorf("a right token from the address others failed from = %d, cookie %v; want 303 and a session", rec.Code, sessionCookie(rec))
		}
		b.clk.Advance(SignInWindow - time.Second)
		if rec := b.serve(signInRequest("guess-late"), shared); rec.Code != http.StatusTooManyRequests || rec.Header().Get("Retry-After") != "1" {
			t.Errorf("a wrong token a second before the window ends = %d, Retry-After %q; want 429, 1", rec.Code, rec.Header().Get("Retry-After"))
		}
		b.clk.Advance(time.Second)
		if rec := b.serve(signInRequest("guess-after"), shared); rec.Code != http.StatusUnauthorized {
			t.Errorf("a wrong token once the window passed = %d, want 401", rec.Code)
		}
	})

	t.Run("One wrong token tried from many addresses is refused 429 past the limit", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		for i := range MaxFailedSignIns {
			if rec := b.serve(signInRequest("the-same-guess"), fmt.Sprintf("127.0.1.%d:40000", i)); rec.Code != http.StatusUnauthorized {
				t.Fatalf("failed sign-in %d = %d, want 401", i, rec.Code)
			}
		}
		if rec := b.serve(signInRequest("the-same-guess"), "127.0.2.1:40000"); rec.Code != http.StatusTooManyRequests {
			t.Errorf("the same wrong token from yet another address = %d, want 429", rec.Code)
		}
		if rec := b.serve(signInRequest("another-guess"), "127.0.2.1:40000"); rec.Code != http.StatusUnauthorized {
			t.Errorf("another wrong token from that address = %d, want 401", rec.Code)
		}
	})
}

// TestDevelopmentTokensFromThisMachineOnly checks that the console takes a
// development token only from a browser on this machine: at sign-in, and
// on every request of a session signed in with one.
func TestDevelopmentTokensFromThisMachineOnly(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const remote = "10.1.2.3:40000"
	rec := b.serve(signInRequest(auth.DevOperatorToken), remote)
	if rec.Code != http.StatusUnauthorized || sessionCookie(rec) != nil || !strings.Contains(rec.Body.String(), "development token") {
		t.Errorf("a development token's sign-in from %s = %d, cookie %v; want 401 and none:\n%s", remote, rec.Code, sessionCookie(rec), rec.Body)
	}
	rec = b.serve(signInRequest(auth.DevOperatorToken), "127.0.0.1:40000")
	ck := sessionCookie(rec)
	if ck == nil {
		t.Fatalf("no session from loopback: %d", rec.Code)
	}
	get := func(from string) int {
		req := httptest.NewRequest("GET", "/console/", nil)
		req.AddCookie(ck)
		return b.serve(req, from).Code
	}
	if code := get(remote); code != http.StatusSeeOther {
		t.Errorf("the session used from %s = %d, want 303 to the sign-in", remote, code)
	}
	if code := get("127.0.0.1:40000"); code != http.StatusSeeOther {
		t.Errorf("the session from loopback after it was used from %s = %d, want it ended (303)", remote, code)
	}
}

// TestRootRedirectsToTheConsole checks that "/" sends a newcomer to the
// console.
func TestRootRedirectsToTheConsole(t *testing.T) {
	t.Parallel()
	b := setup(t)
	code, _, h := b.do(t, "GET", "/", nil, nil)
	if code != http.StatusFound || h.Get("Location") != Prefix {
		t.Errorf("GET / = %d to %q, want 302 to %s", code, h.Get("Location"), Prefix)
	}
}

// TestTextThatIsNotUTF8 checks that a form or address holding bytes that
// are not UTF-8 is refused as the coordinator refuses such a message, and
// that the writer goes on serving.
func TestTextThatIsNotUTF8(t *testing.T) {
	t.Parallel()
	b := setup(t)
	res, err := b.eng.Submit(context.Background(), engine.SubmitRequest{Team: "alpha", RequestID: "r", Docs: []jobs.DocInput{
		{Document: jobs.Document{Name: "a.pdf", ContentType: "application/pdf"}, Content: []byte("pdf")}}})
	if err != nil {
		t.Fatal(err)
	}
	job := server.JobID(res.Batch.Batch.FirstJob)
	csrf := b.signIn(t, auth.DevAlphaToken)
	for _, tc := range []struct{ method, path, body string }{
		{"POST", "/console/jobs/" + job + "/cancel", "csrf=" + url.QueryEscape(csrf) + "&reason=%FF"},
		{"POST", "/console/batches/" + server.BatchID(res.Batch.Batch.ID) + "/cancel", "csrf=" + url.QueryEscape(csrf) + "&reason=ok%C3%28"},
		{"GET", "/console/batches?team=%FF", ""},
		{"GET", "/console/jobs/j-%FF", ""},
	} {
		req, _ := http.NewRequest(tc.method, b.srv.URL+tc.path, strings.NewReader(tc.body))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		resp, err := b.c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		page, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(page), "INVALID_ARGUMENT, reason MALFORMED_REQUEST") {
			t.Errorf("%s %s = %d, want 400 INVALID_ARGUMENT MALFORMED_REQUEST:\n%s", tc.method, tc.path, resp.StatusCode, page)
		}
	}
	if _, err := b.eng.Submit(context.Background(), engine.SubmitRequest{Team: "beta", RequestID: "r", Docs: []jobs.DocInput{
		{Document: jobs.Document{Name: "b.pdf", ContentType: "application/pdf"}, Content: []byte("pdf")}}}); err != nil {
		t.Errorf("another team's submit after the forms = %v, want it accepted", err)
	}
	if code, page, _ := b.do(t, "GET", "/console/jobs/"+job, nil, nil); code != http.StatusOK || strings.Contains(page, "CANCELLED") {
		t.Errorf("the job after the refused cancel = %d, cancelled %v; want 200 and not cancelled", code, strings.Contains(page, "CANCELLED"))
	}
}
