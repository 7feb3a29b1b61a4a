package jobs

import (
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"pgregory.net/rapid"
)

// jitterGen draws jitter uniformly from [0, 1).
var jitterGen = rapid.Float64Range(0, math.Nextafter(1, 0))

// model drives one job through random commands and keeps what the
// invariants need to know that the record alone does not say.
type model struct {
	j   Job
	now time.Time
	// nextToken is the coordinator's fencing-token counter.
	nextToken uint64
	// granted lists every token granted so far, oldest first.
	granted []uint64
	// wasCancelled is set once the job has been CANCELLED.
	wasCancelled bool
	// successToken is the token of the completion that made the job
	// SUCCEEDED, or 0.
	successToken uint64
}

// keyFacts are the fields no refused command may change.
type keyFacts struct {
	Phase          Phase
	Attempt        uint32
	Artifact       Artifact
	TerminalReason TerminalReason
}

func factsOfJob(j Job) keyFacts {
	return keyFacts{j.Phase, j.Attempt, j.Artifact, j.TerminalReason}
}

// refused checks that a refused command left the key facts unchanged and,
// unless the refusal may record itself (rejected completions and cancels
// of finished jobs), the whole record.
func (m *model) refused(t *rapid.T, op string, before, after Job, mayRecord bool) {
	t.Helper()
	if got, want := factsOfJob(after), factsOfJob(before); got != want {
		t.Fatalf("refused %s changed key facts: got %+v, want %+v", op, got, want)
	}
	if !mayRecord {
		if diff := cmp.Diff(before, after); diff != "" {
			t.Fatalf("refused %s changed the record (-before +after):\n%s", op, diff)
		}
		return
	}
	if n := len(after.Events) - len(before.Events); n < 0 || n > 1 {
		t.Fatalf("refused %s added %d events, want at most 1", op, n)
	}
	b, a := before, after
	b.Events, a.Events = nil, nil
	b.UpdatedAt, a.UpdatedAt = time.Time{}, time.Time{}
	b.RejectedCompletions, a.RejectedCompletions = 0, 0
	if diff := cmp.Diff(b, a); diff != "" {
		t.Fatalf("refused %s changed more than its history (-before +after):\n%s", op, diff)
	}
}

// anyToken draws a token a renderer might send: one ever granted (old ones
// included), the zero token, or one never granted.
func (m *model) anyToken(t *rapid.T) uint64 {
	choices := append([]uint64{0, m.nextToken + 7}, m.granted...)
	if len(m.granted) > 0 {
		// Weight the most recent grant, the one most likely to be live.
		choices = append(choices, m.granted[len(m.granted)-1], m.granted[len(m.granted)-1])
	}
	return rapid.SampledFrom(choices).Draw(t, "token")
}

func (m *model) grant(t *rapid.T) {
	before := m.j
	token := m.nextToken
	ttl := time.Duration(rapid.IntRange(1, 30).Draw(t, "ttlSeconds")) * time.Second
	next, err := m.j.Grant(token, "r"+fmt.Sprint(token%3), m.now, ttl)
	if before.Phase != PhaseQueued {
		if !errors.Is(err, ErrIllegalTransition) {
			t.Fatalf("Grant in %v = %v, want ErrIllegalTransition", before.Phase, err)
		}
		m.refused(t, "grant", before, next, false)
		return
	}
	if err != nil {
		t.Fatalf("Grant in QUEUED = %v", err)
	}
	m.nextToken++
	m.granted = append(m.granted, token)
	m.j = next
}

func (m *model) advance(t *rapid.T) {
	m.now = m.now.Add(time.Duration(rapid.Int64Range(0, int64(40*time.Second)).Draw(t, "advance")))
}

func (m *model) heartbeat(t *rapid.T) {
	before := m.j
	token := m.anyToken(t)
	ttl := time.Duration(rapid.IntRange(1, 30).Draw(t, "ttlSeconds")) * time.Second
	next, err := m.j.Heartbeat(token, m.now, ttl)
	live := before.Phase == PhaseLeased && before.Lease.Token == token && m.now.Before(before.Lease.Deadline)
	if live != (err == nil) {
		t.Fatalf("Heartbeat(token %d) = %v, live lease %v", token, err, live)
	}
	if err != nil {
		if !IsFence(err) {
			t.Fatalf("Heartbeat refusal %v is not a fencing error", err)
		}
		m.refused(t, "heartbeat", before, next, false)
		return
	}
	if next.Lease.Deadline.Before(before.Lease.Deadline) {
		t.Fatalf("Heartbeat shortened the deadline from %v to %v", before.Lease.Deadline, next.Lease.Deadline)
	}
	m.j = next
}

func (m *model) expire(t *rapid.T) {
	before := m.j
	next, err := m.j.Expire(m.now, jitterGen.Draw(t, "jitter"))
	due := before.Phase == PhaseLeased && !m.now.Before(before.Lease.Deadline)
	if due != (err == nil) {
		t.Fatalf("Expire at %v in %v (deadline %v) = %v", m.now, before.Phase, before.Lease.Deadline, err)
	}
	if err != nil {
		m.refused(t, "expire", before, next, false)
		return
	}
	if next.Phase != PhaseRetryWait && !(next.Phase == PhaseFailed && next.TerminalReason == ReasonAttemptsExhausted) {
		t.Fatalf("Expire moved the job to %v (%v)", next.Phase, next.TerminalReason)
	}
	m.j = next
}

