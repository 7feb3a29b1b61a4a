package faults

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"testing"
	"time"

	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"github.com/leasehold/leasehold/internal/s3server"
	"github.com/leasehold/leasehold/internal/stack"
)

// TestArtifactStoreOutage drains a batch through a three-node cluster
// whose previews (64 KiB, above the inline threshold) go to a real
// S3-compatible store with presigned uploads, and takes the store away
// twice in the middle: frozen with SIGSTOP (a hung store: calls hang until
// their time-outs), then killed and started again on the same directory
// (an unreachable one). Renderers keep their leases by heartbeats and
// retry; when the store is back every job completes. No preview
// acknowledged before an outage is lost, and no job's pointer names an
// object the store does not hold with its digest and size.
func TestArtifactStoreOutage(t *testing.T) {
	t.Parallel()
	const (
		jobs   = 120
		outage = 3 * time.Second // how long the store stays away each time
	)
	srv := s3server.Start(t, bins.versitygw)
	opts := options()
	opts.Nodes, opts.Env = 3, srv.Env()
	opts.Args = []string{"--artifact-store", srv.URL()}
	s := stack.Start(t, opts)
	var renderers []*renderer
	for _, id := range []string{"r1", "r2"} {
		renderers = append(renderers, startRenderer(t, s.Addrs(), id, "--capacity", "8", "--preview-bytes", "65536", "--latency", "20ms"))
	}
	alpha := s.Client(tokenAlpha)
	batch, ids := submit(t, alpha, "alpha", "outage", docs("outage", jobs))

	succeeded := func(n int) func(map[string]leaseholdv1.Phase) bool {
		return func(phases map[string]leaseholdv1.Phase) bool {
			done := 0
			for _, p := range phases {
				if p == leaseholdv1.Phase_PHASE_SUCCEEDED {
					done++
				}
			}
			return done >= n
		}
	}
	acknowledged := func() map[string]*leaseholdv1.Artifact {
		out := map[string]*leaseholdv1.Artifact{}
		for j, err := range alpha.AllJobs(testContext(t), &leaseholdv1.ListJobsRequest{BatchId: batch, PageSize: 1000}) {
			if err != nil {
				t.Fatal(err)
			}
			if j.GetPhase() == leaseholdv1.Phase_PHASE_SUCCEEDED {
				out[j.GetId()] = j.GetArtifact()
			}
		}
		return out
	}

	waitPhases(t, alpha, batch, "a third succeeded", succeeded(jobs/3))
	hungAt := acknowledged()
	srv.Pause()
	time.Sleep(outage) // the fault: a store that hangs
	srv.Resume()

	waitPhases(t, alpha, batch, "two thirds succeeded", succeeded(2*jobs/3))
	goneAt := acknowledged()
	srv.Kill()
	time.Sleep(outage) // the fault: a store that is gone
	srv.Restart()

	waitPhases(t, alpha, batch, "every job succeeded", succeeded(jobs))
	final := acknowledged()
	if len(final) != jobs {
		t.Fatalf("%d of %d jobs succeeded", len(final), jobs)
	}
	for _, before := range []map[string]*leaseholdv1.Artifact{hungAt, goneAt} {
		for id, a := range before {
			if got := final[id]; got.GetDigest() != a.GetDigest() || got.GetToken() != a.GetToken() {
				t.Errorf("job %s: pointer %s under token %d after the outages, %s under token %d when acknowledged before",
					id, got.GetDigest(), got.GetToken(), a.GetDigest(), a.GetToken())
			}
		}
	}
	for _, id := range ids {
		a := final[id]
		b, err := os.ReadFile(filepath.Join(srv.Root, s3server.Bucket, "alpha", "sha256", a.GetDigest()))
		if sum := sha256.Sum256(b); err != nil || hex.EncodeToString(sum[:]) != a.GetDigest() || int64(len(b)) != a.GetSizeBytes() {
			t.Errorf("job %s points to %s of %d bytes; the store holds %d bytes hashing to %x (%v)", id, a.GetDigest(), a.GetSizeBytes(), len(b), sum, err)
		}
	}
	// Through the coordinators: the bytes stream from the store and hash
	// to the pointer.
	var buf bytes.Buffer
	for _, id := range []string{ids[0], ids[jobs/2], ids[jobs-1]} {
		buf.Reset()
		if _, err := alpha.DownloadArtifact(testContext(t), id, &buf); err != nil || buf.Len() != 65536 {
			t.Errorf("downloading the preview of %s: %d bytes, %v", id, buf.Len(), err)
		}
	}
	var waited int
	for _, r := range renderers {
		waited += len(r.LinesWith("the coordinator's artifact store is unavailable; keeping the lease")) +
			len(r.LinesWith("upload failed, retrying"))
	}
	if waited == 0 {
		t.Errorf("no renderer met the outages (no completion or upload retried): the faults missed the drain")
	}
	degraded := 0
	for _, n := range s.Coordinators {
		degraded += len(n.LinesWith("the artifact store is degraded"))
	}
	t.Logf("FIGURE artifact store outage: %d jobs of 64 KiB through a cluster of 3 and versitygw, frozen %v at %d succeeded and killed %v at %d; "+
		"%d retries by renderers, %d degraded reports by coordinators; every job succeeded, every pointer's object present",
		jobs, outage, len(hungAt), outage, len(goneAt), waited, degraded)
}
