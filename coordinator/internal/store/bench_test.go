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

// hotDocs writes what the writer stores for documents: their submission
// (submit) and their render's success (complete).
type hotDocs struct {
	now              time.Time
	digest           string
	preview, content []byte
	moved            jobs.Counts
}

const (
	hotBatchSize   = 64
	hotTeams       = 4
	hotPreviewSize = 600
)

func newHotDocs() *hotDocs {
	h := &hotDocs{
		now:     time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
		digest:  "77c1c2effe4376885835b4daf40613c6a29b85ca0fde390039d36a3c1d99163c",
		preview: bytes.Repeat([]byte{0x89, 'P', 'N', 'G', '\r', '\n'}, hotPreviewSize/6),
		content: bytes.Repeat([]byte("%PDF-1.7 "), 100),
	}
	h.moved[jobs.PhaseLeased], h.moved[jobs.PhaseSucceeded] = -1, 1
	return h
}

func (h *hotDocs) queued(id uint64) jobs.Job {
	return jobs.Job{ID: id, BatchID: id/hotBatchSize + 1, Team: "team-" + strconv.Itoa(int(id%hotTeams)),
		Doc:    jobs.Document{Name: "report-" + strconv.FormatUint(id, 10) + ".pdf", ContentType: "application/pdf", SizeBytes: int64(len(h.content)), ContentSHA256: h.digest},
		Policy: jobs.RetryPolicy{MaxAttempts: 5, BackoffBase: time.Second, BackoffCap: 5 * time.Minute},
		Phase:  jobs.PhaseQueued, Cycle: 1, CreatedAt: h.now, UpdatedAt: h.now, EnqueuedAt: h.now, ContentBytes: int64(len(h.content)), EventSeq: 1}
}

// submit stores documents first to first+n-1 as queued.
func (h *hotDocs) submit(tx *store.Tx, first uint64, n int) error {
	for id := first; id < first+uint64(n); id++ {
		if err := tx.PutJob(h.queued(id)); err != nil {
			return err
		}
		if err := tx.PutDocument(id, h.content); err != nil {
			return err
		}
		if err := tx.SetUnfinished(id, true); err != nil {
			return err
		}
	}
	return nil
}

// complete stores the success of documents first to first+n-1: the job
// record, two history events, the preview, the job leaving the
// unfinished index, its content dropped, its batch's and team's counts
// moved.
func (h *hotDocs) complete(tx *store.Tx, first uint64, n int) error {
	for id := first; id < first+uint64(n); id++ {
		token := id
		j := h.queued(id)
		j.Phase, j.Attempt, j.TerminalReason, j.FinishedAt, j.UpdatedAt, j.EnqueuedAt = jobs.PhaseSucceeded, 1, jobs.ReasonSucceeded, h.now, h.now, time.Time{}
		j.Artifact = jobs.Artifact{Digest: h.digest, Size: hotPreviewSize, ContentType: "image/png", Token: token, Renderer: "r-1"}
		j.Leases = []jobs.LeaseRecord{{Token: token, Renderer: "r-1", Kind: jobs.LeaseCompleted, Outcome: "success:" + h.digest}}
		j.EventSeq = 3
		evs := []jobs.Event{
			{Seq: 2, At: h.now, Kind: jobs.EventLeased, Phase: jobs.PhaseLeased, Token: token, Renderer: "r-1", Attempt: 1},
			{Seq: 3, At: h.now, Kind: jobs.EventSucceeded, Phase: jobs.PhaseSucceeded, Token: token, Renderer: "r-1", Attempt: 1, Message: h.digest},
		}
		if err := tx.PutJob(j); err != nil {
			return err
		}
		if err := tx.PutEvents(id, evs); err != nil {
			return err
		}
		if err := tx.PutArtifact(id, token, store.Artifact{Digest: h.digest, ContentType: "image/png", Content: h.preview, Renderer: "r-1"}); err != nil {
			return err
		}
		if err := tx.SetUnfinished(id, false); err != nil {
			return err
		}
		if err := tx.DeleteDocument(id); err != nil {
			return err
		}
		if err := tx.AddBatchCounts(j.BatchID, h.moved); err != nil {
			return err
		}
		if err := tx.AddTeamCounts(j.Team, h.moved); err != nil {
			return err
		}
	}
	return nil
}

// BenchmarkHotWritesPerDocument measures what the writer stores when a
// document's render succeeds (hotDocs.complete). Documents commit in
// groups of 256 per transaction, with fsync, as the group commit does; an
// op is one document, and commit-ns/doc is the share of Commit (page
// writes and fsyncs). Each group's documents are submitted outside the
// timing, so that the deletes delete something.
func BenchmarkHotWritesPerDocument(b *testing.B) {
	const group = 256
	st, err := store.Open(filepath.Join(b.TempDir(), "leasehold.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	h := newHotDocs()
	next := uint64(1)
	b.ReportAllocs()
	var commitNs int64
	b.ResetTimer()
	for done := 0; done < b.N; done += group {
		n := min(group, b.N-done)
		b.StopTimer()
		first := next
		next += uint64(n)
		if err := st.Update(func(tx *store.Tx) error { return h.submit(tx, first, n) }); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()

		tx, err := st.Begin()
		if err != nil {
			b.Fatal(err)
		}
		if err := h.complete(tx, first, n); err != nil {
			b.Fatal(err)
		}
		c0 := time.Now()
		if err := tx.Commit(); err != nil {
			b.Fatal(err)
		}
		commitNs += time.Since(c0).Nanoseconds()
	}
	b.ReportMetric(float64(commitNs)/float64(b.N), "commit-ns/doc")
}

// BenchmarkReplicaApply measures a follower's store: the write sets of
// groups of 80 documents submitted and then completed (hotDocs), as a
// leader records them, applied by a replica in batches of 4 entries per
// synced commit, as a follower's batch takes them under load. An op is
// one document (its two entries' share).
func BenchmarkReplicaApply(b *testing.B) {
	const group, perBatch = 80, 4
	dir := b.TempDir()
	src, err := store.Open(filepath.Join(dir, "src.db"), store.WithoutSync())
	if err != nil {
		b.Fatal(err)
	}
	defer src.Close()
	h := newHotDocs()
	var entries []store.Entry
	record := func(fn func(tx *store.Tx) error) {
		tx, err := src.Begin()
		if err != nil {
			b.Fatal(err)
		}
		tx.Record()
		if err := fn(tx); err != nil {
			b.Fatal(err)
		}
		base := uint64(len(entries))
		entries = append(entries, store.Entry{Index: base + 1, WriteSet: tx.WriteSet(base, h.now)})
		if err := tx.Commit(); err != nil {
			b.Fatal(err)
		}
	}
	for first := uint64(1); first <= uint64(b.N); first += group {
		n := min(group, b.N-int(first)+1)
		record(func(tx *store.Tx) error { return h.submit(tx, first, n) })
		record(func(tx *store.Tx) error { return h.complete(tx, first, n) })
	}
	dst, err := store.Open(filepath.Join(dir, "dst.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer dst.Close()
	b.ReportAllocs()
	b.ResetTimer()
	for len(entries) > 0 {
		n := min(perBatch, len(entries))
		batch, err := dst.BeginBatch()
		if err != nil {
			b.Fatal(err)
		}
		if _, err := batch.Apply(entries[:n]); err != nil {
			b.Fatal(err)
		}
		if _, err := batch.Commit(); err != nil {
			b.Fatal(err)
		}
		entries = entries[n:]
	}
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