func (m *model) requeue(t *rapid.T) {
	before := m.j
	next, err := m.j.Requeue(m.now)
	due := before.Phase == PhaseRetryWait && !m.now.Before(before.NextAttemptAt)
	if due != (err == nil) {
		t.Fatalf("Requeue at %v in %v (next attempt %v) = %v", m.now, before.Phase, before.NextAttemptAt, err)
	}
	if err != nil {
		m.refused(t, "requeue", before, next, false)
		return
	}
	m.j = next
}

func (m *model) complete(t *rapid.T) {
	before := m.j
	c := Completion{Token: m.anyToken(t), Renderer: "r"}
	switch kind := rapid.IntRange(0, 4).Draw(t, "outcome"); kind {
	case 0:
		c.Success = true
		c.Digest = "sha256:" + rapid.SampledFrom([]string{"aa", "bb"}).Draw(t, "digest")
		c.Size, c.ContentType = 10, "image/png"
	default:
		c.Class = FailureClass(kind - 1) // UNSPECIFIED, UNSUPPORTED_FORMAT, INVALID_DOCUMENT or TRANSIENT
		c.Message = "cause " + c.Class.String()
	}
	next, replayed, err := m.j.Complete(c, m.now, jitterGen.Draw(t, "jitter"))
	repeat := c.Token != 0 && c.Token == before.CompletedToken
	switch {
	case repeat && c.Outcome() == before.CompletedOutcome:
		if err != nil || !replayed {
			t.Fatalf("replayed completion = (replayed %v, %v), want replayed", replayed, err)
		}
		m.refused(t, "replayed completion", before, next, false)
		return
	case repeat:
		if !errors.Is(err, ErrOutcomeMismatch) {
			t.Fatalf("completion repeating token %d with another outcome = %v, want ErrOutcomeMismatch", c.Token, err)
		}
	case before.CheckLease(c.Token, m.now) != nil:
		if !IsFence(err) {
			t.Fatalf("completion under a dead lease = %v, want a fencing error", err)
		}
	case !c.Success && c.Class == ClassUnspecified:
		if !errors.Is(err, ErrIllegalTransition) {
			t.Fatalf("completion without outcome = %v, want ErrIllegalTransition", err)
		}
		m.refused(t, "completion without outcome", before, next, false)
		return
	default:
		if err != nil || replayed {
			t.Fatalf("completion under the live lease = (replayed %v, %v), want applied", replayed, err)
		}
		if next.Phase == PhaseSucceeded {
			m.successToken = c.Token
		}
		m.j = next
		return
	}
	if replayed {
		t.Fatal("a rejected completion reported replayed")
	}
	m.refused(t, "rejected completion", before, next, true)
	m.j = next
}

func (m *model) cancel(t *rapid.T) {
	// Cancel ends most jobs for good; send it rarely so that runs also
	// explore retries, expiries and replays.
	if rapid.IntRange(0, 5).Draw(t, "cancelNow") != 0 {
		return
	}
	before := m.j
	allowRunning := rapid.Bool().Draw(t, "allowRunning")
	next, res, err := m.j.Cancel("alice", "stop", m.now, allowRunning)
	switch {
	case before.Phase == PhaseCancelled:
		if err != nil || res != AlreadyCancelled {
			t.Fatalf("Cancel of a cancelled job = (%v, %v), want AlreadyCancelled", res, err)
		}
		m.refused(t, "repeated cancel", before, next, false)
		return
	case before.Phase == PhaseSucceeded || before.Phase == PhaseFailed:
		if !errors.Is(err, ErrAlreadyTerminal) {
			t.Fatalf("Cancel in %v = %v, want ErrAlreadyTerminal", before.Phase, err)
		}
		m.refused(t, "cancel of a finished job", before, next, true)
		m.j = next
		return
	case before.Phase == PhaseLeased && !allowRunning:
		if !errors.Is(err, ErrRunningCancelDisabled) {
			t.Fatalf("Cancel of a running job while disabled = %v, want ErrRunningCancelDisabled", err)
		}
		m.refused(t, "disabled cancel", before, next, false)
		return
	}
	if err != nil || next.Phase != PhaseCancelled {
		t.Fatalf("Cancel in %v = (%v, %v) to %v, want CANCELLED", before.Phase, res, err, next.Phase)
	}
	if before.Phase == PhaseLeased && (next.Cancellation.Token != before.Lease.Token || res != CancelledRunning) {
		t.Fatalf("Cancel of a leased job recorded token %d (%v), want %d", next.Cancellation.Token, res, before.Lease.Token)
	}
	m.wasCancelled = true
	m.j = next
}

