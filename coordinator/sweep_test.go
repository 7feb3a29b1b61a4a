package coordinator

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasehold/leasehold/client/reason"
	"github.com/leasehold/leasehold/coordinator/internal/artifacts"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"github.com/leasehold/leasehold/internal/testclock"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// sweepBundle is a coordinator with the directory store, previews above
// 64 bytes kept there, and the sweep's grace of an hour, on an injected
// clock; its sweep is run by hand. Leases last two days: a lease that
// heartbeats keep alive through a long render.
type sweepBundle struct {
	*testBundle
	c   clients
	clk *testclock.Clock
	dir *artifacts.Dir
}

// setupSweep starts a sweepBundle; wrap, if not nil, wraps its store.
func setupSweep(t *testing.T, start time.Time, wrap func(artifacts.Store) artifacts.Store) *sweepBundle {
	t.Helper()
	clk := testclock.New(start)
	b := setup(t, Config{TokensFile: testPrincipals(t), Now: clk.Now, wrapStore: wrap, LeaseTTL: 48 * time.Hour, MetricsListen: "127.0.0.1:0",
		Artifacts: ArtifactConfig{InlineBytes: 64, SweepGrace: time.Hour, SweepInterval: 24 * time.Hour}})
	dir, err := artifacts.OpenDir(filepath.Join(b.c.cfg.DataDir, artifacts.DirName))
	if err != nil {
		t.Fatal(err)
	}
	return &sweepBundle{testBundle: b, c: b.clients(), clk: clk, dir: dir}
}

// submitAndGrant submits one document of team alpha and leases it to r-1.
func (b *sweepBundle) submitAndGrant(ctx context.Context, t *testing.T, name string) *leaseholdv1.Grant {
	t.Helper()
	docs := []*leaseholdv1.Document{{Name: name, ContentType: "application/pdf", Content: []byte("%PDF " + name)}}
	if _, err := b.c.jobs.SubmitBatch(bearer(ctx, alphaToken), &leaseholdv1.SubmitBatchRequest{Team: "alpha", RequestId: name, Documents: docs}); err != nil {
		t.Fatal(err)
	}
	g := b.c.grant(ctx, t, 1)
	if len(g) != 1 {
		t.Fatalf("granted %d leases, want 1", len(g))
	}
	return g[0]
}

// complete completes g with success.
func (b *sweepBundle) complete(ctx context.Context, g *leaseholdv1.Grant, success *leaseholdv1.CompleteSuccess) error {
	_, err := b.c.rend.Complete(bearer(ctx, rendererToken), &leaseholdv1.CompleteRequest{JobId: g.GetJobId(), Token: g.GetLease().GetToken(),
		RendererId: "r-1", Outcome: &leaseholdv1.CompleteRequest_Success{Success: success}})
	return err
}

// named is a success naming a stored object of content.
func named(content []byte) *leaseholdv1.CompleteSuccess {
	return &leaseholdv1.CompleteSuccess{ArtifactDigest: artifacts.Digest(content), SizeBytes: int64(len(content)), ContentType: "image/png"}
}

// upload uploads content under g with UploadArtifact.
func (b *sweepBundle) upload(ctx context.Context, t *testing.T, g *leaseholdv1.Grant, content []byte) {
	t.Helper()
	stream, err := b.c.rend.UploadArtifact(bearer(ctx, rendererToken))
	if err != nil {
		t.Fatal(err)
	}
	msgs := []*leaseholdv1.UploadArtifactRequest{
		{Part: &leaseholdv1.UploadArtifactRequest_Metadata{Metadata: &leaseholdv1.ArtifactMetadata{
			JobId: g.GetJobId(), Token: g.GetLease().GetToken(), RendererId: "r-1", ContentType: "image/png"}}},
		{Part: &leaseholdv1.UploadArtifactRequest_Chunk{Chunk: content}},
	}
	for _, m := range msgs {
		if err := stream.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := stream.CloseAndRecv(); err != nil {
		t.Fatalf("UploadArtifact: %v", err)
	}
}

// download reads the preview of job id as team alpha's submitter.
func (c clients) download(ctx context.Context, t *testing.T, id string) []byte {
	t.Helper()
	stream, err := c.jobs.GetArtifact(bearer(ctx, alphaToken), &leaseholdv1.GetArtifactRequest{JobId: id})
	if err != nil {
		t.Fatal(err)
	}
	var got []byte
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return got
		}
		if err != nil {
			t.Fatalf("GetArtifact(%s): %v", id, err)
		}
		got = append(got, msg.GetChunk()...)
	}
}

