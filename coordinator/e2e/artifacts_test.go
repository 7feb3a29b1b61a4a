package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/leasehold/leasehold/client/reason"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"github.com/leasehold/leasehold/internal/s3server"
	"github.com/leasehold/leasehold/internal/stack"
)

// The late worker with an artifact store: the seed's verification, once
// with the directory store beside the data file and once with a real
// S3-compatible server taking presigned uploads.
//
// Renderer A leases the job and begins to upload its preview, then stalls
// (as a process frozen mid-upload does) until its lease has expired and
// renderer B has leased the job again, uploaded its own preview and
// completed. A then finishes its upload and completes. The job's pointer,
// the bytes `leasehold artifact` downloads and their digest are B's; A's
// completion is refused ABORTED (its lease expired); A's bytes reached the store
// but no pointer names them, and the sweep deletes them while it leaves
// B's. B's completion replayed changes nothing: one terminal transition,
// one pointer, counted once (`coordinator check`).
func TestLateWorkerArtifact(t *testing.T) {
	t.Parallel()

	t.Run("DirectoryStore", func(t *testing.T) {
		t.Parallel()
		coord := startCoordinator(t, lateWorkerFlags...)
		objects := filepath.Join(coord.DataDir, "artifact-store", "alpha", "sha256")
		lw := newLateWorker(t, coord)
		lw.run(t, func(t *testing.T, r rawRenderer, g *leaseholdv1.Grant, content []byte) func(*testing.T) {
			up := r.beginUpload(t, g)
			return func(t *testing.T) { up.finish(t, content) }
		}, func(t *testing.T, r rawRenderer, g *leaseholdv1.Grant, content []byte) *leaseholdv1.CompleteSuccess {
			up := r.beginUpload(t, g)
			up.finish(t, content)
			return &leaseholdv1.CompleteSuccess{ArtifactDigest: digestOf(content)}
		}, func(content []byte) string { return filepath.Join(objects, digestOf(content)) })
		lw.sweep(t, nil)
	})

	t.Run("S3CompatibleStore", func(t *testing.T) {
		t.Parallel()
		srv := s3server.Start(t, bins.versitygw)
		opts := options()
		opts.Args = append([]string{"--artifact-store", srv.URL()}, lateWorkerFlags...)
		opts.Env = srv.Env()
		coord := &coordinator{stack: stack.Start(t, opts)}
		coord.Node = coord.stack.Coordinators[0]
		objects := filepath.Join(srv.Root, s3server.Bucket, "alpha", "sha256")
		lw := newLateWorker(t, coord)
		lw.run(t, func(t *testing.T, r rawRenderer, g *leaseholdv1.Grant, content []byte) func(*testing.T) {
			put := r.prepareUpload(t, g, content)
			return func(t *testing.T) { put.send(t, content) }
		}, func(t *testing.T, r rawRenderer, g *leaseholdv1.Grant, content []byte) *leaseholdv1.CompleteSuccess {
			r.prepareUpload(t, g, content).send(t, content)
			return &leaseholdv1.CompleteSuccess{ArtifactDigest: digestOf(content), SizeBytes: int64(len(content)), ContentType: "image/png"}
		}, func(content []byte) string { return filepath.Join(objects, digestOf(content)) })
		t.Run("LeaseholdArtifactPresignedDownloadsBsBytesFromTheStore", func(t *testing.T) { lw.checkDownload(t, "--presign") })
		t.Run("TheCLIChecksTheDigestOfBytesTheStoreChanged", func(t *testing.T) {
			path := lw.objectPath(lw.previewB)
			tampered := bytes.Clone(lw.previewB)
			tampered[len(tampered)-1] ^= 1
			if err := os.WriteFile(path, tampered, 0o644); err != nil {
				t.Fatal(err)
			}
			defer func() {
				if err := os.WriteFile(path, lw.previewB, 0o644); err != nil {
					t.Fatal(err)
				}
			}()
			for _, args := range [][]string{nil, {"--presign"}} {
				out := filepath.Join(t.TempDir(), "preview.png")
				res := runCLI(t, lw.coord.Addr, tokenAlpha, append([]string{"artifact", lw.jobID, "-f", out}, args...)...)
				if _, err := os.Stat(out); res.code == 0 || !strings.Contains(res.stderr, "hash to") || err == nil {
					t.Errorf("leasehold artifact %v of changed bytes: exit %d, %q, file %v; want a refusal naming the digest and no file", args, res.code, res.stderr, err)
				}
			}
		})
		t.Run("AStaleLeaseGetsNoUploadURL", func(t *testing.T) {
			_, err := lw.a.rc.PrepareUpload(testContext(t), &leaseholdv1.PrepareUploadRequest{JobId: lw.jobID, Token: lw.tokenA,
				RendererId: lw.a.id, Sha256: digestOf(lw.previewA), SizeBytes: int64(len(lw.previewA))})
			if status.Code(err) != codes.Aborted {
				t.Errorf("PrepareUpload under A's stale lease: %v, want ABORTED", err)
			}
		})
		lw.sweep(t, srv.Env(), "--artifact-store", srv.URL())
	})
}

