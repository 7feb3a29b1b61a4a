package cli

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/leasehold/leasehold/client"
	"github.com/leasehold/leasehold/client/internal/fakeserver"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

type testBundle struct {
	fake     *fakeserver.Server
	env      Env
	terminal bool
	vars     map[string]string
	dialed   []string // addresses passed to Dial
}

// setup starts a fake, configured by configure before it serves, and an
// environment that reaches it.
func setup(t *testing.T, configure ...func(*fakeserver.Server)) *testBundle {
	t.Helper()
	b := &testBundle{fake: fakeserver.New(), vars: map[string]string{}}
	for _, c := range configure {
		c(b.fake)
	}
	dialOpt := fakeserver.Start(t, b.fake)
	b.env = Env{
		Stdin:  strings.NewReader(""),
		Getenv: func(k string) string { return b.vars[k] },
		Dial: func(addr string, opts ...client.Option) (*client.Client, error) {
			b.dialed = append(b.dialed, addr)
			return client.Dial(fakeserver.Target, append(opts, client.WithDialOptions(dialOpt))...)
		},
		IsTerminal:   func(io.Writer) bool { return b.terminal },
		NewRequestID: func() string { return "rid" },
	}
	return b
}

// run executes the command line and returns the exit status and outputs.
func (b *testBundle) run(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	return b.runContext(t.Context(), args...)
}

// runContext is run with the command's context.
func (b *testBundle) runContext(ctx context.Context, args ...string) (code int, stdout, stderr string) {
	var out, errOut bytes.Buffer
	env := b.env
	env.Stdout, env.Stderr = &out, &errOut
	code = Run(ctx, env, args)
	return code, out.String(), errOut.String()
}

func writeFiles(t *testing.T, dir string, names ...string) {
	t.Helper()
	for _, n := range names {
		if err := os.WriteFile(filepath.Join(dir, n), []byte("content of "+n), 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

func TestSubmitDirectory(t *testing.T) {
	t.Parallel()

	t.Run("a directory is submitted sorted by name in batches of 500 with numbered request ids", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		dir := t.TempDir()
		var names []string
		for i := range 1001 {
			names = append(names, fmt.Sprintf("doc-%04d.pdf", 1000-i)) // written in reverse order
		}
		writeFiles(t, dir, names...)
		if err := os.Mkdir(filepath.Join(dir, "nested"), 0o700); err != nil {
			t.Fatal(err)
		}
		writeFiles(t, filepath.Join(dir, "nested"), "ignored.pdf")

		code, out, errOut := b.run(t, "submit", "--team", "team-a", "--request-id", "R", dir)
		if code != ExitOK {
			t.Fatalf("exit status = %d, want 0; stderr:\n%s", code, errOut)
		}
		subs := b.fake.Submits()
		type batchShape struct {
			RequestID string
			Team      string
			Docs      int
			First     string
			Last      string
		}
		var got []batchShape
		for _, s := range subs {
			d := s.GetDocuments()
			got = append(got, batchShape{s.GetRequestId(), s.GetTeam(), len(d), d[0].GetName(), d[len(d)-1].GetName()})
		}
		want := []batchShape{
			{"R-0", "team-a", 500, "doc-0000.pdf", "doc-0499.pdf"},
			{"R-1", "team-a", 500, "doc-0500.pdf", "doc-0999.pdf"},
			{"R-2", "team-a", 1, "doc-1000.pdf", "doc-1000.pdf"},
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("submitted batches mismatch (-want +got):\n%s", diff)
		}
		first := subs[0].GetDocuments()[0]
		wantDoc := &leaseholdv1.Document{Name: "doc-0000.pdf", ContentType: "application/pdf", SizeBytes: int64(len("content of doc-0000.pdf")), Content: []byte("content of doc-0000.pdf")}
		if diff := cmp.Diff(wantDoc, first, protocmp.Transform()); diff != "" {
			t.Errorf("first document mismatch (-want +got):\n%s", diff)
		}
		wantOut := "batch b-1: 500 jobs (request id R-0)\nbatch b-2: 500 jobs (request id R-1)\nbatch b-3: 1 jobs (request id R-2)\nsubmitted 1001 jobs in 3 batches\n"
		if diff := cmp.Diff(wantOut, out); diff != "" {
			t.Errorf("output mismatch (-want +got):\n%s", diff)
		}
	})

	t.Run("without a request id a random one is used", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		dir := t.TempDir()
		writeFiles(t, dir, "a.txt")
		if code, _, errOut := b.run(t, "submit", dir); code != ExitOK {
			t.Fatalf("exit status = %d, want 0; stderr:\n%s", code, errOut)
		}
		if got, want := b.fake.Submits()[0].GetRequestId(), "rid-0"; got != want {
			t.Errorf("request id = %q, want %q", got, want)
		}
	})

	t.Run("two files with the same base name are refused before anything is sent", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		d1, d2 := t.TempDir(), t.TempDir()
		writeFiles(t, d1, "same.pdf")
		writeFiles(t, d2, "same.pdf")
		code, _, errOut := b.run(t, "submit", d1, d2)
		if code != ExitError || !strings.Contains(errOut, "unique") {
			t.Errorf("exit status = %d, stderr %q; want 1 and a message about unique names", code, errOut)
		}
		if n := len(b.fake.Submits()); n != 0 {
			t.Errorf("%d batches were submitted, want 0", n)
		}
	})
}

