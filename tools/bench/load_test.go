package main

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
)

func TestUpdatesOf(t *testing.T) {
	t.Parallel()
	succeeded, leased := leaseholdv1.Phase_PHASE_SUCCEEDED, leaseholdv1.Phase_PHASE_LEASED
	tests := []struct {
		name string
		msg  *leaseholdv1.WatchBatchResponse
		want []update
	}{
		{
			name: "SingleEvent",
			msg: &leaseholdv1.WatchBatchResponse{JobId: "j-1", Phase: succeeded,
				Event: &leaseholdv1.JobEvent{Kind: leaseholdv1.EventKind_EVENT_KIND_SUCCEEDED}},
			want: []update{{"j-1", succeeded}},
		},
		{
			name: "SingleSnapshot",
			msg:  &leaseholdv1.WatchBatchResponse{JobId: "j-2", Phase: leased},
			want: []update{{"j-2", leased}},
		},
		{
			name: "Batched",
			msg: &leaseholdv1.WatchBatchResponse{Updates: []*leaseholdv1.JobUpdate{
				{JobId: "j-1", Phase: succeeded, Event: &leaseholdv1.JobEvent{}},
				{JobId: "j-2", Phase: leased},
				{Phase: succeeded}, // no job: skipped
			}},
			want: []update{{"j-1", succeeded}, {"j-2", leased}},
		},
		{
			name: "CountsOnly",
			msg:  &leaseholdv1.WatchBatchResponse{Batch: &leaseholdv1.Batch{Id: "b-1"}},
			want: nil,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if diff := cmp.Diff(tt.want, updatesOf(tt.msg), cmp.AllowUnexported(update{})); diff != "" {
				t.Errorf("updatesOf (-want +got):\n%s", diff)
			}
		})
	}
}

func TestTerminal(t *testing.T) {
	t.Parallel()
	for p, want := range map[leaseholdv1.Phase]bool{
		leaseholdv1.Phase_PHASE_QUEUED:     false,
		leaseholdv1.Phase_PHASE_LEASED:     false,
		leaseholdv1.Phase_PHASE_RETRY_WAIT: false,
		leaseholdv1.Phase_PHASE_SUCCEEDED:  true,
		leaseholdv1.Phase_PHASE_FAILED:     true,
		leaseholdv1.Phase_PHASE_CANCELLED:  true,
	} {
		if got := terminal(p); got != want {
			t.Errorf("terminal(%v) = %v, want %v", p, got, want)
		}
	}
}

func TestDocuments(t *testing.T) {
	t.Parallel()
	docs := documents("bench-x-drain-1", 500)
	names := make(map[string]bool)
	for _, d := range docs {
		if names[d.GetName()] {
			t.Fatalf("duplicate name %q", d.GetName())
		}
		names[d.GetName()] = true
		if len(d.GetContent()) != documentSize || d.GetSizeBytes() != documentSize {
			t.Fatalf("%s: %d bytes, declared %d, want %d", d.GetName(), len(d.GetContent()), d.GetSizeBytes(), documentSize)
		}
		if d.GetContentType() != "text/plain" {
			t.Fatalf("%s: content type %q", d.GetName(), d.GetContentType())
		}
	}
}

func TestTally(t *testing.T) {
	t.Parallel()
	var tl tally
	ack := t0
	tl.add(ack.Add(3), leaseholdv1.Phase_PHASE_SUCCEEDED, ack, true)
	tl.add(ack.Add(9), leaseholdv1.Phase_PHASE_FAILED, ack, true)
	tl.add(ack.Add(5), leaseholdv1.Phase_PHASE_SUCCEEDED, ack, false)
	s, f, last := tl.snapshot()
	if s != 2 || f != 1 || !last.Equal(ack.Add(9)) {
		t.Errorf("snapshot = %d, %d, %v; want 2, 1, ack+9ns", s, f, last)
	}
	if len(tl.latencies) != 2 {
		t.Errorf("kept %d latencies, want 2", len(tl.latencies))
	}
	if got := tl.failures(); got != "1 FAILED" {
		t.Errorf("failures() = %q, want \"1 FAILED\"", got)
	}
}
