package cluster_test

import (
	"flag"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	wal "github.com/hashicorp/raft-wal"
	"github.com/leasehold/leasehold/coordinator/internal/cluster"
	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	"github.com/leasehold/leasehold/coordinator/internal/store"
)

var (
	replayDir = flag.String("replay-raft", "", "BenchmarkFollowerReplay: a node's raft directory (data-nN/raft) kept by `go run ./tools/bench -cluster 3 -keep`")
	replayPer = flag.Int("replay-batch", 8, "BenchmarkFollowerReplay: entries per follower batch (one synced store commit)")
)

// BenchmarkFollowerReplay measures what a follower must do for the
// entries of a real run, on this machine, without raft's transport or
// scheduling: append each entry to a fresh raft-wal with its fsync, as a
// follower's log does, and apply them through the FSM into a fresh store,
// committing (with fsync) every -replay-batch entries, as a follower's
// batch does. It reports the process's CPU per document (user plus
// system, from getrusage; documents are the jobs the entries finish) for
// each part, for comparing with a single coordinator's CPU per document
// in the same bench run. Skipped without -replay-raft.
func BenchmarkFollowerReplay(b *testing.B) {
	if *replayDir == "" {
		b.Skip("no -replay-raft directory")
	}
	src, err := wal.Open(filepath.Join(*replayDir, "wal"))
	if err != nil {
		b.Fatal(err)
	}
	var logs []*raft.Log
	first, _ := src.FirstIndex()
	last, _ := src.LastIndex()
	for i := first; i <= last; i++ {
		l := new(raft.Log)
		if err := src.GetLog(i, l); err != nil {
			b.Fatal(err)
		}
		logs = append(logs, l)
	}
	if err := src.Close(); err != nil {
		b.Fatal(err)
	}

	var logCPU, applyCPU time.Duration
	docs := 0
	for b.Loop() {
		dir := b.TempDir()
		if err := os.Mkdir(filepath.Join(dir, "wal"), 0o700); err != nil {
			b.Fatal(err)
		}
		dst, err := wal.Open(filepath.Join(dir, "wal"))
		if err != nil {
			b.Fatal(err)
		}
		c0 := cpuNow()
		for _, l := range logs {
			if err := dst.StoreLog(l); err != nil {
				b.Fatal(err)
			}
		}
		logCPU += cpuNow() - c0
		if err := dst.Close(); err != nil {
			b.Fatal(err)
		}

		st, err := store.Open(filepath.Join(dir, "leasehold.db"))
		if err != nil {
			b.Fatal(err)
		}
		fsm, err := cluster.NewFSM(st)
		if err != nil {
			b.Fatal(err)
		}
		fsm.HoldBatches()
		c0 = cpuNow()
		for i := 0; i < len(logs); i += *replayPer {
			for _, r := range fsm.ApplyBatch(logs[i:min(i+*replayPer, len(logs))]) {
				if r != nil {
					b.Fatalf("entry refused: %v", r)
				}
			}
			fsm.Flush()
		}
		applyCPU += cpuNow() - c0
		if docs == 0 {
			if docs, err = finishedJobs(st); err != nil || docs == 0 {
				b.Fatalf("the replayed store holds %d finished jobs: %v", docs, err)
			}
			b.Logf("%d entries finishing %d jobs", len(logs), docs)
		}
		if err := st.Close(); err != nil {
			b.Fatal(err)
		}
	}
	per := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(b.N) / float64(docs) }
	b.ReportMetric(per(logCPU), "log-cpu-µs/doc")
	b.ReportMetric(per(applyCPU), "apply-cpu-µs/doc")
	b.ReportMetric(per(logCPU+applyCPU), "cpu-µs/doc")
}

// finishedJobs counts the jobs st holds in a terminal phase.
func finishedJobs(st *store.Store) (int, error) {
	var n int64
	err := st.View(func(tx *store.Tx) error {
		return tx.ForEachTeamCounts(func(_ string, c jobs.Counts) error {
			n += c.Total() - c.Unfinished()
			return nil
		})
	})
	return int(n), err
}

// cpuNow is the process's user plus system CPU time so far.
func cpuNow() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		panic(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