// writeSized writes n files of size bytes each, named f-00.txt, f-01.txt, ...
func writeSized(t *testing.T, dir string, n, size int) {
	t.Helper()
	for i := range n {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("f-%02d.txt", i)), bytes.Repeat([]byte{'x'}, size), 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

func TestSubmitSplitsByBytes(t *testing.T) {
	t.Parallel()
	type shape struct {
		RequestID string
		Docs      int
		Encoded   bool // the request fits the server's receive limit
	}
	shapes := func(b *testBundle, limit int) []shape {
		var got []shape
		for _, r := range b.fake.Submits() {
			got = append(got, shape{r.GetRequestId(), len(r.GetDocuments()), proto.Size(r) <= limit})
		}
		return got
	}

	t.Run("20 files of 250,000 bytes under a 4 MiB limit go as 2 requests that fit it", func(t *testing.T) {
		t.Parallel()
		const limit = 4 << 20
		b := setup(t, func(f *fakeserver.Server) { f.MaxRecvMsgSize = limit })
		dir := t.TempDir()
		writeSized(t, dir, 20, 250_000)
		code, out, errOut := b.run(t, "submit", "--request-id", "R", "--max-batch-inline-bytes", "4MiB", dir)
		if code != ExitOK {
			t.Fatalf("exit status = %d, want 0; stderr:\n%s", code, errOut)
		}
		if diff := cmp.Diff([]shape{{"R-0", 16, true}, {"R-1", 4, true}}, shapes(b, limit)); diff != "" {
			t.Errorf("requests mismatch (-want +got):\n%s", diff)
		}
		want := "batch b-1: 16 jobs (request id R-0)\nbatch b-2: 4 jobs (request id R-1)\nsubmitted 20 jobs in 2 batches\n"
		if diff := cmp.Diff(want, out); diff != "" {
			t.Errorf("output mismatch (-want +got):\n%s", diff)
		}
	})

	t.Run("with the default limits 70 files of 250,000 bytes go as 67 and 3", func(t *testing.T) {
		t.Parallel()
		b := setup(t) // the coordinator's defaults: 16 MiB inline per batch
		dir := t.TempDir()
		writeSized(t, dir, 70, 250_000)
		if code, _, errOut := b.run(t, "submit", "--request-id", "R", dir); code != ExitOK {
			t.Fatalf("exit status = %d, want 0; stderr:\n%s", code, errOut)
		}
		if diff := cmp.Diff([]shape{{"R-0", 67, true}, {"R-1", 3, true}}, shapes(b, fakeserver.DefaultMaxRecvMsgSize)); diff != "" {
			t.Errorf("requests mismatch (-want +got):\n%s", diff)
		}
	})

	t.Run("a refused batch after accepted ones says how to submit the rest", func(t *testing.T) {
		t.Parallel()
		b := setup(t, func(f *fakeserver.Server) { f.Limits.MaxDeclaredBytes = 500 })
		dir := t.TempDir()
		writeSized(t, dir, 2, 10)
		if err := os.WriteFile(filepath.Join(dir, "z-big.txt"), bytes.Repeat([]byte{'z'}, 1000), 0o600); err != nil {
			t.Fatal(err)
		}
		code, _, errOut := b.run(t, "submit", "--request-id", "R", "--max-batch-documents", "2", dir)
		if code != ExitError {
			t.Errorf("exit status = %d, want %d", code, ExitError)
		}
		for _, s := range []string{"1 of 2 batches were accepted; run the same command with --request-id R", "submitting batch 2 of 2 (request id R-1)", "BATCH_TOO_LARGE"} {
			if !strings.Contains(errOut, s) {
				t.Errorf("stderr lacks %q:\n%s", s, errOut)
			}
		}
	})

	t.Run("limits that are not sizes are usage errors", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		for _, args := range [][]string{
			{"submit", "--max-batch-inline-bytes", "lots", "x"},
			{"submit", "--max-batch-bytes", "0", "x"},
			{"submit", "--max-batch-documents", "-1", "x"},
		} {
			if code, _, _ := b.run(t, args...); code != ExitUsage {
				t.Errorf("%v: exit status = %d, want %d", args, code, ExitUsage)
			}
		}
	})
}

