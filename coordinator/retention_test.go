package coordinator

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"github.com/leasehold/leasehold/internal/testclock"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/testing/protocmp"
)

// The tokens of testPrincipals: a submitter of team alpha, a renderer and
// a backup credential, which no development token is.
const (
	alphaToken    = "alpha-token-0f3e9b21"
	rendererToken = "renderer-token-7c2d4a90"
	backupToken   = "backup-token-4d1e7a22"
)

// testPrincipals writes a principals file with the tokens above and
// returns its path.
func testPrincipals(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "principals.json")
	data := `{"principals": [
		{"name": "alpha-svc", "token": "` + alphaToken + `", "team": "alpha", "roles": ["submitter"]},
		{"name": "render-pool", "token": "` + rendererToken + `", "roles": ["renderer"], "renderer_ids": ["*"]},
		{"name": "nightly-backup", "token": "` + backupToken + `", "roles": ["backup"]}
	]}`
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// clients are the three services' stubs over one bundle's connection.
type clients struct {
	jobs leaseholdv1.JobServiceClient
	rend leaseholdv1.RendererServiceClient
	ops  leaseholdv1.OperatorServiceClient
}

func (b *testBundle) clients() clients {
	return clients{leaseholdv1.NewJobServiceClient(b.conn), leaseholdv1.NewRendererServiceClient(b.conn), leaseholdv1.NewOperatorServiceClient(b.conn)}
}

// grant leases up to n jobs to renderer r-1.
func (c clients) grant(ctx context.Context, t *testing.T, n uint32) []*leaseholdv1.Grant {
	t.Helper()
	resp, err := c.rend.Acquire(bearer(ctx, rendererToken), &leaseholdv1.AcquireRequest{RendererId: "r-1", MaxLeases: n, Capacity: n})
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	return resp.GetLeases()
}

// allJobs lists every job alpha may see.
func (c clients) allJobs(ctx context.Context, t *testing.T) []*leaseholdv1.Job {
	t.Helper()
	resp, err := c.jobs.ListJobs(bearer(ctx, alphaToken), &leaseholdv1.ListJobsRequest{Team: "alpha", PageSize: 1000})
	if err != nil {
		t.Fatalf("ListJobs: %v", err)
	}
	return resp.GetJobs()
}

// backupTo downloads a backup into a new file and checks its size and
// digest against the header and trailer.
func (c clients) backupTo(ctx context.Context, t *testing.T) (string, *leaseholdv1.BackupHeader) {
	t.Helper()
	stream, err := c.ops.Backup(bearer(ctx, backupToken), &leaseholdv1.BackupRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var (
		data   bytes.Buffer
		header *leaseholdv1.BackupHeader
		digest string
	)
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("Backup: %v", err)
		}
		if h := msg.GetHeader(); h != nil {
			header = h
		}
		data.Write(msg.GetChunk())
		if tr := msg.GetTrailer(); tr != nil {
			digest = tr.GetSha256()
		}
	}
	sum := sha256.Sum256(data.Bytes())
	if int64(data.Len()) != header.GetSizeBytes() || hex.EncodeToString(sum[:]) != digest {
		t.Fatalf("backup of %d bytes hashing to %x; header says %d bytes, trailer %s", data.Len(), sum, header.GetSizeBytes(), digest)
	}
	path := filepath.Join(t.TempDir(), "leasehold.backup")
	if err := os.WriteFile(path, data.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	return path, header
}

