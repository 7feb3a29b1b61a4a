package coordinator

import (
	"context"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// consoleUser is a browser signed in to the console: its cookie jar holds
// the session.
type consoleUser struct {
	t    *testing.T
	base string
	hc   *http.Client
}

// signInConsole signs in to the console at base with token.
func signInConsole(t *testing.T, base, token string) *consoleUser {
	t.Helper()
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	u := &consoleUser{t: t, base: base, hc: &http.Client{Jar: jar, Timeout: 20 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
	if code, _ := u.post("signin", url.Values{"token": {token}}); code != http.StatusSeeOther {
		t.Fatalf("signing in as %s: %d, want 303", token, code)
	}
	return u
}

// consoleCSRF finds the form field every console page carries.
var consoleCSRF = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// csrf reads the session's CSRF token from a page.
func (u *consoleUser) csrf(page string) string {
	u.t.Helper()
	resp, err := u.hc.Get(u.base + page)
	if err != nil {
		u.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		u.t.Fatal(err)
	}
	m := consoleCSRF.FindSubmatch(body)
	if resp.StatusCode != http.StatusOK || m == nil {
		u.t.Fatalf("GET %s: %d without a CSRF token", page, resp.StatusCode)
	}
	return string(m[1])
}

// post posts a form (with the CSRF token of the overview page, unless
// signing in) and returns the status and body.
func (u *consoleUser) post(path string, form url.Values) (int, string) {
	u.t.Helper()
	if path != "signin" {
		form.Set("csrf", u.csrf(""))
	}
	resp, err := u.hc.PostForm(u.base+path, form)
	if err != nil {
		u.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// TestConsoleTextNeverReachesTheWriter posts the console's forms with
// reasons and request ids no caller may store (invalid UTF-8, a NUL, a
// request id longer than a bbolt key) as a signed-in submitter and
// operator: each is refused as a bad request, and afterwards health is
// SERVING, the job is untouched and another team's SubmitBatch succeeds.
func TestConsoleTextNeverReachesTheWriter(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{MetricsListen: "127.0.0.1:0", Console: true})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	jc := leaseholdv1.NewJobServiceClient(b.conn)
	resp, err := jc.SubmitBatch(bearer(ctx, "dev-alpha"), &leaseholdv1.SubmitBatchRequest{Team: "alpha", RequestId: "r",
		Documents: []*leaseholdv1.Document{{Name: "a.pdf", Content: []byte("%PDF")}}})
	if err != nil {
		t.Fatal(err)
	}
	job, batch := resp.GetBatch().GetJobIds()[0], resp.GetBatch().GetId()

	alpha := signInConsole(t, b.c.ConsoleURL(), "dev-alpha")
	ops := signInConsole(t, b.c.ConsoleURL(), "dev-operator")
	long := strings.Repeat("k", 40<<10)
	posts := []struct {
		who  *consoleUser
		path string
		form url.Values
	}{
		{alpha, "jobs/" + job + "/cancel", url.Values{"reason": {"\xff"}}},
		{alpha, "jobs/" + job + "/cancel", url.Values{"reason": {"stop\x00"}}},
		{alpha, "batches/" + batch + "/cancel", url.Values{"reason": {"a\xc0\xafb"}}},
		{ops, "jobs/" + job + "/cancel", url.Values{"reason": {"\xed\xa0\x80"}}},
		{ops, "dispatch/pause", url.Values{"reason": {"\xff"}}},
		{ops, "dispatch/pause", url.Values{"reason": {"nul\x00"}}},
		{ops, "dispatch/resume", url.Values{"reason": {"\xff"}}},
		{ops, "replay", url.Values{"jobs": {job}, "reason": {"\xff"}, "action": {"plan"}}},
		{ops, "replay", url.Values{"jobs": {job}, "reason": {"rerun\x00"}, "action": {"run"}, "request_id": {"console-1"}}},
		{ops, "replay", url.Values{"jobs": {job}, "reason": {"rerun"}, "action": {"run"}, "request_id": {long}}},
	}
	hc := healthpb.NewHealthClient(b.conn)
	for i, p := range posts {
		code, body := p.who.post(p.path, p.form)
		if code != http.StatusBadRequest {
			t.Errorf("POST %s %q: %d, want 400\n%.300s", p.path, p.form.Get("reason"), code, body)
		}
		if st, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil || st.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("after POST %s: health %v, %v; want SERVING", p.path, st.GetStatus(), err)
		}
		if _, err := jc.SubmitBatch(bearer(ctx, "dev-beta"), &leaseholdv1.SubmitBatchRequest{Team: "beta", RequestId: "b-" + string(rune('a'+i)),
			Documents: []*leaseholdv1.Document{{Name: "b.pdf", Content: []byte("%PDF")}}}); err != nil {
			t.Fatalf("team beta's SubmitBatch after POST %s: %v", p.path, err)
		}
	}
	got, err := jc.GetJob(bearer(ctx, "dev-alpha"), &leaseholdv1.GetJobRequest{JobId: job})
	if err != nil {
		t.Fatal(err)
	}
	if j := got.GetJob(); j.GetPhase() != leaseholdv1.Phase_PHASE_QUEUED || j.GetCancellation() != nil {
		t.Errorf("job %s is %v (cancellation %v), want QUEUED untouched", job, j.GetPhase(), j.GetCancellation())
	}
}
