package client_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/leasehold/leasehold/client"
	"github.com/leasehold/leasehold/client/internal/fakeserver"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

type testBundle struct {
	fake   *fakeserver.Server
	client *client.Client
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	fake := fakeserver.New()
	dialOpt := fakeserver.Start(t, fake)
	c, err := client.Dial(fakeserver.Target, client.WithToken("s3cret"), client.WithDialOptions(dialOpt))
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return &testBundle{fake: fake, client: c}
}

func TestDialSendsBearerToken(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if _, err := b.client.GetBatch(t.Context(), "b-none"); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("GetBatch error = %v, want ErrNotFound", err)
	}
	if diff := cmp.Diff([]string{"Bearer s3cret"}, b.fake.AuthHeaders()); diff != "" {
		t.Errorf("authorization headers mismatch (-want +got):\n%s", diff)
	}
}

func TestSubmitFiles(t *testing.T) {
	t.Parallel()
	b := setup(t)
	dir := t.TempDir()
	small := filepath.Join(dir, "a.pdf")
	big := filepath.Join(dir, "big.docx")
	if err := os.WriteFile(small, []byte("%PDF-1.7"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(big, bytes.Repeat([]byte("x"), client.InlineLimit+1), 0o600); err != nil {
		t.Fatal(err)
	}

	resps, err := b.client.SubmitFiles(t.Context(), "team-a", "req-1", []string{small, big}, client.SubmitOptions{})
	if err != nil {
		t.Fatalf("SubmitFiles: %v", err)
	}
	if len(resps) != 1 {
		t.Fatalf("got %d responses, want 1", len(resps))
	}
	if got, want := resps[0].GetBatch().GetJobCount(), uint32(2); got != want {
		t.Errorf("job count = %d, want %d", got, want)
	}
	want := []*leaseholdv1.SubmitBatchRequest{{
		Team:      "team-a",
		RequestId: "req-1-0",
		Documents: []*leaseholdv1.Document{
			{Name: "a.pdf", ContentType: "application/pdf", SizeBytes: 8, Content: []byte("%PDF-1.7")},
			{Name: "big.docx", ContentType: "application/vnd.openxmlformats-officedocument.wordprocessingml.document", SizeBytes: client.InlineLimit + 1, SourceUri: "file://" + filepath.ToSlash(big)},
		},
	}}
	if diff := cmp.Diff(want, b.fake.Submits(), protocmp.Transform()); diff != "" {
		t.Errorf("submitted requests mismatch (-want +got):\n%s", diff)
	}
}

func TestContentType(t *testing.T) {
	t.Parallel()
	for path, want := range map[string]string{
		"x/report.PDF": "application/pdf",
		"notes.txt":    "text/plain",
		"scan.xyz":     ".xyz",
		"README":       "application/octet-stream",
	} {
		if got := client.ContentType(path); got != want {
			t.Errorf("ContentType(%q) = %q, want %q", path, got, want)
		}
	}
}

func TestAllJobsFollowsPages(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.fake.MaxPageSize = 2
	var want []string
	for _, id := range []string{"j-1", "j-2", "j-3", "j-4", "j-5"} {
		b.fake.AddJob(&leaseholdv1.Job{Id: id, BatchId: "b-1", Team: "a", Phase: leaseholdv1.Phase_PHASE_QUEUED})
		want = append(want, id)
	}
	b.fake.AddJob(&leaseholdv1.Job{Id: "j-9", BatchId: "b-2", Team: "a"})

	var got []string
	for j, err := range b.client.AllJobs(t.Context(), &leaseholdv1.ListJobsRequest{BatchId: "b-1"}) {
		if err != nil {
			t.Fatalf("AllJobs: %v", err)
		}
		got = append(got, j.GetId())
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("job ids mismatch (-want +got):\n%s", diff)
	}

	t.Run("breaking out stops early", func(t *testing.T) {
		n := 0
		for range b.client.AllJobs(t.Context(), nil) {
			n++
			if n == 3 {
				break
			}
		}
		if n != 3 {
			t.Errorf("iterated %d jobs, want 3", n)
		}
	})
}

func TestDownloadArtifact(t *testing.T) {
	t.Parallel()
	payload := bytes.Repeat([]byte("png!"), 3000) // several chunks
	sum := sha256.Sum256(payload)
	digest := hex.EncodeToString(sum[:])

	t.Run("matching bytes are written and the metadata returned", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.fake.SetArtifact("j-1", fakeserver.Artifact{Meta: &leaseholdv1.Artifact{Digest: digest, SizeBytes: int64(len(payload))}, Bytes: payload})
		var buf bytes.Buffer
		art, err := b.client.DownloadArtifact(t.Context(), "j-1", &buf)
		if err != nil {
			t.Fatalf("DownloadArtifact: %v", err)
		}
		if got := art.GetDigest(); got != digest {
			t.Errorf("digest = %s, want %s", got, digest)
		}
		if !bytes.Equal(buf.Bytes(), payload) {
			t.Errorf("downloaded %d bytes that differ from the %d stored", buf.Len(), len(payload))
		}
	})

	t.Run("bytes that do not match the digest are an error", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		tampered := bytes.Clone(payload)
		tampered[100] ^= 1
		b.fake.SetArtifact("j-1", fakeserver.Artifact{Meta: &leaseholdv1.Artifact{Digest: digest, SizeBytes: int64(len(payload))}, Bytes: tampered})
		_, err := b.client.DownloadArtifact(t.Context(), "j-1", &bytes.Buffer{})
		if !errors.Is(err, client.ErrDigestMismatch) {
			t.Fatalf("DownloadArtifact error = %v, want ErrDigestMismatch", err)
		}
	})

	t.Run("a missing artifact is ErrNotFound with its reason", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		_, err := b.client.DownloadArtifact(t.Context(), "j-1", &bytes.Buffer{})
		if !errors.Is(err, client.ErrNotFound) || client.Reason(err) != "ARTIFACT_NOT_FOUND" {
			t.Fatalf("DownloadArtifact error = %v (reason %q), want ErrNotFound ARTIFACT_NOT_FOUND", err, client.Reason(err))
		}
	})
}

func TestWatchBatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	docs := []*leaseholdv1.Document{{Name: "ok.pdf", Content: []byte("x")}, {Name: "fail.pdf", Content: []byte("y")}}
	resp, err := b.client.SubmitBatch(t.Context(), "a", "r", docs, nil)
	if err != nil {
		t.Fatalf("SubmitBatch: %v", err)
	}
	var lines []string
	err = b.client.WatchBatch(t.Context(), resp.GetBatch().GetId(), func(m *leaseholdv1.WatchBatchResponse) error {
		lines = append(lines, m.GetJobId()+" "+strings.TrimPrefix(m.GetPhase().String(), "PHASE_"))
		return nil
	})
	if err != nil {
		t.Fatalf("WatchBatch: %v", err)
	}
	want := []string{"j-1 QUEUED", "j-2 QUEUED", "j-1 SUCCEEDED", "j-2 FAILED"}
	if diff := cmp.Diff(want, lines); diff != "" {
		t.Errorf("watch messages mismatch (-want +got):\n%s", diff)
	}

	t.Run("a callback error ends the watch with that error", func(t *testing.T) {
		stop := errors.New("stop")
		if err := b.client.WatchBatch(t.Context(), resp.GetBatch().GetId(), func(*leaseholdv1.WatchBatchResponse) error { return stop }); !errors.Is(err, stop) {
			t.Errorf("WatchBatch error = %v, want %v", err, stop)
		}
	})
}
