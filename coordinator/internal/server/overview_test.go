package server

import (
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/engine"
	"github.com/leasehold/leasehold/coordinator/internal/overview"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// publishEveryGroup makes the writer publish the overview after every
// group, so that an answer shows the calls before it, and keeps leases for
// an hour, so that moving the clock expires none.
func publishEveryGroup(o *options) {
	o.engine = func(c *engine.Config) {
		c.OverviewEvery = time.Nanosecond
		c.LeaseTTL = time.Hour
	}
}

// overviewWorld is alpha with one SUCCEEDED, one FAILED and one LEASED job
// (to r-1) and two QUEUED a minute later; beta with one LEASED and one
// QUEUED. The batches are b-1 (alpha), b-2 (beta), b-3 (alpha, a minute
// later).
func overviewWorld(t *testing.T) *testBundle {
	t.Helper()
	b := setup(t, publishEveryGroup)
	b.submit(t, alpha, "alpha", "a-1", doc("a1.pdf"), doc("a2.pdf"), doc("a3.pdf"))
	alphaLeases := b.acquire(t, 3)
	b.submit(t, beta, "beta", "b-1", doc("b1.pdf"), doc("b2.pdf"))
	if len(alphaLeases) != 3 || len(b.acquire(t, 1)) != 1 {
		t.Fatal("want three alpha leases and one beta lease")
	}
	b.clock.Advance(time.Minute)
	b.submit(t, alpha, "alpha", "a-2", doc("a4.pdf"), doc("a5.pdf"))
	b.succeed(t, alphaLeases[0], []byte("png"))
	if _, err := b.rend.Complete(as(t, renderer), failure(alphaLeases[1], leaseholdv1.FailureClass_FAILURE_CLASS_INVALID_DOCUMENT)); err != nil {
		t.Fatal(err)
	}
	return b
}

func teamNames(o *leaseholdv1.Overview) []string {
	var names []string
	for _, t := range o.GetTeams() {
		names = append(names, t.GetTeam())
	}
	return names
}

// TestOverviewScope checks that every caller gets the same views restricted
// to the teams it sees, through the same rules as the job listings.
func TestOverviewScope(t *testing.T) {
	t.Parallel()
	b := overviewWorld(t)
	for _, tc := range []struct {
		name, token, team string
		want              []string
		code              codes.Code
		reason            string
	}{
		{name: "an operator of every team sees every team", token: operator, want: []string{"alpha", "beta"}},
		{name: "a scoped operator sees its scope", token: opAlpha, want: []string{"alpha"}},
		{name: "a submitter sees its team", token: beta, want: []string{"beta"}},
		{name: "a team may be asked for by name", token: operator, team: "beta", want: []string{"beta"}},
		{name: "a scoped operator may not name another team", token: opAlpha, team: "beta", code: codes.PermissionDenied, reason: reasonPermissionDenied},
		{name: "a submitter may not name another team", token: alpha, team: "beta", code: codes.PermissionDenied, reason: reasonPermissionDenied},
		{name: "a renderer may not look", token: renderer, code: codes.PermissionDenied, reason: reasonPermissionDenied},
		{name: "no token is unauthenticated", token: "", code: codes.Unauthenticated, reason: reasonUnauthenticated},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := b.ov.GetOverview(as(t, tc.token), &leaseholdv1.GetOverviewRequest{Team: tc.team})
			if tc.code != codes.OK {
				wantError(t, err, tc.code, tc.reason)
				_, err = b.ov.ListBatches(as(t, tc.token), &leaseholdv1.ListBatchesRequest{Team: tc.team})
				wantError(t, err, tc.code, tc.reason)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmpDiff(tc.want, teamNames(resp.GetOverview())); diff != "" {
				t.Errorf("teams (-want +got):\n%s", diff)
			}
			batches, err := b.ov.ListBatches(as(t, tc.token), &leaseholdv1.ListBatchesRequest{Team: tc.team})
			if err != nil {
				t.Fatal(err)
			}
			seen := map[string]bool{}
			for _, bt := range batches.GetBatches() {
				seen[bt.GetTeam()] = true
			}
			for team := range seen {
				if !strings.Contains(strings.Join(tc.want, ","), team) {
					t.Errorf("ListBatches showed a batch of %s to %s", team, tc.token)
				}
			}
			renderers, err := b.ov.ListRenderers(as(t, tc.token), &leaseholdv1.ListRenderersRequest{})
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range renderers.GetRenderers() {
				for _, l := range r.GetLeases() {
					if tc.team == "" && !strings.Contains(strings.Join(tc.want, ","), l.GetTeam()) {
						t.Errorf("ListRenderers showed a lease of %s to %s", l.GetTeam(), tc.token)
					}
				}
			}
		})
	}
}

