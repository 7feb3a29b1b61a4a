package engine

import (
	"context"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/leasehold/leasehold/coordinator/internal/cluster/shadow"
	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	"github.com/leasehold/leasehold/coordinator/internal/reads"
	"github.com/leasehold/leasehold/coordinator/internal/store"
	"github.com/leasehold/leasehold/internal/testclock"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fataler is what opening an engine needs of *testing.T, *testing.B and
// *rapid.T.
type fataler interface {
	Helper()
	Fatalf(format string, args ...any)
}

type testBundle struct {
	dir   string
	clock *testclock.Clock
	cfg   Config
	e     *Engine
	st    *store.Store
	// shadow, unless -shadow=false, applies every group's write set to a
	// second store and compares: each test's scenario is also a test of
	// write-set replication.
	shadow   *shadow.Shadow
	shadowSt *store.Store
	// shadowErr is what the shadows of closed engines found.
	shadowErr error
	// reg is the registry of the engine opened last.
	reg *prometheus.Registry
}

// epoch is where every test's clock starts.
var epoch = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func setup(t *testing.T, mutate ...func(*Config)) *testBundle {
	t.Helper()
	b := newBundle(t.TempDir())
	for _, m := range mutate {
		m(&b.cfg)
	}
	b.open(t)
	return b
}

// newBundle returns a bundle over dir with the tests' default config:
// injected wall and monotonic clocks. A test that sets Mono to nil runs
// with the wall clock as both.
func newBundle(dir string) *testBundle {
	b := &testBundle{dir: dir, clock: testclock.NewMono(epoch, time.Hour)}
	b.cfg = Config{
		Now:           b.clock.Now,
		Mono:          b.clock.Mono,
		LeaseTTL:      15 * time.Second,
		Retry:         jobs.RetryPolicy{MaxAttempts: 3, BackoffBase: time.Second, BackoffCap: 10 * time.Second},
		RunningCancel: true,
		Seed:          1,
		// The injected clock moves when a test says so, also while a
		// group runs: only the stall tests count stalls.
		StallAfter: -1,
	}
	return b
}

// open (re)opens the store and engine on the bundle's directory and stops
// them when the test ends.
func (b *testBundle) open(t *testing.T, opts ...store.Option) {
	t.Helper()
	b.start(t, opts...)
	t.Cleanup(func() {
		b.close()
		if b.shadowErr != nil {
			t.Errorf("write-set replication: %v", b.shadowErr)
			b.shadowErr = nil
		}
	})
}

// start opens the store and starts an engine on it; the caller closes.
func (b *testBundle) start(t fataler, opts ...store.Option) {
	t.Helper()
	st, err := store.Open(filepath.Join(b.dir, "leasehold.db"), opts...)
	if err != nil {
		t.Fatalf("store.Open: %v", err)
	}
	cfg := b.cfg
	b.reg = prometheus.NewRegistry()
	cfg.Store, cfg.Registerer = st, b.reg
	if *shadowFlag && cfg.Committer == nil {
		b.shadowSt, b.shadow = openShadow(t, st, filepath.Join(b.dir, "shadow.db"))
		cfg.Committer = fullShadow{b.shadow}
	}
	e, err := New(cfg)
	if err != nil {
		st.Close()
		t.Fatalf("New: %v", err)
	}
	e.Start()
	b.e, b.st = e, st
}

// resetShadow drops the shadow store, for a test that changed the primary
// file behind the engine's back: the next start copies it afresh.
func (b *testBundle) resetShadow(t *testing.T) {
	t.Helper()
	if err := os.Remove(filepath.Join(b.dir, "shadow.db")); err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
}

// fullShadow compares the whole stores after every group: the tests' stores
// are small.
type fullShadow struct{ *shadow.Shadow }

func (s fullShadow) Commit(tx *store.Tx, wall time.Time) error {
	if err := s.Shadow.Commit(tx, wall); err != nil {
		return err
	}
	_ = s.Compare() // recorded in Err
	return nil
}

var shadowFlag = flag.Bool("shadow", true, "replicate every test's writer groups onto a shadow store and compare digests")

// openShadow opens the shadow store at path and a shadow committer from st
// to it. A shadow store that is new while st is not starts as a copy of st.
func openShadow(t fataler, st *store.Store, path string) (*store.Store, *shadow.Shadow) {
	t.Helper()
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		f, err := os.Create(path)
		if err == nil {
			_, err = st.WriteBackup(f, func(store.BackupInfo) error { return nil })
			err = errors.Join(err, f.Close())
		}
		if err != nil {
			t.Fatalf("copying the store to its shadow: %v", err)
		}
	}
	sst, err := store.Open(path, store.WithoutSync())
	if err != nil {
		t.Fatalf("opening the shadow store: %v", err)
	}
	sh, err := shadow.New(st, sst)
	if err != nil {
		sst.Close()
		t.Fatalf("shadow: %v", err)
	}
	return sst, sh
}

