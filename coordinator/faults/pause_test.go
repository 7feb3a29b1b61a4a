package faults

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/leasehold/leasehold/client"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"github.com/leasehold/leasehold/internal/proctest"
)

// pauseTTL is the lease TTL of the pause test: short, so that a cycle is
// quick, and twice what a loaded CI machine needs to keep the steady
// renderers' leases.
const pauseTTL = 2 * time.Second

// leaseRef names one lease.
type leaseRef struct {
	job   string
	token uint64
}

func (l leaseRef) String() string { return fmt.Sprintf("%s/%d", l.job, l.token) }

// TestPausedRenderers freezes renderers with SIGSTOP while they hold
// leases, under a steady load, until their leases have expired and other
// renderers have completed the jobs, then wakes them with SIGCONT; many
// times over. One frozen renderer never heartbeats (--heartbeat-interval
// 1h), so that on waking its first act is to complete, and every stale
// completion meets the coordinator's fencing check; the other heartbeats
// as usual, so it either completes (refused) or learns from a heartbeat
// answer that its lease is lost and drops the work.
//
// It checks that no stale completion is ever accepted (every job's
// artifact comes from its last lease, never from an expired one), that
// each refused completion is recorded in ListRejectedCompletions and in
// the job's history as COMPLETION_REJECTED, with the artifact another
// renderer's, and that only frozen renderers ever lose a lease.
func TestPausedRenderers(t *testing.T) {
	t.Parallel()
	cycles := 6
	if *long {
		cycles = 100
	}
	coord := startCoordinator(t, "127.0.0.1:0", dataDir(t), "--lease-ttl", pauseTTL.String(),
		"--backoff-base", "50ms", "--backoff-cap", "200ms", "--max-attempts", "10")
	for i := range 2 {
		startRenderer(t, coord.Addr, "steady-"+strconv.Itoa(i), "--capacity", "4", "--latency", "100ms")
	}
	silent := startRenderer(t, coord.Addr, "frozen-silent", "--capacity", "4", "--latency", "300ms", "--heartbeat-interval", "1h")
	beating := startRenderer(t, coord.Addr, "frozen-beating", "--capacity", "4", "--latency", "300ms")
	frozen := []*renderer{silent, beating}
	alpha, beta := dial(t, coord.Addr, tokenAlpha), dial(t, coord.Addr, tokenBeta)
	load := startLoad(t, map[string]*client.Client{"alpha": alpha, "beta": beta}, 3, 12)

	start := time.Now()
	var frozenLeases, rejected, dropped int
	for cycle := range cycles {
		f, r, d := pauseCycle(t, alpha, beta, frozen)
		frozenLeases, rejected, dropped = frozenLeases+f, rejected+r, dropped+d
		if t.Failed() {
			t.Fatalf("cycle %d failed", cycle)
		}
	}
	batches := load.stop(t)
	took := time.Since(start)

	jobs := append(teamJobs(t, alpha, "alpha"), teamJobs(t, beta, "beta")...)
	expired := checkNoStaleSuccess(t, jobs, frozen)
	recorded := checkRejectionsRecorded(t, coord.Addr, jobs, frozen)
	if rejected == 0 {
		t.Errorf("no stale completion was refused in %d cycles; the test froze nothing that completed late", cycles)
	}
	if recorded < rejected {
		t.Errorf("%d rejections recorded, want at least the %d awaited", recorded, rejected)
	}
	t.Logf("FIGURE renderer pauses: %d SIGSTOP/SIGCONT cycles of 2 renderers past a %v TTL under load (%d batches, %d jobs, %v): %d leases frozen and expired (%d expiries in all), %d stale completions refused and recorded, %d dropped by the renderer on a heartbeat answer, 0 accepted",
		cycles, pauseTTL, batches, len(jobs), took.Round(time.Second), frozenLeases, expired, recorded, dropped)
}

