package main

import (
	"testing"

	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
)

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
