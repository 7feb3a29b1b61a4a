package server

import (
	"bytes"
	"context"
	"sync"
	"testing"

	"github.com/leasehold/leasehold/coordinator/internal/auth"
	"github.com/leasehold/leasehold/coordinator/internal/engine"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"google.golang.org/grpc/codes"
)

// heldStage is an engine whose first Stage waits, after signalling staged,
// until release is closed: the upload that made it is then in progress,
// its bytes all received, for as long as the test needs.
type heldStage struct {
	Engine
	once    sync.Once
	staged  chan struct{}
	release chan struct{}
}

func (h *heldStage) Stage(ctx context.Context, req engine.StageRequest) error {
	first := false
	h.once.Do(func() { first = true })
	if first {
		close(h.staged)
		<-h.release
	}
	return h.Engine.Stage(ctx, req)
}

// heldStages is an engine whose every Stage signals arrived, then waits
// until release is closed: each upload that made one is then in progress,
// its bytes all received.
type heldStages struct {
	Engine
	arrived chan struct{}
	release chan struct{}
}

func (h *heldStages) Stage(ctx context.Context, req engine.StageRequest) error {
	h.arrived <- struct{}{}
	<-h.release
	return h.Engine.Stage(ctx, req)
}

// holdUpload starts an upload of data for g's lease that stays in progress
// until the returned function is called; that function returns its result.
func (b *testBundle) holdUpload(t *testing.T, h *heldStage, g *leaseholdv1.Grant, data []byte) func() error {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		_, err := b.sendUpload(t, renderer, uploadMeta(g, g.GetLease().GetToken(), "r-1"), chunk(data))
		done <- err
	}()
	<-h.staged
	var once sync.Once
	release := func() { once.Do(func() { close(h.release) }) }
	// Released before the server stops, which waits for its handlers,
	// should the test end first.
	t.Cleanup(release)
	return func() error {
		release()
		return <-done
	}
}