// close stops the engine and closes the store; safe to call twice.
func (b *testBundle) close() {
	if b.e != nil {
		b.e.Stop()
		b.st.Close()
		b.e, b.st = nil, nil
	}
	if b.shadow != nil {
		b.shadowErr = errors.Join(b.shadowErr, b.shadow.Err())
		b.shadowSt.Close()
		b.shadow, b.shadowSt = nil, nil
	}
}

func (b *testBundle) restart(t *testing.T) {
	t.Helper()
	b.close()
	b.start(t)
}

// rend is a renderer whose credential is its own id.
func rend(id string) Renderer { return Renderer{ID: id, Principal: "cred-" + id} }

func docs(names ...string) []jobs.DocInput {
	out := make([]jobs.DocInput, len(names))
	for i, n := range names {
		out[i] = jobs.DocInput{Document: jobs.Document{Name: n, ContentType: "application/pdf"}, Content: []byte("content of " + n)}
	}
	return out
}

func (b *testBundle) submit(t *testing.T, team, req string, names ...string) jobs.Batch {
	t.Helper()
	res, err := b.e.Submit(context.Background(), SubmitRequest{Team: team, RequestID: req, Docs: docs(names...)})
	if err != nil {
		t.Fatalf("Submit: %v", err)
	}
	return res.Batch.Batch
}

// acquire grants up to n leases to renderer at once and reads their
// content, as the Acquire handler does.
func (b *testBundle) acquire(t *testing.T, renderer string, n int) []Grant {
	t.Helper()
	res, err := acquire(context.Background(), b.e, acquireRequest{Renderer: rend(renderer), Max: n, Capacity: 4})
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if err := b.e.ReadContent(res.Grants); err != nil {
		t.Fatalf("ReadContent: %v", err)
	}
	return res.Grants
}

func (b *testBundle) job(t *testing.T, id uint64) jobs.Job {
	t.Helper()
	j, err := b.e.Job(id)
	if err != nil {
		t.Fatalf("Job(%d): %v", id, err)
	}
	return j
}

// preview is the inline preview a test renderer makes for digest.
func preview(digest string) *jobs.Preview {
	return &jobs.Preview{Digest: digest, ContentType: "image/png", Content: []byte("png bytes of " + digest)}
}

// success is a completion with its preview inline.
func success(job, token uint64, renderer, digest string) CompleteRequest {
	return CompleteRequest{Job: job, Completion: jobs.Completion{Token: token, Renderer: renderer, Success: true}, Preview: preview(digest)}
}

// stagedSuccess is a completion naming a preview uploaded before (Stage).
func stagedSuccess(job, token uint64, renderer, digest string) CompleteRequest {
	return CompleteRequest{Job: job, Completion: jobs.Completion{Token: token, Renderer: renderer, Success: true, Digest: digest}}
}

