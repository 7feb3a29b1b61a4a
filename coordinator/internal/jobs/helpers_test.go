package jobs

import (
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// t0 is the fixed origin of every test clock in this package.
var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// at returns the time d after t0.
func at(d time.Duration) time.Time { return t0.Add(d) }

const (
	testTTL    = 15 * time.Second
	testJitter = 0.5
)

var testPolicy = RetryPolicy{MaxAttempts: 3, BackoffBase: time.Second, BackoffCap: time.Minute}

var testDoc = Document{Name: "report.pdf", ContentType: "application/pdf", SizeBytes: 1234, ContentSHA256: "abc"}

// queued returns a freshly submitted QUEUED job.
func queued() Job {
	return New(7, 3, "team-a", testDoc, testPolicy, false, t0)
}

// mustJob returns a function that fails the test when a transition's error
// is not nil and otherwise returns its record, as in mustJob(t)(j.Grant(...)).
func mustJob(t testing.TB) func(Job, error) Job {
	return func(j Job, err error) Job {
		t.Helper()
		if err != nil {
			t.Fatalf("setup transition failed: %v", err)
		}
		return j
	}
}

// leased returns a job LEASED to renderer r1 under token at attempt 1,
// granted at t0+1s with the test TTL.
func leased(t testing.TB, token uint64) Job {
	t.Helper()
	return mustJob(t)(queued().Grant(token, "r1", at(time.Second), testTTL))
}

// retryWaiting returns a job in RETRY_WAIT after a transient failure of
// attempt 1 under token 1.
func retryWaiting(t testing.TB) Job {
	t.Helper()
	j, _, err := leased(t, 1).Complete(Completion{Token: 1, Renderer: "r1", Class: ClassTransient, Message: "timeout"}, at(2*time.Second), testJitter)
	return mustJob(t)(j, err)
}

// succeeded returns a job SUCCEEDED by token 1.
func succeeded(t testing.TB) Job {
	t.Helper()
	j, _, err := leased(t, 1).Complete(successBy(1, "r1"), at(2*time.Second), testJitter)
	return mustJob(t)(j, err)
}

// failedWith returns a job FAILED by a completion of class under token 1.
func failedWith(t testing.TB, class FailureClass) Job {
	t.Helper()
	j, _, err := leased(t, 1).Complete(Completion{Token: 1, Renderer: "r1", Class: class, Message: "bad"}, at(2*time.Second), testJitter)
	return mustJob(t)(j, err)
}

// exhausted returns a job FAILED (ATTEMPTS_EXHAUSTED) after every attempt
// expired with its holder heard from; its tokens were 1..MaxAttempts.
func exhausted(t testing.TB) Job {
	t.Helper()
	j := queued()
	now := t0
	for tok := uint64(1); tok <= uint64(testPolicy.MaxAttempts); tok++ {
		if tok > 1 {
			now = j.NextAttemptAt
			j = mustJob(t)(j.Requeue(now))
		}
		j = mustJob(t)(j.Grant(tok, "r1", now, testTTL))
		now = j.Lease.Deadline
		j = mustJob(t)(j.Expire(now, testJitter, true))
	}
	if j.Phase != PhaseFailed {
		t.Fatalf("setup: phase %v, want FAILED", j.Phase)
	}
	return j
}

// cancelled returns a job cancelled while LEASED under token 1.
func cancelled(t testing.TB) Job {
	t.Helper()
	j, _, err := leased(t, 1).Cancel("alice", "not needed", at(2*time.Second), true)
	return mustJob(t)(j, err)
}

// successBy is a successful completion under token by renderer.
func successBy(token uint64, renderer string) Completion {
	return Completion{Token: token, Renderer: renderer, Success: true, Digest: "sha256:aa", Size: 99, ContentType: "image/png"}
}

// clone returns a deep copy of j whose history, leases and rejections
// share nothing with j.
func clone(j Job) Job {
	j.Events = slices.Clone(j.Events)
	j.Leases = slices.Clone(j.Leases)
	j.Rejected = slices.Clone(j.Rejected)
	return j
}

// lastEvent returns j's last history entry.
func lastEvent(t testing.TB, j Job) Event {
	t.Helper()
	if len(j.Events) == 0 {
		t.Fatal("job has no history")
	}
	return j.Events[len(j.Events)-1]
}

// kinds returns the kinds of j's history, in order.
func kinds(j Job) []EventKind {
	ks := make([]EventKind, len(j.Events))
	for i, ev := range j.Events {
		ks[i] = ev.Kind
	}
	return ks
}

// assertUnchanged fails when got differs from want in any field.
func assertUnchanged(t testing.TB, got, want Job) {
	t.Helper()
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("refused command changed the record (-want +got):\n%s", diff)
	}
}

// lastAttemptLeased returns a job LEASED to r1 under token 3 at its last
// attempt (3 of 3), after the leases of tokens 1 and 2 expired with their
// holder heard from. The grant is at t0+100s.
func lastAttemptLeased(t testing.TB) Job {
	t.Helper()
	j := queued()
	now := t0
	for tok := uint64(1); tok <= 2; tok++ {
		j = mustJob(t)(j.Grant(tok, "r1", now, testTTL))
		now = j.Lease.Deadline
		j = mustJob(t)(j.Expire(now, testJitter, true))
		now = j.NextAttemptAt
		j = mustJob(t)(j.Requeue(now))
	}
	j = mustJob(t)(j.Grant(3, "r1", at(100*time.Second), testTTL))
	if j.Attempt != testPolicy.MaxAttempts {
		t.Fatalf("setup: attempt %d, want %d", j.Attempt, testPolicy.MaxAttempts)
	}
	return j
}

// withEvents returns j with evs appended to a copy of its history and
// EventSeq naming the last of them, as every transition that records leaves
// it.
func withEvents(j Job, evs ...Event) Job {
	j.Events = append(slices.Clone(j.Events), evs...)
	if len(evs) > 0 {
		j.EventSeq = evs[len(evs)-1].Seq
	}
	return j
}

// neverHeardSpent returns a job LEASED to r1 under token MaxAttempts+1 at
// attempt 1, after MaxAttempts leases (tokens 1..MaxAttempts) expired
// without their holder ever being heard from: the cycle's uncounted
// re-queues are spent. The last grant is at t0+100s.
func neverHeardSpent(t testing.TB) Job {
	t.Helper()
	j := queued()
	now := t0
	for tok := uint64(1); tok <= uint64(testPolicy.MaxAttempts); tok++ {
		j = mustJob(t)(j.Grant(tok, "r1", now, testTTL))
		now = j.Lease.Deadline
		j = mustJob(t)(j.Expire(now, testJitter, false))
	}
	j = mustJob(t)(j.Grant(uint64(testPolicy.MaxAttempts)+1, "r1", at(100*time.Second), testTTL))
	if j.Undelivered != testPolicy.MaxAttempts || j.Attempt != 1 {
		t.Fatalf("setup: undelivered %d attempt %d, want %d and 1", j.Undelivered, j.Attempt, testPolicy.MaxAttempts)
	}
	return j
}