// TestUploadsAreBounded checks that a renderer credential cannot make the
// coordinator buffer a preview per stream it may open: one upload per
// lease at a time, and one budget for the bytes of all of them.
func TestUploadsAreBounded(t *testing.T) {
	t.Parallel()
	held := func(h *heldStage) func(*options) {
		return func(o *options) { o.wrap = func(e Engine) Engine { h.Engine = e; return h } }
	}
	newHeld := func() *heldStage { return &heldStage{staged: make(chan struct{}), release: make(chan struct{})} }

	t.Run("A second upload for a lease with one in progress is RESOURCE_EXHAUSTED UPLOAD_IN_PROGRESS; other leases upload meanwhile", func(t *testing.T) {
		t.Parallel()
		h := newHeld()
		b := setup(t, held(h))
		b.submit(t, alpha, "alpha", "r", doc("a.pdf"), doc("b.pdf"))
		g := b.acquire(t, 2)
		finish := b.holdUpload(t, h, g[0], []byte("first"))

		_, err := b.sendUpload(t, renderer, uploadMeta(g[0], g[0].GetLease().GetToken(), "r-1"), chunk([]byte("second")))
		wantError(t, err, codes.ResourceExhausted, reasonUploadInProgress)
		if _, err := b.sendUpload(t, renderer, uploadMeta(g[1], g[1].GetLease().GetToken(), "r-1"), chunk([]byte("other lease"))); err != nil {
			t.Errorf("an upload for another lease meanwhile: %v", err)
		}

		if err := finish(); err != nil {
			t.Fatalf("the upload in progress: %v", err)
		}
		if _, err := b.sendUpload(t, renderer, uploadMeta(g[0], g[0].GetLease().GetToken(), "r-1"), chunk([]byte("third"))); err != nil {
			t.Errorf("an upload for the lease after the first ended: %v", err)
		}
		if err := b.completeWith(t, g[0], g[0].GetLease().GetToken(), sha([]byte("third"))); err != nil {
			t.Errorf("completing with the last upload: %v", err)
		}
		if n := b.services.Renderers.uploads.inUse(); n != 0 {
			t.Errorf("upload bytes still reserved after every upload ended: %d", n)
		}
	})

	t.Run("Uploads past the buffer budget are RESOURCE_EXHAUSTED UPLOAD_BUDGET_EXHAUSTED until bytes are freed", func(t *testing.T) {
		t.Parallel()
		h := newHeld()
		b := setup(t, held(h), func(o *options) {
			o.maxArtifactBytes = 1 << 20
			o.server = func(c *Config) { c.MaxUploadBufferBytes = 1 << 20 }
		})
		b.submit(t, alpha, "alpha", "r", doc("a.pdf"), doc("b.pdf"))
		g := b.acquire(t, 2)
		big := bytes.Repeat([]byte{7}, 600<<10)
		finish := b.holdUpload(t, h, g[0], big)

		_, err := b.sendUpload(t, renderer, uploadMeta(g[1], g[1].GetLease().GetToken(), "r-1"), chunk(big))
		wantError(t, err, codes.ResourceExhausted, reasonUploadBudget)
		if n := b.services.Renderers.uploads.inUse(); n != 600<<10 {
			t.Errorf("bytes reserved with one upload of 600 KiB in progress: %d", n)
		}

		if err := finish(); err != nil {
			t.Fatalf("the upload in progress: %v", err)
		}
		if _, err := b.sendUpload(t, renderer, uploadMeta(g[1], g[1].GetLease().GetToken(), "r-1"), chunk(big)); err != nil {
			t.Errorf("the upload once the first freed its bytes: %v", err)
		}
		if n := b.services.Renderers.uploads.inUse(); n != 0 {
			t.Errorf("upload bytes still reserved after every upload ended: %d", n)
		}
	})

	t.Run("One credential's uploads hold at most half the budget, and another credential's upload goes through", func(t *testing.T) {
		t.Parallel()
		h := &heldStages{arrived: make(chan struct{}, 8), release: make(chan struct{})}
		const otherToken = "other-renderer-token-0123"
		principals := devPrincipalsWith(map[string]auth.Principal{otherToken: {Name: "other-renderers", Roles: []auth.Role{auth.RoleRenderer},
			RendererIDs: []string{"r-2"}, MaxCapacity: auth.DefaultMaxCapacity}})
		b := setup(t, func(o *options) {
			o.wrap = func(e Engine) Engine { h.Engine = e; return h }
			o.principals = principals
			o.maxArtifactBytes = 1 << 20
			o.server = func(c *Config) { c.MaxUploadBufferBytes = 2 << 20 } // a credential's share: 1 MiB
		})
		b.submit(t, alpha, "alpha", "r", doc("a.pdf"), doc("b.pdf"), doc("c.pdf"))
		g := b.acquire(t, 2) // r-1, the development renderer's
		other, err := b.rend.Acquire(as(t, otherToken), &leaseholdv1.AcquireRequest{RendererId: "r-2", MaxLeases: 1})
		if err != nil || len(other.GetLeases()) != 1 {
			t.Fatalf("Acquire as r-2 = %v, %v", other, err)
		}
		big := bytes.Repeat([]byte{7}, 600<<10)
		done := make(chan error, 2)
		go func() {
			_, err := b.sendUpload(t, renderer, uploadMeta(g[0], g[0].GetLease().GetToken(), "r-1"), chunk(big))
			done <- err
		}()
		var once sync.Once
		release := func() { once.Do(func() { close(h.release) }) }
		t.Cleanup(release) // before the server stops, which waits for its handlers
		<-h.arrived        // r-1's first upload holds 600 KiB
		second := make(chan error, 1)
		go func() {
			_, err := b.sendUpload(t, renderer, uploadMeta(g[1], g[1].GetLease().GetToken(), "r-1"), chunk(big))
			second <- err
		}()
		select {
		case err := <-second:
			wantError(t, err, codes.ResourceExhausted, reasonUploadBudget)
		case <-h.arrived:
			t.Fatalf("r-1's second upload got its 600 KiB past its credential's share of 1 MiB")
		}
		og := other.GetLeases()[0]
		go func() {
			_, err := b.sendUpload(t, otherToken, uploadMeta(og, og.GetLease().GetToken(), "r-2"), chunk(big))
			done <- err
		}()
		<-h.arrived // the other credential's upload got its bytes
		release()
		for range 2 {
			if err := <-done; err != nil {
				t.Errorf("an upload within its credential's share: %v", err)
			}
		}
	})

	t.Run("A buffer grows by doubling and is charged for what it allocates", func(t *testing.T) {
		t.Parallel()
		u := newUploads(100, 80)
		buf, err := u.begin(engine.LeaseRef{Job: 1, Token: 1}, "cred-a")
		if err != nil {
			t.Fatal(err)
		}
		for i, want := range []int64{10, 20, 40, 40, 80} {
			if err := buf.add(bytes.Repeat([]byte{1}, 10), 80); err != nil {
				t.Fatalf("chunk %d: %v", i, err)
			}
			if got := u.inUse(); got != want || int64(cap(buf.content)) != want {
				t.Errorf("after chunk %d: reserved %d, capacity %d; want %d", i, got, cap(buf.content), want)
			}
		}
		other, err := u.begin(engine.LeaseRef{Job: 2, Token: 2}, "cred-b")
		if err != nil {
			t.Fatal(err)
		}
		if err := other.add(make([]byte, 21), 80); err != errUploadBudget {
			t.Errorf("21 bytes past the 20 left = %v, want the budget refusal", err)
		}
		other.end()
		buf.end()
		if got := u.inUse(); got != 0 {
			t.Errorf("reserved after both ended: %d", got)
		}
	})
}