// ignoreHistory compares job records without their history, which the
// writer's answers carry only in part.
var ignoreHistory = cmpopts.IgnoreFields(jobs.Job{}, "Events", "History")

func TestLifecycle(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("SubmitLeaseHeartbeatCompleteEndsSucceeded", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		batch := b.submit(t, "alpha", "r1", "a.pdf", "b.pdf")
		if batch.Count != 2 {
			t.Fatalf("batch count = %d, want 2", batch.Count)
		}
		grants := b.acquire(t, "r-1", 1)
		if len(grants) != 1 || grants[0].Job.ID != batch.FirstJob {
			t.Fatalf("grants = %+v, want the first job", grants)
		}
		g := grants[0]
		if string(g.Content) != "content of a.pdf" {
			t.Errorf("content = %q", g.Content)
		}
		b.clock.Advance(10 * time.Second)
		hb, err := heartbeat(ctx, b.e, heartbeatRequest{Renderer: rend("r-1"), Leases: []LeaseRef{{Job: g.Job.ID, Token: g.Job.Lease.Token}}})
		if err != nil {
			t.Fatal(err)
		}
		if st := hb.Leases[0]; !st.Held || !st.Deadline.Equal(b.clock.Now().Add(15*time.Second)) {
			t.Fatalf("heartbeat = %+v, want held until now+15s", st)
		}
		res, err := complete(ctx, b.e, success(g.Job.ID, g.Job.Lease.Token, "r-1", "d1"))
		if err != nil {
			t.Fatal(err)
		}
		if res.Job.Phase != jobs.PhaseSucceeded || res.Job.Artifact.Digest != "d1" || res.Job.Artifact.Token != g.Job.Lease.Token {
			t.Fatalf("job = %v artifact %+v", res.Job.Phase, res.Job.Artifact)
		}
		art, err := b.e.Artifact(res.Job)
		if err != nil {
			t.Fatalf("Artifact: %v", err)
		}
		want := jobs.Preview{Digest: "d1", ContentType: "image/png", Content: preview("d1").Content}
		if diff := cmp.Diff(want, art); diff != "" {
			t.Errorf("stored preview (-want +got):\n%s", diff)
		}
		v, err := b.e.Batch(batch.ID)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(jobs.Counts{jobs.PhaseQueued: 1, jobs.PhaseSucceeded: 1}, v.Counts); diff != "" || v.Done {
			t.Fatalf("counts (-want +got):\n%s done=%v", diff, v.Done)
		}
	})

	t.Run("SameRequestIDReturnsTheSameBatch", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		first := b.submit(t, "alpha", "r1", "a.pdf")
		res, err := b.e.Submit(ctx, SubmitRequest{Team: "alpha", RequestID: "r1", Docs: docs("a.pdf")})
		if err != nil {
			t.Fatal(err)
		}
		if !res.Replayed || res.Batch.Batch.ID != first.ID || res.Batch.Counts != (jobs.Counts{jobs.PhaseQueued: 1}) {
			t.Fatalf("second submit = %+v, want replay of batch %d with its counts", res, first.ID)
		}
		_, err = b.e.Submit(ctx, SubmitRequest{Team: "alpha", RequestID: "r1", Docs: docs("other.pdf")})
		if !errors.Is(err, jobs.ErrRequestIDReused) {
			t.Fatalf("reused id err = %v, want ErrRequestIDReused", err)
		}
		if all := b.allJobs(t); len(all) != 1 {
			t.Fatalf("stored %d jobs, want 1", len(all))
		}
	})

	t.Run("UnsupportedFormatIsFailedAtSubmissionAndNeverDispatched", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		batch := b.submit(t, "alpha", "r1", "macro.docm", "ok.pdf")
		j := b.job(t, batch.FirstJob)
		if j.Phase != jobs.PhaseFailed || j.TerminalReason != jobs.ReasonUnsupportedFormat {
			t.Fatalf("macro.docm = %v %v, want FAILED UNSUPPORTED_FORMAT", j.Phase, j.TerminalReason)
		}
		grants := b.acquire(t, "r-1", 4)
		if len(grants) != 1 || grants[0].Job.Doc.Name != "ok.pdf" {
			t.Fatalf("grants = %d, want only ok.pdf", len(grants))
		}
	})

	t.Run("TeamQueueFullRejectsTheWholeBatch", func(t *testing.T) {
		t.Parallel()
		b := setup(t, func(c *Config) { c.Limits.MaxTeamQueue = 3 })
		b.submit(t, "alpha", "r1", "a", "b")
		_, err := b.e.Submit(ctx, SubmitRequest{Team: "alpha", RequestID: "r2", Docs: docs("c", "d")})
		if !errors.Is(err, jobs.ErrTeamQueueFull) {
			t.Fatalf("err = %v, want ErrTeamQueueFull", err)
		}
		b.submit(t, "beta", "r2", "c", "d")
		page, err := b.e.ListJobs(reads.JobFilter{Teams: []string{"alpha"}})
		if err != nil {
			t.Fatal(err)
		}
		if len(page.Jobs) != 2 {
			t.Fatalf("alpha has %d jobs, want 2", len(page.Jobs))
		}
	})
}

