package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/leasehold/leasehold/coordinator/internal/engine"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
)

// seen is one event a watcher received.
type seen struct {
	Job  string
	Seq  uint32
	Kind leaseholdv1.EventKind
}

// watchEvents receives n messages (or until the end when n < 0) and
// returns the events in them, the snapshot job ids, and how the stream
// ended (nil for OK, or when n messages were read).
func watchEvents(t *testing.T, stream leaseholdv1.JobService_WatchBatchClient, n int) (evs []seen, snapshots []string, last *leaseholdv1.WatchBatchResponse, end error) {
	t.Helper()
	for i := 0; n < 0 || i < n; i++ {
		m, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return evs, snapshots, last, nil
		}
		if err != nil {
			return evs, snapshots, last, err
		}
		last = m
		updates := m.GetUpdates()
		if len(updates) == 0 {
			updates = []*leaseholdv1.JobUpdate{{JobId: m.GetJobId(), Phase: m.GetPhase(), Event: m.GetEvent()}}
		}
		for _, u := range updates {
			if u.GetEvent() == nil {
				snapshots = append(snapshots, u.GetJobId())
				continue
			}
			evs = append(evs, seen{u.GetJobId(), u.GetEvent().GetSeq(), u.GetEvent().GetKind()})
		}
	}
	return evs, snapshots, last, nil
}

// history returns a job's stored events after seq.
func (b *testBundle) history(t *testing.T, id string, after uint32) []seen {
	t.Helper()
	var out []seen
	for _, ev := range b.getJob(t, id).GetEvents() {
		if ev.GetSeq() > after {
			out = append(out, seen{id, ev.GetSeq(), ev.GetKind()})
		}
	}
	return out
}

