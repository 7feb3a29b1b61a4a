package client_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/leasehold/leasehold/client"
	"github.com/leasehold/leasehold/client/internal/fakeserver"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
)

// fastFollow retries at once-ish so that tests do not wait on backoff.
var fastFollow = client.FollowOptions{MinBackoff: time.Millisecond, MaxBackoff: 4 * time.Millisecond}

// followBundle is a fake with one batch b-1 of three jobs (j-2 fails) that
// lease before they end, and a client dialed to it.
type followBundle struct {
	fake     *fakeserver.Server
	endpoint *fakeserver.Endpoint
	client   *client.Client
}

func setupFollow(t *testing.T) *followBundle {
	t.Helper()
	fake := fakeserver.New()
	fake.LeaseFirst = true
	ep := fakeserver.NewEndpoint(t, fake)
	ep.Start()
	c, err := client.Dial(fakeserver.Target, client.WithDialOptions(ep.DialOption()))
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	docs := []*leaseholdv1.Document{{Name: "a.pdf", Content: []byte("a")}, {Name: "b-fail.pdf", Content: []byte("b")}, {Name: "c.pdf", Content: []byte("c")}}
	if _, err := c.SubmitBatch(t.Context(), "team", "r", docs, nil); err != nil {
		t.Fatalf("SubmitBatch: %v", err)
	}
	return &followBundle{fake: fake, endpoint: ep, client: c}
}

// updateLine renders an update as "j-1 LEASED #1", or "j-1 QUEUED" for a snapshot.
func updateLine(u client.Update) string {
	s := u.JobID + " " + strings.TrimPrefix(u.Phase.String(), "PHASE_")
	if u.Event != nil {
		s += fmt.Sprintf(" #%d", u.Event.GetSeq())
	}
	return s
}

// follow collects every update of b-1 and the error that ended the iteration.
func follow(ctx context.Context, c *client.Client, opts client.FollowOptions) ([]string, error) {
	var lines []string
	for u, err := range c.FollowBatch(ctx, "b-1", opts) {
		if err != nil {
			return lines, err
		}
		lines = append(lines, updateLine(u))
	}
	return lines, nil
}

// allUpdates is what following b-1 yields when nothing goes wrong.
var allUpdates = []string{
	"j-1 QUEUED", "j-2 QUEUED", "j-3 QUEUED",
	"j-1 LEASED #1", "j-2 LEASED #1", "j-3 LEASED #1",
	"j-1 SUCCEEDED #2", "j-2 FAILED #2", "j-3 SUCCEEDED #2",
}

// breakOnce ends watch call 0 with err before its message msg.
func breakOnce(msg int, err error) func(context.Context, int, int) error {
	return func(_ context.Context, call, m int) error {
		if call == 0 && m == msg {
			return err
		}
		return nil
	}
}

func TestFollowBatchResumesExactlyOnce(t *testing.T) {
	t.Parallel()
	unavailable := status.Error(codes.Unavailable, "coordinator restarting")
	slow := func() error {
		st, _ := status.New(codes.ResourceExhausted, "fell behind").WithDetails(&errdetails.ErrorInfo{Reason: "SLOW_WATCHER", Domain: client.ErrorDomain})
		return st.Err()
	}()
	tests := []struct {
		name    string
		batched bool
		msg     int // the message before which call 0 ends
		err     error
		// wantResume is the resume list of the second call.
		wantResume []*leaseholdv1.JobCursor
		// want is what is yielded; nil means allUpdates.
		want []string
	}{
		{"a stream ended by UNAVAILABLE resumes after the last event of each job", false, 7, unavailable,
			[]*leaseholdv1.JobCursor{{JobId: "j-1", Seq: 2}, {JobId: "j-2", Seq: 1}, {JobId: "j-3", Seq: 1}}, nil},
		{"a stream ended by SLOW_WATCHER resumes", false, 7, slow,
			[]*leaseholdv1.JobCursor{{JobId: "j-1", Seq: 2}, {JobId: "j-2", Seq: 1}, {JobId: "j-3", Seq: 1}}, nil},
		{"a stream that ends with OK before the batch is done resumes", false, 6, fakeserver.EndStream,
			[]*leaseholdv1.JobCursor{{JobId: "j-1", Seq: 1}, {JobId: "j-2", Seq: 1}, {JobId: "j-3", Seq: 1}}, nil},
		// Batched, two updates a message: [q1 q2] [q3 l1] [l2 l3] [t1 t2] [t3].
		{"batched messages resume after the last event of each job", true, 4, unavailable,
			[]*leaseholdv1.JobCursor{{JobId: "j-1", Seq: 2}, {JobId: "j-2", Seq: 2}, {JobId: "j-3", Seq: 1}}, nil},
		{"batched messages broken between leases resume, with new snapshots for jobs without events", true, 2, unavailable,
			[]*leaseholdv1.JobCursor{{JobId: "j-1", Seq: 1}},
			[]string{"j-1 QUEUED", "j-2 QUEUED", "j-3 QUEUED", "j-1 LEASED #1", "j-1 SUCCEEDED #2", "j-2 FAILED", "j-3 SUCCEEDED"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setupFollow(t)
			b.fake.WatchFault = breakOnce(tt.msg, tt.err)
			opts := fastFollow
			opts.Batched = tt.batched
			var reconnects []error
			opts.OnReconnect = func(err error, _ time.Duration) { reconnects = append(reconnects, err) }

			got, err := follow(t.Context(), b.client, opts)
			if err != nil {
				t.Fatalf("FollowBatch ended with %v", err)
			}
			want := tt.want
			if want == nil {
				want = allUpdates
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("updates mismatch (-want +got):\n%s", diff)
			}
			watches := b.fake.Watches()
			if len(watches) != 2 {
				t.Fatalf("%d watch calls, want 2", len(watches))
			}
			if diff := cmp.Diff(tt.wantResume, watches[1].GetResume(), protocmp.Transform()); diff != "" {
				t.Errorf("resume cursors mismatch (-want +got):\n%s", diff)
			}
			if watches[1].GetBatched() != tt.batched {
				t.Errorf("second call batched = %v, want %v", watches[1].GetBatched(), tt.batched)
			}
			if len(reconnects) != 1 {
				t.Errorf("OnReconnect called %d times, want once", len(reconnects))
			}
		})
	}
}