// TestBackupRestoresIntoAFreshCoordinator takes an online backup over gRPC,
// goes on granting, restores the backup into a new data directory and
// starts a coordinator there: every job, its history and its preview are
// back, and the tokens it grants are above every token granted before the
// restore, in the backup or after it.
func TestBackupRestoresIntoAFreshCoordinator(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	tokens := testPrincipals(t)
	b := setup(t, Config{TokensFile: tokens})
	c := b.clients()
	docs := []*leaseholdv1.Document{
		{Name: "ok.pdf", ContentType: "application/pdf", Content: []byte("%PDF ok")},
		{Name: "bad.pdf", ContentType: "application/pdf", Content: []byte("%PDF bad")},
		{Name: "later.pdf", ContentType: "application/pdf", Content: []byte("%PDF later")},
	}
	if _, err := c.jobs.SubmitBatch(bearer(ctx, alphaToken), &leaseholdv1.SubmitBatchRequest{Team: "alpha", RequestId: "r", Documents: docs}); err != nil {
		t.Fatal(err)
	}
	grants := c.grant(ctx, t, 2)
	preview := []byte("png of ok.pdf")
	if _, err := c.rend.Complete(bearer(ctx, rendererToken), &leaseholdv1.CompleteRequest{JobId: grants[0].GetJobId(), Token: grants[0].GetLease().GetToken(),
		RendererId: "r-1", Outcome: &leaseholdv1.CompleteRequest_Success{Success: &leaseholdv1.CompleteSuccess{Content: preview, ContentType: "image/png"}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.rend.Complete(bearer(ctx, rendererToken), &leaseholdv1.CompleteRequest{JobId: grants[1].GetJobId(), Token: grants[1].GetLease().GetToken(),
		RendererId: "r-1", Outcome: &leaseholdv1.CompleteRequest_Failure{Failure: &leaseholdv1.CompleteFailure{
			Class: leaseholdv1.FailureClass_FAILURE_CLASS_INVALID_DOCUMENT, Message: "broken"}}}); err != nil {
		t.Fatal(err)
	}
	want := c.allJobs(ctx, t)
	path, header := c.backupTo(ctx, t)
	if header.GetLastToken() != grants[1].GetLease().GetToken() {
		t.Errorf("backup header last token = %d, want %d", header.GetLastToken(), grants[1].GetLease().GetToken())
	}
	// After the backup: a grant the restore loses, whose token its holder
	// still has.
	lost := c.grant(ctx, t, 1)[0].GetLease().GetToken()
	if err := b.c.Close(); err != nil {
		t.Fatal(err)
	}

	dir := filepath.Join(t.TempDir(), "restored")
	res, err := Restore(ctx, dir, path, "", time.Now())
	if err != nil {
		t.Fatalf("Restore: %v", err)
	}
	if res.LastToken != header.GetLastToken() || res.MovedAside != "" {
		t.Errorf("Restore = %+v, want the backup's last token %d and nothing moved aside", res, header.GetLastToken())
	}
	r := setup(t, Config{DataDir: dir, TokensFile: tokens})
	rc := r.clients()

	if diff := cmp.Diff(want, rc.allJobs(ctx, t), protocmp.Transform()); diff != "" {
		t.Errorf("jobs after the restore (-backed up +restored):\n%s", diff)
	}
	got := rc.download(ctx, t, grants[0].GetJobId())
	if !bytes.Equal(got, preview) {
		t.Errorf("restored preview = %q, want %q", got, preview)
	}
	again := rc.grant(ctx, t, 1)
	if len(again) != 1 || again[0].GetJobId() != want[2].GetId() {
		t.Fatalf("after the restore granted %v, want the queued job %s", again, want[2].GetId())
	}
	if tok := again[0].GetLease().GetToken(); tok <= lost || tok <= header.GetLastToken() {
		t.Errorf("token after the restore = %d, want above the backup's %d and the lost grant's %d", tok, header.GetLastToken(), lost)
	}
	// A renderer holding the lost lease is fenced off.
	_, err = rc.rend.Complete(bearer(ctx, rendererToken), &leaseholdv1.CompleteRequest{JobId: again[0].GetJobId(), Token: lost, RendererId: "r-1",
		Outcome: &leaseholdv1.CompleteRequest_Success{Success: &leaseholdv1.CompleteSuccess{Content: preview, ContentType: "image/png"}}})
	if status.Code(err) != codes.Aborted {
		t.Errorf("completion under the lost token: %v, want ABORTED", err)
	}
}

// TestRetentionRun runs the retention loop's body: it works off what is
// due in bounded steps and logs what it deleted.
func TestRetentionRun(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	clk := testclock.New(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	b := setup(t, Config{TokensFile: testPrincipals(t), Now: clk.Now, Retention: 7 * 24 * time.Hour, RejectionRetention: 30 * 24 * time.Hour, AuditRetention: 365 * 24 * time.Hour,
		purgeEvery: time.Hour})
	c := b.clients()
	const n = 300 // more than two steps' worth
	// Unsupported formats end FAILED at submission: every job is terminal.
	for i, size := range []int{1, n} {
		docs := make([]*leaseholdv1.Document, size)
		for j := range docs {
			docs[j] = &leaseholdv1.Document{Name: fmt.Sprintf("doc-%03d.docm", j), ContentType: "application/pdf", Content: []byte("macros")}
		}
		if _, err := c.jobs.SubmitBatch(bearer(ctx, alphaToken), &leaseholdv1.SubmitBatchRequest{Team: "alpha", RequestId: fmt.Sprint(i), Documents: docs}); err != nil {
			t.Fatal(err)
		}
	}
	b.c.purger.RunOnce()
	if got := len(c.allJobs(ctx, t)); got != n+1 {
		t.Fatalf("%d jobs before the retention ran out, want %d", got, n+1)
	}
	clk.Advance(7*24*time.Hour + time.Second)
	b.c.purger.RunOnce()
	if got := len(c.allJobs(ctx, t)); got != 0 {
		t.Errorf("%d jobs left after the retention ran out, want none", got)
	}
	if !strings.Contains(b.logs.String(), `msg="retention purged expired records" jobs=301 batches=2`) {
		t.Errorf("logs lack the run's summary:\n%s", b.logs)
	}
	if _, err := c.jobs.GetBatch(bearer(ctx, alphaToken), &leaseholdv1.GetBatchRequest{BatchId: "b-1"}); status.Code(err) != codes.NotFound {
		t.Errorf("GetBatch of a purged batch: %v, want NOT_FOUND", err)
	}
}

// TestBuildInfo checks the build-info gauge's labels.
func TestBuildInfo(t *testing.T) {
	t.Parallel()
	read := func() (*debug.BuildInfo, bool) {
		return &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v1.4.0"},
			Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "abc123"}, {Key: "vcs.modified", Value: "true"}}}, true
	}
	want := `
# HELP leasehold_build_info Always 1; the labels name the coordinator's build: module version, VCS revision and Go version.
# TYPE leasehold_build_info gauge
leasehold_build_info{go_version="go1.26.8",revision="abc123-modified",version="v1.4.0"} 1
`
	if err := testutil.CollectAndCompare(buildInfo(read), strings.NewReader(want)); err != nil {
		t.Error(err)
	}
}
