package engine

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// series reads one series of a counter vector.
func series(t *testing.T, v *prometheus.CounterVec, labels ...string) float64 {
	t.Helper()
	return testutil.ToFloat64(v.WithLabelValues(labels...))
}

// TestJobCounters scripts a job through every counted transition and
// checks each counter, by team, against what happened since the engine
// started, with every known team's series present from the start.
func TestJobCounters(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t) // 3 attempts, backoff 1 s to 10 s, TTL 15 s

	// A first life: alpha's lease is granted but its holder never speaks
	// before the restart; beta submits and cancels.
	never := b.submit(t, "alpha", "e", "e.pdf").FirstJob
	if g := b.acquire(t, "r-1", 1); len(g) != 1 || g[0].Job.ID != never {
		t.Fatalf("granted %+v, want job %d", g, never)
	}
	beta := b.submit(t, "beta", "b", "b.pdf").FirstJob
	if _, err := b.e.Cancel(ctx, CancelRequest{Job: beta, Principal: "bob"}); err != nil {
		t.Fatal(err)
	}
	b.restart(t)

	t.Run("EveryKnownTeamStartsAtZero", func(t *testing.T) {
		for _, team := range []string{"alpha", "beta"} {
			for name, v := range map[string]*prometheus.CounterVec{"submitted": b.e.m.submitted, "succeeded": b.e.m.succeeded,
				"retried": b.e.m.retried, "expired": b.e.m.expired, "cancelled": b.e.m.cancelled} {
				if got := series(t, v, team); got != 0 {
					t.Errorf("%s{team=%s} = %v after a restart, want 0", name, team, got)
				}
			}
		}
		if got := testutil.CollectAndCount(b.e.m.failed); got != 2*len(failedReasons) {
			t.Errorf("leasehold_jobs_failed_total has %d series, want every failed reason of both teams (%d)", got, 2*len(failedReasons))
		}
		want := `
# HELP leasehold_queue_depth Ready jobs waiting per team.
# TYPE leasehold_queue_depth gauge
leasehold_queue_depth{team="alpha"} 0
leasehold_queue_depth{team="beta"} 0
`
		if err := testutil.GatherAndCompare(b.reg, strings.NewReader(want), "leasehold_queue_depth"); err != nil {
			t.Error(err)
		}
	})

	// The lease never heard from expires uncounted, and is cancelled.
	b.tick(t, 16*time.Second)
	if j := b.job(t, never); j.Phase != jobs.PhaseQueued {
		t.Fatalf("the lease never heard from left its job %v, want QUEUED", j.Phase)
	}
	if _, err := b.e.Cancel(ctx, CancelRequest{Job: never, Principal: "alice"}); err != nil {
		t.Fatal(err)
	}

	// Alpha's main script.
	ids := b.submit(t, "alpha", "a", "a.pdf", "retry.pdf", "c.pdf", "macro.docm").JobIDs()
	for _, g := range b.acquire(t, "r-1", 3) {
		var err error
		switch g.Job.ID {
		case ids[0]:
			_, err = complete(ctx, b.e, success(g.Job.ID, g.Job.Lease.Token, "r-1", "d"))
		case ids[1]:
			_, err = complete(ctx, b.e, failure(g.Job.ID, g.Job.Lease.Token, "r-1", jobs.ClassTransient, "boom"))
		case ids[2]:
			_, err = b.e.Cancel(ctx, CancelRequest{Job: g.Job.ID, Principal: "alice"})
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	b.tick(t, 10*time.Second) // the backoff elapses
	second := b.acquire(t, "r-1", 1)[0]
	if _, err := heartbeat(ctx, b.e, heartbeatRequest{Renderer: rend("r-1"), Leases: []LeaseRef{{Job: second.Job.ID, Token: second.Job.Lease.Token}}}); err != nil {
		t.Fatal(err)
	}
	b.tick(t, 16*time.Second) // its lease expires, counted
	b.tick(t, 10*time.Second)
	third := b.acquire(t, "r-1", 1)[0]
	if _, err := complete(ctx, b.e, failure(third.Job.ID, third.Job.Lease.Token, "r-1", jobs.ClassInvalidDocument, "bad")); err != nil {
		t.Fatal(err)
	}

	t.Run("EachCounterCountsItsTransitions", func(t *testing.T) {
		got := map[string]float64{
			"submitted":                   series(t, b.e.m.submitted, "alpha"),
			"succeeded":                   series(t, b.e.m.succeeded, "alpha"),
			"failed UNSUPPORTED_FORMAT":   series(t, b.e.m.failed, "alpha", "UNSUPPORTED_FORMAT"),
			"failed INVALID_DOCUMENT":     series(t, b.e.m.failed, "alpha", "INVALID_DOCUMENT"),
			"failed ATTEMPTS_EXHAUSTED":   series(t, b.e.m.failed, "alpha", "ATTEMPTS_EXHAUSTED"),
			"retried":                     series(t, b.e.m.retried, "alpha"),
			"expired":                     series(t, b.e.m.expired, "alpha"),
			"cancelled":                   series(t, b.e.m.cancelled, "alpha"),
			"finished SUCCEEDED":          series(t, b.e.m.finishedC, "alpha", "SUCCEEDED"),
			"finished CANCELLED":          series(t, b.e.m.finishedC, "alpha", "CANCELLED"),
			"finished INVALID_DOCUMENT":   series(t, b.e.m.finishedC, "alpha", "INVALID_DOCUMENT"),
			"finished UNSUPPORTED_FORMAT": series(t, b.e.m.finishedC, "alpha", "UNSUPPORTED_FORMAT"),
			"beta submitted":              series(t, b.e.m.submitted, "beta"),
		}
		want := map[string]float64{
			"submitted":                   4, // a, retry, c, macro; e was submitted before the restart
			"succeeded":                   1, // a
			"failed UNSUPPORTED_FORMAT":   1, // macro.docm, at submission
			"failed INVALID_DOCUMENT":     1, // retry.pdf, third attempt
			"failed ATTEMPTS_EXHAUSTED":   0,
			"retried":                     2, // retry.pdf after its transient failure and after its expiry
			"expired":                     2, // e (never heard from, uncounted) and retry.pdf's second lease
			"cancelled":                   2, // e and c
			"finished SUCCEEDED":          1,
			"finished CANCELLED":          2,
			"finished INVALID_DOCUMENT":   1,
			"finished UNSUPPORTED_FORMAT": 1,
			"beta submitted":              0,
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("counters (-want +got):\n%s", diff)
		}
	})

	t.Run("GaugesReadZeroRatherThanVanish", func(t *testing.T) {
		want := `
# HELP leasehold_leases_in_flight Leases held per team.
# TYPE leasehold_leases_in_flight gauge
leasehold_leases_in_flight{team="alpha"} 0
leasehold_leases_in_flight{team="beta"} 0
`
		if err := testutil.GatherAndCompare(b.reg, strings.NewReader(want), "leasehold_leases_in_flight"); err != nil {
			t.Error(err)
		}
	})

	t.Run("TheStoreGaugesDescribeTheFile", func(t *testing.T) {
		mfs, err := b.reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]float64{}
		for _, mf := range mfs {
			if strings.HasPrefix(mf.GetName(), "leasehold_store_") {
				got[mf.GetName()] = mf.GetMetric()[0].GetGauge().GetValue()
			}
		}
		st, err := b.st.Stats()
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]float64{
			"leasehold_store_size_bytes": float64(st.Size),
			"leasehold_store_free_pages": float64(st.FreePages),
			"leasehold_store_free_bytes": float64(st.FreePages * st.PageSize),
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("store gauges (-want +got):\n%s", diff)
		}
		if st.Size <= 0 || st.PageSize <= 0 {
			t.Errorf("stats = %+v, want a file size and a page size", st)
		}
	})

	t.Run("TheMetricsPassPrometheusLint", func(t *testing.T) {
		problems, err := testutil.GatherAndLint(b.reg)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range problems {
			t.Errorf("%s: %s", p.Metric, p.Text)
		}
	})
}
