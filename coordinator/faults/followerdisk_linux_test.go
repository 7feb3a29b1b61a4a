package faults

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/metadata"

	"github.com/leasehold/leasehold/client"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"github.com/leasehold/leasehold/internal/testbin"
)

// requireTmpfsEnv, when set (as CI sets it, running as root), turns the
// skip of a test that cannot mount its tmpfs into a failure.
const requireTmpfsEnv = "LEASEHOLD_REQUIRE_NAMESPACES"

// tmpfsOrSkip mounts a tmpfs of size bytes (mountTmpfs), or skips the
// test when this process may not mount one, unless requireTmpfsEnv is set.
func tmpfsOrSkip(t *testing.T, size int) string {
	t.Helper()
	dir, err := mountTmpfs(t, size)
	if err != nil {
		if os.Getenv(requireTmpfsEnv) != "" {
			t.Fatalf("%v (and %s is set)", err, requireTmpfsEnv)
		}
		t.Skipf("%v: mounting needs root or CAP_SYS_ADMIN; run as root to test a full disk", err)
	}
	return dir
}

// walSegmentBytes is the size of a raft-wal log segment, which the WAL
// allocates whole when it opens one: a node's log needs no more room
// until its segment is full, and then 64 MiB at once.
const walSegmentBytes = 64 << 20

// TestFollowerDiskFull fills the disk of one follower of three, with
// renderers working. The follower must stop by itself, exit status 3 with
// one line saying why (no panic), while the other two go on: every submit
// is acknowledged, before and after, and every job succeeds. Once the
// tmpfs is grown and the follower restarted on the same directory it
// catches up: when all three are stopped they have applied the same
// index, their stores have the same digest, and "coordinator check"
// passes on the follower's.
//
// What fills first depends on the room left. On one volume for the store
// and the raft log, as a pod has, a store that grows usually fills it
// before the log's segment, which is allocated in advance, is full: the
// store then cannot apply an entry. Usually, not always: a follower's
// store applies behind its log, and on a loaded machine it was seen a
// whole segment behind, so that the log's next segment found the disk
// full first. Each case therefore puts one of the two alone on the small
// tmpfs and the other on a roomy one, so that the part under test is the
// one that fills. The first puts the store (the data directory) on the
// small tmpfs and the raft log on a roomy one mounted inside it; the
// second the raft log alone on the small one, which needs a segment's
// worth of documents (64 MiB), about 10 s here.
//
// Mounting needs CAP_SYS_ADMIN; without it the test is skipped, or fails
// where LEASEHOLD_REQUIRE_NAMESPACES is set (CI, as root).
func TestFollowerDiskFull(t *testing.T) {
	t.Parallel()
	cases := []fullFollower{
		{"TheStoreCannotApply", 16 << 20, false, "replica: applying entries"},
		// The log alone on a tmpfs with room for its first segment: the
		// store, on a disk of its own, does not fill first (each document
		// is in the store with its artifact, which takes about twice the
		// room it takes in the log).
		{"TheLogCannotAppend", walSegmentBytes + 4<<20, true, "to the raft log: segment is sealed: the log's next segment could not be made"},
	}
	runConcurrently(t, cases, func(c fullFollower) string { return c.name }, func(t *testing.T, c fullFollower) {
		testFollowerDiskFull(t, c)
	})
}

// fullFollower is a case of TestFollowerDiskFull.
type fullFollower struct {
	name string
	// size is the tmpfs's.
	size int
	// logOnly puts only the raft log (raft/ of the data directory) on
	// it, the store on a roomy one; otherwise the data directory is on
	// it with the raft log on a roomy one.
	logOnly bool
	// cause is in the error of the line the follower stops with.
	cause string
}