func TestWatchBatchShapes(t *testing.T) {
	t.Parallel()

	t.Run("A resumed watch sends exactly the events missed, nothing twice", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		batch := b.submit(t, alpha, "alpha", "r", doc("a.pdf"), doc("b.pdf"), doc("c.pdf"))
		ids := batch.GetJobIds()
		ctx, cancel := context.WithCancel(as(t, alpha))
		first, err := b.jobs.WatchBatch(ctx, &leaseholdv1.WatchBatchRequest{BatchId: batch.GetId()})
		if err != nil {
			t.Fatal(err)
		}
		if _, snaps, _, err := watchEvents(t, first, 3); err != nil || len(snaps) != 3 {
			t.Fatalf("first watch: snapshots %v, %v; want 3", snaps, err)
		}
		g := b.acquire(t, 2)
		if len(g) != 2 {
			t.Fatalf("granted %d, want 2", len(g))
		}
		got1, _, _, err := watchEvents(t, first, 2) // LEASED, LEASED
		if err != nil || len(got1) != 2 {
			t.Fatalf("first watch: events %v, %v; want 2", got1, err)
		}
		cancel() // the watch breaks

		// Missed while disconnected.
		b.succeed(t, g[0], []byte("png"))
		if _, err := b.rend.Complete(as(t, renderer), failure(g[1], leaseholdv1.FailureClass_FAILURE_CLASS_TRANSIENT)); err != nil {
			t.Fatal(err)
		}
		var resume []*leaseholdv1.JobCursor
		cursor := map[string]uint32{}
		for _, e := range got1 {
			cursor[e.Job] = e.Seq
		}
		for id, seq := range cursor {
			resume = append(resume, &leaseholdv1.JobCursor{JobId: id, Seq: seq})
		}
		second, err := b.jobs.WatchBatch(as(t, alpha), &leaseholdv1.WatchBatchRequest{BatchId: batch.GetId(), Resume: resume})
		if err != nil {
			t.Fatal(err)
		}
		var missed []seen
		for id, seq := range cursor {
			missed = append(missed, b.history(t, id, seq)...)
		}
		// One snapshot (the job never seen with an event) and the missed events.
		got2, snaps2, _, err := watchEvents(t, second, 1+len(missed))
		if err != nil {
			t.Fatal(err)
		}
		unleased := ids[2]
		if _, leased := cursor[unleased]; leased {
			t.Fatalf("job %s was expected to stay queued", unleased)
		}
		if diff := cmpDiff([]string{unleased}, snaps2); diff != "" {
			t.Errorf("snapshots of the resumed watch (-want +got):\n%s", diff)
		}
		if diff := cmpDiff(sortSeen(missed), sortSeen(got2)); diff != "" {
			t.Errorf("missed events (-want +got):\n%s", diff)
		}
		// Live events continue until the batch is done.
		if _, err := b.jobs.CancelBatch(as(t, alpha), &leaseholdv1.CancelBatchRequest{BatchId: batch.GetId()}); err != nil {
			t.Fatal(err)
		}
		live, _, last, err := watchEvents(t, second, -1)
		if err != nil {
			t.Fatalf("resumed watch ended with %v, want OK", err)
		}
		if !last.GetBatch().GetDone() {
			t.Errorf("last message's batch is not done: %v", last.GetBatch())
		}
		all := append(append(got1, got2...), live...)
		counts := map[seen]int{}
		for _, e := range all {
			if counts[e]++; counts[e] > 1 {
				t.Errorf("event %v sent twice", e)
			}
		}
		var want []seen
		for _, id := range ids {
			for _, e := range b.history(t, id, 0) {
				if e.Kind != leaseholdv1.EventKind_EVENT_KIND_SUBMITTED {
					want = append(want, e)
				}
			}
		}
		if diff := cmpDiff(sortSeen(want), sortSeen(all)); diff != "" {
			t.Errorf("events over both watches (-want +got):\n%s", diff)
		}
	})

	t.Run("A terminal-only watch sends the snapshot and then only outcomes", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		batch := b.submit(t, alpha, "alpha", "r", doc("a.pdf"), doc("b.pdf"))
		stream, err := b.jobs.WatchBatch(as(t, alpha), &leaseholdv1.WatchBatchRequest{BatchId: batch.GetId(), TerminalOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		if _, snaps, _, err := watchEvents(t, stream, 2); err != nil || len(snaps) != 2 {
			t.Fatalf("snapshot: %v, %v; want 2 jobs", snaps, err)
		}
		g := b.acquire(t, 2)
		b.succeed(t, g[0], []byte("png"))
		if _, err := b.jobs.CancelJob(as(t, alpha), &leaseholdv1.CancelJobRequest{JobId: g[1].GetJobId()}); err != nil {
			t.Fatal(err)
		}
		evs, _, last, err := watchEvents(t, stream, -1)
		if err != nil {
			t.Fatal(err)
		}
		var kinds []string
		for _, e := range evs {
			kinds = append(kinds, e.Job+" "+e.Kind.String())
		}
		want := []string{g[0].GetJobId() + " EVENT_KIND_SUCCEEDED", g[1].GetJobId() + " EVENT_KIND_CANCELLED"}
		if diff := cmpDiff(want, kinds); diff != "" {
			t.Errorf("events (-want +got):\n%s", diff)
		}
		if !last.GetBatch().GetDone() {
			t.Errorf("last batch not done: %v", last.GetBatch())
		}
	})

	t.Run("A batched watch sends updates several to a message", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		batch := b.submit(t, alpha, "alpha", "r", doc("a.pdf"), doc("b.pdf"), doc("c.pdf"))
		stream, err := b.jobs.WatchBatch(as(t, alpha), &leaseholdv1.WatchBatchRequest{BatchId: batch.GetId(), Batched: true})
		if err != nil {
			t.Fatal(err)
		}
		m, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if len(m.GetUpdates()) != 3 || m.GetJobId() != "" || m.GetEvent() != nil || m.GetBatch().GetJobCount() != 3 {
			t.Fatalf("snapshot message = %v, want the 3 jobs in updates with the batch", m)
		}
		if _, err := b.jobs.CancelBatch(as(t, alpha), &leaseholdv1.CancelBatchRequest{BatchId: batch.GetId()}); err != nil {
			t.Fatal(err)
		}
		var updates int
		var last *leaseholdv1.WatchBatchResponse
		for {
			m, err := stream.Recv()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			if m.GetJobId() != "" || m.GetEvent() != nil {
				t.Errorf("batched message carries a single update: %v", m)
			}
			for _, u := range m.GetUpdates() {
				if u.GetEvent().GetKind() != leaseholdv1.EventKind_EVENT_KIND_CANCELLED || u.GetPhase() != leaseholdv1.Phase_PHASE_CANCELLED {
					t.Errorf("update = %v, want CANCELLED", u)
				}
			}
			updates += len(m.GetUpdates())
			last = m
		}
		if updates != 3 || !last.GetBatch().GetDone() {
			t.Errorf("%d updates, last batch %v; want 3 and done", updates, last.GetBatch())
		}
	})

	t.Run("A watcher that falls too far behind ends RESOURCE_EXHAUSTED SLOW_WATCHER", func(t *testing.T) {
		t.Parallel()
		const n = 5000
		b := setup(t, func(o *options) { o.engine = func(c *engine.Config) { c.Limits.MaxDocuments = n } })
		docs := make([]*leaseholdv1.Document, n)
		for i := range docs {
			docs[i] = &leaseholdv1.Document{Name: fmt.Sprintf("d%04d.pdf", i), Content: []byte("x")}
		}
		batch := b.submit(t, alpha, "alpha", "r", docs...)
		// Fixed flow-control windows: a reader that stops reading stops the
		// server's sends after about 64 KiB.
		conn := b.dial(t, grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
		defer conn.Close()
		stream, err := leaseholdv1.NewJobServiceClient(conn).WatchBatch(as(t, alpha), &leaseholdv1.WatchBatchRequest{BatchId: batch.GetId()})
		if err != nil {
			t.Fatal(err)
		}
		// The first snapshot message means the watch is subscribed; the
		// rest of the snapshot cannot be sent before the watcher reads.
		if _, err := stream.Recv(); err != nil {
			t.Fatal(err)
		}
		if _, err := b.jobs.CancelBatch(as(t, alpha), &leaseholdv1.CancelBatchRequest{BatchId: batch.GetId()}); err != nil {
			t.Fatal(err)
		}
		_, _, _, err = watchEvents(t, stream, -1)
		wantError(t, err, codes.ResourceExhausted, reasonSlowWatcher)
	})
}