// lateWorkerFlags are the coordinator's flags of the late-worker test: a
// short lease and retry backoff, so that A's lease expires and the job is
// leased again within a second or two.
var lateWorkerFlags = []string{"--lease-ttl", "1s", "--backoff-base", "50ms", "--backoff-cap", "100ms"}

// lateWorker is the late-worker scenario against one coordinator.
type lateWorker struct {
	coord              *coordinator
	a, b               rawRenderer
	jobID              string
	tokenA, tokenB     uint64
	previewA, previewB []byte
	// objectPath is where the store keeps a preview's bytes.
	objectPath func([]byte) string
}

func newLateWorker(t *testing.T, coord *coordinator) *lateWorker {
	t.Helper()
	rc := dialRenderer(t, coord.Addr)
	return &lateWorker{coord: coord, a: rawRenderer{id: "renderer-a", rc: rc}, b: rawRenderer{id: "renderer-b", rc: rc},
		// Previews of a realistic size, above the inline threshold: they
		// go to the store. A's and B's renders differ, as renders under
		// two leases do.
		previewA: pngOfSize("A", 48<<10), previewB: pngOfSize("B", 48<<10)}
}

// run plays the scenario: stall begins A's upload and returns what
// finishes it; upload makes B's upload and returns B's success.
func (lw *lateWorker) run(t *testing.T,
	stall func(*testing.T, rawRenderer, *leaseholdv1.Grant, []byte) func(*testing.T),
	upload func(*testing.T, rawRenderer, *leaseholdv1.Grant, []byte) *leaseholdv1.CompleteSuccess,
	objectPath func([]byte) string) {
	t.Helper()
	lw.objectPath = objectPath
	ctx := testContext(t)
	alpha := dial(t, lw.coord.Addr, tokenAlpha)
	sub, err := alpha.SubmitBatch(ctx, "alpha", "late-worker", []*leaseholdv1.Document{doc("report.pdf", "%PDF the report")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	lw.jobID = sub.GetBatch().GetJobIds()[0]

	ga := lw.a.acquire(t)
	lw.tokenA = ga.GetLease().GetToken()
	finishA := stall(t, lw.a, ga, lw.previewA)
	// A stalls; its lease expires and the job is granted again, to B.
	gb := lw.b.acquire(t)
	lw.tokenB = gb.GetLease().GetToken()
	if gb.GetJobId() != lw.jobID || lw.tokenB <= lw.tokenA {
		t.Fatalf("B was granted %s under token %d, want %s under a token above A's %d", gb.GetJobId(), lw.tokenB, lw.jobID, lw.tokenA)
	}
	successB := upload(t, lw.b, gb, lw.previewB)
	if _, err := lw.b.complete(t, gb, successB); err != nil {
		t.Fatalf("B's completion: %v", err)
	}
	// A wakes up: its bytes reach the store, its completion is fenced off.
	finishA(t)
	_, err = lw.a.complete(t, ga, &leaseholdv1.CompleteSuccess{ArtifactDigest: digestOf(lw.previewA),
		SizeBytes: int64(len(lw.previewA)), ContentType: "image/png"})
	if r := reasonOf(err); status.Code(err) != codes.Aborted || (r != reason.LeaseExpired.String() && r != reason.StaleLease.String()) {
		t.Fatalf("A's late completion: %v, want ABORTED LEASE_EXPIRED or STALE_LEASE", err)
	}

	t.Run("TheJobsPointerIsBs", func(t *testing.T) {
		j, err := alpha.GetJob(testContext(t), lw.jobID)
		if err != nil {
			t.Fatal(err)
		}
		art := j.GetArtifact()
		if j.GetPhase() != leaseholdv1.Phase_PHASE_SUCCEEDED || art.GetDigest() != digestOf(lw.previewB) ||
			art.GetToken() != lw.tokenB || art.GetRendererId() != lw.b.id || art.GetSizeBytes() != int64(len(lw.previewB)) {
			t.Errorf("job = %v with artifact %v; want SUCCEEDED with B's digest %s, token %d, renderer %s",
				j.GetPhase(), art, digestOf(lw.previewB), lw.tokenB, lw.b.id)
		}
	})
	t.Run("LeaseholdArtifactDownloadsBsBytes", func(t *testing.T) { lw.checkDownload(t) })
	t.Run("AsBytesAreAnOrphanInTheStore", func(t *testing.T) {
		for _, c := range []struct {
			who     string
			content []byte
		}{{"A", lw.previewA}, {"B", lw.previewB}} {
			if got, err := os.ReadFile(lw.objectPath(c.content)); err != nil || !bytes.Equal(got, c.content) {
				t.Errorf("%s's object in the store: %d bytes, %v; want its %d bytes", c.who, len(got), err, len(c.content))
			}
		}
	})
	t.Run("BsCompletionReplayedChangesNothing", func(t *testing.T) {
		resp, err := lw.b.complete(t, gb, successB)
		if err != nil || !resp.GetReplayed() {
			t.Fatalf("B's completion again = replayed %v, %v; want replayed", resp.GetReplayed(), err)
		}
		j, err := alpha.GetJob(testContext(t), lw.jobID)
		if err != nil {
			t.Fatal(err)
		}
		var succeeded []uint64
		for _, ev := range j.GetEvents() {
			if ev.GetKind() == leaseholdv1.EventKind_EVENT_KIND_SUCCEEDED {
				succeeded = append(succeeded, ev.GetToken())
			}
		}
		if len(succeeded) != 1 || succeeded[0] != lw.tokenB || j.GetArtifact().GetDigest() != digestOf(lw.previewB) {
			t.Errorf("SUCCEEDED events under tokens %v, pointer %s; want one, under B's token %d, pointer B's", succeeded, j.GetArtifact().GetDigest(), lw.tokenB)
		}
	})
}

// checkDownload runs `leasehold artifact` with args and checks that it
// writes B's bytes and names their digest.
func (lw *lateWorker) checkDownload(t *testing.T, args ...string) {
	t.Helper()
	out := filepath.Join(t.TempDir(), "preview.png")
	res := runCLI(t, lw.coord.Addr, tokenAlpha, append([]string{"artifact", lw.jobID, "-f", out}, args...)...)
	if res.code != 0 {
		t.Fatalf("leasehold artifact: exit %d: %s", res.code, res.stderr)
	}
	got, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, lw.previewB) || digestOf(got) != digestOf(lw.previewB) || !strings.Contains(res.stdout, digestOf(lw.previewB)) {
		t.Errorf("leasehold artifact wrote %d bytes of digest %s and said %q; want B's %d bytes, digest %s",
			len(got), digestOf(got), res.stdout, len(lw.previewB), digestOf(lw.previewB))
	}
}

// sweep restarts the coordinator with a sweep that runs at once and
// counts every unreferenced object an orphan (args are its store's
// flags, env its environment): A's object goes, B's stays and still downloads; then, with the
// coordinator stopped, `coordinator check` finds the one pointer counted
// once and its object present.
func (lw *lateWorker) sweep(t *testing.T, env []string, args ...string) {
	t.Helper()
	lw.coord.stack.RestartWith(0, append(args, "--artifact-sweep-grace", "1ms", "--artifact-sweep-interval", "100ms")...)
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if _, err := lw.coord.Proc.WaitLine(ctx, 0, []string{"artifact sweep deleted unreferenced objects", "objects=1"}); err != nil {
		t.Fatalf("no sweep deleted A's object: %v", err)
	}
	if _, err := os.Stat(lw.objectPath(lw.previewA)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("A's orphan after the sweep: %v, want it deleted", err)
	}
	if _, err := os.Stat(lw.objectPath(lw.previewB)); err != nil {
		t.Errorf("B's object after the sweep: %v, want it kept", err)
	}
	lw.checkDownload(t)

	lw.coord.Proc.Stop(waitTimeout)
	res := runTool(t, bins.coordinator, env, append([]string{"check", "--data-dir", lw.coord.DataDir, "--json"}, args...)...)
	var rep struct {
		Problems       []string `json:"problems"`
		StoredPointers int      `json:"stored_pointers"`
		Objects        int      `json:"objects"`
		MissingObjects []any    `json:"missing_objects"`
	}
	if err := json.Unmarshal([]byte(res.stdout), &rep); err != nil || res.code != 0 || len(rep.Problems) != 0 ||
		rep.StoredPointers != 1 || rep.Objects != 1 || len(rep.MissingObjects) != 0 {
		t.Errorf("coordinator check: exit %d (%v)\n%s%s\nwant it clean, with one stored pointer, one object and none missing", res.code, err, res.stdout, res.stderr)
	}
}

// rawRenderer is a renderer the test drives call by call over the raw
// RendererService, so that it can stall exactly where the scenario says.
type rawRenderer struct {
	id string
	rc leaseholdv1.RendererServiceClient
}

// acquire long-polls for one lease.
func (r rawRenderer) acquire(t *testing.T) *leaseholdv1.Grant {
	t.Helper()
	resp, err := r.rc.Acquire(testContext(t), &leaseholdv1.AcquireRequest{RendererId: r.id, MaxLeases: 1, Wait: durationpb.New(30 * time.Second)})
	if err != nil || len(resp.GetLeases()) != 1 {
		t.Fatalf("%s's Acquire = %d leases, %v; want one", r.id, len(resp.GetLeases()), err)
	}
	return resp.GetLeases()[0]
}

// complete completes g with success, unary.
func (r rawRenderer) complete(t *testing.T, g *leaseholdv1.Grant, success *leaseholdv1.CompleteSuccess) (*leaseholdv1.CompleteResponse, error) {
	t.Helper()
	return r.rc.Complete(testContext(t), &leaseholdv1.CompleteRequest{JobId: g.GetJobId(), Token: g.GetLease().GetToken(), RendererId: r.id,
		Outcome: &leaseholdv1.CompleteRequest_Success{Success: success}})
}

// pendingUpload is an UploadArtifact call whose metadata is sent.
type pendingUpload struct {
	stream leaseholdv1.RendererService_UploadArtifactClient
}

// beginUpload starts an upload under g: its metadata, checked against the
// lease while the lease lives.
func (r rawRenderer) beginUpload(t *testing.T, g *leaseholdv1.Grant) pendingUpload {
	t.Helper()
	stream, err := r.rc.UploadArtifact(testContext(t))
	if err != nil {
		t.Fatal(err)
	}
	err = stream.Send(&leaseholdv1.UploadArtifactRequest{Part: &leaseholdv1.UploadArtifactRequest_Metadata{Metadata: &leaseholdv1.ArtifactMetadata{
		JobId: g.GetJobId(), Token: g.GetLease().GetToken(), RendererId: r.id, ContentType: "image/png"}}})
	if err != nil {
		t.Fatal(err)
	}
	return pendingUpload{stream: stream}
}

// finish sends content and ends the upload; the answer is what the writer
// made of it (A's is refused: its lease is gone).
func (u pendingUpload) finish(t *testing.T, content []byte) {
	t.Helper()
	if err := u.stream.Send(&leaseholdv1.UploadArtifactRequest{Part: &leaseholdv1.UploadArtifactRequest_Chunk{Chunk: content}}); err != nil {
		t.Fatal(err)
	}
	if _, err := u.stream.CloseAndRecv(); err != nil && status.Code(err) != codes.Aborted {
		t.Fatalf("upload: %v, want success or ABORTED", err)
	}
}

// presignedPut is a presigned upload URL.
type presignedPut struct {
	resp *leaseholdv1.PrepareUploadResponse
}

// prepareUpload asks for a presigned upload of content under g.
func (r rawRenderer) prepareUpload(t *testing.T, g *leaseholdv1.Grant, content []byte) presignedPut {
	t.Helper()
	resp, err := r.rc.PrepareUpload(testContext(t), &leaseholdv1.PrepareUploadRequest{JobId: g.GetJobId(), Token: g.GetLease().GetToken(),
		RendererId: r.id, Sha256: digestOf(content), SizeBytes: int64(len(content))})
	if err != nil {
		t.Fatalf("PrepareUpload: %v", err)
	}
	return presignedPut{resp: resp}
}

// send stores content with the URL, straight in the store.
func (p presignedPut) send(t *testing.T, content []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(testContext(t), p.resp.GetMethod(), p.resp.GetUrl(), bytes.NewReader(content))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range p.resp.GetHeaders() {
		req.Header.Set(k, v)
	}
	req.ContentLength = int64(len(content))
	resp, err := (&http.Client{Transport: &http.Transport{DisableKeepAlives: true}}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		t.Fatalf("presigned PUT: %s", resp.Status)
	}
}

// digestOf is the lower-case hex SHA-256 of b.
func digestOf(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// pngOfSize returns n bytes that start like a PNG and differ by who.
func pngOfSize(who string, n int) []byte {
	b := append([]byte("\x89PNG\r\n\x1a\n"), bytes.Repeat(fmt.Appendf(nil, "preview by %s ", who), n)...)
	return b[:n]
}