func TestByteSize(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]int64{"16MiB": 16 << 20, "256KiB": 256 << 10, "1GiB": 1 << 30, "5MB": 5e6, "200KB": 2e5, "1048576": 1 << 20, "7 B": 7} {
		var b byteSize
		if err := b.Set(in); err != nil || int64(b) != want {
			t.Errorf("Set(%q) = %d, %v; want %d", in, b, err, want)
		}
	}
	for _, in := range []string{"", "MiB", "-1", "1.5MiB", "9999999999999GiB"} {
		var b byteSize
		if err := b.Set(in); err == nil {
			t.Errorf("Set(%q) succeeded with %d, want an error", in, b)
		}
	}
	if got := (func() string { b := byteSize(16 << 20); return b.String() })(); got != "16MiB" {
		t.Errorf("String() = %q, want 16MiB", got)
	}
}

func TestSubmitWait(t *testing.T) {
	t.Parallel()

	t.Run("plain output prints one line per job event and fails when a job failed", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		dir := t.TempDir()
		writeFiles(t, dir, "a.pdf", "b-fail.pdf", "c.pdf")
		code, out, errOut := b.run(t, "submit", "--wait", "--request-id", "R", dir)
		if code != ExitJobsFailed {
			t.Errorf("exit status = %d, want %d", code, ExitJobsFailed)
		}
		want := "batch b-1: 3 jobs (request id R-0)\njob j-1 SUCCEEDED\njob j-2 FAILED\njob j-3 SUCCEEDED\ndone: 2 succeeded, 1 failed, 0 cancelled\n"
		if diff := cmp.Diff(want, out); diff != "" {
			t.Errorf("output mismatch (-want +got):\n%s", diff)
		}
		if !strings.Contains(errOut, "1 jobs failed") {
			t.Errorf("stderr = %q, want the failure count", errOut)
		}
	})

	t.Run("a terminal gets a progress bar redrawn in place within its width", func(t *testing.T) {
		t.Parallel()
		b := setup(t, func(f *fakeserver.Server) { f.UpdatesPerMessage = 1 }) // a count change per message
		b.terminal = true
		const width = 50
		b.env.TerminalWidth = func(io.Writer) int { return width }
		clock := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
		b.env.Now = func() time.Time { clock = clock.Add(time.Second); return clock }
		dir := t.TempDir()
		writeFiles(t, dir, "a.pdf", "b.pdf", "c.pdf", "d.pdf")
		code, out, errOut := b.run(t, "submit", "--wait", dir)
		if code != ExitOK {
			t.Fatalf("exit status = %d, want 0; stderr:\n%s", code, errOut)
		}
		// A draw a second: four snapshots, then a job done at each draw.
		for _, want := range []string{
			"\r[..............] 0/4 done",
			"\r[###...........] 1/4 done  0.2 docs/s  ETA 12s",
			"\r[#######.......] 2/4 done  0.4 docs/s  ETA 5s \r", // padded over the longer line before
			"\r[##############] 4/4 done  0.5 docs/s\n",
		} {
			if !strings.Contains(out, want) {
				t.Errorf("output lacks %q:\n%q", want, out)
			}
		}
		for _, line := range strings.Split(strings.TrimRight(out, "\n"), "\r")[1:] {
			line, _, _ = strings.Cut(line, "\n")
			if len(strings.TrimRight(line, " ")) >= width {
				t.Errorf("line %q is %d columns, want fewer than %d", line, len(line), width)
			}
		}
		if strings.Contains(out, "job j-1") {
			t.Errorf("output has per-job lines under a progress bar:\n%q", out)
		}
	})
}

// jsonLines decodes every line of out as a JSON object.
func jsonLines(t *testing.T, out string) []map[string]any {
	t.Helper()
	var objs []map[string]any
	for _, line := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("line %q is not a JSON object: %v", line, err)
		}
		objs = append(objs, m)
	}
	return objs
}

func keys(m map[string]any) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

