package faults

import (
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"github.com/leasehold/leasehold/internal/frozenfs"
	"github.com/leasehold/leasehold/internal/proctest"
)

// Timing of the storage stall test: a TTL short enough that the freeze
// outlasts it twice over, and renders long enough that every lease must
// be heartbeated through the whole freeze and past it.
const (
	stallTTL    = time.Second
	stallFreeze = 5 * stallTTL / 2
	// stallRender is how long the heartbeating renderers' renders take:
	// more than a TTL past the end of the freeze, so that a lease is still
	// held when they complete only if the heartbeats sent during the
	// freeze and after it were applied.
	stallRender = stallFreeze + 2*stallTTL
	// stallExpiryBound bounds how long after the thaw the lease of a
	// renderer that really stopped may still be held: the half-TTL grace
	// that follows a stall, with a TTL and a second on top as slack for a
	// loaded machine.
	stallExpiryBound = stallTTL/2 + stallTTL + time.Second
)

// TestStorageStall runs a coordinator whose data directory is on an ext4
// filesystem frozen with fsfreeze for 2.5 TTLs while renderers hold
// leases, and while a submit's commit waits on the frozen disk. The
// writer cannot apply the renderers' heartbeats meanwhile: they wait in
// their streams until the commit returns after the thaw. Leases of
// renderers that kept heartbeating must survive (each job succeeds on its
// first attempt under its first token, with no LEASE_EXPIRED event), and
// the coordinator must say that its writer stalled.
//
// The grace is bounded: two renderers frozen with SIGSTOP just before the
// disk lose their leases within stallExpiryBound of the thaw. One of them
// never heartbeats (--heartbeat-interval 1h), so that once woken its first
// act is to complete, and that completion must be refused; the other
// heartbeats as usual, so on waking it either completes (refused) or first
// learns from a heartbeat answer that its lease is lost and drops the work.
//
// Mounting, loop devices and fsfreeze need root; without them, or without
// losetup, mkfs.ext4 or fsfreeze, the test is skipped.
func TestStorageStall(t *testing.T) {
	t.Parallel()
	mnt := frozenfs.Mount(t, 64<<20)
	coord := startCoordinator(t, "127.0.0.1:0", filepath.Join(mnt, "data"), "--lease-ttl", stallTTL.String(),
		"--backoff-base", "50ms", "--backoff-cap", "200ms")
	// Two renderers whose capacity the first batch fills, so that the
	// jobs submitted next go to the renderers frozen later.
	const capacity = 3
	for i := range 2 {
		startRenderer(t, coord.Addr, fmt.Sprintf("beating-%d", i), "--capacity", fmt.Sprint(capacity), "--latency", stallRender.String())
	}
	alpha := dial(t, coord.Addr, tokenAlpha)
	batch, ids := submit(t, alpha, "alpha", "held", docs("held", 2*capacity))
	waitPhases(t, alpha, batch, "every job leased", func(ph map[string]leaseholdv1.Phase) bool {
		return countPhase(ph, leaseholdv1.Phase_PHASE_LEASED) == len(ids)
	})
	firstToken := map[string]uint64{}
	for _, id := range ids {
		firstToken[id] = getJob(t, alpha, id).GetLease().GetToken()
	}

	// The renderers that stop, one lease each. Their renders (a TTL) end
	// while they are stopped.
	stopped := map[string]*stoppedRenderer{}
	for _, silent := range []bool{true, false} {
		r := &stoppedRenderer{silent: silent}
		args := []string{"--capacity", "1", "--latency", stallTTL.String()}
		id := "stopped-beating"
		if silent {
			id = "stopped-silent"
			args = append(args, "--heartbeat-interval", "1h")
		}
		r.renderer = startRenderer(t, coord.Addr, id, args...)
		stopped[id] = r
	}
	stoppedBatch, stoppedIDs := submit(t, alpha, "alpha", "stopped", docs("stopped", len(stopped)))
	waitPhases(t, alpha, stoppedBatch, "the stopped renderers' jobs leased", func(ph map[string]leaseholdv1.Phase) bool {
		return countPhase(ph, leaseholdv1.Phase_PHASE_LEASED) == len(stoppedIDs)
	})
	for _, id := range stoppedIDs {
		lease := getJob(t, alpha, id).GetLease()
		r := stopped[lease.GetRendererId()]
		if r == nil || r.job != "" {
			t.Fatalf("job %s is leased to %q, want one job for each stopped renderer", id, lease.GetRendererId())
		}
		r.job, r.token = id, lease.GetToken()
		// The grant reached the renderer before it stops.
		r.WaitFor(append([]string{"lease acquired"}, r.lease()...)...)
		r.Signal(syscall.SIGSTOP)
	}

	// Freeze the disk, and have the writer commit on it: the submit's
	// group holds the writer until the thaw.
	stalledMark := coord.Mark()
	thaw := frozenfs.Freeze(t, mnt)
	frozenAt := time.Now()
	type submitted struct {
		at  time.Time
		err error
	}
	during := make(chan submitted, 1)
	ctx := testContext(t)
	go func() {
		_, err := alpha.SubmitBatch(ctx, "alpha", "during-freeze", docs("during", 2), nil)
		during <- submitted{time.Now(), err}
	}()
	// Sleeping makes the fault last; nothing waits on it.
	time.Sleep(stallFreeze)
	thawAt := time.Now()
	thaw()
	frozeFor := time.Since(frozenAt)

	s := <-during
	if s.err != nil {
		t.Fatalf("the submit made during the freeze failed: %v", s.err)
	}
	if s.at.Before(thawAt) {
		t.Fatalf("the submit made during the freeze returned %v before the thaw; the writer never waited on the frozen disk",
			thawAt.Sub(s.at).Round(time.Millisecond))
	}
	stallLine := coord.WaitFrom(stalledMark, "writer stalled")
	stalled, err := time.ParseDuration(proctest.LogAttr(stallLine, "stalled"))
	if err != nil || stalled < stallFreeze/2 {
		t.Errorf("the coordinator logged %q, want a stall of about the %v freeze", stallLine, stallFreeze)
	}

	// The stopped renderers' leases must expire, within the bound.
	waitPhases(t, alpha, stoppedBatch, "the stopped renderers' leases expired", func(ph map[string]leaseholdv1.Phase) bool {
		for _, id := range stoppedIDs {
			if p := ph[id]; p == leaseholdv1.Phase_PHASE_UNSPECIFIED || p == leaseholdv1.Phase_PHASE_LEASED {
				return false
			}
		}
		return true
	})
	for _, r := range stopped {
		j := getJob(t, alpha, r.job)
		evs := eventsOf(j, leaseholdv1.EventKind_EVENT_KIND_LEASE_EXPIRED)
		if len(evs) != 1 || evs[0].GetToken() != r.token {
			t.Errorf("job %s of %s left LEASED without its lease (token %d) expiring once; history:\n%s", r.job, r.id, r.token, history(j))
			continue
		}
		r.expiredAfter = evs[0].GetAt().AsTime().Sub(thawAt)
		switch {
		case r.expiredAfter < 0:
			t.Errorf("the lease of %s expired %v before the thaw; its deadline did not fall in the stall, so the test proves nothing of the grace's bound; history:\n%s",
				r.id, -r.expiredAfter.Round(time.Millisecond), history(j))
		case r.expiredAfter > stallExpiryBound:
			t.Errorf("the lease of %s expired %v after the thaw, want within %v; history:\n%s",
				r.id, r.expiredAfter.Round(time.Millisecond), stallExpiryBound, history(j))
		}
	}
	// Woken, each answers its lost lease: the silent one by completing,
	// refused; the other by completing, refused, or by dropping the work
	// on a heartbeat's answer, whichever comes first.
	for _, r := range stopped {
		mark := r.Mark()
		r.Signal(syscall.SIGCONT)
		want := [][]string{append([]string{"completion rejected"}, r.lease()...)}
		if !r.silent {
			want = append(want, append([]string{"lease lost"}, r.lease()...))
		}
		line := r.WaitAny(mark, want...)
		if !strings.Contains(line, "completion rejected") {
			r.outcome = "dropped on a heartbeat answer"
			continue
		}
		r.outcome = "completion refused"
		j := getJob(t, alpha, r.job)
		if rejected := eventsOf(j, leaseholdv1.EventKind_EVENT_KIND_COMPLETION_REJECTED); len(rejected) != 1 || rejected[0].GetToken() != r.token {
			t.Errorf("job %s: %s logged %q, want one COMPLETION_REJECTED of its token %d in the history:\n%s", r.job, r.id, line, r.token, history(j))
		}
	}

	// Every lease heartbeated through the freeze must have been kept.
	waitBatchDone(t, alpha, batch)
	expired := 0
	for _, id := range ids {
		j := getJob(t, alpha, id)
		lost := len(eventsOf(j, leaseholdv1.EventKind_EVENT_KIND_LEASE_EXPIRED))
		expired += lost
		if j.GetPhase() != leaseholdv1.Phase_PHASE_SUCCEEDED || j.GetAttempt() != 1 || lost > 0 ||
			j.GetArtifact().GetToken() != firstToken[id] || len(eventsOf(j, leaseholdv1.EventKind_EVENT_KIND_LEASED)) != 1 {
			t.Errorf("job %s: %v on attempt %d with %d expiries, artifact of token %d, want SUCCEEDED on attempt 1 under its first token %d; history:\n%s",
				id, j.GetPhase(), j.GetAttempt(), lost, j.GetArtifact().GetToken(), firstToken[id], history(j))
		}
	}
	silent, beating := stopped["stopped-silent"], stopped["stopped-beating"]
	t.Logf("FIGURE storage stall: ext4 data disk frozen %v under a %v TTL (writer stalled %v, a submit held until %v after the thaw); %d heartbeated leases held through it, %d expired; of the 2 renderers SIGSTOPped before the freeze, the leases expired %v (silent) and %v (heartbeating) after the thaw (bound %v), their work ended: %s, %s",
		frozeFor.Round(time.Millisecond), stallTTL, stalled.Round(time.Millisecond), s.at.Sub(thawAt).Round(time.Millisecond),
		len(ids), expired, silent.expiredAfter.Round(time.Millisecond), beating.expiredAfter.Round(time.Millisecond), stallExpiryBound,
		silent.outcome, beating.outcome)
}

// stoppedRenderer is a renderer frozen with SIGSTOP before the disk was, with
// the one lease it held and what became of it.
type stoppedRenderer struct {
	*renderer
	silent       bool // never heartbeats
	job          string
	token        uint64
	expiredAfter time.Duration // from the thaw to the lease's expiry
	outcome      string
}

// lease returns the parts of a log line naming r's lease.
func (r *stoppedRenderer) lease() []string {
	return []string{"job=" + r.job + " ", fmt.Sprintf("token=%d ", r.token)}
}