func TestFollowBatchSurvivesACoordinatorRestart(t *testing.T) {
	t.Parallel()
	b := setupFollow(t)
	// Call 0 holds back from its eighth message on; the coordinator is
	// restarted once the client has read the first seven, so that what was
	// sent was also received.
	b.fake.WatchFault = func(ctx context.Context, call, msg int) error {
		if call == 0 && msg == 7 {
			<-ctx.Done()
			return ctx.Err()
		}
		return nil
	}
	var got []string
	for u, err := range b.client.FollowBatch(t.Context(), "b-1", fastFollow) {
		if err != nil {
			t.Fatalf("FollowBatch ended with %v", err)
		}
		got = append(got, updateLine(u))
		if len(got) == 7 {
			b.endpoint.Stop() // ends the stream: the client sees UNAVAILABLE
			b.endpoint.Start()
		}
	}
	if diff := cmp.Diff(allUpdates, got); diff != "" {
		t.Errorf("updates mismatch (-want +got):\n%s", diff)
	}
	want := []*leaseholdv1.JobCursor{{JobId: "j-1", Seq: 2}, {JobId: "j-2", Seq: 1}, {JobId: "j-3", Seq: 1}}
	watches := b.fake.Watches()
	if diff := cmp.Diff(want, watches[len(watches)-1].GetResume(), protocmp.Transform()); diff != "" {
		t.Errorf("resume cursors of the last watch mismatch (-want +got):\n%s", diff)
	}
}

