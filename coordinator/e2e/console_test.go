package e2e

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"github.com/leasehold/leasehold/internal/proctest"
)

// browserFlags start Debian's chromium headless, alone: no sandbox (tests
// run as root in CI), no GPU, no QUIC, and nothing that phones home.
func browserFlags(userDataDir string) []chromedp.ExecAllocatorOption {
	return []chromedp.ExecAllocatorOption{
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(userDataDir),
		chromedp.WindowSize(1280, 900),
	}
}

// chromiumPath returns Debian's chromium, or skips the test without it
// (fails, when LEASEHOLD_REQUIRE_BROWSER is set, as scripts/test sets it).
func chromiumPath(t *testing.T) string {
	t.Helper()
	for _, p := range []string{os.Getenv("LEASEHOLD_CHROMIUM"), "/usr/bin/chromium"} {
		if p == "" {
			continue
		}
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	if p, err := exec.LookPath("chromium"); err == nil {
		return p
	}
	if os.Getenv("LEASEHOLD_REQUIRE_BROWSER") != "" {
		t.Fatal("chromium is not installed and LEASEHOLD_REQUIRE_BROWSER is set")
	}
	t.Skip("chromium is not installed (scripts/test installs it: apt-get install -y --no-install-recommends chromium)")
	return ""
}

// screenshotDir is where a test saves its screenshots: its artifact
// directory when go test runs with -artifacts, otherwise a directory that
// outlives the test, named in the log.
func screenshotDir(t *testing.T) string {
	t.Helper()
	if f := flag.Lookup("test.artifacts"); f != nil && f.Value.String() == "true" {
		return t.ArtifactDir()
	}
	dir, err := os.MkdirTemp("", "leasehold-console-screenshots-")
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// browser is one headless chromium tab on the console.
type browser struct {
	t    *testing.T
	ctx  context.Context
	base string
	dir  string
	shot int
}

// run runs chromedp actions, failing the test on an error.
func (b *browser) run(what string, actions ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, waitTimeout)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		b.screenshot("failure")
		b.t.Fatalf("%s: %v", what, err)
	}
}

// value runs one chromedp action that returns a value.
func value[T any](b *browser, what string, a chromedp.Action[T]) T {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, waitTimeout)
	defer cancel()
	v, err := chromedp.Run(ctx, a)
	if err != nil {
		b.screenshot("failure")
		b.t.Fatalf("%s: %v", what, err)
	}
	return v
}

// open navigates to a console path and waits for the page's heading.
func (b *browser) open(path string) {
	b.t.Helper()
	b.run("opening "+path, chromedp.Navigate(b.base+path), chromedp.WaitVisible(chromedp.CSS("main h1")))
}

// waitFor waits until the JavaScript expression is true: the live parts
// of a page refresh by themselves, so this waits for the coordinator's
// state to show, without sleeping. A navigation ends a poll, so it polls
// again until the expression holds on the page that stays.
func (b *browser) waitFor(what, expr string) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, waitTimeout)
	defer cancel()
	for {
		_, err := chromedp.Run(ctx, chromedp.Poll[bool](expr, chromedp.WithPollingTimeout(waitTimeout), chromedp.WithPollingInterval(100*time.Millisecond)))
		if err == nil {
			return
		}
		if ctx.Err() != nil {
			b.screenshot("failure")
			b.t.Fatalf("waiting for %s: %v", what, err)
		}
	}
}

// text returns the text of the first element matching sel.
func (b *browser) text(sel string) string {
	b.t.Helper()
	return value(b, "reading "+sel, chromedp.Text(chromedp.CSS(sel)))
}

// screenshot saves the whole page as NN-name.png.
func (b *browser) screenshot(name string) {
	b.shot++
	ctx, cancel := context.WithTimeout(b.ctx, waitTimeout)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		b.t.Logf("screenshot %s: %v", name, err)
		return
	}
	if err := os.WriteFile(filepath.Join(b.dir, fmt.Sprintf("%02d-%s.png", b.shot, name)), png, 0o644); err != nil {
		b.t.Logf("saving screenshot %s: %v", name, err)
	}
}

