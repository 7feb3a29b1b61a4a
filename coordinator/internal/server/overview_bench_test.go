package server

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/auth"
	"github.com/leasehold/leasehold/coordinator/internal/engine"
	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	"github.com/leasehold/leasehold/coordinator/internal/store"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
)

// BenchmarkOverviewMillionJobs measures what a console page or `leasehold
// top` asks for against a store of 1,000,000 jobs: 2,000 batches of 500
// over four teams, 90% SUCCEEDED with three history events each, 5%
// FAILED, the newest 5% (50,000) QUEUED, built directly through the
// store's own record helpers in the setup (about a minute), then opened by
// a real engine, which rebuilds its queues and counts from it. Each op is
// one call of the handler with the caller in its context, as the console
// makes it; the contract is under 50 ms.
//
//	go test -run '^$' -bench OverviewMillionJobs -benchtime 200x ./coordinator/internal/server/
func BenchmarkOverviewMillionJobs(b *testing.B) {
	const (
		jobsTotal = 1_000_000
		batchSize = 500
		teams     = 4
	)
	dir := b.TempDir()
	path := filepath.Join(dir, "leasehold.db")
	start := time.Now()
	fillStore(b, path, jobsTotal, batchSize, teams)
	b.Logf("store of %d jobs built in %v", jobsTotal, time.Since(start).Round(time.Second))

	st, err := store.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	opened := time.Now()
	eng, err := engine.New(engine.Config{Store: st, Limits: jobs.Limits{MaxTeamQueue: jobsTotal}})
	if err != nil {
		b.Fatal(err)
	}
	eng.Start()
	defer eng.Stop()
	b.Logf("engine rebuilt its indexes in %v", time.Since(opened).Round(time.Millisecond))
	svc, err := New(Config{Engine: eng})
	if err != nil {
		b.Fatal(err)
	}
	defer svc.Shutdown()
	ops := auth.NewContext(context.Background(), auth.Principal{Name: "ops", Scope: []string{auth.AllTeams}, Roles: []auth.Role{auth.RoleOperator}})
	team1 := auth.NewContext(context.Background(), auth.Principal{Name: "t1", Team: "team-1", Roles: []auth.Role{auth.RoleSubmitter}})

	for _, bc := range []struct {
		name string
		call func() error
	}{
		{"GetOverview/operator-all-teams", func() error {
			resp, err := svc.Overview.GetOverview(ops, &leaseholdv1.GetOverviewRequest{})
			if err == nil && len(resp.GetOverview().GetTeams()) != teams {
				err = fmt.Errorf("%d teams, want %d", len(resp.GetOverview().GetTeams()), teams)
			}
			return err
		}},
		{"ListBatches/operator-first-page", func() error {
			resp, err := svc.Overview.ListBatches(ops, &leaseholdv1.ListBatchesRequest{})
			if err == nil && len(resp.GetBatches()) != 100 {
				err = fmt.Errorf("%d batches, want 100", len(resp.GetBatches()))
			}
			return err
		}},
		{"ListBatches/submitter-done-only", func() error {
			resp, err := svc.Overview.ListBatches(team1, &leaseholdv1.ListBatchesRequest{State: leaseholdv1.BatchState_BATCH_STATE_DONE})
			if err == nil && len(resp.GetBatches()) != 100 {
				err = fmt.Errorf("%d batches, want 100", len(resp.GetBatches()))
			}
			return err
		}},
		{"ListRenderers/operator", func() error {
			_, err := svc.Overview.ListRenderers(ops, &leaseholdv1.ListRenderersRequest{})
			return err
		}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			var worst time.Duration
			for b.Loop() {
				t0 := time.Now()
				if err := bc.call(); err != nil {
					b.Fatal(err)
				}
				worst = max(worst, time.Since(t0))
			}
			b.ReportMetric(float64(worst.Microseconds())/1000, "max-ms")
			if worst > 50*time.Millisecond {
				b.Errorf("slowest call took %v, over the 50 ms the overview promises", worst)
			}
		})
	}
}