// pauseCycle freezes each renderer of frozen as soon as it takes a new
// lease, waits until the jobs it held have expired and succeeded elsewhere,
// wakes it and waits for its answer to each lost lease. It returns how
// many leases were frozen, how many late completions were refused and how
// many leases a renderer dropped on a heartbeat answer.
func pauseCycle(t *testing.T, alpha, beta *client.Client, frozen []*renderer) (frozenLeases, rejected, dropped int) {
	t.Helper()
	marks := make([]int, len(frozen))
	for i, r := range frozen {
		r.WaitFrom(r.Mark(), "lease acquired")
		r.Signal(syscall.SIGSTOP)
		marks[i] = r.Mark()
	}
	// The leases each frozen renderer holds, by batch.
	held := map[string][]leaseRef{}
	byBatch := map[string][]string{}
	teamOf := map[string]string{}
	clients := map[string]*client.Client{"alpha": alpha, "beta": beta}
	for team, c := range clients {
		for j, err := range c.AllJobs(testContext(t), &leaseholdv1.ListJobsRequest{Team: team, Phase: leaseholdv1.Phase_PHASE_LEASED, PageSize: 1000, OmitEvents: true}) {
			if err != nil {
				t.Fatalf("listing leased jobs: %v", err)
			}
			l := j.GetLease()
			for _, r := range frozen {
				if l.GetRendererId() == r.id {
					held[r.id] = append(held[r.id], leaseRef{j.GetId(), l.GetToken()})
					teamOf[j.GetId()] = team
					byBatch[team+"/"+j.GetBatchId()] = append(byBatch[team+"/"+j.GetBatchId()], j.GetId())
				}
			}
		}
	}
	for key, ids := range byBatch {
		team, batch, _ := strings.Cut(key, "/")
		waitPhases(t, clients[team], batch, "the frozen renderers' jobs succeeded elsewhere", func(ph map[string]leaseholdv1.Phase) bool {
			for _, id := range ids {
				if ph[id] != leaseholdv1.Phase_PHASE_SUCCEEDED {
					return false
				}
			}
			return true
		})
	}
	// A lease whose completion had left before the freeze may have won;
	// every other one expired and owes an answer once its holder wakes.
	lost := map[string][]leaseRef{}
	for id, refs := range held {
		for _, l := range refs {
			j := getJob(t, clients[teamOf[l.job]], l.job)
			if j.GetArtifact().GetToken() == l.token {
				continue
			}
			if !slices.ContainsFunc(eventsOf(j, leaseholdv1.EventKind_EVENT_KIND_LEASE_EXPIRED), func(ev *leaseholdv1.JobEvent) bool {
				return ev.GetToken() == l.token
			}) {
				t.Errorf("lease %v of frozen %s ended without expiring; history:\n%s", l, id, history(j))
			}
			lost[id] = append(lost[id], l)
			frozenLeases++
		}
	}
	for i, r := range frozen {
		r.Signal(syscall.SIGCONT)
		for _, l := range lost[r.id] {
			job, token := "job="+l.job+" ", "token="+strconv.FormatUint(l.token, 10)+" "
			want := [][]string{{"completion rejected", job, token}}
			if r.id != "frozen-silent" {
				want = append(want, []string{"lease lost", job, token})
			}
			line := r.WaitAny(marks[i], want...)
			if strings.Contains(line, "completion rejected") {
				rejected++
			} else {
				dropped++
			}
		}
	}
	return frozenLeases, rejected, dropped
}