func TestFencing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("LateWorkerIsRejectedAndChangesNothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t, func(c *Config) { c.Retry.BackoffBase = time.Millisecond; c.Retry.BackoffCap = time.Millisecond })
		batch := b.submit(t, "alpha", "r1", "a.pdf")
		a := b.acquire(t, "renderer-a", 1)[0]
		b.clock.Advance(16 * time.Second)
		if err := b.e.Tick(ctx); err != nil {
			t.Fatal(err)
		}
		if j := b.job(t, batch.FirstJob); j.Phase != jobs.PhaseRetryWait {
			t.Fatalf("after the deadline phase = %v, want RETRY_WAIT", j.Phase)
		}
		b.clock.Advance(time.Second)
		bg := b.acquire(t, "renderer-b", 1)
		if len(bg) != 1 || bg[0].Job.Lease.Token <= a.Job.Lease.Token {
			t.Fatalf("B's grant = %+v, want a larger token than %d", bg, a.Job.Lease.Token)
		}
		bres, err := complete(ctx, b.e, success(batch.FirstJob, bg[0].Job.Lease.Token, "renderer-b", "digest-b"))
		if err != nil {
			t.Fatal(err)
		}
		before := b.job(t, batch.FirstJob)
		_, err = complete(ctx, b.e, success(batch.FirstJob, a.Job.Lease.Token, "renderer-a", "digest-a"))
		if !errors.Is(err, jobs.ErrLeaseExpired) {
			t.Fatalf("A's completion err = %v, want ErrLeaseExpired", err)
		}
		after := b.job(t, batch.FirstJob)
		rejectionBookkeeping := cmpopts.IgnoreFields(jobs.Job{}, "Events", "History", "EventSeq", "RejectedCompletions", "Rejected", "UpdatedAt")
		if diff := cmp.Diff(before, after, rejectionBookkeeping); diff != "" {
			t.Fatalf("rejected completion changed the job (-before +after):\n%s", diff)
		}
		if len(after.History) != len(before.History)+1 || after.History[len(after.History)-1].Kind != jobs.EventCompletionRejected {
			t.Fatalf("want exactly one COMPLETION_REJECTED event appended")
		}
		rej := b.rejections(t, batch.FirstJob)
		if len(rej) != 1 || rej[0].Reason != "LEASE_EXPIRED" || rej[0].Token != a.Job.Lease.Token {
			t.Fatalf("rejections = %+v", rej)
		}
		if _, err := b.artifactAt(t, batch.FirstJob, a.Job.Lease.Token); !errors.Is(err, store.ErrArtifactNotFound) {
			t.Errorf("preview of the refused completion: err = %v, want jobs.ErrArtifactNotFound", err)
		}
		replay, err := complete(ctx, b.e, success(batch.FirstJob, bg[0].Job.Lease.Token, "renderer-b", "digest-b"))
		if err != nil || !replay.Replayed {
			t.Fatalf("replayed completion = %+v, %v; want replayed", replay, err)
		}
		final := b.job(t, batch.FirstJob)
		if diff := cmp.Diff(after, final); diff != "" {
			t.Fatalf("replay changed the job:\n%s", diff)
		}
		if n := countEvents(final, jobs.EventSucceeded); n != 1 || final.Artifact.Digest != "digest-b" || final.Artifact.Token != bres.Job.Artifact.Token {
			t.Fatalf("terminal events = %d artifact = %+v", n, final.Artifact)
		}
	})

	t.Run("FencingDecidesBeforeAMissingArtifact", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		batch := b.submit(t, "alpha", "r1", "a.pdf")
		g := b.acquire(t, "r-1", 1)[0]
		missing := stagedSuccess(batch.FirstJob, g.Job.Lease.Token, "r-1", "never-uploaded")
		before := b.job(t, batch.FirstJob)
		if _, err := complete(ctx, b.e, missing); !errors.Is(err, jobs.ErrArtifactMissing) {
			t.Fatalf("holder's completion with no upload: err = %v, want ErrArtifactMissing", err)
		}
		if diff := cmp.Diff(before, b.job(t, batch.FirstJob)); diff != "" {
			t.Fatalf("refused completion changed the job:\n%s", diff)
		}
		stale := missing
		stale.Token = g.Job.Lease.Token + 100
		if _, err := complete(ctx, b.e, stale); !errors.Is(err, jobs.ErrStaleLease) {
			t.Fatalf("stale completion with no upload: err = %v, want ErrStaleLease", err)
		}
		if rej := b.rejections(t, batch.FirstJob); len(rej) != 1 {
			t.Fatalf("rejections = %d, want the stale completion recorded once", len(rej))
		}

		// An upload under the lease makes the named digest complete; another
		// digest is still missing.
		p := preview("uploaded")
		if err := b.e.Stage(ctx, StageRequest{Job: g.Job.ID, Token: g.Job.Lease.Token, Renderer: "r-1", Preview: *p}); err != nil {
			t.Fatalf("Stage: %v", err)
		}
		if _, err := complete(ctx, b.e, stagedSuccess(g.Job.ID, g.Job.Lease.Token, "r-1", "other")); !errors.Is(err, jobs.ErrArtifactMissing) {
			t.Fatalf("completion naming another digest than the upload: err = %v, want ErrArtifactMissing", err)
		}
		res, err := complete(ctx, b.e, stagedSuccess(g.Job.ID, g.Job.Lease.Token, "r-1", "uploaded"))
		if err != nil {
			t.Fatalf("completion naming the upload: %v", err)
		}
		wantArt := jobs.Artifact{Digest: "uploaded", Size: int64(len(p.Content)), ContentType: "image/png", Token: g.Job.Lease.Token, Renderer: "r-1"}
		if diff := cmp.Diff(wantArt, res.Job.Artifact); diff != "" {
			t.Errorf("artifact reference (-want +got):\n%s", diff)
		}
	})

	t.Run("AnUploadByAnotherRendererIsRefusedAndStoresNothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		id := b.submit(t, "alpha", "r1", "a.pdf").FirstJob
		tok := b.acquire(t, "r-1", 1)[0].Job.Lease.Token
		err := b.e.Stage(ctx, StageRequest{Job: id, Token: tok, Renderer: "r-2", Preview: *preview("impostor")})
		if !errors.Is(err, jobs.ErrNotHolder) {
			t.Fatalf("Stage by another renderer: err = %v, want ErrNotHolder", err)
		}
		if _, err := b.artifactAt(t, id, tok); !errors.Is(err, store.ErrArtifactNotFound) {
			t.Errorf("preview after a refused upload: err = %v, want jobs.ErrArtifactNotFound", err)
		}
		if err := b.e.Stage(ctx, StageRequest{Job: 999, Token: tok, Renderer: "r-1", Preview: *preview("x")}); !errors.Is(err, jobs.ErrNotFound) {
			t.Errorf("Stage for an unknown job: err = %v, want jobs.ErrNotFound", err)
		}
	})

	t.Run("TokensKeepIncreasingAcrossRestartsAndLeasesSurvive", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.submit(t, "alpha", "r1", "a", "b", "c")
		first := b.acquire(t, "r-1", 2)
		b.restart(t)
		hb, err := heartbeat(ctx, b.e, heartbeatRequest{Renderer: rend("r-1"), Leases: []LeaseRef{{Job: first[0].Job.ID, Token: first[0].Job.Lease.Token}}})
		if err != nil || !hb.Leases[0].Held {
			t.Fatalf("heartbeat after restart = %+v, %v; want held", hb, err)
		}
		later := b.acquire(t, "r-2", 1)
		if len(later) != 1 || later[0].Job.Lease.Token <= first[1].Job.Lease.Token {
			t.Fatalf("token after restart = %+v, want > %d", later, first[1].Job.Lease.Token)
		}
		if _, err := complete(ctx, b.e, success(first[1].Job.ID, first[1].Job.Lease.Token, "r-1", "d")); err != nil {
			t.Fatalf("old lease inside its deadline should complete: %v", err)
		}
	})
}