func TestJSONOutput(t *testing.T) {
	t.Parallel()

	t.Run("list prints one job per line with snake_case field names", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.fake.AddJob(&leaseholdv1.Job{Id: "j-1", BatchId: "b-1", Team: "a", Phase: leaseholdv1.Phase_PHASE_FAILED, MaxAttempts: 5,
			TerminalReason: leaseholdv1.TerminalReason_TERMINAL_REASON_ATTEMPTS_EXHAUSTED, Document: &leaseholdv1.DocumentInfo{Name: "x.pdf", SizeBytes: 3}})
		b.fake.AddJob(&leaseholdv1.Job{Id: "j-2", BatchId: "b-1", Team: "a", Phase: leaseholdv1.Phase_PHASE_QUEUED})
		code, out, errOut := b.run(t, "list", "--batch", "b-1", "-o", "json")
		if code != ExitOK {
			t.Fatalf("exit status = %d; stderr:\n%s", code, errOut)
		}
		objs := jsonLines(t, out)
		if len(objs) != 2 {
			t.Fatalf("got %d lines, want 2:\n%s", len(objs), out)
		}
		if diff := cmp.Diff([]string{"batch_id", "document", "id", "max_attempts", "phase", "team", "terminal_reason"}, keys(objs[0])); diff != "" {
			t.Errorf("first job's keys mismatch (-want +got):\n%s", diff)
		}
		if got := objs[0]["document"].(map[string]any)["size_bytes"]; got != "3" {
			t.Errorf("document.size_bytes = %v, want \"3\"", got)
		}
		if got := objs[1]["phase"]; got != "PHASE_QUEUED" {
			t.Errorf("second job's phase = %v, want PHASE_QUEUED", got)
		}
	})

	t.Run("watch prints one message per line keyed job_id and phase", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		dir := t.TempDir()
		writeFiles(t, dir, "a.pdf")
		if code, _, errOut := b.run(t, "submit", dir); code != ExitOK {
			t.Fatalf("submit exit status = %d; stderr:\n%s", code, errOut)
		}
		code, out, errOut := b.run(t, "watch", "b-1", "--output=json")
		if code != ExitOK {
			t.Fatalf("exit status = %d; stderr:\n%s", code, errOut)
		}
		objs := jsonLines(t, out)
		if diff := cmp.Diff([]string{"batch", "job_id", "phase"}, keys(objs[0])); diff != "" {
			t.Errorf("snapshot keys mismatch (-want +got):\n%s", diff)
		}
		last := objs[len(objs)-1]
		if diff := cmp.Diff([]string{"batch", "event", "job_id", "phase"}, keys(last)); diff != "" {
			t.Errorf("event keys mismatch (-want +got):\n%s", diff)
		}
		if last["job_id"] != "j-1" || last["phase"] != "PHASE_SUCCEEDED" {
			t.Errorf("last message = %v, want j-1 PHASE_SUCCEEDED", last)
		}
		if done := last["batch"].(map[string]any)["done"]; done != true {
			t.Errorf("last message's batch.done = %v, want true", done)
		}
	})
}

func TestTableOutput(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.fake.MaxPageSize = 1
	b.fake.AddJob(&leaseholdv1.Job{Id: "j-1", BatchId: "b-1", Team: "a", Phase: leaseholdv1.Phase_PHASE_FAILED, Attempt: 5, MaxAttempts: 5,
		TerminalReason: leaseholdv1.TerminalReason_TERMINAL_REASON_ATTEMPTS_EXHAUSTED, Document: &leaseholdv1.DocumentInfo{Name: "x.pdf"}})
	b.fake.AddJob(&leaseholdv1.Job{Id: "j-2", BatchId: "b-1", Team: "a", Phase: leaseholdv1.Phase_PHASE_QUEUED})

	t.Run("list follows pages and prints short phases", func(t *testing.T) {
		code, out, errOut := b.run(t, "list")
		if code != ExitOK {
			t.Fatalf("exit status = %d; stderr:\n%s", code, errOut)
		}
		want := "ID   BATCH  TEAM  PHASE   ATTEMPT  REASON              DOCUMENT\n" +
			"j-1  b-1    a     FAILED  5/5      ATTEMPTS_EXHAUSTED  x.pdf\n" +
			"j-2  b-1    a     QUEUED  0        -                   -\n"
		if diff := cmp.Diff(want, out); diff != "" {
			t.Errorf("output mismatch (-want +got):\n%s", diff)
		}
	})

	t.Run("list stops at the limit", func(t *testing.T) {
		_, out, _ := b.run(t, "list", "--limit", "1")
		if got := strings.Count(out, "\n"); got != 2 {
			t.Errorf("got %d lines, want a header and one job:\n%s", got, out)
		}
	})

	t.Run("get prints key/value lines", func(t *testing.T) {
		code, out, _ := b.run(t, "get", "j-1")
		if code != ExitOK {
			t.Fatalf("exit status = %d, want 0", code)
		}
		got := map[string]string{}
		for _, line := range strings.Split(out, "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok {
				got[k] = strings.TrimSpace(v)
			}
		}
		for k, want := range map[string]string{"id": "j-1", "phase": "FAILED", "attempt": "5/5", "terminal reason": "ATTEMPTS_EXHAUSTED", "document": "x.pdf (-, 0 bytes)"} {
			if got[k] != want {
				t.Errorf("%s = %q, want %q; output:\n%s", k, got[k], want, out)
			}
		}
	})
}