// checkNoStaleSuccess checks that every job succeeded exactly once, under
// its last lease, whose renderer's preview it references, and that only
// frozen renderers lost leases. It returns the number of expiries.
func checkNoStaleSuccess(t *testing.T, jobs []*leaseholdv1.Job, frozen []*renderer) (expiries int) {
	t.Helper()
	isFrozen := map[string]bool{}
	for _, r := range frozen {
		isFrozen[r.id] = true
	}
	for _, j := range jobs {
		leased := eventsOf(j, leaseholdv1.EventKind_EVENT_KIND_LEASED)
		succeeded := eventsOf(j, leaseholdv1.EventKind_EVENT_KIND_SUCCEEDED)
		if j.GetPhase() != leaseholdv1.Phase_PHASE_SUCCEEDED || len(succeeded) != 1 || len(leased) == 0 {
			t.Errorf("job %s: %v with %d SUCCEEDED events, want one success; history:\n%s", j.GetId(), j.GetPhase(), len(succeeded), history(j))
			continue
		}
		last := leased[len(leased)-1]
		if a := j.GetArtifact(); a.GetToken() != last.GetToken() || a.GetRendererId() != last.GetRendererId() || succeeded[0].GetToken() != last.GetToken() {
			t.Errorf("job %s: artifact of token %d by %s, want its last lease's (token %d by %s); history:\n%s",
				j.GetId(), a.GetToken(), a.GetRendererId(), last.GetToken(), last.GetRendererId(), history(j))
		}
		for _, ev := range eventsOf(j, leaseholdv1.EventKind_EVENT_KIND_LEASE_EXPIRED) {
			expiries++
			if !isFrozen[ev.GetRendererId()] {
				t.Errorf("job %s: the lease of %s (token %d), which was never frozen, expired; history:\n%s",
					j.GetId(), ev.GetRendererId(), ev.GetToken(), history(j))
			}
		}
	}
	return expiries
}

// checkRejectionsRecorded checks every rejected completion against the
// jobs and the frozen renderers' logs: each refused completion a renderer
// logged is recorded once, with its job's history showing it and the
// job's artifact made under a later lease: another renderer's, or the
// same renderer's, which may win the job's next lease once it thaws. It
// returns the number of rejections recorded.
func checkRejectionsRecorded(t *testing.T, addr string, jobs []*leaseholdv1.Job, frozen []*renderer) int {
	t.Helper()
	byID := map[string]*leaseholdv1.Job{}
	for _, j := range jobs {
		byID[j.GetId()] = j
	}
	type key struct {
		leaseRef
		renderer string
	}
	recorded := map[key]*leaseholdv1.RejectedCompletion{}
	ops := dial(t, addr, tokenOperator)
	for rc, err := range ops.AllRejectedCompletions(testContext(t), &leaseholdv1.ListRejectedCompletionsRequest{}) {
		if err != nil {
			t.Fatalf("listing rejected completions: %v", err)
		}
		k := key{leaseRef{rc.GetJobId(), rc.GetToken()}, rc.GetRendererId()}
		if recorded[k] != nil {
			t.Errorf("rejection of %v by %s recorded twice", k.leaseRef, k.renderer)
		}
		recorded[k] = rc
		if problem := rejectionProblem(rc, byID[rc.GetJobId()]); problem != "" {
			t.Errorf("rejection of %v by %s: %s", k.leaseRef, k.renderer, problem)
		}
	}
	for _, r := range frozen {
		for _, line := range r.LinesWith("completion rejected") {
			token, _ := strconv.ParseUint(proctest.LogAttr(line, "token"), 10, 64)
			k := key{leaseRef{proctest.LogAttr(line, "job"), token}, r.id}
			if recorded[k] == nil {
				t.Errorf("%s logged a refused completion of %v that ListRejectedCompletions does not record: %s", r.id, k.leaseRef, line)
			}
		}
	}
	for k := range recorded {
		if !slices.ContainsFunc(frozen, func(r *renderer) bool { return r.id == k.renderer }) {
			t.Errorf("a completion of %v by %s, which was never frozen, was refused", k.leaseRef, k.renderer)
		}
	}
	return len(recorded)
}