// TestOverviewFigures checks the figures against what the world did.
func TestOverviewFigures(t *testing.T) {
	t.Parallel()
	b := overviewWorld(t)
	b.clock.Advance(30 * time.Second)

	resp, err := b.ov.GetOverview(as(t, operator), &leaseholdv1.GetOverviewRequest{Team: "alpha"})
	if err != nil {
		t.Fatal(err)
	}
	o := resp.GetOverview()
	if len(o.GetTeams()) != 1 {
		t.Fatalf("teams = %v, want alpha", teamNames(o))
	}
	a := o.GetTeams()[0]
	want := map[leaseholdv1.Phase]uint32{leaseholdv1.Phase_PHASE_QUEUED: 2, leaseholdv1.Phase_PHASE_LEASED: 1,
		leaseholdv1.Phase_PHASE_SUCCEEDED: 1, leaseholdv1.Phase_PHASE_FAILED: 1}
	got := map[leaseholdv1.Phase]uint32{}
	for _, c := range a.GetCounts() {
		got[c.GetPhase()] = c.GetCount()
	}
	if diff := cmpDiff(want, got); diff != "" {
		t.Errorf("alpha counts (-want +got):\n%s", diff)
	}
	if a.GetQueueDepth() != 2 || a.GetLeasesInFlight() != 1 {
		t.Errorf("alpha depth %d, in flight %d, want 2 and 1", a.GetQueueDepth(), a.GetLeasesInFlight())
	}
	// The queued jobs are a-2's, submitted a minute after the start.
	if got, want := a.GetOldestQueuedAge().AsDuration(), 30*time.Second; got != want {
		t.Errorf("oldest queued age = %v, want %v", got, want)
	}
	if !o.GetAsOf().AsTime().Equal(b.clock.Now()) {
		t.Errorf("as_of = %v, want the engine's clock %v", o.GetAsOf().AsTime(), b.clock.Now())
	}
	if len(a.GetMinutes()) != overview.RingMinutes {
		t.Errorf("%d minutes, want %d", len(a.GetMinutes()), overview.RingMinutes)
	}
	tp := a.GetThroughput()
	if len(tp) != 4 || tp[1].GetWindow().AsDuration() != 5*time.Minute {
		t.Fatalf("throughput windows = %v, want 1, 5, 15 and 60 minutes", tp)
	}
	if w := tp[1]; w.GetSucceeded() != 1 || w.GetFailed() != 1 || w.GetFailureRate() != 0.5 || w.GetPerMinute() != 0.4 {
		t.Errorf("5-minute window = %v, want 1 succeeded, 1 failed, rate 0.5, 0.4 per minute", w)
	}

	renderers, err := b.ov.ListRenderers(as(t, opAlpha), &leaseholdv1.ListRenderersRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(renderers.GetRenderers()) != 1 {
		t.Fatalf("renderers = %v, want r-1", renderers.GetRenderers())
	}
	r := renderers.GetRenderers()[0]
	if r.GetRendererId() != "r-1" || r.GetCapacity() != 8 || len(r.GetLeases()) != 1 || r.GetLeases()[0].GetTeam() != "alpha" {
		t.Errorf("r-1 as a scoped operator sees it = %v, want capacity 8 with its one alpha lease", r)
	}

	t.Run("Answers carry no document data", func(t *testing.T) {
		text := prototext.Format(resp) + prototext.Format(renderers)
		batches, err := b.ov.ListBatches(as(t, alpha), &leaseholdv1.ListBatchesRequest{})
		if err != nil {
			t.Fatal(err)
		}
		text += prototext.Format(batches)
		for _, secret := range []string{secretURI, secretContent, "a1.pdf", "a4.pdf"} {
			if strings.Contains(text, secret) {
				t.Errorf("an overview answer contains %q", secret)
			}
		}
	})
}

func TestListBatchesRequests(t *testing.T) {
	t.Parallel()
	b := overviewWorld(t)
	list := func(t *testing.T, token string, req *leaseholdv1.ListBatchesRequest) []string {
		t.Helper()
		resp, err := b.ov.ListBatches(as(t, token), req)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, bt := range resp.GetBatches() {
			ids = append(ids, bt.GetId())
			if len(bt.GetJobIds()) != 0 {
				t.Errorf("batch %s lists its job ids", bt.GetId())
			}
		}
		return ids
	}
	start := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, tc := range []struct {
		name  string
		token string
		req   *leaseholdv1.ListBatchesRequest
		want  []string
	}{
		{"every batch newest first", operator, &leaseholdv1.ListBatchesRequest{}, []string{"b-3", "b-2", "b-1"}},
		{"one team", operator, &leaseholdv1.ListBatchesRequest{Team: "alpha"}, []string{"b-3", "b-1"}},
		{"a submitter's own", alpha, &leaseholdv1.ListBatchesRequest{}, []string{"b-3", "b-1"}},
		{"running ones", alpha, &leaseholdv1.ListBatchesRequest{State: leaseholdv1.BatchState_BATCH_STATE_RUNNING}, []string{"b-3", "b-1"}},
		{"done ones", alpha, &leaseholdv1.ListBatchesRequest{State: leaseholdv1.BatchState_BATCH_STATE_DONE}, nil},
		{"created after the first minute", operator, &leaseholdv1.ListBatchesRequest{CreatedAfter: timestamppb.New(start.Add(time.Minute))}, []string{"b-3"}},
		{"created before the first minute", operator, &leaseholdv1.ListBatchesRequest{CreatedBefore: timestamppb.New(start.Add(time.Minute))}, []string{"b-2", "b-1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmpDiff(tc.want, list(t, tc.token, tc.req)); diff != "" {
				t.Errorf("batches (-want +got):\n%s", diff)
			}
		})
	}

	t.Run("Pages follow one another", func(t *testing.T) {
		var got []string
		req := &leaseholdv1.ListBatchesRequest{PageSize: 1}
		for range 5 {
			resp, err := b.ov.ListBatches(as(t, operator), req)
			if err != nil {
				t.Fatal(err)
			}
			for _, bt := range resp.GetBatches() {
				got = append(got, bt.GetId())
			}
			if resp.GetNextPageToken() == "" {
				break
			}
			req.PageToken = resp.GetNextPageToken()
		}
		if diff := cmpDiff([]string{"b-3", "b-2", "b-1"}, got); diff != "" {
			t.Errorf("paged batches (-want +got):\n%s", diff)
		}
	})

	t.Run("Malformed requests are refused", func(t *testing.T) {
		_, err := b.ov.ListBatches(as(t, operator), &leaseholdv1.ListBatchesRequest{State: 7})
		wantError(t, err, codes.InvalidArgument, reasonInvalidBatchState)
		_, err = b.ov.ListBatches(as(t, operator), &leaseholdv1.ListBatchesRequest{PageSize: 1001})
		wantError(t, err, codes.InvalidArgument, reasonInvalidPageSize)
		_, err = b.ov.ListBatches(as(t, operator), &leaseholdv1.ListBatchesRequest{PageToken: "nope"})
		wantError(t, err, codes.InvalidArgument, reasonInvalidPageToken)
	})
}

