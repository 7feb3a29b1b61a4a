package edge

import (
	"context"
	"testing"
	"time"

	"github.com/leasehold/leasehold/client/reason"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestStreamCaps checks the per-principal stream caps over real gRPC.
func TestStreamCaps(t *testing.T) {
	t.Parallel()
	caps := []StreamCap{
		{Name: "watch", Methods: []string{leaseholdv1.JobService_WatchBatch_FullMethodName}, PerPrincipal: 2},
		{Name: "renderer", Methods: []string{leaseholdv1.RendererService_Heartbeat_FullMethodName, leaseholdv1.RendererService_UploadArtifact_FullMethodName}, PerPrincipal: 1},
	}
	b := setup(t, caps)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	jc := leaseholdv1.NewJobServiceClient(b.conn)
	rc := leaseholdv1.NewRendererServiceClient(b.conn)

	// watch opens a WatchBatch stream and returns once the handler runs
	// (its first message arrived), or the refusal.
	watch := func(ctx context.Context, token string) (context.CancelFunc, error) {
		ctx, cancel := context.WithCancel(as(ctx, token))
		s, err := jc.WatchBatch(ctx, &leaseholdv1.WatchBatchRequest{BatchId: "b-1"})
		if err == nil {
			_, err = s.Recv()
		}
		if err != nil {
			cancel()
			return nil, err
		}
		return cancel, nil
	}
	// awaitEnd waits until a stream of method has left the interceptors.
	awaitEnd := func(method string) {
		t.Helper()
		select {
		case got := <-b.ended:
			if got != method {
				t.Fatalf("ended %s, want %s", got, method)
			}
		case <-ctx.Done():
			t.Fatalf("stream of %s never ended", method)
		}
	}

	stop1, err := watch(ctx, "dev-alpha")
	if err != nil {
		t.Fatal(err)
	}
	stop2, err := watch(ctx, "dev-alpha")
	if err != nil {
		t.Fatal(err)
	}
	defer stop2()

	t.Run("A principal at its cap is refused RESOURCE_EXHAUSTED TOO_MANY_STREAMS with a QuotaFailure", func(t *testing.T) {
		_, err := watch(ctx, "dev-alpha")
		if got := status.Code(err); got != codes.ResourceExhausted {
			t.Fatalf("third watch = %v, want ResourceExhausted", err)
		}
		awaitEnd(leaseholdv1.JobService_WatchBatch_FullMethodName)
		info, _, quota := details(err)
		if info.GetReason() != string(reason.TooManyStreams) || info.GetDomain() != ErrorDomain || info.GetMetadata()["principal"] != "dev-alpha" {
			t.Errorf("ErrorInfo = %v", info)
		}
		if v := quota.GetViolations(); len(v) != 1 || v[0].GetSubject() != "principal:dev-alpha" {
			t.Errorf("QuotaFailure = %v, want one violation for principal:dev-alpha", quota)
		}
	})
	t.Run("Another principal has a cap of its own", func(t *testing.T) {
		stop, err := watch(ctx, "dev-beta")
		if err != nil {
			t.Fatalf("dev-beta's watch: %v", err)
		}
		stop()
		awaitEnd(leaseholdv1.JobService_WatchBatch_FullMethodName)
	})
	t.Run("A closed stream frees its place", func(t *testing.T) {
		stop1()
		awaitEnd(leaseholdv1.JobService_WatchBatch_FullMethodName)
		if got := b.caps.Open("dev-alpha", "watch"); got != 1 {
			t.Errorf("open watch streams = %d, want 1", got)
		}
		stop, err := watch(ctx, "dev-alpha")
		if err != nil {
			t.Fatalf("watch after one closed: %v", err)
		}
		stop()
		awaitEnd(leaseholdv1.JobService_WatchBatch_FullMethodName)
	})
	t.Run("The methods of one cap count together", func(t *testing.T) {
		rctx, rcancel := context.WithCancel(as(ctx, "dev-renderer"))
		defer rcancel()
		hb, err := rc.Heartbeat(rctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := hb.Send(&leaseholdv1.HeartbeatRequest{RendererId: "r-1"}); err != nil {
			t.Fatal(err)
		}
		if _, err := hb.Recv(); err != nil {
			t.Fatalf("heartbeat: %v", err)
		}
		up, err := rc.UploadArtifact(as(ctx, "dev-renderer"))
		if err != nil {
			t.Fatal(err)
		}
		_, err = up.CloseAndRecv()
		if got := status.Code(err); got != codes.ResourceExhausted {
			t.Errorf("upload beside a heartbeat stream = %v, want ResourceExhausted", err)
		}
		awaitEnd(leaseholdv1.RendererService_UploadArtifact_FullMethodName)
		rcancel()
		awaitEnd(leaseholdv1.RendererService_Heartbeat_FullMethodName)
	})
	t.Run("Unary calls are not counted", func(t *testing.T) {
		if _, err := jc.GetJob(as(ctx, "dev-alpha"), &leaseholdv1.GetJobRequest{JobId: "j-1"}); err != nil {
			t.Errorf("GetJob at the watch cap: %v", err)
		}
	})
}

// TestDefaultStreamCaps checks the documented defaults.
func TestDefaultStreamCaps(t *testing.T) {
	t.Parallel()
	want := map[string]int{
		leaseholdv1.JobService_WatchBatch_FullMethodName:          DefaultWatchStreams,
		leaseholdv1.RendererService_Session_FullMethodName:        DefaultRendererStreams,
		leaseholdv1.RendererService_Heartbeat_FullMethodName:      DefaultRendererStreams,
		leaseholdv1.RendererService_UploadArtifact_FullMethodName: DefaultRendererStreams,
		leaseholdv1.OverviewService_WatchOverview_FullMethodName:  DefaultOverviewStreams,
		leaseholdv1.OperatorService_Backup_FullMethodName:         DefaultBackupStreams,
	}
	s := NewStreamCaps(DefaultStreamCaps()...)
	if len(s.byMethod) != len(want) {
		t.Errorf("capped methods = %d, want %d", len(s.byMethod), len(want))
	}
	for m, n := range want {
		if c := s.byMethod[m]; c == nil || c.PerPrincipal != n {
			t.Errorf("cap of %s = %+v, want %d per principal", m, c, n)
		}
	}
	if DefaultWatchStreams != 64 || DefaultRendererStreams != 256 {
		t.Errorf("defaults = %d, %d; want 64, 256", DefaultWatchStreams, DefaultRendererStreams)
	}
}