// rejectionProblem says what is wrong with a recorded rejection of a
// completion of j: a reason other than a lost lease's, a job that does not
// exist, an artifact not made under a later lease, or a history that does
// not show it. The later lease may be the same renderer's: once thawed, it
// may win the job back. It returns "" when nothing is wrong.
func rejectionProblem(rc *leaseholdv1.RejectedCompletion, j *leaseholdv1.Job) string {
	switch {
	case rc.GetReason() != "LEASE_EXPIRED" && rc.GetReason() != "STALE_LEASE":
		return fmt.Sprintf("reason %s, want LEASE_EXPIRED or STALE_LEASE", rc.GetReason())
	case j == nil:
		return "it names an unknown job"
	case j.GetArtifact().GetToken() <= rc.GetToken():
		return fmt.Sprintf("the job's artifact is token %d by %s, want one made under a later lease",
			j.GetArtifact().GetToken(), j.GetArtifact().GetRendererId())
	case !slices.ContainsFunc(eventsOf(j, leaseholdv1.EventKind_EVENT_KIND_COMPLETION_REJECTED), func(ev *leaseholdv1.JobEvent) bool {
		return ev.GetToken() == rc.GetToken()
	}):
		return "it is missing from the job's history:\n" + history(j)
	}
	return ""
}

// TestRejectionProblem checks the check of a recorded rejection on jobs
// made up for it, without processes.
func TestRejectionProblem(t *testing.T) {
	t.Parallel()
	job := func(artifactToken uint64, renderer string) *leaseholdv1.Job {
		return &leaseholdv1.Job{Id: "j-1", Artifact: &leaseholdv1.Artifact{Token: artifactToken, RendererId: renderer},
			Events: []*leaseholdv1.JobEvent{{Kind: leaseholdv1.EventKind_EVENT_KIND_COMPLETION_REJECTED, Token: 7, RendererId: "frozen"}}}
	}
	rc := &leaseholdv1.RejectedCompletion{JobId: "j-1", Token: 7, RendererId: "frozen", Reason: "LEASE_EXPIRED"}
	tests := []struct {
		name string
		job  *leaseholdv1.Job
		ok   bool
	}{
		{"Another renderer's artifact under a later lease", job(9, "quick"), true},
		{"The same renderer's artifact under a later lease, won after it thawed", job(9, "frozen"), true},
		{"An artifact under the refused lease", job(7, "frozen"), false},
		{"An artifact under an earlier lease", job(5, "quick"), false},
		{"An unknown job", nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := rejectionProblem(rc, tt.job); (got == "") != tt.ok {
				t.Errorf("rejectionProblem = %q, want ok %v", got, tt.ok)
			}
		})
	}
}

// load is a closed-loop load: each submitter submits a batch, waits until
// it is done, and submits the next.
type load struct {
	stopC chan struct{}
	wg    sync.WaitGroup
	mu    sync.Mutex
	done  int
	errs  []error
}

// startLoad starts submitters per team, each submitting batches of size
// documents.
func startLoad(t *testing.T, clients map[string]*client.Client, submitters, size int) *load {
	l := &load{stopC: make(chan struct{})}
	for team, c := range clients {
		for i := range submitters {
			l.wg.Go(func() {
				for n := 0; ; n++ {
					select {
					case <-l.stopC:
						return
					default:
					}
					name := fmt.Sprintf("%s-%d-%d", team, i, n)
					ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
					resp, err := c.SubmitBatch(ctx, team, name, docs(name, size), nil)
					if err == nil {
						_, err = watchBatch(ctx, c, resp.GetBatch().GetId(), nil)
					}
					cancel()
					l.mu.Lock()
					if err != nil {
						l.errs = append(l.errs, fmt.Errorf("batch %s: %w", name, err))
					} else {
						l.done++
					}
					l.mu.Unlock()
					if err != nil {
						return
					}
				}
			})
		}
	}
	t.Cleanup(func() { l.halt() })
	return l
}

// halt stops the submitters after their current batch and waits for them.
func (l *load) halt() {
	select {
	case <-l.stopC:
	default:
		close(l.stopC)
	}
	l.wg.Wait()
}

// stop halts the load, fails the test on any submitter's error, and
// returns how many batches were submitted and done.
func (l *load) stop(t *testing.T) int {
	t.Helper()
	l.halt()
	if err := errors.Join(l.errs...); err != nil {
		t.Fatalf("load: %v", err)
	}
	return l.done
}