// exists reports whether the store holds content under team alpha.
func (b *sweepBundle) exists(t *testing.T, content []byte) bool {
	t.Helper()
	_, err := b.dir.Stat(t.Context(), artifacts.Key{Team: "alpha", Digest: artifacts.Digest(content)})
	if err != nil && !errors.Is(err, artifacts.ErrNotFound) {
		t.Fatal(err)
	}
	return err == nil
}

// preview returns n bytes of a preview numbered i.
func preview(i, n int) []byte {
	return bytes.Repeat(fmt.Appendf(nil, "preview %d ", i), n/10+1)[:n]
}

// TestSweep runs the sweep of the directory store against a real
// coordinator: what it deletes and what it must never delete.
func TestSweep(t *testing.T) {
	t.Parallel()

	t.Run("AnOrphanIsDeletedOnceOlderThanTheGraceAndItsTombstoneForgotten", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		b := setupSweep(t, time.Now(), nil)
		orphan := preview(1, 1000)
		if err := b.dir.Put(ctx, artifacts.Key{Team: "alpha", Digest: artifacts.Digest(orphan)}, orphan); err != nil {
			t.Fatal(err)
		}
		res, err := b.testBundle.c.sweep.RunOnce(ctx)
		if err != nil || res.Deleted != 0 || res.Kept != 1 {
			t.Fatalf("a run within the grace = %+v, %v; want the orphan kept", res, err)
		}
		b.clk.Advance(time.Hour + time.Minute)
		res, err = b.testBundle.c.sweep.RunOnce(ctx)
		if err != nil || res.Deleted != 1 {
			t.Fatalf("a run past the grace = %+v, %v; want the orphan deleted", res, err)
		}
		if b.exists(t, orphan) {
			t.Error("the orphan is still in the store")
		}
		if tombs, _ := b.testBundle.c.eng.Tombs(); len(tombs) != 1 || tombs[0].Buried == 0 {
			t.Errorf("tombstones after the deletion = %+v, want one, buried", tombs)
		}
		b.clk.Advance(time.Hour + time.Minute)
		if _, err := b.testBundle.c.sweep.RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
		if tombs, _ := b.testBundle.c.eng.Tombs(); len(tombs) != 0 {
			t.Errorf("tombstones a grace after the burial = %+v, want none", tombs)
		}
	})

	t.Run("AnObjectAPointerNamesIsNeverDeleted", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		b := setupSweep(t, time.Now(), nil)
		g := b.submitAndGrant(ctx, t, "kept.pdf")
		content := preview(2, 1000)
		if err := b.complete(ctx, g, &leaseholdv1.CompleteSuccess{Content: content, ContentType: "image/png"}); err != nil {
			t.Fatal(err)
		}
		b.clk.Advance(24 * time.Hour)
		res, err := b.testBundle.c.sweep.RunOnce(ctx)
		if err != nil || res.Deleted != 0 {
			t.Fatalf("a run past the grace = %+v, %v; want nothing deleted", res, err)
		}
		if got := b.c.download(ctx, t, g.GetJobId()); !bytes.Equal(got, content) {
			t.Errorf("the preview after the sweep is %d bytes, not the %d completed", len(got), len(content))
		}
	})

	t.Run("AnUploadStagedUnderALiveLeaseIsNeverDeleted", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		// A render that takes longer than the grace: the upload is staged
		// under a lease that heartbeats keep alive, its completion to come.
		b := setupSweep(t, time.Now(), nil)
		g := b.submitAndGrant(ctx, t, "slow.pdf")
		content := preview(3, 1000)
		b.upload(ctx, t, g, content)
		b.clk.Advance(24 * time.Hour)
		res, err := b.testBundle.c.sweep.RunOnce(ctx)
		if err != nil || res.Deleted != 0 {
			t.Fatalf("a run past the grace = %+v, %v; want the staged upload kept", res, err)
		}
		if err := b.complete(ctx, g, &leaseholdv1.CompleteSuccess{ArtifactDigest: artifacts.Digest(content)}); err != nil {
			t.Fatalf("completing the staged upload: %v", err)
		}
		if got := b.c.download(ctx, t, g.GetJobId()); !bytes.Equal(got, content) {
			t.Errorf("the preview is %d bytes, not the %d uploaded", len(got), len(content))
		}
	})

	t.Run("ACompletionThatCheckedAnObjectBeforeTheSweepDeletedItSetsNoPointer", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		// The writer's wall clock is an hour behind this process's, as a
		// node whose clock lags, or one stepped back, would have it: the
		// judgement must not depend on which clock read what.
		gate := &gatedStore{statted: make(chan struct{}), release: make(chan struct{})}
		b := setupSweep(t, time.Now().Add(-time.Hour), gate.wrap)
		g := b.submitAndGrant(ctx, t, "race.pdf")
		content := preview(4, 1000)
		key := artifacts.Key{Team: "alpha", Digest: artifacts.Digest(content)}
		// An upload long enough ago to be past the grace, whose completion
		// comes only now.
		if err := b.dir.Put(ctx, key, content); err != nil {
			t.Fatal(err)
		}
		old := time.Now().Add(-3 * time.Hour)
		if err := os.Chtimes(filepath.Join(b.dir.Root(), key.String()), old, old); err != nil {
			t.Fatal(err)
		}
		gate.armed.Store(true)
		done := make(chan error, 1)
		go func() { done <- b.complete(ctx, g, named(content)) }()
		<-gate.statted // the completion found the object
		res, err := b.testBundle.c.sweep.RunOnce(ctx)
		if err != nil || res.Deleted != 1 {
			t.Fatalf("the sweep = %+v, %v; want the unreferenced object deleted", res, err)
		}
		gate.armed.Store(false)
		close(gate.release)
		err = <-done
		if st := status.Convert(err); st.Code() != codes.FailedPrecondition || reasonOf(err) != reason.ArtifactNotFound.String() {
			t.Fatalf("a completion that checked the object before its deletion: %v, want FAILED_PRECONDITION ARTIFACT_NOT_FOUND", err)
		}
		j, err := b.c.jobs.GetJob(bearer(ctx, alphaToken), &leaseholdv1.GetJobRequest{JobId: g.GetJobId()})
		if err != nil || j.GetJob().GetPhase() != leaseholdv1.Phase_PHASE_LEASED {
			t.Fatalf("the job after the refusal = %v, %v; want it still LEASED", j.GetJob().GetPhase(), err)
		}

		// The renderer keeps its lease and uploads again: the object found
		// after the burial is a new one.
		if err := b.dir.Put(ctx, key, content); err != nil {
			t.Fatal(err)
		}
		if err := b.complete(ctx, g, named(content)); err != nil {
			t.Fatalf("the completion after the upload again: %v", err)
		}
		if got := b.c.download(ctx, t, g.GetJobId()); !bytes.Equal(got, content) {
			t.Errorf("the preview is %d bytes, not the %d uploaded", len(got), len(content))
		}
		if tombs, _ := b.testBundle.c.eng.Tombs(); len(tombs) != 0 {
			t.Errorf("tombstones once a pointer names the object = %+v, want none", tombs)
		}
	})
}

// gatedStore holds a Stat that found its object, while armed, until the
// test releases it: the completion has checked the object and not yet
// reached the writer.
type gatedStore struct {
	artifacts.Store
	armed            atomic.Bool
	statted, release chan struct{}
}

func (g *gatedStore) wrap(st artifacts.Store) artifacts.Store {
	g.Store = st
	return g
}

func (g *gatedStore) Stat(ctx context.Context, k artifacts.Key) (artifacts.Info, error) {
	info, err := g.Store.Stat(ctx, k)
	if err == nil && g.armed.Load() {
		g.statted <- struct{}{}
		<-g.release
	}
	return info, err
}