func (m *model) ackCancel(t *rapid.T) {
	before := m.j
	token := m.anyToken(t)
	next, ok := m.j.AckCancel(token, m.now)
	want := before.Phase == PhaseCancelled && token != 0 && token == before.Cancellation.Token && before.Cancellation.AckedAt.IsZero()
	if ok != want {
		t.Fatalf("AckCancel(%d) = %v, want %v", token, ok, want)
	}
	if !ok {
		m.refused(t, "acknowledgement", before, next, false)
		return
	}
	m.j = next
}

func (m *model) replay(t *rapid.T) {
	before := m.j
	includePermanent := rapid.Bool().Draw(t, "includePermanent")
	next, err := m.j.Replay("oscar", "again", includePermanent, m.now)
	want := before.Phase == PhaseFailed && (includePermanent || !before.TerminalReason.Permanent())
	if want != (err == nil) {
		t.Fatalf("Replay in %v (%v, override %v) = %v", before.Phase, before.TerminalReason, includePermanent, err)
	}
	if err != nil {
		m.refused(t, "replay", before, next, false)
		return
	}
	if next.Phase != PhaseQueued || next.Attempt != 0 || next.Cycle != before.Cycle+1 {
		t.Fatalf("Replay gave phase %v attempt %d cycle %d, want QUEUED 0 %d", next.Phase, next.Attempt, next.Cycle, before.Cycle+1)
	}
	m.j = next
}

// check asserts the invariants of DESIGN.md that concern one job.
func (m *model) check(t *rapid.T) {
	j := m.j
	if j.Attempt > j.Policy.MaxAttempts {
		t.Fatalf("attempt %d exceeds the maximum %d", j.Attempt, j.Policy.MaxAttempts)
	}

	terminal, lastToken := 0, uint64(0)
	var succeededBy uint64
	for i, ev := range j.Events {
		if ev.Seq != uint32(i)+1 {
			t.Fatalf("event %d has sequence %d", i, ev.Seq)
		}
		switch ev.Kind {
		case EventReplayed:
			terminal, succeededBy = 0, 0
		case EventSucceeded:
			terminal++
			succeededBy = ev.Token
		case EventFailed, EventCancelled:
			terminal++
		case EventLeased:
			if ev.Token <= lastToken {
				t.Fatalf("LEASED token %d after %d: tokens must strictly increase", ev.Token, lastToken)
			}
			lastToken = ev.Token
		}
		if terminal > 1 {
			t.Fatalf("%d terminal transitions in one cycle: %v", terminal, kinds(j))
		}
	}
	if j.Phase.Terminal() != (terminal == 1) {
		t.Fatalf("phase %v with %d terminal events in the cycle", j.Phase, terminal)
	}

	if (j.Artifact != Artifact{}) != (j.Phase == PhaseSucceeded) {
		t.Fatalf("artifact %+v in phase %v: it must be set exactly when SUCCEEDED", j.Artifact, j.Phase)
	}
	if j.Phase == PhaseSucceeded {
		if j.Artifact.Token != m.successToken || j.Artifact.Token != succeededBy || j.Artifact.Token == 0 {
			t.Fatalf("artifact token %d, succeeding completion %d, SUCCEEDED event token %d: must be equal", j.Artifact.Token, m.successToken, succeededBy)
		}
	}

	if m.wasCancelled {
		if j.Phase != PhaseCancelled {
			t.Fatalf("a cancelled job moved to %v", j.Phase)
		}
		seen := false
		for _, ev := range j.Events {
			seen = seen || ev.Kind == EventCancelled
			if seen && ev.Kind == EventLeased {
				t.Fatalf("a cancelled job was leased again: %v", kinds(j))
			}
		}
	}

	if (j.Phase == PhaseLeased) != (j.Lease != Lease{}) {
		t.Fatalf("lease %+v in phase %v: it must be set exactly when LEASED", j.Lease, j.Phase)
	}
	if (j.Phase == PhaseRetryWait) != !j.NextAttemptAt.IsZero() {
		t.Fatalf("next attempt %v in phase %v: it must be set exactly in RETRY_WAIT", j.NextAttemptAt, j.Phase)
	}
}

func TestJobInvariantsUnderRandomCommands(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		base := time.Duration(rapid.Int64Range(int64(time.Millisecond), int64(2*time.Second)).Draw(t, "backoffBase"))
		policy := RetryPolicy{
			MaxAttempts: rapid.Uint32Range(1, 5).Draw(t, "maxAttempts"),
			BackoffBase: base,
			BackoffCap:  base * time.Duration(rapid.Int64Range(1, 64).Draw(t, "capFactor")),
		}
		m := &model{
			j:         New(1, 1, "team", testDoc, policy, false, t0),
			now:       t0,
			nextToken: rapid.Uint64Range(1, 1<<40).Draw(t, "firstToken"),
		}
		t.Repeat(map[string]func(*rapid.T){
			"grant":     m.grant,
			"advance":   m.advance,
			"heartbeat": m.heartbeat,
			"expire":    m.expire,
			"requeue":   m.requeue,
			"complete":  m.complete,
			"cancel":    m.cancel,
			"ackCancel": m.ackCancel,
			"replay":    m.replay,
			"":          m.check,
		})
	})
}
