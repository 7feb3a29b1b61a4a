package engine

import (
	"context"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	"github.com/leasehold/leasehold/coordinator/internal/store"
)

// Strings no command may store: not UTF-8 (a stray byte, an overlong
// form, a surrogate half, past U+10FFFF), and text with a NUL, a line break,
// an escape, a C1 control or a right-to-left override.
var badStrings = []string{"\xff", "a\xc0\xafb", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\x00", "a\nb", "\x1b[2J", "a\u009bb", "a\u202eb"}

// wantTextRefusal fails unless err is the writer's refusal of field:
// a *jobs.ValidationError wrapping ErrInvalidText with reason INVALID_TEXT.
func wantTextRefusal(t *testing.T, what string, err error, field string) {
	t.Helper()
	var ve *jobs.ValidationError
	if !errors.As(err, &ve) || !errors.Is(err, jobs.ErrInvalidText) || ve.Reason != "INVALID_TEXT" {
		t.Errorf("%s: err = %v, want the writer's INVALID_TEXT refusal", what, err)
		return
	}
	if len(ve.Violations) != 1 || ve.Violations[0].Field != field {
		t.Errorf("%s: violations %+v, want one naming %s", what, ve.Violations, field)
	}
}

// TestGroupCommitsAroundTextItCannotStore puts commands whose text the
// store may not keep (sent straight to the engine, below the handlers'
// checks) in one group with good ones: the bad ones are refused
// INVALID_TEXT, the good ones commit, and the writer keeps serving.
func TestGroupCommitsAroundTextItCannotStore(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	first := b.submit(t, "alpha", "r1", "a.pdf", "b.pdf")
	a, bb := first.FirstJob, first.FirstJob+1

	release := b.block(t)
	probeFirst, probeLast := &probeCmd{}, &probeCmd{}
	var (
		goodSubmit   SubmitResult
		goodErr      error
		badCancelErr error
		goodCancel   CancelResult
		goodCancelEr error
		badPauseErr  error
		badReplayErr error
	)
	steps := []func(){
		func() { _ = b.e.do(ctx, probeFirst) },
		func() {
			goodSubmit, goodErr = b.e.Submit(ctx, SubmitRequest{Team: "beta", RequestID: "good", Docs: docs("c.pdf")})
		},
		func() {
			_, badCancelErr = b.e.Cancel(ctx, CancelRequest{Job: a, Principal: "alice", Reason: "encoding fails: \xff"})
		},
		func() {
			goodCancel, goodCancelEr = b.e.Cancel(ctx, CancelRequest{Job: bb, Principal: "alice", Reason: "fine"})
		},
		func() { _, badPauseErr = b.e.SetPaused(ctx, true, "ops", "nul\x00") },
		func() {
			_, badReplayErr = b.e.Replay(ctx, ReplayRequest{Principal: "ops", RequestID: strings.Repeat("k", 40<<10), Reason: "too long a key", JobIDs: []uint64{a}})
		},
		func() { _ = b.e.do(ctx, probeLast) },
	}
	var done []<-chan struct{}
	for i, s := range steps {
		done = append(done, async(s))
		b.waitQueued(t, i+1)
	}
	release()
	for _, d := range done {
		waitClosed(t, d, "a command of the group")
	}
	if probeFirst.g == nil || probeFirst.g != probeLast.g {
		t.Fatal("the commands were applied in more than one group")
	}

	if goodErr != nil || goodSubmit.Batch.Batch.Count != 1 {
		t.Errorf("the good submit: %+v, %v; want one job stored", goodSubmit, goodErr)
	}
	if goodCancelEr != nil || goodCancel.Job.Phase != jobs.PhaseCancelled {
		t.Errorf("the good cancel: %v, %v; want CANCELLED", goodCancel.Job.Phase, goodCancelEr)
	}
	wantTextRefusal(t, "the cancel with invalid UTF-8", badCancelErr, "reason")
	wantTextRefusal(t, "the pause with a NUL", badPauseErr, "reason")
	wantTextRefusal(t, "the replay with a request id longer than a key", badReplayErr, "request_id")
	if !b.e.Serving() {
		t.Fatal("the writer stopped")
	}
	if j := b.job(t, a); j.Phase != jobs.PhaseQueued || j.Cancellation.Reason != "" {
		t.Errorf("the job of the refused cancel is %v (cancellation %+v), want QUEUED untouched", j.Phase, j.Cancellation)
	}
	if b.e.DispatchState().Paused {
		t.Error("the refused pause paused dispatch")
	}
	if audit := b.allAudit(t); len(audit) != 0 {
		t.Errorf("audit records %+v, want none", audit)
	}

	// What committed survives a restart, and the writer takes the next
	// command.
	b.restart(t)
	if j := b.job(t, goodSubmit.Batch.Batch.FirstJob); j.Team != "beta" || j.Phase != jobs.PhaseQueued {
		t.Errorf("after a restart the good submit's job is %s %v, want beta QUEUED", j.Team, j.Phase)
	}
	if j := b.job(t, bb); j.Phase != jobs.PhaseCancelled {
		t.Errorf("after a restart the good cancel's job is %v, want CANCELLED", j.Phase)
	}
	b.submit(t, "gamma", "next", "d.pdf")
}

// TestEveryCommandRefusesTextItCannotStore calls every engine entry point
// that carries caller text with strings the store may not keep: each is
// refused (by the batch validation, or by the writer's own check), nothing
// is written, and the writer serves the next command.
func TestEveryCommandRefusesTextItCannotStore(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newBundle(t.TempDir())
	writes := &atomic.Int64{}
	b.open(t, store.WithFault(func(string) error {
		writes.Add(1)
		return nil
	}))
	batch := b.submit(t, "alpha", "r1", "a.pdf", "b.pdf")
	g := b.acquire(t, "r-1", 1)[0]
	tok := g.Job.Lease.Token
	session := b.openSession(t, "r-s", 0)

	type entry struct {
		name  string
		field string
		// reason is the batch validation's, or INVALID_TEXT for the writer.
		reason string
		call   func(s string) error
	}
	submit := func(mut func(*SubmitRequest)) func(string) error {
		return func(string) error {
			req := SubmitRequest{Team: "alpha", RequestID: "bad", Docs: docs("x.pdf")}
			mut(&req)
			_, err := b.e.Submit(ctx, req)
			return err
		}
	}
	var cur string
	entries := []entry{
		{"Submit team", "team", "INVALID_TEAM", submit(func(r *SubmitRequest) { r.Team = cur })},
		{"Submit request id", "request_id", "INVALID_REQUEST_ID", submit(func(r *SubmitRequest) { r.RequestID = cur })},
		{"Submit name", "documents[0].name", "INVALID_NAME", submit(func(r *SubmitRequest) { r.Docs[0].Name = cur })},
		{"Submit content type", "documents[0].content_type", "INVALID_CONTENT_TYPE", submit(func(r *SubmitRequest) { r.Docs[0].ContentType = cur })},
		{"Submit source URI", "documents[0].source_uri", "INVALID_SOURCE_URI", submit(func(r *SubmitRequest) { r.Docs[0].SourceURI = "s3://" + cur })},
		{"Submit trace parent", "trace_parent", "INVALID_TEXT", submit(func(r *SubmitRequest) { r.TraceParent = cur })},
		{"Cancel job reason", "reason", "INVALID_TEXT", func(s string) error {
			_, err := b.e.Cancel(ctx, CancelRequest{Job: batch.FirstJob + 1, Principal: "alice", Reason: s})
			return err
		}},
		{"Cancel leased job reason", "reason", "INVALID_TEXT", func(s string) error {
			_, err := b.e.Cancel(ctx, CancelRequest{Job: g.Job.ID, Principal: "alice", Reason: s, Operator: true})
			return err
		}},
		{"Cancel batch reason", "reason", "INVALID_TEXT", func(s string) error {
			_, err := b.e.Cancel(ctx, CancelRequest{Batch: batch.ID, Principal: "alice", Reason: s})
			return err
		}},
		{"Cancel principal", "principal", "INVALID_TEXT", func(s string) error {
			_, err := b.e.Cancel(ctx, CancelRequest{Job: batch.FirstJob + 1, Principal: s})
			return err
		}},
		{"Replay reason", "reason", "INVALID_TEXT", func(s string) error {
			_, err := b.e.Replay(ctx, ReplayRequest{Principal: "ops", RequestID: "rp", Reason: s, Batch: batch.ID})
			return err
		}},
		{"Replay request id", "request_id", "INVALID_TEXT", func(s string) error {
			_, err := b.e.Replay(ctx, ReplayRequest{Principal: "ops", RequestID: s, Reason: "rerun", Batch: batch.ID})
			return err
		}},
		{"Pause reason", "reason", "INVALID_TEXT", func(s string) error {
			_, err := b.e.SetPaused(ctx, true, "ops", s)
			return err
		}},
		{"Resume reason", "reason", "INVALID_TEXT", func(s string) error {
			_, err := b.e.SetPaused(ctx, false, "ops", s)
			return err
		}},
		{"RecordAudit reason", "reason", "INVALID_TEXT", func(s string) error {
			return b.e.RecordAudit(ctx, jobs.AuditRecord{Principal: "ops", Action: jobs.AuditDenied, Reason: s, Teams: []string{"beta"}})
		}},
		{"RecordAudit team", "teams[0]", "INVALID_TEXT", func(s string) error {
			return b.e.RecordAudit(ctx, jobs.AuditRecord{Principal: "ops", Action: jobs.AuditDenied, Reason: "r", Teams: []string{s}})
		}},
		{"Complete failure message", "failure.message", "INVALID_TEXT", func(s string) error {
			_, err := complete(ctx, b.e, failure(g.Job.ID, tok, "r-1", jobs.ClassTransient, s))
			return err
		}},
		{"Complete stale failure message", "failure.message", "INVALID_TEXT", func(s string) error {
			_, err := complete(ctx, b.e, failure(g.Job.ID, tok+100, "r-1", jobs.ClassTransient, s))
			return err
		}},
		{"Complete stale digest", "success.artifact_digest", "INVALID_TEXT", func(s string) error {
			_, err := complete(ctx, b.e, stagedSuccess(g.Job.ID, tok+100, "r-1", s))
			return err
		}},
		{"Complete preview media type", "preview.content_type", "INVALID_TEXT", func(s string) error {
			req := success(g.Job.ID, tok, "r-1", "d")
			req.Preview.ContentType = s
			_, err := complete(ctx, b.e, req)
			return err
		}},
		{"Complete renderer", "renderer_id", "INVALID_TEXT", func(s string) error {
			_, err := complete(ctx, b.e, failure(g.Job.ID, tok, s, jobs.ClassTransient, "m"))
			return err
		}},
		{"Stage media type", "metadata.content_type", "INVALID_TEXT", func(s string) error {
			p := preview("d")
			p.ContentType = s
			return b.e.Stage(ctx, StageRequest{Job: g.Job.ID, Token: tok, Renderer: "r-1", Preview: *p})
		}},
		{"Session completion message", "failure.message", "INVALID_TEXT", func(s string) error {
			res, err := b.e.Receive(ctx, session, SessionInput{Completions: []CompleteRequest{failure(g.Job.ID, tok, "", jobs.ClassTransient, s)}})
			if err != nil {
				return fmt.Errorf("the session command failed as a whole: %w", err)
			}
			return res.Completions[0].Err
		}},
		{"OpenSession instance", "instance_id", "INVALID_TEXT", func(s string) error {
			_, _, err := b.e.Open(ctx, SessionOpen{Renderer: rend("r-new"), Instance: s, Capacity: 1})
			return err
		}},
		{"OpenSession renderer", "renderer_id", "INVALID_TEXT", func(s string) error {
			_, _, err := b.e.Open(ctx, SessionOpen{Renderer: rend(s), Instance: "i", Capacity: 1})
			return err
		}},
		{"OpenStream principal", "principal", "INVALID_TEXT", func(s string) error {
			_, err := openStream(ctx, b.e, Renderer{ID: "r-new", Principal: s}, 1)
			return err
		}},
		{"Acquire renderer", "renderer_id", "INVALID_TEXT", func(s string) error {
			_, err := acquire(ctx, b.e, acquireRequest{Renderer: rend(s), Max: 1, Capacity: 1})
			return err
		}},
		{"Heartbeat renderer", "renderer_id", "INVALID_TEXT", func(s string) error {
			_, err := heartbeat(ctx, b.e, heartbeatRequest{Renderer: rend(s), Leases: []LeaseRef{{Job: g.Job.ID, Token: tok}}})
			return err
		}},
		{"Release renderer", "renderer_id", "INVALID_TEXT", func(s string) error {
			return release(ctx, b.e, s, []LeaseRef{{Job: g.Job.ID, Token: tok}})
		}},
	}
	n := 0
	for _, en := range entries {
		for _, s := range badStrings {
			cur = s
			what := fmt.Sprintf("%s %q", en.name, s)
			before, jobsBefore := writes.Load(), b.allJobs(t)
			err := en.call(s)
			var ve *jobs.ValidationError
			switch {
			case !errors.As(err, &ve) || string(ve.Reason) != en.reason:
				t.Errorf("%s: err = %v, want a refusal with reason %s", what, err, en.reason)
			case !slices.ContainsFunc(ve.Violations, func(v jobs.Violation) bool { return v.Field == en.field }):
				t.Errorf("%s: violations %+v, want one naming %s", what, ve.Violations, en.field)
			}
			if d := writes.Load() - before; d != 0 {
				t.Errorf("%s: %d records written", what, d)
			}
			if !slices.EqualFunc(jobsBefore, b.allJobs(t), func(x, y jobs.Job) bool { return reflect.DeepEqual(x, y) }) {
				t.Errorf("%s: the jobs changed", what)
			}
			if !b.e.Serving() {
				t.Fatalf("%s: the writer stopped", what)
			}
			n++
			if _, err := b.e.Submit(ctx, SubmitRequest{Team: "beta", RequestID: fmt.Sprintf("after-%d", n), Docs: docs("n.pdf")}); err != nil {
				t.Fatalf("the submit after %s: %v", what, err)
			}
		}
	}
	// The refused completions left the lease live and its holder's.
	if j := b.job(t, g.Job.ID); j.Phase != jobs.PhaseLeased || j.Lease.Token != tok || j.RejectedCompletions != 0 {
		t.Errorf("the leased job is %v under %d with %d rejections, want LEASED under %d with none", j.Phase, j.Lease.Token, j.RejectedCompletions, tok)
	}
}

// commandPrototypes holds one value of every command type the writer
// applies, with one element in every slice, so that each string the
// command carries can be reached.
func commandPrototypes() []command {
	one := []LeaseRef{{Job: 1, Token: 1}}
	r := Renderer{ID: "r", Principal: "p"}
	cr := CompleteRequest{Job: 1, Completion: jobs.Completion{Token: 1, Renderer: "r", Digest: "d", ContentType: "c", Message: "m"},
		Preview: &jobs.Preview{Digest: "d", ContentType: "c"}}
	return []command{
		&submitCmd{req: SubmitRequest{Team: "t", RequestID: "r", Docs: docs("a"), TraceParent: "tp"},
			docs: []jobs.Document{{Name: "n", ContentType: "c", SourceURI: "s", ContentSHA256: "h"}}},
		&cancelCmd{req: CancelRequest{Principal: "p", Reason: "r"}},
		&replayCmd{req: ReplayRequest{Principal: "p", RequestID: "r", Reason: "r", JobIDs: []uint64{1}}},
		&pauseCmd{principal: "p", reason: "r"},
		&auditCmd{rec: jobs.AuditRecord{Principal: "p", Action: "a", Reason: "r", RequestID: "q", Teams: []string{"t"}}},
		&stageCmd{req: StageRequest{Renderer: "r", Preview: jobs.Preview{Digest: "d", ContentType: "c"}}},
		&doomCmd{keys: []ObjectKey{{Team: "t", Digest: "d"}}},
		&buryCmd{keys: []ObjectKey{{Team: "t", Digest: "d"}}},
		&forgetTombsCmd{},
		&openCmd{req: SessionOpen{Renderer: r, Instance: "i", Holding: one}},
		// Outside any session a message's renderer is its own.
		&receiveCmd{in: SessionInput{Renderer: r, Received: one, Heartbeats: one, Completions: []CompleteRequest{cr}, HandBacks: one, Acks: one, Undelivered: one}},
		&closeCmd{undelivered: one},
		&announceCmd{id: "n1", addr: "a"},
		&purgeCmd{},
		&tickCmd{},
		&observeCmd{},
	}
}

// notCarried are the strings of a command that text need not name, and why.
var notCarried = map[string]string{
	// Results, filled in by evaluate.
	"res": "a result", "left": "a result", "holding": "a result",
	// newSubmitCmd copies req.Docs into docs, which is what is stored.
	"submitCmd.req.Docs": "copied into docs",
	// completeOne checks each completion of a session on its own.
	"receiveCmd.in.Completions": "checked by completeOne",
}

// TestEveryCommandNamesItsText sets every string each command carries,
// one at a time, to invalid UTF-8, and checks that the command's text
// refuses it: a string added to a command and left out of its text would
// reach a record unchecked. It also checks that the prototypes cover every
// command type of the package.
func TestEveryCommandNamesItsText(t *testing.T) {
	t.Parallel()
	protos := commandPrototypes()
	have := map[string]bool{}
	for _, c := range protos {
		have[reflect.TypeOf(c).Elem().Name()] = true
	}
	for _, name := range evaluateReceivers(t) {
		if !have[name] {
			t.Errorf("command %s has no prototype in commandPrototypes", name)
		}
	}
	for _, c := range protos {
		name := reflect.TypeOf(c).Elem().Name()
		if err := c.text(); err != nil {
			t.Errorf("%s: the prototype is refused: %v", name, err)
		}
		eachString(reflect.ValueOf(c).Elem(), name, func(path string, v reflect.Value) {
			old := v.String()
			v.SetString("\xff")
			err := c.text()
			v.SetString(old)
			if err == nil {
				t.Errorf("text accepts invalid UTF-8 in %s", path)
			}
		})
	}
	// The session's completions, left to completeOne, are checked there.
	sc := &receiveCmd{in: SessionInput{Completions: []CompleteRequest{{Completion: jobs.Completion{Message: "\xff"}}}}}
	if sc.in.Completions[0].text() == nil {
		t.Error("a session completion's message of invalid UTF-8 passes CompleteRequest.text")
	}
}

// eachString calls fn with every string reachable from v through structs,
// slices and pointers, made settable, except those notCarried names.
func eachString(v reflect.Value, path string, fn func(string, reflect.Value)) {
	switch v.Kind() {
	case reflect.String:
		fn(path, reflect.NewAt(v.Type(), unsafe.Pointer(v.UnsafeAddr())).Elem())
	case reflect.Struct:
		if v.Type() == reflect.TypeFor[time.Time]() {
			return
		}
		for i := range v.NumField() {
			f := v.Type().Field(i)
			p := path + "." + f.Name
			if _, skip := notCarried[f.Name]; skip {
				continue
			}
			if _, skip := notCarried[p]; skip {
				continue
			}
			eachString(v.Field(i), p, fn)
		}
	case reflect.Slice, reflect.Array:
		for i := range v.Len() {
			eachString(v.Index(i), fmt.Sprintf("%s[%d]", path, i), fn)
		}
	case reflect.Pointer:
		if !v.IsNil() && v.Type() != reflect.TypeFor[*Conn]() {
			eachString(v.Elem(), path, fn)
		}
	}
}

// evaluateReceivers lists the types with an evaluate(*group) method in the
// package's non-test files: the commands.
func evaluateReceivers(t *testing.T) []string {
	t.Helper()
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	var files []*ast.File
	for _, e := range entries {
		if n := e.Name(); strings.HasSuffix(n, ".go") && !strings.HasSuffix(n, "_test.go") {
			f, err := parser.ParseFile(fset, n, nil, parser.SkipObjectResolution)
			if err != nil {
				t.Fatal(err)
			}
			files = append(files, f)
		}
	}
	var names []string
	for _, f := range files {
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			// A command's evaluate takes the group alone; the Engine's
			// evaluates a whole batch.
			if !ok || fd.Recv == nil || fd.Name.Name != "evaluate" || fd.Type.Params.NumFields() != 1 {
				continue
			}
			if star, ok := fd.Recv.List[0].Type.(*ast.StarExpr); ok {
				if id, ok := star.X.(*ast.Ident); ok {
					names = append(names, id.Name)
				}
			}
		}
	}
	if len(names) == 0 {
		t.Fatal("found no command in the package")
	}
	return names
}