func TestAtomicAcceptance(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	acked := b.submit(t, "alpha", "r1", "a", "b")
	b.close()

	// Fail the third job write of the next batch: the writer must roll the
	// whole transaction back, acknowledge nothing and stop.
	writes := 0
	b.open(t, store.WithFault(func(bucket string) error {
		if bucket == "jobs" {
			writes++
			if writes == 3 {
				return store.ErrInjected
			}
		}
		return nil
	}))
	_, err := b.e.Submit(ctx, SubmitRequest{Team: "alpha", RequestID: "r2", Docs: docs("c", "d", "e", "f")})
	if !errors.Is(err, ErrStorageFailed) || errors.Is(err, ErrStorageFull) {
		t.Fatalf("submit during a storage fault: err = %v, want ErrStorageFailed (not full)", err)
	}
	if b.e.Serving() {
		t.Fatal("engine still serving after a failed commit")
	}
	waitClosed(t, b.e.Failed(), "Failed after a failed commit")
	if _, err := b.e.Submit(ctx, SubmitRequest{Team: "alpha", RequestID: "r3", Docs: docs("g")}); !errors.Is(err, ErrStorageFailed) {
		t.Fatalf("submit after fail-stop: err = %v, want ErrStorageFailed", err)
	}
	b.restart(t)
	all := b.allJobs(t)
	if len(all) != 2 || all[0].BatchID != acked.ID || all[1].BatchID != acked.ID {
		t.Fatalf("after restart jobs = %d, want only the acknowledged batch's 2", len(all))
	}
	v, err := b.e.Batch(acked.ID)
	if err != nil || v.Counts != (jobs.Counts{jobs.PhaseQueued: 2}) {
		t.Fatalf("acknowledged batch after restart = %+v, %v; want 2 QUEUED", v.Counts, err)
	}
	if got := len(b.acquire(t, "r", 4)); got != 2 {
		t.Fatalf("dispatchable after restart = %d, want 2", got)
	}
}

