package faults

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/leasehold/leasehold/client"
	"github.com/leasehold/leasehold/coordinator/internal/store"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
)

// Sizes of the disk-full test: a small tmpfs, a filler file that gives its
// room back once the disk has filled, and batches of documents near the
// inline limit so that the disk fills in a few dozen submits.
const (
	tmpfsBytes  = 20 << 20
	fillerBytes = 4 << 20
	docBytes    = 200 << 10
	docsPerFill = 4
)

// TestDiskFull runs a coordinator whose data directory is on a 20 MiB
// tmpfs, with renderers working, and submits until the disk is full. The
// coordinator must fail-stop: the submit that found the disk full and
// every one after it are refused UNAVAILABLE STORAGE_FULL, and health
// turns NOT_SERVING. Once a filler file placed there at the start is
// deleted and the coordinator restarted, every acknowledged job must be
// there and succeed, none having lost an attempt to the full disk, no
// refused batch may be stored even in part, and the store must pass
// bbolt's consistency check.
//
// Mounting needs CAP_SYS_ADMIN; without it the test is skipped, unless
// the environment requires the mount (see tmpfsOrSkip).
func TestDiskFull(t *testing.T) {
	t.Parallel()
	mnt := tmpfsOrSkip(t, tmpfsBytes)
	filler := filepath.Join(mnt, "filler")
	if err := os.WriteFile(filler, make([]byte, fillerBytes), 0o600); err != nil {
		t.Fatalf("writing the filler: %v", err)
	}
	dataDir := filepath.Join(mnt, "data")
	args := []string{"--lease-ttl", "5s"}
	coord := startCoordinator(t, "127.0.0.1:0", dataDir, args...)
	renderers := make([]*renderer, 2)
	for i := range renderers {
		renderers[i] = startRenderer(t, coord.Addr, fmt.Sprintf("r%d", i), "--capacity", "4", "--latency", "200ms")
	}
	alpha := dial(t, coord.Addr, tokenAlpha)

	// Submit until the disk is full.
	acked := map[string][]string{} // batch id -> job ids
	var refusal error
	for i := 0; refusal == nil; i++ {
		if i == 10*tmpfsBytes/(docsPerFill*docBytes) {
			t.Fatalf("%d batches of %d KiB accepted on a %d MiB disk; it never filled", i, docsPerFill*docBytes>>10, tmpfsBytes>>20)
		}
		resp, err := alpha.SubmitBatch(testContext(t), "alpha", fmt.Sprintf("fill-%d", i), bulkDocs(i), nil)
		if err != nil {
			refusal = err
			break
		}
		acked[resp.GetBatch().GetId()] = resp.GetBatch().GetJobIds()
	}
	if !errors.Is(refusal, client.ErrStorageFull) || !errors.Is(refusal, client.ErrUnavailable) {
		t.Fatalf("the submit that filled the disk failed with %v, want UNAVAILABLE STORAGE_FULL", refusal)
	}
	coord.WaitFor("commit failed", "no space left on device")
	if got := procs.Health(t, coord.Addr, false); got != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("health after the disk filled = %v, want NOT_SERVING", got)
	}
	if _, err := alpha.SubmitBatch(testContext(t), "alpha", "after-full", bulkDocs(-1)[:1], nil); !errors.Is(err, client.ErrStorageFull) {
		t.Errorf("a submit after the fail-stop = %v, want UNAVAILABLE STORAGE_FULL", err)
	}
	jobs := 0
	for _, ids := range acked {
		jobs += len(ids)
	}
	// Reads go on: the renderers' leases are still held, and must survive.
	inFlight := 0
	for _, j := range teamJobs(t, alpha, "alpha") {
		if j.GetPhase() == leaseholdv1.Phase_PHASE_LEASED {
			inFlight++
		}
	}
	if inFlight == 0 {
		t.Errorf("no lease was held when the disk filled; the test proves nothing about attempts")
	}
	t.Logf("disk full after %d acknowledged batches (%d jobs, %d leased): %v", len(acked), jobs, inFlight, refusal)

	// Give the room back and restart.
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	coord.Signal(syscall.SIGTERM)
	coord.WaitGone()
	coord = startCoordinator(t, coord.Addr, dataDir, args...)
	alpha = dial(t, coord.Addr, tokenAlpha)
	requeued := 0
	for batch, ids := range acked {
		waitBatchDone(t, alpha, batch)
		for _, id := range ids {
			j := getJob(t, alpha, id)
			requeued += len(eventsOf(j, leaseholdv1.EventKind_EVENT_KIND_REQUEUED))
			lost := len(eventsOf(j, leaseholdv1.EventKind_EVENT_KIND_LEASE_EXPIRED)) + len(eventsOf(j, leaseholdv1.EventKind_EVENT_KIND_ATTEMPT_FAILED))
			if j.GetPhase() != leaseholdv1.Phase_PHASE_SUCCEEDED || j.GetAttempt() != 1 || lost > 0 {
				t.Errorf("job %s: %v on attempt %d with %d attempts lost, want SUCCEEDED on the first attempt; history:\n%s",
					id, j.GetPhase(), j.GetAttempt(), lost, history(j))
			}
		}
	}
	stored := teamJobs(t, alpha, "alpha")
	if len(stored) != jobs {
		t.Errorf("the store holds %d jobs, want the %d acknowledged and nothing of the refused batches", len(stored), jobs)
	}
	if lines := coord.LinesWith("disagrees"); len(lines) > 0 {
		t.Errorf("the restarted coordinator found its indexes and store disagreeing: %q", lines)
	}

	coord.Signal(syscall.SIGTERM)
	coord.WaitGone()
	st, err := store.Open(filepath.Join(dataDir, "leasehold.db"))
	if err != nil {
		t.Fatalf("opening the store: %v", err)
	}
	defer st.Close()
	if err := st.Check(); err != nil {
		t.Errorf("the store fails its consistency check: %v", err)
	}
	t.Logf("FIGURE disk full: %d MiB tmpfs filled after %d acknowledged batches (%d jobs, %d leased); refused UNAVAILABLE STORAGE_FULL, NOT_SERVING; after the restart all %d jobs succeeded on their first attempt (%d leases re-queued uncounted), nothing of the refused batch stored, bbolt check clean",
		tmpfsBytes>>20, len(acked), jobs, inFlight, jobs, requeued)
}

// bulkDocs returns a fill batch's documents: docsPerFill of docBytes each,
// different for every i.
func bulkDocs(i int) []*leaseholdv1.Document {
	out := make([]*leaseholdv1.Document, docsPerFill)
	for k := range out {
		content := make([]byte, docBytes)
		for b := range content {
			content[b] = byte(b*31 + k*7 + i)
		}
		out[k] = &leaseholdv1.Document{Name: fmt.Sprintf("bulk-%d-%d.txt", i, k), ContentType: "text/plain",
			Content: content, SizeBytes: int64(len(content))}
	}
	return out
}
