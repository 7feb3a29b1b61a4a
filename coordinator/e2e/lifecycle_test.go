package e2e

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/encoding/protojson"

	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
)

// TestLifecycle submits 200 documents from two teams in several batches
// with the CLI, renders them with two renderer processes, and checks that
// every job succeeds, that downloaded previews match their digests, and
// that the API is reachable with grpcurl as the README shows.
func TestLifecycle(t *testing.T) {
	t.Parallel()
	coord := startCoordinator(t, "--lease-ttl", "5s")
	startRenderer(t, coord.Addr, "r1", "--capacity", "8")
	startRenderer(t, coord.Addr, "r2", "--capacity", "8")

	type submission struct {
		team, token string
		dir         string
	}
	var subs []submission
	for i, n := range []int{50, 40, 30} {
		subs = append(subs, submission{"alpha", tokenAlpha, writeDocs(t, fmt.Sprintf("alpha%d", i), ".pdf", n)})
	}
	for i, n := range []int{45, 35} {
		subs = append(subs, submission{"beta", tokenBeta, writeDocs(t, fmt.Sprintf("beta%d", i), ".txt", n)})
	}

	t.Run("every submitted document succeeds", func(t *testing.T) {
		results := make([]cliResult, len(subs))
		errs := make([]error, len(subs))
		var wg sync.WaitGroup
		for i, s := range subs {
			wg.Go(func() {
				results[i], errs[i] = execTool(bins.cli, []string{"LEASEHOLD_ADDR=" + coord.Addr, "LEASEHOLD_TOKEN=" + s.token},
					"submit", "--team", s.team, "--wait", s.dir+string(filepath.Separator))
			})
		}
		wg.Wait()
		for i, r := range results {
			if errs[i] != nil {
				t.Fatal(errs[i])
			}
			if r.code != 0 {
				t.Errorf("submit --team %s --wait %s: exit %d, want 0\nstdout:\n%s\nstderr:\n%s", subs[i].team, subs[i].dir, r.code, r.stdout, r.stderr)
			}
		}

		for team, want := range map[string]int{"alpha": 120, "beta": 80} {
			c := dial(t, coord.Addr, "dev-"+team)
			got := map[leaseholdv1.Phase]int{}
			for j, err := range c.AllJobs(testContext(t), &leaseholdv1.ListJobsRequest{Team: team, OmitEvents: true}) {
				if err != nil {
					t.Fatalf("listing %s's jobs: %v", team, err)
				}
				got[j.GetPhase()]++
			}
			if diff := cmp.Diff(map[leaseholdv1.Phase]int{leaseholdv1.Phase_PHASE_SUCCEEDED: want}, got); diff != "" {
				t.Errorf("phases of %s's jobs (-want +got):\n%s", team, diff)
			}
		}
	})

	t.Run("downloaded previews hash to their digests", func(t *testing.T) {
		c := dial(t, coord.Addr, tokenAlpha)
		resp, err := c.ListJobs(testContext(t), &leaseholdv1.ListJobsRequest{Team: "alpha", PageSize: 5})
		if err != nil {
			t.Fatalf("ListJobs: %v", err)
		}
		if len(resp.GetJobs()) != 5 {
			t.Fatalf("ListJobs returned %d jobs, want 5", len(resp.GetJobs()))
		}
		dir := t.TempDir()
		for _, j := range resp.GetJobs() {
			file := filepath.Join(dir, j.GetId()+".png")
			if r := runCLI(t, coord.Addr, tokenAlpha, "artifact", j.GetId(), "-f", file); r.code != 0 {
				t.Fatalf("artifact %s: exit %d\n%s%s", j.GetId(), r.code, r.stdout, r.stderr)
			}
			b, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			sum := sha256.Sum256(b)
			if got, want := hex.EncodeToString(sum[:]), j.GetArtifact().GetDigest(); got != want {
				t.Errorf("SHA-256 of job %s's downloaded preview = %s, want the artifact digest %s", j.GetId(), got, want)
			}
		}
	})

	t.Run("grpcurl lists the services", func(t *testing.T) {
		r := runTool(t, bins.grpcurl, nil, "-plaintext", coord.Addr, "list")
		if r.code != 0 {
			t.Fatalf("grpcurl list: exit %d\n%s", r.code, r.stderr)
		}
		got := strings.Fields(r.stdout)
		for _, want := range []string{
			"leasehold.v1.JobService", "leasehold.v1.RendererService", "leasehold.v1.OperatorService",
			"grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection",
		} {
			if !slices.Contains(got, want) {
				t.Errorf("grpcurl list = %q, want it to include %s", got, want)
			}
		}
	})

	t.Run("grpcurl submits a batch and gets its job", func(t *testing.T) {
		auth := "authorization: Bearer " + tokenAlpha
		r := runTool(t, bins.grpcurl, nil, "-plaintext", "-H", auth,
			"-d", `{"team": "alpha", "request_id": "grpcurl-1", "documents": [{"name": "hello.txt", "content_type": "text/plain", "content": "aGVsbG8K"}]}`,
			coord.Addr, "leasehold.v1.JobService/SubmitBatch")
		if r.code != 0 {
			t.Fatalf("grpcurl SubmitBatch: exit %d\n%s", r.code, r.stderr)
		}
		var submitted leaseholdv1.SubmitBatchResponse
		if err := protojson.Unmarshal([]byte(r.stdout), &submitted); err != nil {
			t.Fatalf("decoding SubmitBatch output %q: %v", r.stdout, err)
		}
		if got := len(submitted.GetBatch().GetJobIds()); got != 1 {
			t.Fatalf("SubmitBatch returned %d job ids, want 1", got)
		}
		waitBatchDone(t, dial(t, coord.Addr, tokenAlpha), submitted.GetBatch().GetId())

		jobID := submitted.GetBatch().GetJobIds()[0]
		r = runTool(t, bins.grpcurl, nil, "-plaintext", "-H", auth,
			"-d", fmt.Sprintf(`{"job_id": %q}`, jobID), coord.Addr, "leasehold.v1.JobService/GetJob")
		if r.code != 0 {
			t.Fatalf("grpcurl GetJob: exit %d\n%s", r.code, r.stderr)
		}
		var got leaseholdv1.GetJobResponse
		if err := protojson.Unmarshal([]byte(r.stdout), &got); err != nil {
			t.Fatalf("decoding GetJob output %q: %v", r.stdout, err)
		}
		if got.GetJob().GetId() != jobID || got.GetJob().GetPhase() != leaseholdv1.Phase_PHASE_SUCCEEDED {
			t.Errorf("GetJob = job %s in %v, want job %s in PHASE_SUCCEEDED", got.GetJob().GetId(), got.GetJob().GetPhase(), jobID)
		}
		if got.GetJob().GetDocument().GetName() != "hello.txt" {
			t.Errorf("GetJob document name = %q, want hello.txt", got.GetJob().GetDocument().GetName())
		}
	})
}