// fillStore writes n jobs in batches of batchSize over teams teams into a
// new store at path, as the writer would have left them: records, history
// events, the team and unfinished indexes, and the batch and team counts.
func fillStore(b *testing.B, path string, n, batchSize, teams int) {
	b.Helper()
	st, err := store.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	const batchesPerTx = 20
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	policy := jobs.RetryPolicy{MaxAttempts: 5, BackoffBase: time.Second, BackoffCap: 5 * time.Minute}
	batches := n / batchSize
	queuedFrom := batches - batches/20
	for first := 0; first < batches; first += batchesPerTx {
		err := st.Update(func(tx *store.Tx) error {
			teamDelta := map[string]*jobs.Counts{}
			for bi := first; bi < min(first+batchesPerTx, batches); bi++ {
				team := fmt.Sprintf("team-%d", bi%teams)
				at := t0.Add(time.Duration(bi) * time.Second)
				id, err := tx.NextBatchID()
				if err != nil {
					return err
				}
				firstJob, err := tx.NextJobIDs(batchSize)
				if err != nil {
					return err
				}
				if err := tx.PutBatch(jobs.Batch{ID: id, Team: team, RequestID: fmt.Sprintf("req-%d", bi), CreatedAt: at,
					FirstJob: firstJob, Count: uint32(batchSize), Policy: policy}); err != nil {
					return err
				}
				var counts jobs.Counts
				for k := range batchSize {
					j := jobs.Job{ID: firstJob + uint64(k), BatchID: id, Team: team, Policy: policy, Cycle: 1,
						Doc:       jobs.Document{Name: fmt.Sprintf("doc-%d.pdf", k), ContentType: "application/pdf", SizeBytes: 4096},
						CreatedAt: at, UpdatedAt: at, EnqueuedAt: at, Phase: jobs.PhaseQueued}
					evs := []jobs.Event{{Seq: 1, At: at, Kind: jobs.EventSubmitted, Phase: jobs.PhaseQueued}}
					switch {
					case bi >= queuedFrom:
						if err := tx.SetUnfinished(j.ID, true); err != nil {
							return err
						}
					case k%20 == 0:
						j.Phase, j.Attempt, j.TerminalReason, j.FinishedAt = jobs.PhaseFailed, 1, jobs.ReasonInvalidDocument, at
						evs = append(evs, jobs.Event{Seq: 2, At: at, Kind: jobs.EventLeased, Phase: jobs.PhaseLeased, Token: j.ID, Renderer: "r-1", Attempt: 1},
							jobs.Event{Seq: 3, At: at, Kind: jobs.EventFailed, Phase: jobs.PhaseFailed, Token: j.ID, Renderer: "r-1", Attempt: 1})
					default:
						j.Phase, j.Attempt, j.TerminalReason, j.FinishedAt = jobs.PhaseSucceeded, 1, jobs.ReasonSucceeded, at
						j.Artifact = jobs.Artifact{Digest: "77c1c2effe4376885835b4daf40613c6a29b85ca0fde390039d36a3c1d99163c", Size: 600, ContentType: "image/png", Token: j.ID, Renderer: "r-1"}
						j.Leases = []jobs.LeaseRecord{{Token: j.ID, Renderer: "r-1", Kind: jobs.LeaseCompleted}}
						evs = append(evs, jobs.Event{Seq: 2, At: at, Kind: jobs.EventLeased, Phase: jobs.PhaseLeased, Token: j.ID, Renderer: "r-1", Attempt: 1},
							jobs.Event{Seq: 3, At: at, Kind: jobs.EventSucceeded, Phase: jobs.PhaseSucceeded, Token: j.ID, Renderer: "r-1", Attempt: 1})
					}
					j.EventSeq = uint32(len(evs))
					if err := tx.PutJob(j); err != nil {
						return err
					}
					if err := tx.PutEvents(j.ID, evs); err != nil {
						return err
					}
					if err := tx.IndexTeamJob(team, j.ID); err != nil {
						return err
					}
					counts[j.Phase]++
				}
				if err := tx.AddBatchCounts(id, counts); err != nil {
					return err
				}
				if teamDelta[team] == nil {
					teamDelta[team] = &jobs.Counts{}
				}
				teamDelta[team].Add(counts)
			}
			for team, d := range teamDelta {
				if err := tx.AddTeamCounts(team, *d); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
	}
}
