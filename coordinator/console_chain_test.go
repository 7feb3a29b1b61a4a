package coordinator

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"regexp"
	"strings"
	"testing"

	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// consoleBundle is a coordinator with its console on a loopback metrics
// address, JSON logs at Debug, and a gRPC connection to it.
type consoleBundle struct {
	*testBundle
	logs *syncBuffer
	base string
	jobs leaseholdv1.JobServiceClient
	rend leaseholdv1.RendererServiceClient
	ops  leaseholdv1.OperatorServiceClient
}

func setupConsole(t *testing.T, cfg Config) *consoleBundle {
	t.Helper()
	logs := &syncBuffer{}
	cfg.Console, cfg.MetricsListen = true, "127.0.0.1:0"
	cfg.Logger = slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	b := setup(t, cfg)
	return &consoleBundle{testBundle: b, logs: logs, base: strings.TrimSuffix(b.c.ConsoleURL(), "/console/"),
		jobs: leaseholdv1.NewJobServiceClient(b.conn), rend: leaseholdv1.NewRendererServiceClient(b.conn), ops: leaseholdv1.NewOperatorServiceClient(b.conn)}
}

// browser is one browser on the console: a cookie jar, no redirects
// followed, and the session's CSRF token once signed in.
type browser struct {
	t    *testing.T
	base string
	c    *http.Client
	csrf string
}