// signIn signs in with token through the form.
func (b *browser) signIn(token string) {
	b.t.Helper()
	b.open("/console/signin")
	b.run("signing in", chromedp.SendKeys(chromedp.CSS("#token"), token), chromedp.Submit(chromedp.CSS("#token")),
		chromedp.WaitVisible(chromedp.CSS(`nav[aria-label="Main"]`)))
}

// signOut signs out with the header's button.
func (b *browser) signOut() {
	b.t.Helper()
	b.run("signing out", chromedp.Click(chromedp.CSS(`form.who button`)), chromedp.WaitVisible(chromedp.CSS("#token")))
}

// forgePost submits a form built in the page to path with the session's
// CSRF token, as a hand-made request of the signed-in user would, for
// actions the page does not offer.
func (b *browser) forgePost(path string, fields map[string]string) {
	b.t.Helper()
	js := `(() => { const f = document.createElement('form'); f.method = 'post'; f.action = ` + jsString(path) + `;
  const add = (k, v) => { const i = document.createElement('input'); i.type = 'hidden'; i.name = k; i.value = v; f.appendChild(i); };
  add('csrf', document.querySelector('input[name=csrf]').value);`
	for k, v := range fields {
		js += ` add(` + jsString(k) + `, ` + jsString(v) + `);`
	}
	js += ` document.body.appendChild(f); f.submit(); return true; })()`
	value(b, "posting to "+path, chromedp.Evaluate[bool](js))
}

func jsString(s string) string { return fmt.Sprintf("%q", s) }

// freeAddr returns a loopback address with a port free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	return lis.Addr().String()
}

// pauseForms counts the page's forms that pause dispatch.
func pauseForms(b *browser) int {
	b.t.Helper()
	return value(b, "counting pause forms", chromedp.Evaluate[int](`document.querySelectorAll('form[action="/console/dispatch/pause"]').length`))
}

// focusContrast is an expression that computes the contrast ratio between
// the focused element's outline colour and the body's background colour.
const focusContrast = `(() => {
  const lum = c => {
    const [r, g, b] = c.match(/[\d.]+/g).slice(0, 3).map(v => {
      v = v / 255;
      return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4);
    });
    return 0.2126 * r + 0.7152 * g + 0.0722 * b;
  };
  const bg = getComputedStyle(document.body).backgroundColor;
  const a = lum(getComputedStyle(document.activeElement).outlineColor);
  const b = lum(bg === 'rgba(0, 0, 0, 0)' ? getComputedStyle(document.documentElement).backgroundColor : bg);
  return (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
})()`

// heading is an expression true once the page's heading reads h.
func heading(h string) string {
	return `(document.querySelector('main h1') || {}).innerText === ` + jsString(h)
}

// contains is an expression true once sel's text contains s.
func contains(sel, s string) string {
	return `((document.querySelector(` + jsString(sel) + `) || {}).innerText || '').includes(` + jsString(s) + `)`
}