func TestReplay(t *testing.T) {
	t.Parallel()
	failed := func(b *testBundle) {
		b.fake.AddJob(&leaseholdv1.Job{Id: "j-1", BatchId: "b-1", Team: "a", Phase: leaseholdv1.Phase_PHASE_FAILED,
			TerminalReason: leaseholdv1.TerminalReason_TERMINAL_REASON_ATTEMPTS_EXHAUSTED})
		b.fake.AddJob(&leaseholdv1.Job{Id: "j-2", BatchId: "b-1", Team: "a", Phase: leaseholdv1.Phase_PHASE_SUCCEEDED})
	}

	t.Run("without --yes only the dry run is sent", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		failed(b)
		code, out, errOut := b.run(t, "replay", "--job", "j-1", "--job", "j-2", "--reason", "renderer fixed")
		if code != ExitOK {
			t.Fatalf("exit status = %d; stderr:\n%s", code, errOut)
		}
		want := []*leaseholdv1.ReplayJobsRequest{{JobIds: []string{"j-1", "j-2"}, Reason: "renderer fixed", DryRun: true}}
		if diff := cmp.Diff(want, b.fake.Replays(), protocmp.Transform()); diff != "" {
			t.Errorf("replay requests mismatch (-want +got):\n%s", diff)
		}
		for _, s := range []string{"j-1  b-1    a     FAILED     ATTEMPTS_EXHAUSTED  0        REQUEUE", "NOT_FAILED", "selected 2: 1 to requeue, 1 to skip", "--yes"} {
			if !strings.Contains(out, s) {
				t.Errorf("output lacks %q:\n%s", s, out)
			}
		}
	})

	t.Run("with --yes the dry run is followed by the real run with the same selection", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		failed(b)
		code, out, errOut := b.run(t, "replay", "--batch", "b-1", "--terminal-reason", "attempts_exhausted", "--reason", "renderer fixed", "--yes")
		if code != ExitOK {
			t.Fatalf("exit status = %d; stderr:\n%s", code, errOut)
		}
		sel := func(dry bool, rid string) *leaseholdv1.ReplayJobsRequest {
			return &leaseholdv1.ReplayJobsRequest{BatchId: "b-1", TerminalReason: leaseholdv1.TerminalReason_TERMINAL_REASON_ATTEMPTS_EXHAUSTED, Reason: "renderer fixed", DryRun: dry, RequestId: rid}
		}
		want := []*leaseholdv1.ReplayJobsRequest{sel(true, ""), sel(false, "rid")}
		if diff := cmp.Diff(want, b.fake.Replays(), protocmp.Transform()); diff != "" {
			t.Errorf("replay requests mismatch (-want +got):\n%s", diff)
		}
		if !strings.Contains(out, "replayed (request id rid, audit record 1): 1 requeued") {
			t.Errorf("output lacks the result:\n%s", out)
		}
	})

	t.Run("with --yes nothing is sent for real when the dry run requeues nothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		failed(b)
		code, _, errOut := b.run(t, "replay", "--job", "j-2", "--reason", "r", "--yes", "-o", "json")
		if code != ExitOK {
			t.Fatalf("exit status = %d; stderr:\n%s", code, errOut)
		}
		if got := len(b.fake.Replays()); got != 1 {
			t.Errorf("%d replay calls, want only the dry run", got)
		}
	})
}