func sortSeen(s []seen) []seen {
	out := append([]seen(nil), s...)
	for i := 1; i < len(out); i++ {
		for j := i; j > 0 && less(out[j], out[j-1]); j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return out
}

func less(a, b seen) bool {
	if a.Job != b.Job {
		return a.Job < b.Job
	}
	return a.Seq < b.Seq
}

// TestWatchBatchCounts checks that every message carries the batch's
// counts right after that message, so that a follower may trust the last
// message it read.
func TestWatchBatchCounts(t *testing.T) {
	t.Parallel()

	t.Run("Each event message carries the counts after its own event", func(t *testing.T) {
		t.Parallel()
		const n = 50
		b := setup(t)
		docs := make([]*leaseholdv1.Document, n)
		for i := range docs {
			docs[i] = doc(fmt.Sprintf("d%02d.pdf", i))
		}
		batch := b.submit(t, alpha, "alpha", "r", docs...)
		stream, err := b.jobs.WatchBatch(as(t, alpha), &leaseholdv1.WatchBatchRequest{BatchId: batch.GetId()})
		if err != nil {
			t.Fatal(err)
		}
		if _, snaps, _, err := watchEvents(t, stream, n); err != nil || len(snaps) != n {
			t.Fatalf("snapshot: %d messages, %v; want %d", len(snaps), err, n)
		}
		// One commit: n events, which the watch may send in one go.
		if _, err := b.jobs.CancelBatch(as(t, alpha), &leaseholdv1.CancelBatchRequest{BatchId: batch.GetId()}); err != nil {
			t.Fatal(err)
		}
		for i := 1; ; i++ {
			m, err := stream.Recv()
			if errors.Is(err, io.EOF) {
				if i != n+1 {
					t.Errorf("the watch ended after %d events, want %d", i-1, n)
				}
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			var cancelled, queued uint32
			for _, c := range m.GetBatch().GetCounts() {
				switch c.GetPhase() {
				case leaseholdv1.Phase_PHASE_CANCELLED:
					cancelled = c.GetCount()
				case leaseholdv1.Phase_PHASE_QUEUED:
					queued = c.GetCount()
				}
			}
			if cancelled != uint32(i) || queued != uint32(n-i) || m.GetBatch().GetDone() != (i == n) {
				t.Fatalf("event message %d: %d cancelled, %d queued, done %v; want %d, %d, %v",
					i, cancelled, queued, m.GetBatch().GetDone(), i, n-i, i == n)
			}
		}
	})

	t.Run("The snapshot of a batch larger than a page counts every job", func(t *testing.T) {
		t.Parallel()
		const n = 1500
		b := setup(t, func(o *options) { o.engine = func(c *engine.Config) { c.Limits.MaxDocuments = n } })
		docs := make([]*leaseholdv1.Document, n)
		for i := range docs {
			docs[i] = &leaseholdv1.Document{Name: fmt.Sprintf("d%04d.pdf", i), Content: []byte("x")}
		}
		batch := b.submit(t, alpha, "alpha", "r", docs...)
		stream, err := b.jobs.WatchBatch(as(t, alpha), &leaseholdv1.WatchBatchRequest{BatchId: batch.GetId()})
		if err != nil {
			t.Fatal(err)
		}
		m, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		var total uint32
		for _, c := range m.GetBatch().GetCounts() {
			total += c.GetCount()
		}
		if total != n {
			t.Errorf("the first snapshot message counts %d jobs of %d: %v", total, n, m.GetBatch().GetCounts())
		}
	})
}