// TestConsole drives the web console in a real browser against a real
// coordinator and renderer: sign in, follow a batch to done, read a failed
// job's history, replay it after its dry run, cancel a running job, and
// check that a scoped operator and a submitter are held to what the API
// allows them. Every page is saved as a screenshot.
func TestConsole(t *testing.T) {
	t.Parallel()
	chromium := chromiumPath(t)
	coord := startCoordinator(t, "--console", "--metrics-listen", freeAddr(t), "--lease-ttl", "30s")
	base := strings.TrimSuffix(proctest.LogAttr(coord.WaitFor("coordinator listening"), "console"), "/console/")
	if base == "" {
		t.Fatal("the coordinator did not log its console URL")
	}
	dir := screenshotDir(t)
	t.Logf("screenshots in %s", dir)

	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), append(browserFlags(t.TempDir()), chromedp.ExecPath(chromium))...)
	defer cancelAlloc()
	tabCtx, cancelTab := chromedp.NewContext(allocCtx)
	defer cancelTab()
	b := &browser{t: t, ctx: tabCtx, base: base, dir: dir}
	if err := chromedp.Do(tabCtx); err != nil {
		t.Fatalf("starting chromium: %v", err)
	}

	alpha := dial(t, coord.Addr, tokenAlpha)
	beta := dial(t, coord.Addr, tokenBeta)
	operator := dial(t, coord.Addr, tokenOperator)
	ctx := testContext(t)

	t.Run("an operator signs in and sees the overview", func(t *testing.T) {
		b.t = t
		b.open("/console/")
		b.waitFor("the sign-in form", `!!document.querySelector('#token')`)
		b.screenshot("signin")
		b.signIn(tokenOperator)
		b.waitFor("the overview", heading("Overview"))
		b.waitFor("the live summary", contains("#summary", "live renderer capacity"))
		// The first Tab stop skips to the content.
		b.run("tabbing", chromedp.KeyEvent("\t"))
		if focused := value(b, "reading the focus", chromedp.Evaluate[string](`document.activeElement.className`)); focused != "skip" {
			t.Errorf("the first Tab focuses %q, want the skip link", focused)
		}
		// The focus outline stands out from the page: 3:1 at least (WCAG
		// 1.4.11), measured against the body's background.
		if ratio := value(b, "measuring the focus outline", chromedp.Evaluate[float64](focusContrast)); ratio < 3 {
			t.Errorf("the focus outline's contrast with the page is %.2f:1, want at least 3:1", ratio)
		}
		b.screenshot("overview-empty")
	})

	var heldJob string
	t.Run("cancelling a running job shows it CANCELLED", func(t *testing.T) {
		b.t = t
		sub, err := alpha.SubmitBatch(ctx, "alpha", "held", []*leaseholdv1.Document{doc("held.txt", "held")}, nil)
		if err != nil {
			t.Fatal(err)
		}
		heldJob = sub.GetBatch().GetJobIds()[0]
		// A renderer that takes the job and keeps it: no renderer process
		// runs yet.
		acq, err := dialRenderer(t, coord.Addr).Acquire(ctx, &leaseholdv1.AcquireRequest{RendererId: "holder", MaxLeases: 1, Capacity: 1})
		if err != nil || len(acq.GetLeases()) != 1 {
			t.Fatalf("Acquire = %v, %v; want the held job", acq, err)
		}
		b.open("/console/jobs/" + heldJob)
		b.waitFor("the job LEASED", contains("#job-state", "LEASED"))
		if got := b.text("#lease-h + dl"); !strings.Contains(got, "holder") {
			t.Errorf("lease section = %q, want the holder named", got)
		}
		b.screenshot("job-leased")
		b.run("cancelling", chromedp.SendKeys(chromedp.CSS("#cancel-reason"), "not needed"), chromedp.Submit(chromedp.CSS("#cancel-reason")))
		b.waitFor("the job CANCELLED", contains("#job-state", "CANCELLED"))
		b.waitFor("the cancellation shown", contains("#cancel-h + dl", "holder"))
		b.screenshot("job-cancelled")
		j, err := alpha.GetJob(ctx, heldJob)
		if err != nil || j.GetPhase() != leaseholdv1.Phase_PHASE_CANCELLED {
			t.Fatalf("GetJob = %v, %v; want CANCELLED", j.GetPhase(), err)
		}
		// The holder finishes anyway: its completion is fenced off.
		lease := acq.GetLeases()[0].GetLease()
		_, err = dialRenderer(t, coord.Addr).Complete(ctx, &leaseholdv1.CompleteRequest{JobId: heldJob, Token: lease.GetToken(), RendererId: "holder",
			Outcome: &leaseholdv1.CompleteRequest_Success{Success: &leaseholdv1.CompleteSuccess{Content: []byte("late png"), ContentType: "image/png"}}})
		if status.Code(err) != codes.Aborted {
			t.Fatalf("late completion: %v, want ABORTED", err)
		}
	})

	startRenderer(t, coord.Addr, "r1", "--capacity", "2", "--latency", "100ms")

	t.Run("a batch progresses to done", func(t *testing.T) {
		b.t = t
		docs := make([]*leaseholdv1.Document, 12)
		for i := range docs {
			docs[i] = doc(fmt.Sprintf("page-%02d.txt", i), fmt.Sprintf("page %d", i))
		}
		sub, err := alpha.SubmitBatch(ctx, "alpha", "progress", docs, nil)
		if err != nil {
			t.Fatal(err)
		}
		id := sub.GetBatch().GetId()
		b.open("/console/batches/" + id)
		b.screenshot("batch-running")
		b.waitFor("the batch done", contains("#batch-state", "Done"))
		b.waitFor("every job SUCCEEDED", contains("#batch-state", "12 succeeded"))
		if progress := value(b, "reading the progress", chromedp.Evaluate[string](`document.querySelector('#progress').value.toString()`)); progress != "100" {
			t.Errorf("progress = %s, want 100", progress)
		}
		b.screenshot("batch-done")
		b.open("/console/batches")
		if got := b.text("main"); !strings.Contains(got, id) {
			t.Errorf("batch list does not show %s", id)
		}
		b.screenshot("batches")
		b.open("/console/")
		b.waitFor("the overview's figures", contains("#summary", "0 queued"))
		b.screenshot("overview")
	})

	var failedJob, failedBatch string
	t.Run("a failed job shows its history", func(t *testing.T) {
		b.t = t
		sub, err := alpha.SubmitBatch(ctx, "alpha", "broken", []*leaseholdv1.Document{doc("broken.txt", "%INVALID not a document")}, nil)
		if err != nil {
			t.Fatal(err)
		}
		failedBatch, failedJob = sub.GetBatch().GetId(), sub.GetBatch().GetJobIds()[0]
		waitBatchDone(t, alpha, failedBatch)
		b.open("/console/jobs/" + failedJob)
		b.waitFor("the job FAILED", contains("#job-state", "INVALID_DOCUMENT"))
		hist := b.text("ol.history")
		for _, want := range []string{"SUBMITTED", "LEASED", "FAILED"} {
			if !strings.Contains(hist, want) {
				t.Errorf("history %q lacks %s", hist, want)
			}
		}
		b.screenshot("job-failed")
	})

	t.Run("a replay shows its dry run, then runs", func(t *testing.T) {
		b.t = t
		b.open("/console/replay?batch=" + failedBatch)
		b.run("asking for the plan", chromedp.Click(chromedp.CSS("#r-permanent")),
			chromedp.SendKeys(chromedp.CSS("#r-reason"), "renderer fixed"), chromedp.Submit(chromedp.CSS("#r-reason")))
		b.waitFor("the plan", contains("#plan-h + p", "1 job would be re-queued"))
		b.screenshot("replay-plan")
		if j, err := operator.GetJob(ctx, failedJob); err != nil || j.GetCycle() != 1 {
			t.Fatalf("after the dry run: cycle %d, %v; want 1 (nothing changed)", j.GetCycle(), err)
		}
		b.run("confirming", chromedp.Click(chromedp.CSS(`form[action="/console/replay"] button.danger`)))
		b.waitFor("the result", contains("main", "Replayed: 1 job re-queued"))
		b.screenshot("replay-done")
		// The replay committed before the page answered: the batch has a
		// queued job again until its second cycle ends.
		waitBatchDone(t, operator, failedBatch)
		if j, err := operator.GetJob(ctx, failedJob); err != nil || j.GetCycle() != 2 || j.GetPhase() != leaseholdv1.Phase_PHASE_FAILED {
			t.Fatalf("after the replay: %v cycle %d, %v; want FAILED in cycle 2", j.GetPhase(), j.GetCycle(), err)
		}
		b.open("/console/jobs/" + failedJob)
		b.waitFor("the replay in the history", contains("ol.history", "REPLAYED"))
		b.screenshot("job-replayed")
	})

	t.Run("renderers, rejected completions and the audit log", func(t *testing.T) {
		b.t = t
		b.open("/console/renderers")
		b.waitFor("r1 listed", contains("main table", "r1"))
		b.screenshot("renderers")
		b.open("/console/rejections")
		if got := b.text("main table"); !strings.Contains(got, heldJob) || !strings.Contains(got, "JOB_CANCELLED") {
			t.Errorf("rejections = %q, want %s refused JOB_CANCELLED", got, heldJob)
		}
		b.screenshot("rejections")
		b.open("/console/audit")
		if got := b.text("main table"); !strings.Contains(got, "REPLAY") || !strings.Contains(got, "renderer fixed") {
			t.Errorf("audit = %q, want the replay with its reason", got)
		}
		b.screenshot("audit")
	})

	t.Run("a scoped operator cannot see or act on another team", func(t *testing.T) {
		b.t = t
		sub, err := beta.SubmitBatch(ctx, "beta", "beta-work", []*leaseholdv1.Document{doc("beta.txt", "beta")}, nil)
		if err != nil {
			t.Fatal(err)
		}
		betaBatch, betaJob := sub.GetBatch().GetId(), sub.GetBatch().GetJobIds()[0]
		waitBatchDone(t, beta, betaBatch)
		b.signOut()
		b.signIn(tokenOperatorAlpha)
		b.open("/console/batches")
		if got := b.text("main table"); strings.Contains(got, betaBatch) || strings.Contains(got, "beta") {
			t.Errorf("dev-operator-alpha's batch list shows beta: %q", got)
		}
		b.open("/console/batches/" + betaBatch)
		b.waitFor("not found", heading("Not found"))
		b.screenshot("scoped-operator-other-team")
		b.forgePost("/console/batches/"+betaBatch+"/cancel", map[string]string{"reason": "not mine"})
		b.waitFor("the refusal", heading("Not found"))
		if got := b.text("main"); !strings.Contains(got, "BATCH_NOT_FOUND") {
			t.Errorf("refusal page = %q, want BATCH_NOT_FOUND", got)
		}
		if j, err := beta.GetJob(ctx, betaJob); err != nil || j.GetPhase() != leaseholdv1.Phase_PHASE_SUCCEEDED {
			t.Errorf("beta's job after the refused cancel: %v, %v; want SUCCEEDED", j.GetPhase(), err)
		}
		b.open("/console/")
		if pauseForms(b) != 0 {
			t.Errorf("a scoped operator is offered to pause dispatch")
		}
		if got := b.text("main"); strings.Contains(got, "beta") {
			t.Errorf("dev-operator-alpha's overview mentions beta")
		}
	})

	t.Run("a submitter cannot pause, and sees its previews", func(t *testing.T) {
		b.t = t
		b.signOut()
		b.signIn(tokenAlpha)
		if pauseForms(b) != 0 {
			t.Errorf("a submitter is offered to pause dispatch")
		}
		b.forgePost("/console/dispatch/pause", map[string]string{"reason": "why not"})
		b.waitFor("the refusal", heading("Not allowed"))
		if got := b.text("main"); !strings.Contains(got, "PERMISSION_DENIED") {
			t.Errorf("refusal page = %q, want PERMISSION_DENIED", got)
		}
		b.screenshot("submitter-pause-refused")
		ov, err := operator.Overview.GetOverview(ctx, &leaseholdv1.GetOverviewRequest{})
		if err != nil || ov.GetOverview().GetDispatchPaused() {
			t.Errorf("dispatch paused = %v, %v; want running", ov.GetOverview().GetDispatchPaused(), err)
		}
		// A succeeded job of its own team shows its preview.
		jobs := batchJobs(t, alpha, "b-2")
		b.open("/console/jobs/" + jobs[0].GetId())
		b.waitFor("the preview loaded", `(() => { const i = document.querySelector('main img'); return !!i && i.complete && i.naturalWidth > 0; })()`)
		b.screenshot("job-preview")
	})

	t.Run("pages are readable 360 pixels wide", func(t *testing.T) {
		b.t = t
		b.run("narrowing the window", chromedp.EmulateViewport(360, 740))
		for _, path := range []string{"/console/", "/console/batches", "/console/batches/b-2", "/console/jobs/" + failedJob, "/console/renderers"} {
			b.open(path)
			if !value(b, "measuring "+path, chromedp.Evaluate[bool](`document.documentElement.scrollWidth <= window.innerWidth + 1`)) {
				t.Errorf("%s scrolls sideways at 360 px", path)
			}
			b.screenshot("narrow-" + strings.Trim(strings.ReplaceAll(strings.TrimPrefix(path, "/console"), "/", "-"), "-"))
		}
	})
}