func testFollowerDiskFull(t *testing.T, c fullFollower) {
	tmpfsSize := c.size
	// The others have room for twice the documents the follower's disk
	// could hold, in both their log and their store, and its log's
	// segments allocated in advance.
	dirs := []string{tmpfsOrSkip(t, 2<<30), tmpfsOrSkip(t, 2<<30)}
	var small string
	if c.logOnly {
		dir := tmpfsOrSkip(t, 2<<30)
		small = filepath.Join(dir, "raft")
		if err := os.Mkdir(small, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := mountTmpfsOn(t, small, tmpfsSize); err != nil {
			t.Fatal(err)
		}
		dirs = append(dirs, dir)
	} else {
		small = tmpfsOrSkip(t, tmpfsSize)
		roomy := filepath.Join(small, "raft")
		if err := os.Mkdir(roomy, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := mountTmpfsOn(t, roomy, 2<<30); err != nil {
			t.Fatal(err)
		}
		dirs = append(dirs, small)
	}
	cl := newCluster(t, dirs, "--lease-ttl", "5s")
	full := cl.Coordinators[2]
	leader := cl.Leader()
	if leader == full {
		op := dial(t, full.Addr, tokenOperator)
		if _, err := op.TransferLeadership(testContext(t), "n1", "the follower's disk is under test"); err != nil {
			t.Fatalf("moving the leadership off %s: %v", full.ID, err)
		}
		leader = cl.Leader(cl.Coordinators[0])
	}
	renderers := make([]*renderer, 2)
	for i := range renderers {
		renderers[i] = startRenderer(t, cl.Addrs(), fmt.Sprintf("r%d", i), "--capacity", "4", "--latency", "200ms")
	}
	alpha := dial(t, cl.Addrs(), tokenAlpha)
	// A succeeded job's document leaves the store, so a store whose
	// renderers keep up with the submits reuses its pages and may never
	// fill. Dispatch is paused until the follower stops when the store is
	// the part under test.
	op := dial(t, cl.Addrs(), tokenOperator)
	if !c.logOnly {
		if _, err := op.PauseDispatch(testContext(t), "the follower's store must fill"); err != nil {
			t.Fatalf("pausing dispatch: %v", err)
		}
	}

	// Submit until the follower stops; each submit must be acknowledged.
	acked := map[string][]string{}
	submitted := 0
	// Twice what the disk holds is enough to fill it; a follower applies
	// behind its log (far behind on a loaded machine), so once that much is
	// acknowledged the follower is given time to apply it and stop.
	limit := 2 * tmpfsSize / (docsPerFill * docBytes)
fill:
	for ; ; submitted++ {
		select {
		case <-full.Exited():
			break fill
		default:
		}
		if submitted == limit {
			select {
			case <-full.Exited():
			case <-time.After(waitTimeout):
				t.Fatalf("%d batches of %d KiB acknowledged and %s still runs on a %d MiB disk %v later", submitted, docsPerFill*docBytes>>10, full.ID, tmpfsSize>>20, waitTimeout)
			}
			break fill
		}
		id, jobs := submit(t, alpha, "alpha", fmt.Sprintf("fill-%d", submitted), bulkDocs(submitted))
		acked[id] = jobs
	}
	if !c.logOnly {
		if _, err := op.ResumeDispatch(testContext(t), "the follower stopped"); err != nil {
			t.Fatalf("resuming dispatch: %v", err)
		}
	}
	if code := full.WaitExit(); code != 3 {
		t.Errorf("%s exited with status %d, want 3", full.ID, code)
	}
	stops := full.LinesWith("this node cannot store or apply the replicated log: stopping")
	if len(stops) != 1 || !strings.Contains(stops[0], c.cause) || !strings.Contains(stops[0], "no space left on device") {
		t.Errorf("%s stopped with %q, want one line whose error says %q and no space left on device", full.ID, stops, c.cause)
	}
	if lines := full.LinesWith("panic"); len(lines) > 0 {
		t.Errorf("%s panicked: %q", full.ID, lines)
	}
	t.Logf("%s stopped after %d acknowledged batches: %s", full.ID, submitted, stops)

	// The other two go on.
	for i := range 5 {
		id, jobs := submit(t, alpha, "alpha", fmt.Sprintf("after-%d", i), docs(fmt.Sprintf("after-%d", i), 2))
		acked[id] = jobs
	}
	jobs := 0
	for batch, ids := range acked {
		waitBatchDone(t, alpha, batch)
		for _, id := range ids {
			jobs++
			if j := getJob(t, alpha, id); j.GetPhase() != leaseholdv1.Phase_PHASE_SUCCEEDED {
				t.Errorf("job %s: %v, want SUCCEEDED; history:\n%s", id, j.GetPhase(), history(j))
			}
		}
	}

	// Room again: the follower restarted on its directory catches up.
	growTmpfs(t, small, tmpfsSize+2*walSegmentBytes)
	cl.StartNode(cl.Index(full))
	for _, r := range renderers {
		r.Signal(syscall.SIGTERM)
		r.WaitGone()
	}
	// A last batch, once in every store, has everything before it there.
	leader = cl.Leader()
	marker, _ := submit(t, alpha, "alpha", "marker", docs("marker", 1))
	for _, n := range cl.Coordinators {
		waitStored(t, n, marker)
	}
	applied := waitApplied(t, leader, cl.Coordinators)
	for _, n := range append(cl.Others(leader), leader) {
		n.Signal(syscall.SIGTERM)
		n.WaitGone()
	}
	var digests []string
	for _, n := range cl.Coordinators {
		idx, d := storeState(t, n)
		digests = append(digests, fmt.Sprintf("%s applied %d digest %x", n.ID, idx, d[:8]))
		if want, wantD := storeState(t, leader); idx != want || d != wantD {
			t.Errorf("stopped, %s applied %d with digest %x; the leader %s applied %d with %x", n.ID, idx, d[:8], leader.ID, want, wantD[:8])
		}
	}
	out, err := checkStore(full.DataDir)
	if err != nil || !strings.HasSuffix(out, "consistent\n") {
		t.Errorf("coordinator check --data-dir %s: %v\n%s", full.DataDir, err, out)
	}
	where := "store (the raft log on a roomy volume)"
	if c.logOnly {
		where = "raft log"
	}
	t.Logf("FIGURE follower disk full: %s with its %s on a %d MiB tmpfs stopped with status 3 after %d batches of %d KiB; %d jobs acknowledged, all succeeded; restarted on %d MiB it caught up to index %d: %s; check: %s",
		full.ID, where, tmpfsSize>>20, submitted, docsPerFill*docBytes>>10, jobs, (tmpfsSize+2*walSegmentBytes)>>20, applied,
		strings.Join(digests, ", "), strings.TrimSpace(out[strings.LastIndex(strings.TrimSuffix(out, "\n"), "\n")+1:]))
}

// checkStore runs "coordinator check" on a stopped node's data directory.
func checkStore(dir string) (string, error) {
	cmd := exec.Command(bins.coordinator, "check", "--data-dir", dir)
	cmd.Env = testbin.Env()
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		err = fmt.Errorf("exit status %d", exit.ExitCode())
	}
	return string(out), err
}

// waitStored waits until n's own store holds the batch, asking it with a
// stale read (served from its store) until it does: raft counts an entry
// applied once it hands it to the store, and a node caught up from far
// behind may still be writing what it was handed.
func waitStored(t testing.TB, n *node, batchID string) {
	t.Helper()
	c := dial(t, n.Addr, tokenAlpha)
	ctx := metadata.AppendToOutgoingContext(testContext(t), "leasehold-read", "stale")
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		_, err := c.GetBatch(ctx, batchID)
		if err == nil {
			return
		}
		if !errors.Is(err, client.ErrNotFound) {
			t.Fatalf("a stale read of batch %s on %s: %v", batchID, n.ID, err)
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			t.Fatalf("%s's store does not hold batch %s within %v", n.ID, batchID, waitTimeout)
		}
	}
}
