package coordinator

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/leasehold/leasehold/client"
	"github.com/leasehold/leasehold/client/reason"
	"github.com/leasehold/leasehold/coordinator/internal/artifacts"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
)

// downStore answers every call ErrUnavailable while down is set, as an
// unreachable store does.
type downStore struct {
	artifacts.Store
	down atomic.Bool
}

func (d *downStore) wrap(st artifacts.Store) artifacts.Store {
	d.Store = st
	return d
}

func (d *downStore) err(what string) error {
	if d.down.Load() {
		return fmt.Errorf("%s: %w: connection refused", what, artifacts.ErrUnavailable)
	}
	return nil
}

func (d *downStore) Put(ctx context.Context, k artifacts.Key, b []byte) error {
	if err := d.err("put"); err != nil {
		return err
	}
	return d.Store.Put(ctx, k, b)
}

func (d *downStore) Stat(ctx context.Context, k artifacts.Key) (artifacts.Info, error) {
	if err := d.err("stat"); err != nil {
		return artifacts.Info{}, err
	}
	return d.Store.Stat(ctx, k)
}

func (d *downStore) Check(ctx context.Context) error {
	if err := d.err("check"); err != nil {
		return err
	}
	return d.Store.Check(ctx)
}

// TestArtifactStoreOutage: while the store does not answer, a completion
// of a stored preview is answered UNAVAILABLE ARTIFACT_STORE_UNAVAILABLE and
// changes nothing, the health entry says NOT_SERVING and the gauge 1; the
// probe sees the store answer again, and the same completion then
// succeeds.
func TestArtifactStoreOutage(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	store := &downStore{}
	b := setupSweep(t, time.Now(), store.wrap)
	hc := healthpb.NewHealthClient(b.conn)
	entry := func(t *testing.T) healthpb.HealthCheckResponse_ServingStatus {
		t.Helper()
		resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: ArtifactStoreHealthName})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetStatus()
	}
	if got := entry(t); got != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("%s at start = %v, want SERVING", ArtifactStoreHealthName, got)
	}
	g := b.submitAndGrant(ctx, t, "outage.pdf")
	content := preview(5, 1000)
	success := &leaseholdv1.CompleteSuccess{Content: content, ContentType: "image/png"}

	store.down.Store(true)
	err := b.complete(ctx, g, success)
	if status.Code(err) != codes.Unavailable || reasonOf(err) != reason.ArtifactStoreUnavailable.String() {
		t.Fatalf("a completion while the store is down: %v, want UNAVAILABLE ARTIFACT_STORE_UNAVAILABLE", err)
	}
	j, err := b.c.jobs.GetJob(bearer(ctx, alphaToken), &leaseholdv1.GetJobRequest{JobId: g.GetJobId()})
	if err != nil || j.GetJob().GetPhase() != leaseholdv1.Phase_PHASE_LEASED {
		t.Fatalf("the job = %v, %v; want it still LEASED", j.GetJob().GetPhase(), err)
	}
	if got := entry(t); got != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("%s while the store is down = %v, want NOT_SERVING", ArtifactStoreHealthName, got)
	}
	if got := b.metric(t, "leasehold_artifact_store_degraded"); got != "1" {
		t.Errorf("leasehold_artifact_store_degraded = %s, want 1", got)
	}
	b.testBundle.c.storeProbe.probe()
	if got := entry(t); got != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("%s after a probe of a store still down = %v, want NOT_SERVING", ArtifactStoreHealthName, got)
	}

	store.down.Store(false)
	b.testBundle.c.storeProbe.probe()
	if got := entry(t); got != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("%s once the store answers = %v, want SERVING", ArtifactStoreHealthName, got)
	}
	if got := b.metric(t, "leasehold_artifact_store_degraded"); got != "0" {
		t.Errorf("leasehold_artifact_store_degraded = %s, want 0", got)
	}
	if err := b.complete(ctx, g, success); err != nil {
		t.Fatalf("the same completion once the store answers: %v", err)
	}
	if got := b.c.download(ctx, t, g.GetJobId()); string(got) != string(content) {
		t.Errorf("the preview is %d bytes, not the %d completed", len(got), len(content))
	}
}

