package store_test

import (
	"bytes"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	"github.com/leasehold/leasehold/coordinator/internal/store"
)

// BenchmarkHotWritesPerDocument measures what the writer stores when a
// document's render succeeds: the job record, two history events, the
// 600-byte preview, the job leaving the unfinished index, its content
// dropped, and its batch's and team's counts moved. Documents commit in
// groups of 256 per transaction, with fsync, as the group commit does; an
// op is one document, and commit-ns/doc is the share of Commit (page
// writes and fsyncs). Each group's documents are submitted outside the
// timing, so that the deletes delete something.
func BenchmarkHotWritesPerDocument(b *testing.B) {
	const (
		group       = 256
		batchSize   = 64
		teams       = 4
		previewSize = 600
	)
	st, err := store.Open(filepath.Join(b.TempDir(), "leasehold.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()

	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	digest := "77c1c2effe4376885835b4daf40613c6a29b85ca0fde390039d36a3c1d99163c"
	preview := bytes.Repeat([]byte{0x89, 'P', 'N', 'G', '\r', '\n'}, previewSize/6)
	content := bytes.Repeat([]byte("%PDF-1.7 "), 100)
	queued := func(id uint64) jobs.Job {
		return jobs.Job{ID: id, BatchID: id/batchSize + 1, Team: "team-" + strconv.Itoa(int(id%teams)),
			Doc:    jobs.Document{Name: "report-" + strconv.FormatUint(id, 10) + ".pdf", ContentType: "application/pdf", SizeBytes: int64(len(content)), ContentSHA256: digest},
			Policy: jobs.RetryPolicy{MaxAttempts: 5, BackoffBase: time.Second, BackoffCap: 5 * time.Minute},
			Phase:  jobs.PhaseQueued, Cycle: 1, CreatedAt: now, UpdatedAt: now, EnqueuedAt: now, ContentBytes: int64(len(content)), EventSeq: 1}
	}
	var moved jobs.Counts
	moved[jobs.PhaseLeased], moved[jobs.PhaseSucceeded] = -1, 1

	// submit stores the next n documents as queued, untimed.
	next := uint64(1)
	submit := func(n int) uint64 {
		first := next
		err := st.Update(func(tx *store.Tx) error {
			for id := first; id < first+uint64(n); id++ {
				if err := tx.PutJob(queued(id)); err != nil {
					return err
				}
				if err := tx.PutDocument(id, content); err != nil {
					return err
				}
				if err := tx.SetUnfinished(id, true); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
		next += uint64(n)
		return first
	}

	b.ReportAllocs()
	var commitNs int64
	b.ResetTimer()
	for done := 0; done < b.N; done += group {
		n := min(group, b.N-done)
		b.StopTimer()
		first := submit(n)
		b.StartTimer()

		tx, err := st.Begin()
		if err != nil {
			b.Fatal(err)
		}
		for id := first; id < first+uint64(n); id++ {
			token := id
			j := queued(id)
			j.Phase, j.Attempt, j.TerminalReason, j.FinishedAt, j.UpdatedAt, j.EnqueuedAt = jobs.PhaseSucceeded, 1, jobs.ReasonSucceeded, now, now, time.Time{}
			j.Artifact = jobs.Artifact{Digest: digest, Size: previewSize, ContentType: "image/png", Token: token, Renderer: "r-1"}
			j.Leases = []jobs.LeaseRecord{{Token: token, Renderer: "r-1", Kind: jobs.LeaseCompleted, Outcome: "success:" + digest}}
			j.EventSeq = 3
			evs := []jobs.Event{
				{Seq: 2, At: now, Kind: jobs.EventLeased, Phase: jobs.PhaseLeased, Token: token, Renderer: "r-1", Attempt: 1},
				{Seq: 3, At: now, Kind: jobs.EventSucceeded, Phase: jobs.PhaseSucceeded, Token: token, Renderer: "r-1", Attempt: 1, Message: digest},
			}
			if err := tx.PutJob(j); err != nil {
				b.Fatal(err)
			}
			if err := tx.PutEvents(id, evs); err != nil {
				b.Fatal(err)
			}
			if err := tx.PutArtifact(id, token, store.Artifact{Digest: digest, ContentType: "image/png", Content: preview, Renderer: "r-1"}); err != nil {
				b.Fatal(err)
			}
			if err := tx.SetUnfinished(id, false); err != nil {
				b.Fatal(err)
			}
			if err := tx.DeleteDocument(id); err != nil {
				b.Fatal(err)
			}
			if err := tx.AddBatchCounts(j.BatchID, moved); err != nil {
				b.Fatal(err)
			}
			if err := tx.AddTeamCounts(j.Team, moved); err != nil {
				b.Fatal(err)
			}
		}
		c0 := time.Now()
		if err := tx.Commit(); err != nil {
			b.Fatal(err)
		}
		commitNs += time.Since(c0).Nanoseconds()
	}
	b.ReportMetric(float64(commitNs)/float64(b.N), "commit-ns/doc")
}

// BenchmarkStaged measures what the writer reads to complete an
// uploaded preview: its digest, content type and size, for a preview of
// 1 MiB.
func BenchmarkStaged(b *testing.B) {
	st, err := store.Open(filepath.Join(b.TempDir(), "leasehold.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	const digest = "77c1c2effe4376885835b4daf40613c6a29b85ca0fde390039d36a3c1d99163c"
	preview := bytes.Repeat([]byte{0x89, 'P', 'N', 'G'}, 1<<20/4)
	err = st.Update(func(tx *store.Tx) error {
		return tx.PutArtifact(1, 7, store.Artifact{Digest: digest, ContentType: "image/png", Content: preview, Renderer: "r-1"})
	})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	err = st.View(func(tx *store.Tx) error {
		for b.Loop() {
			st, err := tx.Staged(1, 7)
			if err != nil || st.Digest != digest || st.Size != int64(len(preview)) {
				b.Fatalf("Staged = %+v, %v", st, err)
			}
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
}