func (b *consoleBundle) browser(t *testing.T) *browser {
	t.Helper()
	jar, _ := cookiejar.New(nil)
	br := &browser{t: t, base: b.base, c: &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
	t.Cleanup(br.c.CloseIdleConnections)
	return br
}

var csrfField = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// signIn signs in with token and keeps the session's CSRF token, read off
// the page sign-in leads to (an error page for a principal the overview
// refuses has it too).
func (br *browser) signIn(token string) *browser {
	br.t.Helper()
	if code, _ := br.send("POST", "/console/signin", "token="+url.QueryEscape(token)); code != http.StatusSeeOther {
		br.t.Fatalf("sign-in with %s = %d, want 303", token, code)
	}
	_, page := br.send("GET", "/console/", "")
	m := csrfField.FindStringSubmatch(page)
	if m == nil {
		br.t.Fatalf("no CSRF token after signing in with %s:\n%s", token, page)
	}
	br.csrf = m[1]
	return br
}

// send sends a request with an already encoded form body, and returns the
// status and the body.
func (br *browser) send(method, path, body string) (int, string) {
	br.t.Helper()
	req, err := http.NewRequest(method, br.base+path, strings.NewReader(body))
	if err != nil {
		br.t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	resp, err := br.c.Do(req)
	if err != nil {
		br.t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(data)
}

// post sends a form with the session's CSRF token and the fields of raw,
// an encoded query string that may hold any bytes.
func (br *browser) post(path, raw string) (int, string) {
	br.t.Helper()
	return br.send("POST", path, "csrf="+url.QueryEscape(br.csrf)+"&"+raw)
}

// submit submits documents for team as token over gRPC and returns the
// batch.
func (b *consoleBundle) submit(t *testing.T, token, team, requestID string, names ...string) *leaseholdv1.Batch {
	t.Helper()
	var docs []*leaseholdv1.Document
	for _, n := range names {
		docs = append(docs, &leaseholdv1.Document{Name: n, ContentType: "application/pdf", SizeBytes: 3, Content: []byte("pdf")})
	}
	resp, err := b.jobs.SubmitBatch(bearer(context.Background(), token), &leaseholdv1.SubmitBatchRequest{Team: team, RequestId: requestID, Documents: docs})
	if err != nil {
		t.Fatalf("SubmitBatch for %s: %v", team, err)
	}
	return resp.GetBatch()
}

// stillServing checks that the coordinator reports SERVING and that
// another team's submission is accepted.
func (b *consoleBundle) stillServing(t *testing.T, after string) {
	t.Helper()
	resp, err := healthpb.NewHealthClient(b.conn).Check(context.Background(), &healthpb.HealthCheckRequest{})
	if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health after %s = %v, %v; want SERVING", after, resp.GetStatus(), err)
	}
	if _, err := b.jobs.SubmitBatch(bearer(context.Background(), "dev-beta"), &leaseholdv1.SubmitBatchRequest{Team: "beta", RequestId: "after " + after,
		Documents: []*leaseholdv1.Document{{Name: "b.pdf", ContentType: "application/pdf", SizeBytes: 3, Content: []byte("pdf")}}}); err != nil {
		t.Fatalf("team beta's SubmitBatch after %s: %v", after, err)
	}
}

// httpStatusOf is the page status the console answers for a call that
// answered err: a redirect (or the page) when it succeeded, else the
// status of its code.
func httpStatusOf(err error, ok int) int {
	switch status.Code(err) {
	case codes.OK:
		return ok
	case codes.InvalidArgument:
		return http.StatusBadRequest
	case codes.PermissionDenied:
		return http.StatusForbidden
	case codes.NotFound:
		return http.StatusNotFound
	case codes.FailedPrecondition:
		return http.StatusConflict
	}
	return http.StatusInternalServerError
}

// reasonOf returns the ErrorInfo reason of err, or "".
func reasonOf(err error) string {
	info, _ := errorInfo(err)
	return info.GetReason()
}

// TestConsoleFormsCannotStopTheWriter posts the console's forms with text
// that is not UTF-8 and with a NUL byte. Each is answered with a page of
// its own and the coordinator goes on serving every team: the console's
// calls pass the coordinator's codec and checks as a gRPC client's do, and
// a NUL is answered exactly as the gRPC API answers it.
func TestConsoleFormsCannotStopTheWriter(t *testing.T) {
	t.Parallel()
	b := setupConsole(t, Config{})
	alpha := b.browser(t).signIn("dev-alpha")
	ops := b.browser(t).signIn("dev-operator")
	ctx := context.Background()

	t.Run("Cancelling a job", func(t *testing.T) {
		batch := b.submit(t, "dev-alpha", "alpha", "cancel", "a.pdf", "b.pdf", "c.pdf")
		ids := batch.GetJobIds()
		code, page := alpha.post("/console/jobs/"+ids[0]+"/cancel", "reason=%FF")
		if code != http.StatusBadRequest || !strings.Contains(page, "reason MALFORMED_REQUEST") {
			t.Errorf("cancel with reason %%FF = %d, want 400 MALFORMED_REQUEST:\n%s", code, page)
		}
		b.stillServing(t, "a cancel with reason %FF")

		_, grpcErr := b.jobs.CancelJob(bearer(ctx, "dev-alpha"), &leaseholdv1.CancelJobRequest{JobId: ids[1], Reason: "\x00"})
		code, page = alpha.post("/console/jobs/"+ids[2]+"/cancel", "reason=%00")
		if want := httpStatusOf(grpcErr, http.StatusSeeOther); code != want || code == http.StatusInternalServerError || code == http.StatusServiceUnavailable {
			t.Errorf("cancel with reason %%00 = %d; gRPC answered %v, so want %d", code, grpcErr, want)
		}
		if grpcErr != nil && !strings.Contains(page, "reason "+reasonOf(grpcErr)) {
			t.Errorf("cancel with reason %%00: the page lacks the reason %s:\n%s", reasonOf(grpcErr), page)
		}
		b.stillServing(t, "a cancel with reason %00")
	})

	t.Run("Cancelling a batch", func(t *testing.T) {
		batch := b.submit(t, "dev-alpha", "alpha", "cancel batch", "a.pdf")
		if code, page := alpha.post("/console/batches/"+batch.GetId()+"/cancel", "reason=%FF"); code != http.StatusBadRequest {
			t.Errorf("batch cancel with reason %%FF = %d, want 400:\n%s", code, page)
		}
		b.stillServing(t, "a batch cancel with reason %FF")
	})

	t.Run("Pausing and resuming dispatch", func(t *testing.T) {
		for _, path := range []string{"/console/dispatch/pause", "/console/dispatch/resume"} {
			if code, page := ops.post(path, "reason=%FF"); code != http.StatusBadRequest || !strings.Contains(page, "reason MALFORMED_REQUEST") {
				t.Errorf("%s with reason %%FF = %d, want 400 MALFORMED_REQUEST:\n%s", path, code, page)
			}
			b.stillServing(t, path+" with reason %FF")
		}
		_, pauseErr := b.ops.PauseDispatch(bearer(ctx, "dev-operator"), &leaseholdv1.PauseDispatchRequest{Reason: "\x00"})
		_, resumeErr := b.ops.ResumeDispatch(bearer(ctx, "dev-operator"), &leaseholdv1.ResumeDispatchRequest{Reason: "\x00"})
		for path, grpcErr := range map[string]error{"/console/dispatch/pause": pauseErr, "/console/dispatch/resume": resumeErr} {
			code, _ := ops.post(path, "reason=%00")
			if want := httpStatusOf(grpcErr, http.StatusSeeOther); code != want {
				t.Errorf("%s with reason %%00 = %d; gRPC answered %v, so want %d", path, code, grpcErr, want)
			}
			b.stillServing(t, path+" with reason %00")
		}
		if _, err := b.ops.ResumeDispatch(bearer(ctx, "dev-operator"), &leaseholdv1.ResumeDispatchRequest{Reason: "done"}); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("Replaying", func(t *testing.T) {
		batch := b.submit(t, "dev-alpha", "alpha", "replay", "bad.exe")
		for _, action := range []string{"plan", "run"} {
			code, page := ops.post("/console/replay", "action="+action+"&request_id=r-1&batch="+batch.GetId()+"&reason=%FF")
			if code != http.StatusBadRequest || !strings.Contains(page, "reason MALFORMED_REQUEST") {
				t.Errorf("replay %s with reason %%FF = %d, want 400 MALFORMED_REQUEST:\n%s", action, code, page)
			}
			b.stillServing(t, "a replay "+action+" with reason %FF")
		}
		_, grpcErr := b.ops.ReplayJobs(bearer(ctx, "dev-operator"), &leaseholdv1.ReplayJobsRequest{BatchId: batch.GetId(), DryRun: true, Reason: "\x00"})
		code, _ := ops.post("/console/replay", "action=plan&batch="+batch.GetId()+"&reason=%00")
		if want := httpStatusOf(grpcErr, http.StatusOK); code != want {
			t.Errorf("replay plan with reason %%00 = %d; gRPC answered %v, so want %d", code, grpcErr, want)
		}
		b.stillServing(t, "a replay with reason %00")
	})
}

// TestConsoleCallsAreGRPCCalls checks that the console's calls pass the
// gRPC server's interceptors: each has its "finished call" line naming
// the signed-in principal, and a refusal is counted with the API's.
func TestConsoleCallsAreGRPCCalls(t *testing.T) {
	t.Parallel()
	b := setupConsole(t, Config{})
	batch := b.submit(t, "dev-alpha", "alpha", "log", "a.pdf")
	alpha := b.browser(t).signIn("dev-alpha")
	if code, page := alpha.post("/console/jobs/"+batch.GetJobIds()[0]+"/cancel", "reason=from+the+console"); code != http.StatusSeeOther {
		t.Fatalf("cancel = %d:\n%s", code, page)
	}
	if code, _ := alpha.post("/console/dispatch/pause", "reason=not+mine"); code != http.StatusForbidden {
		t.Fatalf("a submitter's pause = %d, want 403", code)
	}
	lines := logLines(t, b.logs.String())
	if l := finishedCall(t, lines, "CancelJob", "OK"); l["principal"] != "dev-alpha" || l["team"] != "alpha" {
		t.Errorf("the console's CancelJob line = %v, want principal dev-alpha of team alpha", l)
	}
	if l := finishedCall(t, lines, "PauseDispatch", "PermissionDenied"); l["principal"] != "dev-alpha" {
		t.Errorf("the console's refused PauseDispatch line = %v, want principal dev-alpha", l)
	}
	if m := scrapeMetrics(t, b.c.MetricsAddr()); !strings.Contains(m, `leasehold_refused_calls_total{code="PermissionDenied"} 1`) {
		t.Errorf("refused calls after the console's refused pause:\n%s", grepLines(m, "leasehold_refused_calls_total"))
	}
}

// grepLines returns the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for l := range strings.Lines(s) {
		if strings.Contains(l, sub) {
			out = append(out, strings.TrimSpace(l))
		}
	}
	return strings.Join(out, "\n")
}

// TestConsoleHostAndRoot checks, on the coordinator's own metrics
// listener, that the console refuses a rebound host and that "/" leads to
// it.
func TestConsoleHostAndRoot(t *testing.T) {
	t.Parallel()
	b := setupConsole(t, Config{})
	br := b.browser(t)
	port := b.c.MetricsAddr()[strings.LastIndex(b.c.MetricsAddr(), ":")+1:]
	req, _ := http.NewRequest("POST", b.base+"/console/signin", strings.NewReader("token=dev-operator"))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Host = "rebind.attacker.example:" + port
	resp, err := br.c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMisdirectedRequest || len(resp.Cookies()) != 0 {
		t.Errorf("sign-in with Host %s = %d with %d cookies, want 421 and none", req.Host, resp.StatusCode, len(resp.Cookies()))
	}
	code, _ := br.send("GET", "/", "")
	resp, err = br.c.Get(b.base + "/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if code != http.StatusFound || resp.Header.Get("Location") != "/console/" {
		t.Errorf("GET / = %d to %q, want 302 to /console/", code, resp.Header.Get("Location"))
	}
	if code, _ := br.send("GET", "/metrics", ""); code != http.StatusOK {
		t.Errorf("GET /metrics = %d, want 200", code)
	}

	t.Run("Without the console / is not found", func(t *testing.T) {
		t.Parallel()
		plain := setup(t, Config{MetricsListen: "127.0.0.1:0"})
		resp, err := http.Get("http://" + plain.c.MetricsAddr() + "/")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("GET / without the console = %d, want 404", resp.StatusCode)
		}
	})
}

// matrixWorld is what the console matrix acts on, per team: a job and a
// batch to cancel, a FAILED job to replay, a SUCCEEDED job with a preview.
type matrixWorld struct {
	queuedJob, batch, failed, succeeded string
}

// buildMatrixWorld submits each team's documents and completes the first
// two as the development renderer: one with a preview, one as an invalid
// document. No renderer runs afterwards, so the rest stay QUEUED.
func (b *consoleBundle) buildMatrixWorld(t *testing.T) map[string]matrixWorld {
	t.Helper()
	ctx := bearer(context.Background(), "dev-renderer")
	world := map[string]matrixWorld{}
	done := map[string]*leaseholdv1.Batch{}
	for _, team := range []string{"alpha", "beta"} {
		done[team] = b.submit(t, "dev-"+team, team, "done", team+"-ok.pdf", team+"-bad.pdf")
	}
	resp, err := b.rend.Acquire(ctx, &leaseholdv1.AcquireRequest{RendererId: "r-1", MaxLeases: 4, Capacity: 4})
	if err != nil || len(resp.GetLeases()) != 4 {
		t.Fatalf("Acquire = %d leases, %v; want 4", len(resp.GetLeases()), err)
	}
	grants := map[string]*leaseholdv1.Grant{}
	for _, g := range resp.GetLeases() {
		grants[g.GetJobId()] = g
	}
	for team, batch := range done {
		ok, bad := grants[batch.GetJobIds()[0]], grants[batch.GetJobIds()[1]]
		if _, err := b.rend.Complete(ctx, &leaseholdv1.CompleteRequest{JobId: ok.GetJobId(), Token: ok.GetLease().GetToken(), RendererId: "r-1",
			Outcome: &leaseholdv1.CompleteRequest_Success{Success: &leaseholdv1.CompleteSuccess{Content: []byte("\x89PNG\r\n\x1a\npreview of " + team), ContentType: "image/png"}}}); err != nil {
			t.Fatalf("Complete: %v", err)
		}
		if _, err := b.rend.Complete(ctx, &leaseholdv1.CompleteRequest{JobId: bad.GetJobId(), Token: bad.GetLease().GetToken(), RendererId: "r-1",
			Outcome: &leaseholdv1.CompleteRequest_Failure{Failure: &leaseholdv1.CompleteFailure{Class: leaseholdv1.FailureClass_FAILURE_CLASS_INVALID_DOCUMENT, Message: "bad"}}}); err != nil {
			t.Fatalf("Complete: %v", err)
		}
		queued := b.submit(t, "dev-"+team, team, "queued", team+"-q.pdf")
		world[team] = matrixWorld{queuedJob: queued.GetJobIds()[0], batch: queued.GetId(), failed: bad.GetJobId(), succeeded: ok.GetJobId()}
	}
	return world
}

// consoleCaller is one kind of caller of the matrix.
type consoleCaller struct {
	name, token string
	// sees reports whether the caller may see and act on team's jobs,
	// submits whether it submits for team.
	sees, submits  func(team string) bool
	operator, full bool
}

func onlyTeam(team string) func(string) bool { return func(t string) bool { return t == team } }
func noTeam(string) bool                     { return false }
func everyTeam(string) bool                  { return true }

var consoleCallers = []consoleCaller{
	{name: "a submitter of alpha", token: "dev-alpha", sees: onlyTeam("alpha"), submits: onlyTeam("alpha")},
	{name: "a submitter of beta", token: "dev-beta", sees: onlyTeam("beta"), submits: onlyTeam("beta")},
	{name: "an operator of every team", token: "dev-operator", sees: everyTeam, submits: noTeam, operator: true, full: true},
	{name: "an operator of alpha", token: "dev-operator-alpha", sees: onlyTeam("alpha"), submits: noTeam, operator: true},
	{name: "a renderer", token: "dev-renderer", sees: noTeam, submits: noTeam},
}

// consoleAction is one page or action of the matrix, with the status it
// must answer and, when allowed, what its page must show.
type consoleAction struct {
	name string
	// global: the action names no team's object, so it is tried once.
	global bool
	do     func(br *browser, w matrixWorld) (int, string)
	want   func(c consoleCaller, team string) (code int, shows string)
}

// seen answers allowed (ok) what the caller may see, and NOT_FOUND for
// the rest: another team's object is answered as one that does not exist.
func seen(ok int, notFound string) func(consoleCaller, string) (int, string) {
	return func(c consoleCaller, team string) (int, string) {
		if c.sees(team) {
			return ok, ""
		}
		return http.StatusNotFound, notFound
	}
}

var consoleActions = []consoleAction{
	{name: "the job page", want: seen(http.StatusOK, "JOB_NOT_FOUND"),
		do: func(br *browser, w matrixWorld) (int, string) {
			return br.send("GET", "/console/jobs/"+w.queuedJob, "")
		}},
	{name: "the batch page", want: seen(http.StatusOK, "BATCH_NOT_FOUND"),
		do: func(br *browser, w matrixWorld) (int, string) { return br.send("GET", "/console/batches/"+w.batch, "") }},
	{name: "the preview",
		want: func(c consoleCaller, team string) (int, string) {
			switch {
			case c.submits(team):
				return http.StatusOK, "preview of " + team
			case c.token == "dev-alpha" || c.token == "dev-beta":
				return http.StatusNotFound, "JOB_NOT_FOUND"
			}
			return http.StatusForbidden, "PERMISSION_DENIED" // only submitters read previews
		},
		do: func(br *browser, w matrixWorld) (int, string) {
			return br.send("GET", "/console/jobs/"+w.succeeded+"/preview", "")
		}},
	{name: "cancelling a job", want: seen(http.StatusSeeOther, "JOB_NOT_FOUND"),
		do: func(br *browser, w matrixWorld) (int, string) {
			return br.post("/console/jobs/"+w.queuedJob+"/cancel", "reason=matrix")
		}},
	{name: "cancelling a batch", want: seen(http.StatusSeeOther, "BATCH_NOT_FOUND"),
		do: func(br *browser, w matrixWorld) (int, string) {
			return br.post("/console/batches/"+w.batch+"/cancel", "reason=matrix")
		}},
	{name: "the replay plan",
		want: func(c consoleCaller, team string) (int, string) {
			switch {
			case !c.operator:
				return http.StatusForbidden, "PERMISSION_DENIED"
			case c.sees(team):
				return http.StatusOK, "REQUEUE"
			}
			return http.StatusOK, "JOB_NOT_FOUND" // a job out of scope is skipped as one that does not exist
		},
		do: func(br *browser, w matrixWorld) (int, string) {
			return br.post("/console/replay", "action=plan&include_permanent=on&reason=matrix&jobs="+w.failed)
		}},
	{name: "pausing dispatch", global: true,
		want: func(c consoleCaller, _ string) (int, string) {
			if c.full {
				return http.StatusSeeOther, ""
			}
			return http.StatusForbidden, "PERMISSION_DENIED"
		},
		do: func(br *browser, _ matrixWorld) (int, string) {
			return br.post("/console/dispatch/pause", "reason=matrix")
		}},
	{name: "resuming dispatch", global: true,
		want: func(c consoleCaller, _ string) (int, string) {
			if c.full {
				return http.StatusSeeOther, ""
			}
			return http.StatusForbidden, "PERMISSION_DENIED"
		},
		do: func(br *browser, _ matrixWorld) (int, string) {
			return br.post("/console/dispatch/resume", "reason=matrix")
		}},
}

// TestConsoleAuthorizationMatrix tries every page and action of the
// console as every kind of caller, on its own team's objects and on
// another team's: the console allows and refuses what the API does, and
// answers what a caller may not see as what does not exist.
func TestConsoleAuthorizationMatrix(t *testing.T) {
	t.Parallel()
	b := setupConsole(t, Config{})
	world := b.buildMatrixWorld(t)
	browsers := map[string]*browser{}
	for _, c := range consoleCallers {
		browsers[c.token] = b.browser(t).signIn(c.token)
	}
	for _, a := range consoleActions {
		teams := []string{"alpha", "beta"}
		if a.global {
			teams = teams[:1]
		}
		for _, team := range teams {
			for _, c := range consoleCallers {
				want, shows := a.want(c, team)
				name := fmt.Sprintf("%s of team %s as %s answers %d", a.name, team, c.name, want)
				if a.global {
					name = fmt.Sprintf("%s as %s answers %d", a.name, c.name, want)
				}
				t.Run(name, func(t *testing.T) {
					code, page := a.do(browsers[c.token], world[team])
					if code != want || !strings.Contains(page, shows) {
						t.Errorf("%s = %d, want %d showing %q:\n%s", a.name, code, want, shows, page)
					}
					if !a.global && !c.sees(team) && strings.Contains(page, team) {
						t.Errorf("the page names team %s, which %s may not see:\n%s", team, c.name, page)
					}
				})
			}
		}
	}
	// Cancelled by those allowed, refused to the rest: each team's queued
	// job ended CANCELLED once, and dispatch was resumed last.
	for team, w := range world {
		j, err := b.jobs.GetJob(bearer(context.Background(), "dev-"+team), &leaseholdv1.GetJobRequest{JobId: w.queuedJob})
		if err != nil || j.GetJob().GetPhase() != leaseholdv1.Phase_PHASE_CANCELLED {
			t.Errorf("team %s's queued job after the matrix: %v, %v; want CANCELLED", team, j.GetJob().GetPhase(), err)
		}
	}
}
