package dispatch

import (
	"fmt"
	"runtime"
	"testing"
)

// BenchmarkNext measures one lease cycle, Release + Next + Push, against a
// steady backlog spread over eight teams, with the renderers kept busy so that
// the cap check runs on every pick. It also reports the heap held per queued
// job. Throughput should not depend on the backlog's size.
//
// Job ids come from a counter, as the coordinator hands them out; with
// ids=scattered they follow no order at all, the case the job index serves
// from a plain map.
func BenchmarkNext(b *testing.B) {
	for _, mode := range []struct {
		name string
		cfg  Config
	}{
		{name: "fair", cfg: Config{Weights: map[string]int{"team-0": 3}}},
		{name: "fifo", cfg: Config{FIFO: true}},
	} {
		for _, ids := range []struct {
			name string
			id   func(n uint64) uint64
		}{
			{name: "counter", id: func(n uint64) uint64 { return n }},
			// An odd multiplier permutes the ids, so they stay distinct.
			{name: "scattered", id: func(n uint64) uint64 { return n * 0x9E3779B97F4A7C15 }},
		} {
			for _, backlog := range []int{1_000, 1_000_000} {
				name := fmt.Sprintf("mode=%s/ids=%s/backlog=%d", mode.name, ids.name, backlog)
				b.Run(name, func(b *testing.B) {
					benchmarkNext(b, mode.cfg, ids.id, backlog)
				})
			}
		}
	}
}

func benchmarkNext(b *testing.B, cfg Config, idOf func(uint64) uint64, backlog int) {
	const (
		teamCount = 8
		capacity  = 64
	)
	names := make([]string, teamCount)
	for i := range names {
		names[i] = fmt.Sprintf("team-%d", i)
	}

	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	s := New(cfg)
	id := uint64(0)
	for range backlog {
		s.Push(names[id%teamCount], idOf(id))
		id++
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	bytesPerJob := float64(after.HeapAlloc-before.HeapAlloc) / float64(backlog)

	// Fill every renderer; leases then end in the order they began.
	leases := make([]string, capacity)
	for i := range leases {
		team, _, ok := s.Next(capacity)
		if !ok {
			b.Fatal("Next found no work in a full backlog")
		}
		leases[i] = team
		s.Push(team, idOf(id))
		id++
	}
	cycle := func(i int) {
		slot := i % capacity
		s.Release(leases[slot])
		team, _, ok := s.Next(capacity)
		if !ok {
			b.Fatal("Next found no work in a full backlog")
		}
		leases[slot] = team
		s.Push(team, idOf(id))
		id++
	}
	// Turn the whole backlog over once, so that the buffers have reached the
	// size they keep and the measurement sees the steady state.
	for i := range backlog {
		cycle(i)
	}

	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		cycle(i)
	}
	b.StopTimer()
	if got := s.Ready(); got != backlog {
		b.Fatalf("Ready() = %d after the run, want the steady backlog %d", got, backlog)
	}
	b.ReportMetric(bytesPerJob, "bytes/job")
}
