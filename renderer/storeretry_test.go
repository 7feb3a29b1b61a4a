package renderer_test

import (
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/leasehold/leasehold/client/reason"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"github.com/leasehold/leasehold/renderer"
	"github.com/leasehold/leasehold/renderer/mock"
)

// TestWorkerWaitsForTheArtifactStore: a completion answered UNAVAILABLE
// ARTIFACT_STORE_UNAVAILABLE changed nothing, so the worker keeps the
// lease, heartbeating it, and sends the same completion again after its
// backoff until it is applied; a lease answered lost meanwhile ends the
// wait.
func TestWorkerWaitsForTheArtifactStore(t *testing.T) {
	t.Parallel()
	const interval = time.Second
	cfg := func() renderer.Config {
		// Retries paced well above the heartbeat interval: the lease is
		// heartbeated while the completion waits.
		return renderer.Config{Provider: newMockT(t), Capacity: 1, BackoffMin: 4 * time.Second, BackoffMax: 8 * time.Second}
	}
	unavailable := func(c *leaseholdv1.SessionCompletion) *leaseholdv1.CompletionResult {
		return &leaseholdv1.CompletionResult{JobId: c.GetJobId(), Token: c.GetToken(), Code: int32(codes.Unavailable),
			Reason: reason.ArtifactStoreUnavailable.String(), Phase: leaseholdv1.Phase_PHASE_LEASED, CurrentToken: c.GetToken()}
	}
	hasCompletion := func(r *leaseholdv1.SessionRequest) bool { return len(r.GetCompletions()) > 0 }

	t.Run("TheCompletionIsSentAgainWhileHeartbeatsKeepTheLease", func(t *testing.T) {
		t.Parallel()
		synctest.Test(t, func(t *testing.T) {
			var answered atomic.Int32
			b := setup(t, cfg(), func(f *fakeCoordinator) {
				f.welcome.HeartbeatInterval = durationpb.New(interval)
				f.answer = func(c *leaseholdv1.SessionCompletion) *leaseholdv1.CompletionResult {
					if answered.Add(1) <= 2 {
						return unavailable(c)
					}
					return answerOK(c)
				}
			})
			s := b.session(t)
			s.grantNow(grant("job-s", 7, pdf("x")))
			first := s.waitReq(t, "the completion", hasCompletion).GetCompletions()[0]
			for attempt := 2; attempt <= 3; attempt++ {
				var heartbeats int
				req := s.waitReq(t, "the completion again", func(r *leaseholdv1.SessionRequest) bool {
					if len(r.GetHeartbeats()) > 0 {
						heartbeats++
						if diff := cmp.Diff([]*leaseholdv1.LeaseRef{ref("job-s", 7)}, r.GetHeartbeats(), protocmp.Transform()); diff != "" {
							t.Errorf("heartbeat while the completion waits (-want +got):\n%s", diff)
						}
					}
					return hasCompletion(r)
				})
				if heartbeats < 2 {
					t.Errorf("attempt %d: %d heartbeats while the completion waited, want the lease kept by heartbeats", attempt, heartbeats)
				}
				if diff := cmp.Diff(first, req.GetCompletions()[0], protocmp.Transform()); diff != "" {
					t.Errorf("attempt %d sent another completion (-first +again):\n%s", attempt, diff)
				}
			}
			synctest.Wait()
			if got, want := b.metric(t, "leasehold_renderer_completions_store_unavailable_total"),
				"leasehold_renderer_completions_store_unavailable_total 2"; got != want {
				t.Errorf("metric = %q, want %q", got, want)
			}
			// Applied: the lease is no longer heartbeated.
			time.Sleep(3 * interval)
			synctest.Wait()
			for len(s.reqs) > 0 {
				if r := <-s.reqs; len(r.GetHeartbeats()) > 0 || hasCompletion(r) {
					t.Errorf("after the completion was applied the worker sent %v", r)
				}
			}
		})
	})

	t.Run("ALeaseLostWhileTheCompletionWaitsEndsTheWait", func(t *testing.T) {
		t.Parallel()
		synctest.Test(t, func(t *testing.T) {
			b := setup(t, cfg(), func(f *fakeCoordinator) {
				f.welcome.HeartbeatInterval = durationpb.New(interval)
				f.answer = unavailable
			})
			s := b.session(t)
			s.grantNow(grant("job-l", 9, pdf("x")))
			s.waitReq(t, "the completion", hasCompletion)
			s.waitReq(t, "a heartbeat", func(r *leaseholdv1.SessionRequest) bool { return len(r.GetHeartbeats()) > 0 })
			s.push <- &leaseholdv1.SessionResponse{Leases: []*leaseholdv1.LeaseStatus{{JobId: "job-l", Token: 9,
				State: leaseholdv1.LeaseState_LEASE_STATE_LOST, Reason: reason.LeaseExpired.String()}}}
			lost := b.waitLog(t, "lease lost")
			if lost.attrs["job"] != "job-l" {
				t.Errorf("lease lost log = %v, want job-l's", lost.attrs)
			}
			time.Sleep(time.Minute)
			synctest.Wait()
			for len(s.reqs) > 0 {
				if r := <-s.reqs; len(r.GetHeartbeats()) > 0 || hasCompletion(r) {
					t.Errorf("after the lease was lost the worker sent %v", r)
				}
			}
		})
	})
}

// newMockT is the mock provider with its defaults.
func newMockT(t *testing.T) renderer.Provider { return newMock(t, mock.Config{}) }