func TestArtifact(t *testing.T) {
	t.Parallel()
	payload := bytes.Repeat([]byte("\x89PNG"), 5000)
	sum := sha256.Sum256(payload)
	digest := hex.EncodeToString(sum[:])

	t.Run("a verified download is written to the file", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.fake.SetArtifact("j-1", fakeserver.Artifact{Meta: &leaseholdv1.Artifact{Digest: digest, SizeBytes: int64(len(payload))}, Bytes: payload})
		path := filepath.Join(t.TempDir(), "out.png")
		code, out, errOut := b.run(t, "artifact", "j-1", "-f", path)
		if code != ExitOK {
			t.Fatalf("exit status = %d; stderr:\n%s", code, errOut)
		}
		got, err := os.ReadFile(path)
		if err != nil || !bytes.Equal(got, payload) {
			t.Errorf("file holds %d bytes (err %v), want the %d-byte payload", len(got), err, len(payload))
		}
		if want := path + "\tsha256 " + digest + ", 20000 bytes\n"; out != want {
			t.Errorf("output = %q, want %q", out, want)
		}
	})

	t.Run("a digest mismatch is an error and leaves no file", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		tampered := bytes.Clone(payload)
		tampered[7] ^= 0xff
		b.fake.SetArtifact("j-1", fakeserver.Artifact{Meta: &leaseholdv1.Artifact{Digest: digest, SizeBytes: int64(len(payload))}, Bytes: tampered})
		dir := t.TempDir()
		path := filepath.Join(dir, "out.png")
		code, _, errOut := b.run(t, "artifact", "j-1", "--file", path)
		if code != ExitError || !strings.Contains(errOut, "digest mismatch") {
			t.Errorf("exit status = %d, stderr %q; want 1 and a digest mismatch", code, errOut)
		}
		entries, _ := os.ReadDir(dir)
		if len(entries) != 0 {
			t.Errorf("directory holds %d entries after a failed download, want none", len(entries))
		}
	})
}

func TestBackup(t *testing.T) {
	t.Parallel()
	payload := bytes.Repeat([]byte("bbolt page "), 3000)
	sum := sha256.Sum256(payload)
	digest := hex.EncodeToString(sum[:])
	takenAt := time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)
	good := fakeserver.Backup{Bytes: payload, SizeBytes: int64(len(payload)), SHA256: digest, LastToken: 41, TakenAt: takenAt}

	t.Run("the help says which credential a backup takes", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		code, out, _ := b.run(t, "help", "backup")
		if code != ExitOK {
			t.Fatalf("exit status = %d", code)
		}
		for _, want := range []string{"backup role", `"roles": ["backup"]`, "no development token"} {
			if !strings.Contains(out, want) {
				t.Errorf("help backup lacks %q:\n%s", want, out)
			}
		}
	})

	t.Run("a verified backup is written to the file, readable by its owner only", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.fake.SetBackup(good)
		path := filepath.Join(t.TempDir(), "leasehold.backup")
		code, out, errOut := b.run(t, "backup", "-f", path)
		if code != ExitOK {
			t.Fatalf("exit status = %d; stderr:\n%s", code, errOut)
		}
		got, err := os.ReadFile(path)
		if err != nil || !bytes.Equal(got, payload) {
			t.Errorf("file holds %d bytes (err %v), want the %d-byte payload", len(got), err, len(payload))
		}
		if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("file mode = %v (%v), want 0600", fi.Mode().Perm(), err)
		}
		if want := path + "\tsha256 " + digest + ", 33000 bytes, schema 2, last token 41, taken at 2026-03-04T05:06:07Z\n"; out != want {
			t.Errorf("output = %q, want %q", out, want)
		}
	})

	t.Run("an existing file is kept unless forced", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.fake.SetBackup(good)
		path := filepath.Join(t.TempDir(), "leasehold.backup")
		if err := os.WriteFile(path, []byte("yesterday's"), 0o600); err != nil {
			t.Fatal(err)
		}
		if code, _, errOut := b.run(t, "backup", "-f", path); code != ExitError || !strings.Contains(errOut, "--force") {
			t.Errorf("exit status = %d, stderr %q; want 1 naming --force", code, errOut)
		}
		if got, _ := os.ReadFile(path); string(got) != "yesterday's" {
			t.Errorf("the existing file was changed")
		}
		if code, _, errOut := b.run(t, "backup", "-f", path, "--force"); code != ExitOK {
			t.Errorf("with --force: exit status = %d; stderr:\n%s", code, errOut)
		}
	})

	for name, bad := range map[string]fakeserver.Backup{
		"a digest mismatch": {Bytes: payload, SizeBytes: int64(len(payload)), SHA256: strings.Repeat("0", 64)},
		"a short stream":    {Bytes: payload[:1000], SizeBytes: int64(len(payload)), SHA256: digest},
	} {
		t.Run(name+" is an error and leaves no file", func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.fake.SetBackup(bad)
			dir := t.TempDir()
			code, _, errOut := b.run(t, "backup", "--file", filepath.Join(dir, "leasehold.backup"))
			if code != ExitError || !strings.Contains(errOut, "digest mismatch") {
				t.Errorf("exit status = %d, stderr %q; want 1 and a digest mismatch", code, errOut)
			}
			if entries, _ := os.ReadDir(dir); len(entries) != 0 {
				t.Errorf("directory holds %d entries after a failed backup, want none", len(entries))
			}
		})
	}
}

func TestUsageErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		args []string
	}{
		{"no command", nil},
		{"an unknown command", []string{"frobnicate"}},
		{"an unknown flag", []string{"list", "--bogus"}},
		{"get without a job", []string{"get"}},
		{"get with two jobs", []string{"get", "j-1", "j-2"}},
		{"an unknown output format", []string{"list", "-o", "xml"}},
		{"an unknown phase", []string{"list", "--phase", "DONE"}},
		{"submit without files", []string{"submit", "--team", "a"}},
		{"cancel with a job and a batch", []string{"cancel", "j-1", "--batch", "b-1"}},
		{"replay without a reason", []string{"replay", "--job", "j-1"}},
		{"replay with jobs and a batch", []string{"replay", "--job", "j-1", "--batch", "b-1", "--reason", "r"}},
		{"replay with a terminal reason but no batch", []string{"replay", "--job", "j-1", "--terminal-reason", "ATTEMPTS_EXHAUSTED", "--reason", "r"}},
		{"rejections with a bad time", []string{"rejections", "--since", "yesterday"}},
		{"pause without a reason", []string{"pause"}},
	}
	for _, tt := range tests {
		t.Run(tt.name+" exits 2 and sends nothing", func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			code, _, errOut := b.run(t, tt.args...)
			if code != ExitUsage {
				t.Errorf("exit status = %d, want %d; stderr:\n%s", code, ExitUsage, errOut)
			}
			if errOut == "" {
				t.Errorf("stderr is empty, want an explanation")
			}
			if n := len(b.fake.AuthHeaders()); n != 0 {
				t.Errorf("%d calls reached the server, want 0", n)
			}
		})
	}

	t.Run("help exits 0 and prints to stdout", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		for _, args := range [][]string{{"help"}, {"-h"}, {"help", "replay"}, {"submit", "-h"}} {
			code, out, _ := b.run(t, args...)
			if code != ExitOK || !strings.Contains(out, "usage: leasehold") {
				t.Errorf("%v: exit status %d, stdout %q; want 0 and usage", args, code, out)
			}
		}
	})
}

func TestErrorsAndGlobalFlags(t *testing.T) {
	t.Parallel()

	t.Run("an RPC error prints its message, code and reason and exits 1", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		code, _, errOut := b.run(t, "get", "j-404")
		if code != ExitError {
			t.Errorf("exit status = %d, want 1", code)
		}
		if want := "leasehold: job j-404 not found (NOT_FOUND JOB_NOT_FOUND)\n"; errOut != want {
			t.Errorf("stderr = %q, want %q", errOut, want)
		}
	})

	t.Run("address and token come from the environment", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.vars["LEASEHOLD_ADDR"] = "coord:9"
		b.vars["LEASEHOLD_TOKEN"] = "tok"
		b.run(t, "audit")
		if diff := cmp.Diff([]string{"coord:9"}, b.dialed); diff != "" {
			t.Errorf("dialed addresses mismatch (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff([]string{"Bearer tok"}, b.fake.AuthHeaders()); diff != "" {
			t.Errorf("authorization headers mismatch (-want +got):\n%s", diff)
		}
	})

	t.Run("flags override the environment and the default address applies without either", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.run(t, "pause", "--reason", "rollout")
		b.vars["LEASEHOLD_ADDR"] = "coord:9"
		b.run(t, "resume", "--reason", "done", "--addr", "other:1", "--token", "t2")
		if diff := cmp.Diff([]string{DefaultAddr, "other:1"}, b.dialed); diff != "" {
			t.Errorf("dialed addresses mismatch (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff([]string{"", "Bearer t2"}, b.fake.AuthHeaders()); diff != "" {
			t.Errorf("authorization headers mismatch (-want +got):\n%s", diff)
		}
	})

	t.Run("a cancelled context ends the command with CANCELLED", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		var out, errOut bytes.Buffer
		env := b.env
		env.Stdout, env.Stderr = &out, &errOut
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		if code := Run(ctx, env, []string{"get", "j-1"}); code != ExitError || !strings.Contains(errOut.String(), "CANCELLED") {
			t.Errorf("exit status %d, stderr %q; want 1 and CANCELLED", code, errOut.String())
		}
	})
}

