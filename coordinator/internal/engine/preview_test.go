package engine

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	"github.com/leasehold/leasehold/coordinator/internal/store"
)

// TestPreviews checks that a preview is stored in the transaction that
// records its success, and only then: nothing acknowledged is lost across
// a crash, and nothing is left behind by completions that lost.
func TestPreviews(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("ACompletionCommittedBeforeACrashSurvivesAndItsRetryIsAReplay", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		id := b.submit(t, "alpha", "r1", "a.pdf").FirstJob
		g := b.acquire(t, "r-1", 1)[0]
		req := success(id, g.Job.Lease.Token, "r-1", "d1")

		// The caller gives up before the answer (as when the coordinator
		// dies between the commit and the reply); the commit happens.
		release := b.block(t)
		cctx, cancel := context.WithCancel(ctx)
		var err error
		done := async(func() { _, err = complete(cctx, b.e, req) })
		b.waitQueued(t, 1)
		cancel()
		waitClosed(t, done, "the abandoned completion")
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("abandoned completion: err = %v, want context.Canceled", err)
		}
		release()
		if err := b.e.Tick(ctx); err != nil { // behind the completion's group
			t.Fatal(err)
		}
		b.restart(t)

		j := b.job(t, id)
		if j.Phase != jobs.PhaseSucceeded || j.Artifact.Token != g.Job.Lease.Token || j.Artifact.Digest != "d1" {
			t.Fatalf("after the restart: %v artifact %+v; want SUCCEEDED with d1 under token %d", j.Phase, j.Artifact, g.Job.Lease.Token)
		}
		want := jobs.Preview{Digest: "d1", ContentType: "image/png", Content: req.Preview.Content}
		art, err := b.e.Artifact(j)
		if diff := cmp.Diff(want, art); err != nil || diff != "" {
			t.Fatalf("preview after the restart, %v (-want +got):\n%s", err, diff)
		}
		res, err := complete(ctx, b.e, req)
		if err != nil || !res.Replayed {
			t.Fatalf("the renderer's retry = %+v, %v; want a replay", res, err)
		}
		if diff := cmp.Diff(j, b.job(t, id)); diff != "" {
			t.Errorf("the retry changed the job:\n%s", diff)
		}
		if art2, err := b.e.Artifact(j); err != nil || !cmp.Equal(art, art2) {
			t.Errorf("the retry changed the preview: %+v, %v", art2, err)
		}
		if d := b.document(t, id); d != nil {
			t.Errorf("a succeeded job kept its document %q", d)
		}
	})

	t.Run("ARefusedCompletionStoresNoPreview", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		id := b.submit(t, "alpha", "r1", "a.pdf").FirstJob
		g := b.acquire(t, "r-1", 1)[0]
		tok := g.Job.Lease.Token
		for _, req := range []CompleteRequest{
			success(id, tok+1, "r-1", "never-granted"),
			success(id, tok, "r-2", "impostor"),
		} {
			if _, err := complete(ctx, b.e, req); !jobs.IsFence(err) {
				t.Fatalf("completion %+v: err = %v, want a fencing refusal", req.Completion, err)
			}
		}
		for _, tk := range []uint64{tok, tok + 1} {
			if a, err := b.artifactAt(t, id, tk); !errors.Is(err, store.ErrArtifactNotFound) {
				t.Errorf("preview under token %d after refused completions = %+v, %v; want none", tk, a, err)
			}
		}
		// The holder's own completion then stores its preview.
		if _, err := complete(ctx, b.e, success(id, tok, "r-1", "mine")); err != nil {
			t.Fatal(err)
		}
		if a, err := b.artifactAt(t, id, tok); err != nil || a.Digest != "mine" || a.Renderer != "r-1" {
			t.Errorf("preview of the applied completion = %+v, %v; want mine by r-1", a, err)
		}
	})

	t.Run("UploadsOfLeasesThatLostAreDeletedWhenTheJobEnds", func(t *testing.T) {
		t.Parallel()
		b := setup(t, func(c *Config) {
			c.Retry.BackoffBase, c.Retry.BackoffCap = time.Millisecond, time.Millisecond
		})
		ids := b.submit(t, "alpha", "r1", "succeeds.pdf", "cancelled.pdf", "fails.pdf").JobIDs()
		stage := func(g Grant, renderer, digest string) error {
			return b.e.Stage(ctx, StageRequest{Job: g.Job.ID, Token: g.Job.Lease.Token, Renderer: renderer, Preview: *preview(digest)})
		}
		first := b.acquire(t, "r-1", 3)
		for _, g := range first {
			if err := stage(g, "r-1", "first"); err != nil {
				t.Fatalf("Stage under the first lease of job %d: %v", g.Job.ID, err)
			}
		}
		b.tick(t, b.cfg.LeaseTTL+time.Second) // every first lease expires
		if err := stage(first[0], "r-1", "late"); !errors.Is(err, jobs.ErrLeaseExpired) {
			t.Fatalf("an upload under an expired lease: err = %v, want ErrLeaseExpired", err)
		}
		for _, g := range first {
			if a, err := b.artifactAt(t, g.Job.ID, g.Job.Lease.Token); err != nil || a.Digest != "first" {
				t.Fatalf("the first upload of job %d while the job is live = %+v, %v; want kept", g.Job.ID, a, err)
			}
		}
		b.tick(t, time.Second) // every backoff elapsed
		second := b.acquire(t, "r-2", 3)
		// Their backoffs were drawn at random: the order of the retries is not
		// the order of the jobs.
		slices.SortFunc(second, func(x, y Grant) int { return int(x.Job.ID) - int(y.Job.ID) })
		if diff := cmp.Diff(ids, grantedIDs(second)); diff != "" {
			t.Fatalf("second grants (-want +got):\n%s", diff)
		}
		if err := stage(second[0], "r-2", "second"); err != nil {
			t.Fatal(err)
		}
		if _, err := complete(ctx, b.e, stagedSuccess(ids[0], second[0].Job.Lease.Token, "r-2", "second")); err != nil {
			t.Fatalf("completion naming the upload: %v", err)
		}
		if _, err := b.e.Cancel(ctx, CancelRequest{Job: ids[1], Principal: "alice"}); err != nil {
			t.Fatal(err)
		}
		if err := stage(second[2], "r-2", "second"); err != nil {
			t.Fatal(err)
		}
		if _, err := complete(ctx, b.e, failure(ids[2], second[2].Job.Lease.Token, "r-2", jobs.ClassInvalidDocument, "broken")); err != nil {
			t.Fatal(err)
		}

		type kept struct {
			Job    uint64
			Tokens []uint64
		}
		var got []kept
		for i, id := range ids {
			k := kept{Job: id}
			for _, g := range []Grant{first[i], second[i]} {
				if _, err := b.artifactAt(t, id, g.Job.Lease.Token); err == nil {
					k.Tokens = append(k.Tokens, g.Job.Lease.Token)
				} else if !errors.Is(err, store.ErrArtifactNotFound) {
					t.Fatal(err)
				}
			}
			got = append(got, k)
		}
		want := []kept{{ids[0], []uint64{second[0].Job.Lease.Token}}, {Job: ids[1]}, {Job: ids[2]}}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("previews left after the jobs ended (-want +got):\n%s", diff)
		}
		// A failed job keeps its document for a replay; the others drop it.
		for i, wantDoc := range []bool{false, false, true} {
			if d := b.document(t, ids[i]); (d != nil) != wantDoc {
				t.Errorf("job %d document %q, want kept %v", ids[i], d, wantDoc)
			}
		}
	})
}