// metric returns the value of the coordinator's unlabelled metric name.
func (b *sweepBundle) metric(t *testing.T, name string) string {
	t.Helper()
	resp, err := http.Get("http://" + b.testBundle.c.metricsLis.Addr().String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(body)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+" "); ok {
			return v
		}
	}
	t.Fatalf("no %s in the metrics", name)
	return ""
}

// TestBackupNamesItsObjects: a backup names the objects of the artifact
// store its pointers need (it holds inline previews only), and a restore
// says which previews it cannot bring back because their objects are gone.
func TestBackupNamesItsObjects(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	objects := t.TempDir()
	tokens := testPrincipals(t)
	b := setup(t, Config{TokensFile: tokens, Artifacts: ArtifactConfig{Store: "file://" + objects, InlineBytes: 64}})
	c := b.clients()
	docs := []*leaseholdv1.Document{
		{Name: "a.pdf", ContentType: "application/pdf", Content: []byte("%PDF a")},
		{Name: "b.pdf", ContentType: "application/pdf", Content: []byte("%PDF b")},
		{Name: "c.pdf", ContentType: "application/pdf", Content: []byte("%PDF c")},
	}
	if _, err := c.jobs.SubmitBatch(bearer(ctx, alphaToken), &leaseholdv1.SubmitBatchRequest{Team: "alpha", RequestId: "r", Documents: docs}); err != nil {
		t.Fatal(err)
	}
	grants := c.grant(ctx, t, 3)
	contents := [][]byte{preview(6, 1000), preview(7, 1000), []byte("small")}
	for i, g := range grants {
		_, err := c.rend.Complete(bearer(ctx, rendererToken), &leaseholdv1.CompleteRequest{JobId: g.GetJobId(), Token: g.GetLease().GetToken(),
			RendererId: "r-1", Outcome: &leaseholdv1.CompleteRequest_Success{Success: &leaseholdv1.CompleteSuccess{Content: contents[i], ContentType: "image/png"}}})
		if err != nil {
			t.Fatal(err)
		}
	}
	cl, err := client.Dial(b.addr, client.WithToken(backupToken))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	path := filepath.Join(t.TempDir(), "backup.db")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	info, err := cl.Backup(ctx, f)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatalf("Backup: %v", err)
	}
	keys := func(cs ...[]byte) []string {
		var out []string
		for _, c := range cs {
			out = append(out, artifacts.Key{Team: "alpha", Digest: artifacts.Digest(c)}.String())
		}
		slices.Sort(out)
		return out
	}
	if got := slices.Sorted(slices.Values(info.Objects)); !slices.Equal(got, keys(contents[0], contents[1])) {
		t.Errorf("the backup names objects %v, want the two stored previews' %v", got, keys(contents[0], contents[1]))
	}
	if err := b.c.Close(); err != nil {
		t.Fatal(err)
	}
	// One object is lost with the store; the other, and the inline
	// preview in the backup, come back.
	lost := artifacts.Key{Team: "alpha", Digest: artifacts.Digest(contents[1])}
	if err := os.Remove(filepath.Join(objects, lost.String())); err != nil {
		t.Fatal(err)
	}
	restored := filepath.Join(t.TempDir(), "restored")
	res, err := Restore(ctx, restored, path, "file://"+objects, time.Now())
	if err != nil {
		t.Fatalf("Restore: %v", err)
	}
	if res.Objects != 2 || res.ObjectsErr != nil || len(res.MissingObjects) != 1 || res.MissingObjects[0].Key != lost.String() ||
		!slices.Equal(res.MissingObjects[0].Jobs, []string{grants[1].GetJobId()}) {
		t.Errorf("Restore = %d objects, missing %+v (%v); want 2, of which %s of job %s missing", res.Objects, res.MissingObjects, res.ObjectsErr,
			lost, grants[1].GetJobId())
	}
	rep, err := Check(ctx, restored, "file://"+objects)
	if err != nil {
		t.Fatal(err)
	}
	if rep.OK() || rep.StoredPointers != 2 || rep.Objects != 2 || len(rep.MissingObjects) != 1 || rep.MissingObjects[0].Key != lost.String() {
		t.Errorf("Check = %d pointers to %d objects, missing %+v, problems %q; want 2 to 2, %s missing, and a problem",
			rep.StoredPointers, rep.Objects, rep.MissingObjects, rep.Problems, lost)
	}
}