func TestParseInterspersed(t *testing.T) {
	t.Parallel()
	o := &cancelOpts{}
	var g globalOpts
	fs := newFlagSet(command{name: "cancel"}, Env{}, o, &g)
	g.Output = "table"
	pos, err := parseInterspersed(fs, []string{"j-1", "--reason", "x", "-o", "json", "--", "-j-2"})
	if err != nil {
		t.Fatalf("parseInterspersed: %v", err)
	}
	if diff := cmp.Diff([]string{"j-1", "-j-2"}, pos); diff != "" {
		t.Errorf("positional arguments mismatch (-want +got):\n%s", diff)
	}
	if o.Reason != "x" || g.Output != "json" {
		t.Errorf("reason %q, output %q; want x and json", o.Reason, g.Output)
	}
}

func TestGlobalFlagsBeforeTheCommand(t *testing.T) {
	t.Parallel()

	t.Run("address, token and output given before the command apply", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.fake.AddJob(&leaseholdv1.Job{Id: "j-1", BatchId: "b-1", Team: "a", Phase: leaseholdv1.Phase_PHASE_QUEUED})
		code, out, errOut := b.run(t, "--addr", "other:1", "--token=t9", "-o", "json", "list")
		if code != ExitOK {
			t.Fatalf("exit status = %d; stderr:\n%s", code, errOut)
		}
		if diff := cmp.Diff([]string{"other:1"}, b.dialed); diff != "" {
			t.Errorf("dialed addresses mismatch (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff([]string{"Bearer t9"}, b.fake.AuthHeaders()); diff != "" {
			t.Errorf("authorization headers mismatch (-want +got):\n%s", diff)
		}
		if objs := jsonLines(t, out); len(objs) != 1 || objs[0]["id"] != "j-1" {
			t.Errorf("output = %q, want one JSON job", out)
		}
	})

	t.Run("a flag repeated after the command wins", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		code, out, _ := b.run(t, "-o", "json", "--addr", "a:1", "audit", "-o", "table", "--addr", "b:2")
		if code != ExitOK || !strings.HasPrefix(out, "ID") {
			t.Errorf("exit status %d, output %q; want 0 and a table", code, out)
		}
		if diff := cmp.Diff([]string{"b:2"}, b.dialed); diff != "" {
			t.Errorf("dialed addresses mismatch (-want +got):\n%s", diff)
		}
	})

	t.Run("a command's own flag before the command is a usage error", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		code, _, errOut := b.run(t, "--team", "a", "submit", "x")
		if code != ExitUsage || !strings.Contains(errOut, "Only the global flags") {
			t.Errorf("exit status %d, stderr %q; want %d and a hint", code, errOut, ExitUsage)
		}
	})

	t.Run("global flags without a command are a usage error", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		if code, _, errOut := b.run(t, "-o", "json"); code != ExitUsage || !strings.Contains(errOut, "usage: leasehold") {
			t.Errorf("exit status %d, stderr %q; want %d and the usage", code, errOut, ExitUsage)
		}
	})

	t.Run("help after global flags prints the usage", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		for _, args := range [][]string{{"--addr", "x:1", "help"}, {"--addr", "x:1", "--help"}, {"-o", "json", "help", "list"}} {
			if code, out, _ := b.run(t, args...); code != ExitOK || !strings.Contains(out, "usage: leasehold") {
				t.Errorf("%v: exit status %d, stdout %q; want 0 and usage", args, code, out)
			}
		}
	})
}

func TestCancelOnSignal(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name  string
		sig   os.Signal
		cause error
	}{
		{"SIGINT cancels with errInterrupted", os.Interrupt, errInterrupted},
		{"SIGTERM cancels with errTerminated", syscall.SIGTERM, errTerminated},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			sigs := make(chan os.Signal, 1)
			first := make(chan struct{})
			ctx, stop := cancelOnSignal(t.Context(), sigs, func() { close(first) })
			defer stop()
			sigs <- tt.sig
			<-ctx.Done()
			<-first
			if got := context.Cause(ctx); !errors.Is(got, tt.cause) {
				t.Errorf("cause = %v, want %v", got, tt.cause)
			}
		})
	}

	t.Run("stop without a signal cancels with context.Canceled", func(t *testing.T) {
		t.Parallel()
		ctx, stop := cancelOnSignal(t.Context(), make(chan os.Signal), nil)
		stop()
		if got := context.Cause(ctx); !errors.Is(got, context.Canceled) || interrupted(ctx) {
			t.Errorf("cause = %v, want context.Canceled", got)
		}
	})
}
