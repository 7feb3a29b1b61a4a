package engine

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	"github.com/leasehold/leasehold/coordinator/internal/store"
	"github.com/leasehold/leasehold/internal/testclock"
	"github.com/prometheus/client_golang/prometheus"
)

// newBenchEngine starts an engine on a real bbolt file (every commit
// fsyncs) in b.TempDir(), with the real clock, and a registry to read the
// writer's group sizes from.
func newBenchEngine(b *testing.B) (*Engine, *prometheus.Registry) {
	b.Helper()
	dir := b.TempDir()
	st, err := store.Open(filepath.Join(dir, "leasehold.db"))
	if err != nil {
		b.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	e, err := New(Config{
		Store: st, Registerer: reg, Seed: 1,
		// Long leases: no expiry may interfere with a run.
		LeaseTTL: time.Hour,
		Limits:   jobs.Limits{MaxTeamQueue: 1 << 30},
	})
	if err != nil {
		b.Fatal(err)
	}
	e.Start()
	b.Cleanup(func() {
		e.Stop()
		st.Close()
	})
	return e, reg
}

// BenchmarkWriter measures the writer's throughput under group commit:
// N concurrent callers each submit one-document batches, so up to N
// commands share one transaction and one fsync.
func BenchmarkWriter(b *testing.B) {
	for _, callers := range []int{1, 16, 256} {
		b.Run(fmt.Sprintf("callers=%d", callers), func(b *testing.B) {
			e, reg := newBenchEngine(b)
			ctx := context.Background()
			doc := []jobs.DocInput{{Document: jobs.Document{Name: "a.pdf", ContentType: "application/pdf"}, Content: []byte("%PDF-1.7 tiny")}}
			// Warm up so the histogram covers only the measured groups.
			if _, err := e.Submit(ctx, SubmitRequest{Team: "alpha", RequestID: "warm-up", Docs: doc}); err != nil {
				b.Fatal(err)
			}
			groupsBefore := meanGroupState(b, reg)
			var next atomic.Int64
			var wg sync.WaitGroup
			b.ResetTimer()
			for range callers {
				wg.Go(func() {
					for {
						i := next.Add(1)
						if i > int64(b.N) {
							return
						}
						if _, err := e.Submit(ctx, SubmitRequest{Team: "alpha", RequestID: fmt.Sprintf("req-%d", i), Docs: doc}); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			b.StopTimer()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "cmds/s")
			b.ReportMetric(groupsBefore.since(meanGroupState(b, reg)), "cmds/group")
		})
	}
}

// groupState is the group-size histogram's running sum and count.
type groupState struct{ sum, count float64 }

func meanGroupState(b *testing.B, reg *prometheus.Registry) groupState {
	b.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		b.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "leasehold_writer_group_commands" {
			h := mf.GetMetric()[0].GetHistogram()
			return groupState{h.GetSampleSum(), float64(h.GetSampleCount())}
		}
	}
	b.Fatal("no leasehold_writer_group_commands metric")
	return groupState{}
}

// since returns the mean group size between s and later.
func (s groupState) since(later groupState) float64 {
	if later.count == s.count {
		return 0
	}
	return (later.sum - s.sum) / (later.count - s.count)
}

// preGrant submits n jobs and leases them all.
func preGrant(b *testing.B, e *Engine, n int) []Grant {
	b.Helper()
	ctx := context.Background()
	grants := make([]Grant, 0, n)
	for batch := 0; len(grants) < n; batch++ {
		size := min(n-len(grants), jobs.DefaultMaxDocuments)
		docs := make([]jobs.DocInput, size)
		for i := range docs {
			docs[i] = jobs.DocInput{Document: jobs.Document{Name: fmt.Sprintf("d%d.pdf", i), ContentType: "application/pdf", SourceURI: fmt.Sprintf("s3://previews/%d/d%d.pdf", batch, i)}}
		}
		if _, err := e.Submit(ctx, SubmitRequest{Team: "alpha", RequestID: fmt.Sprintf("batch-%d", batch), Docs: docs}); err != nil {
			b.Fatal(err)
		}
		res, err := acquire(ctx, e, acquireRequest{Renderer: rend("r-1"), Max: size, Capacity: n})
		if err != nil || len(res.Grants) != size {
			b.Fatalf("Acquire = %d grants, %v; want %d", len(res.Grants), err, size)
		}
		grants = append(grants, res.Grants...)
	}
	return grants
}

// BenchmarkComplete measures unary Complete (with a small inline
// preview) through the fencing check, with
// every completion under the current token, half of them under a token
// that was never granted (rejected and recorded), or all of them. The
// sequential runs pay one fsync per command; the parallel runs let group
// commit share it, which shows the cost of the check and the rejection
// records themselves.
func BenchmarkComplete(b *testing.B) {
	mixes := []struct {
		name       string
		staleEvery int
	}{{"current", 0}, {"half-stale", 2}, {"all-stale", 1}}
	complete := func(b *testing.B, e *Engine, g Grant, i int, staleEvery int) {
		tok := g.Job.Lease.Token
		stale := staleEvery > 0 && i%staleEvery == 0
		if stale {
			tok += 1 << 40
		}
		_, err := complete(context.Background(), e, success(g.Job.ID, tok, "r-1", "digest"))
		if stale != (err != nil) {
			b.Errorf("completion %d (stale %v): err = %v", i, stale, err)
		}
	}
	for _, mode := range []string{"sequential", "parallel"} {
		for _, mix := range mixes {
			b.Run(mode+"/"+mix.name, func(b *testing.B) {
				e, reg := newBenchEngine(b)
				grants := preGrant(b, e, b.N)
				before := meanGroupState(b, reg)
				b.ResetTimer()
				if mode == "sequential" {
					for i := range b.N {
						complete(b, e, grants[i], i, mix.staleEvery)
					}
				} else {
					var next atomic.Int64
					b.SetParallelism(16)
					b.RunParallel(func(pb *testing.PB) {
						for pb.Next() {
							i := int(next.Add(1) - 1)
							complete(b, e, grants[i], i, mix.staleEvery)
						}
					})
				}
				b.StopTimer()
				b.ReportMetric(before.since(meanGroupState(b, reg)), "cmds/group")
			})
		}
	}
}

// BenchmarkSessionPerDocument measures the session path per document:
// each of N renderer sessions holds one lease at a time, completes it with
// a ~600-byte preview inline and one credit in the same message, and takes
// the grant that refills its slot, published by the same commit. One op is
// one document; the figure includes the caller's side (digest, content read
// after the commit) as the Session handler does it.
func BenchmarkSessionPerDocument(b *testing.B) {
	for _, sessions := range []int{1, 16, 64} {
		b.Run(fmt.Sprintf("sessions=%d", sessions), func(b *testing.B) {
			e, reg := newBenchEngine(b)
			ctx := context.Background()
			submitDocs(b, e, b.N+sessions)
			conns := make([]*Conn, sessions)
			for i := range conns {
				c, _, err := e.Open(ctx, SessionOpen{Renderer: rend(fmt.Sprintf("r-%d", i)), Instance: "i", Capacity: 1})
				if err != nil {
					b.Fatal(err)
				}
				conns[i] = c
			}
			page := make([]byte, 600)
			for i := range page {
				page[i] = byte(i)
			}
			before := meanGroupState(b, reg)
			var done atomic.Int64
			var wg sync.WaitGroup
			b.ReportAllocs()
			b.ResetTimer()
			for _, c := range conns {
				wg.Go(func() {
					if _, err := e.Receive(ctx, c, SessionInput{Credits: 1}); err != nil {
						b.Error(err)
						return
					}
					for {
						<-c.Outbox.Ready()
						grants, _, ended := c.Outbox.Take()
						if ended != nil {
							b.Error(ended)
							return
						}
						if err := e.ReadContent(grants); err != nil {
							b.Error(err)
							return
						}
						for _, g := range grants {
							if done.Add(1) > int64(b.N) {
								return
							}
							content := append(page[:0:0], page...)
							binary.BigEndian.PutUint64(content, g.Job.ID)
							sum := sha256.Sum256(content)
							req := CompleteRequest{Job: g.Job.ID, Completion: jobs.Completion{Token: g.Job.Lease.Token, Success: true},
								Preview: &jobs.Preview{Digest: hex.EncodeToString(sum[:]), ContentType: "image/png", Content: content}}
							res, err := e.Receive(ctx, c, SessionInput{Completions: []CompleteRequest{req}, Credits: 1})
							if err != nil || res.Completions[0].Err != nil {
								b.Errorf("completion of job %d: %v, %v", g.Job.ID, err, res.Completions)
								return
							}
						}
					}
				})
			}
			wg.Wait()
			b.StopTimer()
			b.ReportMetric(before.since(meanGroupState(b, reg)), "cmds/group")
			for _, c := range conns {
				if _, err := closeConn(ctx, e, c, nil, true); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// submitDocs submits n one-page documents with inline content.
func submitDocs(b *testing.B, e *Engine, n int) {
	b.Helper()
	ctx := context.Background()
	for batch := 0; n > 0; batch++ {
		size := min(n, jobs.DefaultMaxDocuments)
		docs := make([]jobs.DocInput, size)
		for i := range docs {
			docs[i] = jobs.DocInput{Document: jobs.Document{Name: fmt.Sprintf("d%d.pdf", i), ContentType: "application/pdf"},
				Content: []byte("%PDF-1.7 one page")}
		}
		if _, err := e.Submit(ctx, SubmitRequest{Team: "alpha", RequestID: fmt.Sprintf("batch-%d", batch), Docs: docs}); err != nil {
			b.Fatal(err)
		}
		n -= size
	}
}

// BenchmarkPurgeStep measures one retention step: one op deletes
// DefaultPurgeStep succeeded jobs, each with its history (four events) and
// a 2 KiB preview, in one writer group with its fsync. It is what the
// commands queued behind a step wait for at most.
func BenchmarkPurgeStep(b *testing.B) {
	dir := b.TempDir()
	st, err := store.Open(filepath.Join(dir, "leasehold.db"))
	if err != nil {
		b.Fatal(err)
	}
	clk := testclock.NewMono(epoch, time.Hour)
	e, err := New(Config{Store: st, Seed: 1, Now: clk.Now, Mono: clk.Mono, LeaseTTL: time.Hour,
		Limits: jobs.Limits{MaxTeamQueue: 1 << 30}, Retention: Retention{Jobs: time.Hour}})
	if err != nil {
		b.Fatal(err)
	}
	e.Start()
	b.Cleanup(func() {
		e.Stop()
		st.Close()
	})
	ctx := context.Background()
	png := make([]byte, 2<<10)
	grants := preGrant(b, e, b.N*DefaultPurgeStep)
	var wg sync.WaitGroup
	var next atomic.Int64
	for range 64 {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < len(grants); i = int(next.Add(1) - 1) {
				g := grants[i]
				req := CompleteRequest{Job: g.Job.ID, Completion: jobs.Completion{Token: g.Job.Lease.Token, Renderer: "r-1", Success: true},
					Preview: &jobs.Preview{Digest: fmt.Sprint(i), ContentType: "image/png", Content: png}}
				if _, err := complete(ctx, e, req); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	clk.Advance(2 * time.Hour)
	b.ResetTimer()
	for range b.N {
		r, err := e.Purge(ctx)
		if err != nil || r.Jobs != DefaultPurgeStep {
			b.Fatalf("Purge = %+v, %v; want %d jobs", r, err, DefaultPurgeStep)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N*DefaultPurgeStep)/b.Elapsed().Seconds(), "jobs/s")
}