// TestWatchOverview checks the stream: an overview at once, another after
// a change, the interval's bounds, and the end at shutdown.
func TestWatchOverview(t *testing.T) {
	t.Parallel()

	t.Run("A change is sent without waiting for the interval", func(t *testing.T) {
		t.Parallel()
		b := setup(t, publishEveryGroup)
		ctx := as(t, alpha)
		stream, err := b.ov.WatchOverview(ctx, &leaseholdv1.WatchOverviewRequest{Interval: durationpb.New(time.Minute), IncludeRenderers: true})
		if err != nil {
			t.Fatal(err)
		}
		first, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if len(first.GetOverview().GetTeams()) != 0 {
			t.Fatalf("first message = %v, want no team yet", first)
		}
		b.submit(t, alpha, "alpha", "w-1", doc("a.pdf"))
		for {
			msg, err := stream.Recv()
			if err != nil {
				t.Fatal(err)
			}
			if ts := msg.GetOverview().GetTeams(); len(ts) == 1 && ts[0].GetQueueDepth() == 1 {
				break
			}
		}
	})

	t.Run("The interval is bounded", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		for _, d := range []time.Duration{time.Millisecond, 2 * time.Minute, -time.Second} {
			stream, err := b.ov.WatchOverview(as(t, operator), &leaseholdv1.WatchOverviewRequest{Interval: durationpb.New(d)})
			if err == nil {
				_, err = stream.Recv()
			}
			wantError(t, err, codes.InvalidArgument, reasonInvalidInterval)
		}
	})

	t.Run("A zero interval is the default", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		stream, err := b.ov.WatchOverview(as(t, operator), &leaseholdv1.WatchOverviewRequest{Interval: durationpb.New(0)})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := stream.Recv(); err != nil {
			t.Errorf("first message with a zero interval: %v", err)
		}
	})

	t.Run("A renderer may not watch", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		stream, err := b.ov.WatchOverview(as(t, renderer), &leaseholdv1.WatchOverviewRequest{})
		if err == nil {
			_, err = stream.Recv()
		}
		wantError(t, err, codes.PermissionDenied, reasonPermissionDenied)
	})

	t.Run("Shutdown ends the stream UNAVAILABLE", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		stream, err := b.ov.WatchOverview(as(t, operator), &leaseholdv1.WatchOverviewRequest{Interval: durationpb.New(time.Minute)})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := stream.Recv(); err != nil {
			t.Fatal(err)
		}
		b.services.Shutdown()
		_, err = stream.Recv()
		wantError(t, err, codes.Unavailable, reasonShuttingDown)
	})
}