func TestLiveCapacity(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("StreamsCountUntilClosedAndAcquirersUntilSilent", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		if _, err := openStream(ctx, b.e, rend("r-1"), 4); err != nil {
			t.Fatal(err)
		}
		r2, err := openStream(ctx, b.e, rend("r-2"), 2)
		if err != nil {
			t.Fatal(err)
		}
		if got := b.capacity(t); got != 6 {
			t.Fatalf("live capacity with two streams = %d, want 6", got)
		}
		if _, err := closeConn(ctx, b.e, r2, nil, true); err != nil {
			t.Fatal(err)
		}
		if got := b.capacity(t); got != 4 {
			t.Fatalf("live capacity after r-2's stream closed = %d, want 4", got)
		}
		// A renderer seen only through Acquire stays live until it has been
		// silent for RendererTimeout.
		b.acquire(t, "r-3", 1)
		if got := b.capacity(t); got != 8 {
			t.Fatalf("live capacity after r-3 acquired = %d, want 8", got)
		}
		b.clock.Advance(DefaultRendererTimeout + time.Second)
		b.acquire(t, "r-1", 1)
		if got := b.capacity(t); got != 4 {
			t.Fatalf("live capacity after r-3 went silent = %d, want 4", got)
		}
	})

	t.Run("RenderersOfOneCredentialCountAtMostItsMaxCapacity", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		shared := func(id string) Renderer { return Renderer{ID: id, Principal: "pool", MaxCapacity: 4} }
		for _, id := range []string{"p-1", "p-2"} {
			if _, err := openStream(ctx, b.e, shared(id), 100); err != nil {
				t.Fatal(err)
			}
		}
		if got := b.capacity(t); got != 4 {
			t.Fatalf("two renderers of one credential declaring 100 each count %d, want its MaxCapacity 4", got)
		}
		if _, _, err := b.e.Open(ctx, SessionOpen{Renderer: shared("p-3"), Instance: "i", Capacity: 100}); err != nil {
			t.Fatal(err)
		}
		b.acquire(t, "other", 1) // another credential, unbounded, capacity 4
		if got := b.capacity(t); got != 8 {
			t.Fatalf("with a third renderer of the credential and another credential = %d, want 4 + 4", got)
		}
	})

	t.Run("TheBoundedCapacityIsWhatTheShareCapUses", func(t *testing.T) {
		t.Parallel()
		// With MaxShare 0.5, a live capacity of 4 caps a team at 2 leases
		// while another waits; counted unbounded (200) it would never bite.
		b := setup(t, func(c *Config) { c.Dispatch.MaxShare = 0.5 })
		shared := Renderer{ID: "p-1", Principal: "pool", MaxCapacity: 4}
		b.submit(t, "alpha", "bulk", names("a", 6)...)
		res, err := acquire(ctx, b.e, acquireRequest{Renderer: shared, Max: 2, Capacity: 200})
		if err != nil || len(res.Grants) != 2 {
			t.Fatalf("Acquire = %d grants, %v; want 2", len(res.Grants), err)
		}
		b.submit(t, "beta", "small", names("b", 2)...)
		res, err = acquire(ctx, b.e, acquireRequest{Renderer: shared, Max: 2, Capacity: 200})
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff([]string{"b1.pdf", "b2.pdf"}, grantedDocs(res.Grants)); diff != "" {
			t.Errorf("with alpha at the cap of the bounded capacity, grants (-want +got):\n%s", diff)
		}
	})
}