func TestFollowBatchSnapshots(t *testing.T) {
	t.Parallel()

	t.Run("a job seen only by its snapshot is shown again only if its phase moved", func(t *testing.T) {
		t.Parallel()
		b := setupFollow(t)
		// Call 0 sends the three snapshots and j-1's and j-2's LEASED events.
		b.fake.WatchFault = breakOnce(5, status.Error(codes.Unavailable, "gone"))
		got, err := follow(t.Context(), b.client, fastFollow)
		if err != nil {
			t.Fatalf("FollowBatch ended with %v", err)
		}
		want := []string{
			"j-1 QUEUED", "j-2 QUEUED", "j-3 QUEUED", "j-1 LEASED #1", "j-2 LEASED #1",
			"j-1 SUCCEEDED #2", "j-2 FAILED #2", "j-3 SUCCEEDED", // j-3 had no cursor: its new snapshot
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("updates mismatch (-want +got):\n%s", diff)
		}
	})

	t.Run("an unchanged snapshot after a reconnect is not yielded again", func(t *testing.T) {
		t.Parallel()
		b := setupFollow(t)
		b.fake.LeaseFirst = false
		b.fake.AddJob(&leaseholdv1.Job{Id: "j-9", BatchId: "b-2", Team: "team", Phase: leaseholdv1.Phase_PHASE_SUCCEEDED})
		b.fake.AddJob(&leaseholdv1.Job{Id: "j-10", BatchId: "b-2", Team: "team", Phase: leaseholdv1.Phase_PHASE_QUEUED})
		b.fake.WatchFault = breakOnce(1, status.Error(codes.Unavailable, "gone")) // after j-9's snapshot
		var got []string
		for u, err := range b.client.FollowBatch(t.Context(), "b-2", fastFollow) {
			if err != nil {
				t.Fatalf("FollowBatch ended with %v", err)
			}
			got = append(got, updateLine(u))
		}
		if diff := cmp.Diff([]string{"j-9 SUCCEEDED", "j-10 SUCCEEDED"}, got); diff != "" {
			t.Errorf("updates mismatch (-want +got):\n%s", diff)
		}
	})

	t.Run("terminal-only is asked for and passed through", func(t *testing.T) {
		t.Parallel()
		b := setupFollow(t)
		opts := fastFollow
		opts.TerminalOnly = true
		got, err := follow(t.Context(), b.client, opts)
		if err != nil {
			t.Fatalf("FollowBatch ended with %v", err)
		}
		want := []string{"j-1 QUEUED", "j-2 QUEUED", "j-3 QUEUED", "j-1 SUCCEEDED #2", "j-2 FAILED #2", "j-3 SUCCEEDED #2"}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("updates mismatch (-want +got):\n%s", diff)
		}
		if !b.fake.Watches()[0].GetTerminalOnly() {
			t.Error("the watch request did not ask for terminal events only")
		}
	})

	t.Run("each update carries the batch's counts and the last says done", func(t *testing.T) {
		t.Parallel()
		b := setupFollow(t)
		var last client.Update
		for u, err := range b.client.FollowBatch(t.Context(), "b-1", fastFollow) {
			if err != nil {
				t.Fatalf("FollowBatch ended with %v", err)
			}
			if u.Batch == nil {
				t.Fatalf("update %s carries no batch", updateLine(u))
			}
			last = u
		}
		if !last.Batch.GetDone() || last.Batch.GetJobCount() != 3 {
			t.Errorf("last batch = %v, want 3 jobs, done", last.Batch)
		}
	})
}

func TestFollowBatchEnds(t *testing.T) {
	t.Parallel()

	t.Run("an error that watching again cannot fix ends it at once", func(t *testing.T) {
		t.Parallel()
		b := setupFollow(t)
		var err error
		for _, e := range b.client.FollowBatch(t.Context(), "b-404", fastFollow) {
			err = e
		}
		if !errors.Is(err, client.ErrNotFound) {
			t.Errorf("error = %v, want ErrNotFound", err)
		}
		if n := len(b.fake.Watches()); n != 1 {
			t.Errorf("%d watch calls, want 1", n)
		}
	})

	t.Run("the context ending stops the retries with its error", func(t *testing.T) {
		t.Parallel()
		b := setupFollow(t)
		b.fake.WatchFault = func(context.Context, int, int) error { return status.Error(codes.Unavailable, "down") }
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		opts := fastFollow
		n := 0
		opts.OnReconnect = func(error, time.Duration) {
			if n++; n == 3 {
				cancel()
			}
		}
		_, err := follow(ctx, b.client, opts)
		if !errors.Is(err, context.Canceled) {
			t.Errorf("error = %v, want context.Canceled", err)
		}
		if got := len(b.fake.Watches()); got != 3 {
			t.Errorf("%d watch calls, want 3", got)
		}
	})

	t.Run("the backoff doubles up to its bound while streams deliver nothing", func(t *testing.T) {
		t.Parallel()
		b := setupFollow(t)
		b.fake.WatchFault = func(_ context.Context, call, _ int) error {
			if call < 4 {
				return status.Error(codes.Unavailable, "down")
			}
			return nil
		}
		opts := fastFollow
		var delays []time.Duration
		opts.OnReconnect = func(_ error, d time.Duration) { delays = append(delays, d) }
		if _, err := follow(t.Context(), b.client, opts); err != nil {
			t.Fatalf("FollowBatch ended with %v", err)
		}
		want := []time.Duration{time.Millisecond, 2 * time.Millisecond, 4 * time.Millisecond, 4 * time.Millisecond}
		if diff := cmp.Diff(want, delays); diff != "" {
			t.Errorf("delays mismatch (-want +got):\n%s", diff)
		}
	})

	t.Run("breaking out of the loop closes the stream", func(t *testing.T) {
		t.Parallel()
		b := setupFollow(t)
		n := 0
		for range b.client.FollowBatch(t.Context(), "b-1", fastFollow) {
			if n++; n == 2 {
				break
			}
		}
		if n != 2 {
			t.Errorf("iterated %d updates, want 2", n)
		}
	})
}
