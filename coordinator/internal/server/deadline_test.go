package server

import (
	"testing"
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/engine"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"github.com/leasehold/leasehold/internal/testclock"
	"google.golang.org/grpc/codes"
)

// TestShownDeadline checks that the lease deadline people see is decided
// at the grant and at each extension, on the wall clock, and that commands
// that do not extend the lease leave it where it was, however the
// monotonic clock the writer judges by drifts from the wall clock.
func TestShownDeadline(t *testing.T) {
	t.Parallel()
	mono := testclock.NewMono(time.Time{}, time.Hour)
	b := setup(t, func(o *options) { o.engine = func(c *engine.Config) { c.Mono = mono.Mono } })
	advance := func(wall, drift time.Duration) {
		b.clock.Advance(wall)
		mono.Advance(wall + drift)
	}
	g := b.leaseOne(t)
	granted := g.GetLease().GetDeadline().AsTime()
	if want := b.clock.Now().Add(15 * time.Second); !granted.Equal(want) {
		t.Fatalf("granted deadline %v, want %v", granted, want)
	}

	for i, drift := range []time.Duration{260 * time.Nanosecond, -10 * time.Nanosecond, time.Microsecond} {
		advance(time.Second, drift)
		_, err := b.rend.Complete(as(t, renderer), successOf(g.GetJobId(), g.GetLease().GetToken()+uint64(1+i), sha([]byte("x"))))
		wantError(t, err, codes.Aborted, "STALE_LEASE")
		if got := b.getJob(t, g.GetJobId()).GetLease().GetDeadline().AsTime(); !got.Equal(granted) {
			t.Errorf("after a refused completion with the clocks %v apart: deadline %v, want %v as granted (moved %v)", drift, got, granted, got.Sub(granted))
		}
	}

	advance(time.Second, 70*time.Nanosecond)
	sc := b.openSession(t, hello("r-1", "i-1", 1), 0)
	st := sc.call(&leaseholdv1.SessionRequest{Heartbeats: []*leaseholdv1.LeaseRef{ref(g)}}).GetLeases()[0]
	extended := b.clock.Now().Add(15 * time.Second)
	if st.GetState() != leaseholdv1.LeaseState_LEASE_STATE_HELD || !st.GetDeadline().AsTime().Equal(extended) {
		t.Errorf("heartbeat = %v, want HELD until %v", st, extended)
	}
	advance(time.Second, -30*time.Nanosecond)
	_, err := b.rend.Complete(as(t, renderer), successOf(g.GetJobId(), g.GetLease().GetToken()+100, sha([]byte("x"))))
	wantError(t, err, codes.Aborted, "STALE_LEASE")
	if got := b.getJob(t, g.GetJobId()).GetLease().GetDeadline().AsTime(); !got.Equal(extended) {
		t.Errorf("after the extension and a refused completion: deadline %v, want %v as extended (moved %v)", got, extended, got.Sub(extended))
	}
}