// capacity runs an empty group and returns the live capacity its metrics
// snapshot saw.
func (b *testBundle) capacity(t *testing.T) int {
	t.Helper()
	if err := b.e.Tick(context.Background()); err != nil {
		t.Fatal(err)
	}
	return b.e.m.snap.Load().capacity
}

// TestSubmitLimits checks every batch limit just under and just over through
// the writer, and that a refused batch leaves no record behind.
func TestSubmitLimits(t *testing.T) {
	t.Parallel()
	limits := jobs.Limits{MaxDocuments: 3, MaxDocumentBytes: 100, MaxBatchBytes: 250, MaxInlineBytes: 50, MaxNameBytes: 8, MaxTeamQueue: 5}
	doc := func(name string, size int64, inline int) jobs.DocInput {
		return jobs.DocInput{Document: jobs.Document{Name: name, SizeBytes: size, SourceURI: "s3://bucket/" + name}, Content: make([]byte, inline)}
	}
	tests := []struct {
		name       string
		docs       []jobs.DocInput
		wantReason string // "" means accepted
	}{
		{"AsManyDocumentsAsAllowedIsAccepted", []jobs.DocInput{doc("a", 1, 0), doc("b", 1, 0), doc("c", 1, 0)}, ""},
		{"OneDocumentTooManyIsRefused", []jobs.DocInput{doc("a", 1, 0), doc("b", 1, 0), doc("c", 1, 0), doc("d", 1, 0)}, "BATCH_TOO_LARGE"},
		{"ADocumentAtTheSizeLimitIsAccepted", []jobs.DocInput{doc("a", 100, 0)}, ""},
		{"ADocumentOneByteOverIsRefused", []jobs.DocInput{doc("a", 101, 0)}, "DOCUMENT_TOO_LARGE"},
		{"ABatchAtTheByteLimitIsAccepted", []jobs.DocInput{doc("a", 100, 0), doc("b", 100, 0), doc("c", 50, 0)}, ""},
		{"ABatchOneByteOverIsRefused", []jobs.DocInput{doc("a", 100, 0), doc("b", 100, 0), doc("c", 51, 0)}, "BATCH_TOO_LARGE"},
		{"InlineContentAtTheLimitIsAccepted", []jobs.DocInput{doc("a", 0, 50)}, ""},
		{"InlineContentOneByteOverIsRefused", []jobs.DocInput{doc("a", 0, 51)}, "CONTENT_TOO_LARGE"},
		{"ANameAtTheLimitIsAccepted", []jobs.DocInput{doc("12345678", 1, 0)}, ""},
		{"ANameOneByteOverIsRefused", []jobs.DocInput{doc("123456789", 1, 0)}, "INVALID_NAME"},
		{"AnEmptyBatchIsRefused", nil, "EMPTY_BATCH"},
		{"DuplicateNamesAreRefused", []jobs.DocInput{doc("a", 1, 0), doc("a", 1, 0)}, "DUPLICATE_NAME"},
		{"OneBadDocumentRefusesTheWholeBatch", []jobs.DocInput{doc("a", 1, 0), doc("b", 101, 0)}, "DOCUMENT_TOO_LARGE"},
		{"ABatchPastTheTeamQueueDepthIsRefused", []jobs.DocInput{doc("a", 1, 0), doc("b", 1, 0), doc("c", 1, 0)}, "TEAM_QUEUE_FULL"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, func(c *Config) { c.Limits = limits })
			if tt.wantReason == "TEAM_QUEUE_FULL" {
				b.submit(t, "alpha", "first", "x", "y", "z")
			}
			before := b.allJobs(t)
			_, err := b.e.Submit(context.Background(), SubmitRequest{Team: "alpha", RequestID: "req", Docs: tt.docs})
			after := b.allJobs(t)
			if tt.wantReason == "" {
				if err != nil || len(after) != len(before)+len(tt.docs) {
					t.Fatalf("Submit = %v, stored %d new jobs; want accepted with %d", err, len(after)-len(before), len(tt.docs))
				}
				return
			}
			var ve *jobs.ValidationError
			if !errors.As(err, &ve) || string(ve.Reason) != tt.wantReason {
				t.Fatalf("Submit err = %v, want reason %s", err, tt.wantReason)
			}
			if len(after) != len(before) {
				t.Fatalf("a refused batch stored %d jobs", len(after)-len(before))
			}
			// The request id stays free: nothing of the refused batch exists.
			err = b.st.View(func(tx *store.Tx) error {
				if _, found, err := tx.BatchByRequest("alpha", "req"); err != nil || found {
					t.Errorf("BatchByRequest after a refused batch: found=%v err=%v", found, err)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}
