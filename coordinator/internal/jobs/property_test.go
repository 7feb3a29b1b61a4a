package jobs

import (
	"errors"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"pgregory.net/rapid"
)

// jitterGen draws jitter uniformly from [0, 1).
var jitterGen = rapid.Float64Range(0, math.Nextafter(1, 0))

// modelRenderers are the renderers the model draws callers from: few, so
// that a renderer often sends a token granted to another.
var modelRenderers = []string{"r0", "r1", "r2"}

// model drives one job through random commands and keeps, apart from the
// record, what the record must agree with: the leases granted and how each
// ended, the cycle's recorded rejections and the whole history (the record
// itself is sometimes loaded without it, as the writer does).
type model struct {
	j   Job
	now time.Time
	// nextToken is the coordinator's fencing-token counter.
	nextToken uint64
	// leases is every lease granted, oldest first, with how it ended.
	leases []LeaseRecord
	// cycleStart is the index in leases of the cycle's first lease.
	cycleStart int
	// deadline is the live lease's deadline.
	deadline time.Time
	// history is every event the job recorded, in order.
	history []Event
	// rejected lists the cycle's recorded (token, reason) rejections and
	// rejections counts every counted one over all cycles.
	rejected   []RejectionKey
	rejections uint32
	// cancelRejected is set once a cancel of the finished cycle was recorded.
	cancelRejected bool
	// undelivered counts the cycle's uncounted never-heard expiries.
	undelivered uint32
	// handedBack counts the cycle's uncounted hand-backs.
	handedBack uint32
	// revoked is the token of the lease a cancel revoked, and acked whether
	// its holder acknowledged.
	revoked uint64
	acked   bool
	// wasCancelled is set once the job has been CANCELLED.
	wasCancelled bool
	// successToken is the token of the completion that made the job
	// SUCCEEDED, or 0.
	successToken uint64
	// applied lists every completion applied, in every cycle.
	applied []Completion
}

// unchanged checks that a command left the record exactly as it was.
func (m *model) unchanged(t *rapid.T, op string, before, after Job) {
	t.Helper()
	if diff := cmp.Diff(before, after); diff != "" {
		t.Fatalf("%s changed the record (-before +after):\n%s", op, diff)
	}
}

// commit makes next the model's record, appending the events the command
// recorded to the model's history.
func (m *model) commit(t *rapid.T, before, next Job) {
	t.Helper()
	if len(next.Events) < len(before.Events) || !slices.Equal(next.Events[:len(before.Events)], before.Events) {
		t.Fatalf("a transition rewrote the history it was given: %v -> %v", kinds(before), kinds(next))
	}
	m.history = append(m.history, next.Events[len(before.Events):]...)
	m.j = next
}

// newEvents returns the events next recorded over before.
func newEvents(before, next Job) []Event { return next.Events[len(before.Events):] }

// lease returns the model's record of the lease granted under token.
func (m *model) lease(token uint64) (LeaseRecord, bool) {
	for _, l := range m.leases {
		if l.Token == token {
			return l, true
		}
	}
	return LeaseRecord{}, false
}

// endLease records how the lease under token ended.
func (m *model) endLease(t *rapid.T, token uint64, kind LeaseEndKind, outcome string) {
	for i := range m.leases {
		if m.leases[i].Token == token {
			if m.leases[i].Kind != LeaseLive {
				t.Fatalf("lease %d ended twice: %v then %v", token, m.leases[i].Kind, kind)
			}
			m.leases[i].Kind, m.leases[i].Outcome = kind, outcome
			return
		}
	}
	t.Fatalf("ending lease %d, never granted", token)
}

// lastToken is the token a fencing error must name as current.
func (m *model) lastToken() uint64 {
	if m.j.Phase == PhaseLeased {
		return m.j.Lease.Token
	}
	if n := len(m.leases); n > 0 {
		return m.leases[n-1].Token
	}
	return 0
}

// neverHeld reports whether renderer never held a lease of the job.
func (m *model) neverHeld(renderer string) bool {
	return !slices.ContainsFunc(m.leases, func(l LeaseRecord) bool { return l.Renderer == renderer })
}

// wantFence is the model's fencing verdict for token sent by renderer: nil
// for the live lease's holder, else the sentinel in the documented order.
func (m *model) wantFence(token uint64, renderer string) error {
	rec, known := m.lease(token)
	live := m.j.Phase == PhaseLeased && m.j.Lease.Token == token
	switch {
	case live && rec.Renderer == renderer && m.now.Before(m.deadline):
		return nil
	case m.neverHeld(renderer):
		return ErrNotHolder
	case known && rec.Renderer != renderer:
		return ErrNotHolder
	case m.j.Phase == PhaseCancelled && token != 0 && token == m.revoked:
		return ErrJobCancelled
	case live:
		return ErrLeaseExpired
	case known && rec.Kind == LeaseExpired:
		return ErrLeaseExpired
	}
	return ErrStaleLease
}

// checkFence checks that err is the fencing error the model expects, naming
// the job's state only to a renderer that held a lease of it.
func (m *model) checkFence(t *rapid.T, op string, renderer string, err, want error) {
	t.Helper()
	var fe *FenceError
	if !errors.Is(err, want) || !errors.As(err, &fe) {
		t.Fatalf("%s = %v, want a *FenceError matching %v", op, err, want)
	}
	if m.neverHeld(renderer) {
		if !fe.NeverHeld || fe.CurrentToken != 0 || fe.CurrentPhase != PhaseUnspecified {
			t.Fatalf("%s by %s, which never held a lease, = %+v; want NeverHeld and no state", op, renderer, fe)
		}
		return
	}
	if fe.NeverHeld || fe.CurrentToken != m.lastToken() || fe.CurrentPhase != m.j.Phase {
		t.Fatalf("%s named token %d %v, want %d %v", op, fe.CurrentToken, fe.CurrentPhase, m.lastToken(), m.j.Phase)
	}
}

// anyToken draws a token a renderer might send: one ever granted (old ones
// included), the zero token, or one never granted.
func (m *model) anyToken(t *rapid.T) uint64 {
	choices := []uint64{0, m.nextToken + 7}
	for _, l := range m.leases {
		choices = append(choices, l.Token)
	}
	if n := len(m.leases); n > 0 {
		// Weight the most recent grant, the one most likely to be live.
		choices = append(choices, m.leases[n-1].Token, m.leases[n-1].Token)
	}
	return rapid.SampledFrom(choices).Draw(t, "token")
}

// anyRenderer draws the renderer sending token: most often its holder, but
// any renderer may send any token.
func (m *model) anyRenderer(t *rapid.T, token uint64) string {
	choices := modelRenderers
	if l, ok := m.lease(token); ok {
		choices = append([]string{l.Renderer, l.Renderer, l.Renderer}, modelRenderers...)
	}
	return rapid.SampledFrom(choices).Draw(t, "renderer")
}

func (m *model) grant(t *rapid.T) {
	before := m.j
	token := m.nextToken
	renderer := rapid.SampledFrom(modelRenderers).Draw(t, "grantee")
	ttl := time.Duration(rapid.IntRange(1, 30).Draw(t, "ttlSeconds")) * time.Second
	next, err := m.j.Grant(token, renderer, m.now, ttl)
	if before.Phase != PhaseQueued {
		if !errors.Is(err, ErrIllegalTransition) {
			t.Fatalf("Grant in %v = %v, want ErrIllegalTransition", before.Phase, err)
		}
		m.unchanged(t, "refused grant", before, next)
		return
	}
	if err != nil {
		t.Fatalf("Grant in QUEUED = %v", err)
	}
	if next.Phase != PhaseLeased || next.Attempt != before.Attempt+1 || next.Lease.Renderer != renderer {
		t.Fatalf("Grant gave %v attempt %d holder %q, want LEASED %d %q", next.Phase, next.Attempt, next.Lease.Renderer, before.Attempt+1, renderer)
	}
	m.nextToken++
	m.leases = append(m.leases, LeaseRecord{Token: token, Renderer: renderer})
	m.deadline = m.now.Add(ttl)
	m.commit(t, before, next)
}

func (m *model) advance(t *rapid.T) {
	m.now = m.now.Add(time.Duration(rapid.Int64Range(0, int64(40*time.Second)).Draw(t, "advance")))
}

// loadWithoutHistory drops the history from the record, as the writer loads
// a job to apply a command; transitions must decide the same.
func (m *model) loadWithoutHistory(*rapid.T) {
	m.j.Events = nil
}

func (m *model) heartbeat(t *rapid.T) {
	before := m.j
	token := m.anyToken(t)
	renderer := m.anyRenderer(t, token)
	ttl := time.Duration(rapid.IntRange(1, 30).Draw(t, "ttlSeconds")) * time.Second
	next, err := m.j.Heartbeat(token, renderer, m.now, ttl)
	if want := m.wantFence(token, renderer); want != nil {
		m.checkFence(t, "Heartbeat", renderer, err, want)
		m.unchanged(t, "refused heartbeat", before, next)
		return
	}
	if err != nil {
		t.Fatalf("Heartbeat of the live lease by its holder = %v", err)
	}
	if d := m.now.Add(ttl); d.After(m.deadline) {
		m.deadline = d
	}
	if !next.Lease.Deadline.Equal(m.deadline) || len(next.Events) != len(before.Events) {
		t.Fatalf("Heartbeat left deadline %v and %d new events, want %v and none", next.Lease.Deadline, len(next.Events)-len(before.Events), m.deadline)
	}
	m.commit(t, before, next)
}

// requeuedUncounted checks a lease that went back to the queue uncounted
// with reason, and records it.
func (m *model) requeuedUncounted(t *rapid.T, op string, before, next Job, reason string) {
	t.Helper()
	tok := before.Lease.Token
	if next.Phase != PhaseQueued || next.Attempt != before.Attempt-1 || next.Lease != (Lease{}) || !next.EnqueuedAt.Equal(m.now) {
		t.Fatalf("%s gave %v attempt %d lease %+v, want QUEUED %d without lease", op, next.Phase, next.Attempt, next.Lease, before.Attempt-1)
	}
	evs := newEvents(before, next)
	if len(evs) != 1 || evs[0].Kind != EventRequeued || evs[0].Reason != reason || evs[0].Token != tok || evs[0].Renderer != before.Lease.Renderer {
		t.Fatalf("%s recorded %+v, want one REQUEUED %s for token %d", op, evs, reason, tok)
	}
	m.endLease(t, tok, LeaseReleased, "")
	m.commit(t, before, next)
}

func (m *model) handBack(t *rapid.T) {
	before := m.j
	token := m.anyToken(t)
	renderer := m.anyRenderer(t, token)
	next, err := m.j.HandBack(token, renderer, m.now, jitterGen.Draw(t, "jitter"))
	if want := m.wantFence(token, renderer); want != nil {
		m.checkFence(t, "HandBack", renderer, err, want)
		m.unchanged(t, "refused hand-back", before, next)
		return
	}
	if err != nil {
		t.Fatalf("HandBack of the live lease by its holder = %v", err)
	}
	if m.handedBack < before.Policy.MaxAttempts {
		m.handedBack++
		if next.HandedBack != m.handedBack {
			t.Fatalf("uncounted hand-back left HandedBack %d, want %d", next.HandedBack, m.handedBack)
		}
		m.requeuedUncounted(t, "HandBack", before, next, "HANDED_BACK")
		return
	}
	switch {
	case before.Attempt >= before.Policy.MaxAttempts:
		if next.Phase != PhaseFailed || next.TerminalReason != ReasonAttemptsExhausted {
			t.Fatalf("counted hand-back of the last attempt gave %v (%v), want FAILED ATTEMPTS_EXHAUSTED", next.Phase, next.TerminalReason)
		}
	case next.Phase != PhaseRetryWait:
		t.Fatalf("counted hand-back of attempt %d of %d gave %v, want RETRY_WAIT", before.Attempt, before.Policy.MaxAttempts, next.Phase)
	}
	evs := newEvents(before, next)
	if len(evs) != 2 || evs[0].Kind != EventAttemptFailed || evs[0].Reason != "HANDED_BACK" || evs[0].Token != before.Lease.Token {
		t.Fatalf("counted hand-back recorded %v, want ATTEMPT_FAILED HANDED_BACK then the outcome", evs)
	}
	if next.Attempt != before.Attempt || next.HandedBack != before.HandedBack {
		t.Fatalf("counted hand-back changed attempt %d -> %d, handed back %d -> %d", before.Attempt, next.Attempt, before.HandedBack, next.HandedBack)
	}
	m.endLease(t, before.Lease.Token, LeaseCompleted, "failure:HANDED_BACK")
	m.commit(t, before, next)
}

func (m *model) release(t *rapid.T) {
	before := m.j
	token := m.anyToken(t)
	renderer := m.anyRenderer(t, token)
	next, err := m.j.Release(token, renderer, m.now, ReleaseUndelivered)
	if held := before.CheckLease(token, renderer, m.now); held != nil {
		if !IsFence(err) || ReasonCode(err) != ReasonCode(held) {
			t.Fatalf("Release(%d, %s) in %v = %v, want the fencing refusal %v", token, renderer, before.Phase, err, held)
		}
		m.unchanged(t, "refused release", before, next)
		return
	}
	if err != nil {
		t.Fatalf("Release of the live lease = %v", err)
	}
	m.requeuedUncounted(t, "Release", before, next, "LEASE_UNDELIVERED")
}

func (m *model) expire(t *rapid.T) {
	m.expireWith(t, rapid.Bool().Draw(t, "heard"))
}

// expireWith expires the job at the model's time, its holder heard from or
// not, and checks the answer against the model.
func (m *model) expireWith(t *rapid.T, heard bool) {
	before := m.j
	next, err := m.j.Expire(m.now, jitterGen.Draw(t, "jitter"), heard)
	due := before.Phase == PhaseLeased && !m.now.Before(m.deadline)
	if due != (err == nil) {
		t.Fatalf("Expire at %v in %v (deadline %v) = %v", m.now, before.Phase, m.deadline, err)
	}
	if err != nil {
		m.unchanged(t, "refused expiry", before, next)
		return
	}
	if !heard && m.undelivered < before.Policy.MaxAttempts {
		m.undelivered++
		if next.Undelivered != m.undelivered {
			t.Fatalf("never-heard expiry left Undelivered %d, want %d", next.Undelivered, m.undelivered)
		}
		m.requeuedUncounted(t, "never-heard Expire", before, next, "LEASE_NEVER_HEARD")
		return
	}
	switch {
	case before.Attempt >= before.Policy.MaxAttempts:
		if next.Phase != PhaseFailed || next.TerminalReason != ReasonAttemptsExhausted {
			t.Fatalf("expiry of the last attempt gave %v (%v), want FAILED ATTEMPTS_EXHAUSTED", next.Phase, next.TerminalReason)
		}
	case next.Phase != PhaseRetryWait:
		t.Fatalf("expiry of attempt %d of %d gave %v, want RETRY_WAIT", before.Attempt, before.Policy.MaxAttempts, next.Phase)
	}
	if evs := newEvents(before, next); len(evs) != 2 || evs[0].Kind != EventLeaseExpired || evs[0].Token != before.Lease.Token {
		t.Fatalf("counted expiry recorded %v, want LEASE_EXPIRED then the outcome", evs)
	}
	if next.Attempt != before.Attempt || next.Undelivered != before.Undelivered {
		t.Fatalf("counted expiry changed attempt %d -> %d, undelivered %d -> %d", before.Attempt, next.Attempt, before.Undelivered, next.Undelivered)
	}
	m.endLease(t, before.Lease.Token, LeaseExpired, "")
	m.commit(t, before, next)
}

func (m *model) requeue(t *rapid.T) {
	before := m.j
	next, err := m.j.Requeue(m.now)
	due := before.Phase == PhaseRetryWait && !m.now.Before(before.NextAttemptAt)
	if due != (err == nil) {
		t.Fatalf("Requeue at %v in %v (next attempt %v) = %v", m.now, before.Phase, before.NextAttemptAt, err)
	}
	if err != nil {
		m.unchanged(t, "refused requeue", before, next)
		return
	}
	m.commit(t, before, next)
}

// drawCompletion draws a completion of any outcome under token by renderer.
func drawCompletion(t *rapid.T, token uint64, renderer string) Completion {
	c := Completion{Token: token, Renderer: renderer}
	switch kind := rapid.IntRange(0, 4).Draw(t, "outcome"); kind {
	case 0:
		c.Success = true
		c.Digest = "sha256:" + rapid.SampledFrom([]string{"aa", "bb"}).Draw(t, "digest")
		c.Size, c.ContentType = 10, "image/png"
		c.ArtifactMissing = rapid.IntRange(0, 7).Draw(t, "artifactMissing") == 0
	default:
		c.Class = FailureClass(kind - 1) // UNSPECIFIED, UNSUPPORTED_FORMAT, INVALID_DOCUMENT or TRANSIENT
		c.Message = "cause " + c.Class.String()
	}
	return c
}

func (m *model) complete(t *rapid.T) {
	token := m.anyToken(t)
	m.completeWith(t, drawCompletion(t, token, m.anyRenderer(t, token)))
}

// resendApplied sends again a completion applied earlier, in this cycle
// or before, as a renderer retrying after a lost answer does; sometimes from
// another renderer, as an impostor would.
func (m *model) resendApplied(t *rapid.T) {
	if len(m.applied) == 0 {
		return
	}
	c := rapid.SampledFrom(m.applied).Draw(t, "resent")
	c.Renderer = rapid.SampledFrom(append([]string{c.Renderer, c.Renderer, c.Renderer}, modelRenderers...)).Draw(t, "resender")
	m.completeWith(t, c)
}

// strayCompletions sends a burst of completions under tokens never granted
// for this job, so that runs reach the cycle's cap on kept rejections.
func (m *model) strayCompletions(t *rapid.T) {
	for range rapid.IntRange(1, MaxRejectionEvents).Draw(t, "strays") {
		token := 1<<50 + rapid.Uint64Range(0, 2*MaxRejectionEvents).Draw(t, "strayToken")
		m.completeWith(t, drawCompletion(t, token, rapid.SampledFrom(modelRenderers).Draw(t, "strayRenderer")))
	}
}

// expireDue grants a queued job, then moves the clock to the live lease's
// deadline or just past it and expires it, its holder mostly never heard
// from, so that runs reach the bound on never-heard expiries.
func (m *model) expireDue(t *rapid.T) {
	if m.j.Phase == PhaseQueued {
		m.grant(t)
	}
	if m.j.Phase != PhaseLeased {
		return
	}
	m.now = m.deadline.Add(time.Duration(rapid.Int64Range(0, int64(2*time.Second)).Draw(t, "pastDeadline")))
	m.expireWith(t, rapid.IntRange(0, 3).Draw(t, "heardDue") == 0)
}

// completeWith sends c and checks the answer against the model.
func (m *model) completeWith(t *rapid.T, c Completion) {
	before := m.j
	token := c.Token
	next, replayed, err := m.j.Complete(c, m.now, jitterGen.Draw(t, "jitter"))
	rec, known := m.lease(token)
	applied := known && rec.Kind == LeaseCompleted && rec.Renderer == c.Renderer
	switch {
	case applied && c.Outcome() == rec.Outcome:
		if err != nil || !replayed {
			t.Fatalf("replay of the completion applied under token %d = (replayed %v, %v), want replayed", token, replayed, err)
		}
		m.unchanged(t, "replayed completion", before, next)
		return
	case applied:
		m.rejectedCompletion(t, c, next, replayed, err, ErrOutcomeMismatch)
		return
	}
	if want := m.wantFence(token, c.Renderer); want != nil {
		m.rejectedCompletion(t, c, next, replayed, err, want)
		return
	}
	switch {
	case c.Success && c.ArtifactMissing:
		if !errors.Is(err, ErrArtifactMissing) || replayed {
			t.Fatalf("holder's success without an upload = (replayed %v, %v), want ErrArtifactMissing", replayed, err)
		}
		m.unchanged(t, "completion without artifact", before, next)
		return
	case !c.Success && c.Class == ClassUnspecified:
		if !errors.Is(err, ErrIllegalTransition) || replayed {
			t.Fatalf("completion without outcome = (replayed %v, %v), want ErrIllegalTransition", replayed, err)
		}
		m.unchanged(t, "completion without outcome", before, next)
		return
	}
	if err != nil || replayed {
		t.Fatalf("holder's completion under the live lease = (replayed %v, %v), want applied", replayed, err)
	}
	switch {
	case c.Success:
		want := Artifact{Digest: c.Digest, Size: c.Size, ContentType: c.ContentType, Token: token, Renderer: c.Renderer}
		if next.Phase != PhaseSucceeded || next.Artifact != want {
			t.Fatalf("success gave %v artifact %+v, want SUCCEEDED %+v", next.Phase, next.Artifact, want)
		}
		m.successToken = token
	case c.Class == ClassTransient && before.Attempt < before.Policy.MaxAttempts:
		if next.Phase != PhaseRetryWait {
			t.Fatalf("transient failure of attempt %d of %d gave %v, want RETRY_WAIT", before.Attempt, before.Policy.MaxAttempts, next.Phase)
		}
	case c.Class == ClassTransient:
		if next.Phase != PhaseFailed || next.TerminalReason != ReasonAttemptsExhausted {
			t.Fatalf("transient failure of the last attempt gave %v (%v), want FAILED ATTEMPTS_EXHAUSTED", next.Phase, next.TerminalReason)
		}
	default:
		if next.Phase != PhaseFailed || !next.TerminalReason.Permanent() {
			t.Fatalf("%v failure gave %v (%v), want a permanent FAILED", c.Class, next.Phase, next.TerminalReason)
		}
	}
	m.endLease(t, token, LeaseCompleted, c.Outcome())
	m.applied = append(m.applied, c)
	m.commit(t, before, next)
}

// rejectedCompletion checks a completion refused with want: one
// COMPLETION_REJECTED event and one count the first time its (token,
// renderer, reason) is refused in the cycle while fewer than
// MaxRejectionEvents are kept, and nothing at all for a repeat or past
// that.
func (m *model) rejectedCompletion(t *rapid.T, c Completion, next Job, replayed bool, err, want error) {
	t.Helper()
	before := m.j
	if replayed {
		t.Fatal("a rejected completion reported replayed")
	}
	m.checkFence(t, "rejected Complete", c.Renderer, err, want)
	key := RejectionKey{Token: c.Token, Reason: ReasonCode(want), Renderer: c.Renderer}
	wantJob := clone(before)
	switch {
	case slices.Contains(m.rejected, key), len(m.rejected) >= MaxRejectionEvents:
	default:
		m.rejected = append(m.rejected, key)
		m.rejections++
		wantJob.RejectedCompletions++
		wantJob.Rejected = append(wantJob.Rejected, key)
		wantJob.UpdatedAt = m.now
		wantJob = withEvents(wantJob, Event{
			Seq: before.EventSeq + 1, At: m.now, Kind: EventCompletionRejected, Phase: before.Phase,
			Token: c.Token, Renderer: c.Renderer, Attempt: before.Attempt, Reason: key.Reason, Message: c.Outcome(),
		})
	}
	if diff := cmp.Diff(wantJob, next); diff != "" {
		t.Fatalf("record after the %s rejection of token %d by %s (-want +got):\n%s", key.Reason, c.Token, c.Renderer, diff)
	}
	m.commit(t, before, next)
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
		m.unchanged(t, "repeated cancel", before, next)
		return
	case before.Phase == PhaseSucceeded || before.Phase == PhaseFailed:
		if !errors.Is(err, ErrAlreadyTerminal) || res != 0 {
			t.Fatalf("Cancel in %v = (%v, %v), want ErrAlreadyTerminal", before.Phase, res, err)
		}
		if m.cancelRejected {
			m.unchanged(t, "repeated cancel of a finished job", before, next)
			return
		}
		m.cancelRejected = true
		want := clone(before)
		want.CancelRejected = true
		want.UpdatedAt = m.now
		want = withEvents(want, Event{Seq: before.EventSeq + 1, At: m.now, Kind: EventCancelRejected, Phase: before.Phase, Attempt: before.Attempt, Principal: "alice", Reason: "ALREADY_TERMINAL", Message: "stop"})
		if diff := cmp.Diff(want, next); diff != "" {
			t.Fatalf("record after the first cancel of a finished job (-want +got):\n%s", diff)
		}
		m.commit(t, before, next)
		return
	case before.Phase == PhaseLeased && !allowRunning:
		if !errors.Is(err, ErrRunningCancelDisabled) {
			t.Fatalf("Cancel of a running job while disabled = %v, want ErrRunningCancelDisabled", err)
		}
		m.unchanged(t, "disabled cancel", before, next)
		return
	}
	if err != nil || next.Phase != PhaseCancelled {
		t.Fatalf("Cancel in %v = (%v, %v) to %v, want CANCELLED", before.Phase, res, err, next.Phase)
	}
	m.revoked = 0
	if before.Phase == PhaseLeased {
		if next.Cancellation.Token != before.Lease.Token || next.Cancellation.Renderer != before.Lease.Renderer || res != CancelledRunning {
			t.Fatalf("Cancel of a leased job recorded token %d of %q (%v), want %d of %q", next.Cancellation.Token, next.Cancellation.Renderer, res, before.Lease.Token, before.Lease.Renderer)
		}
		m.revoked = before.Lease.Token
		m.endLease(t, before.Lease.Token, LeaseRevoked, "")
	}
	m.wasCancelled = true
	m.commit(t, before, next)
}

func (m *model) ackCancel(t *rapid.T) {
	before := m.j
	token := m.anyToken(t)
	renderer := m.anyRenderer(t, token)
	next, ok := m.j.AckCancel(token, renderer, m.now)
	rec, _ := m.lease(token)
	want := before.Phase == PhaseCancelled && token != 0 && token == m.revoked && rec.Renderer == renderer && !m.acked
	if ok != want {
		t.Fatalf("AckCancel(%d, %s) = %v, want %v (revoked %d of %q, acked %v)", token, renderer, ok, want, m.revoked, rec.Renderer, m.acked)
	}
	if !ok {
		m.unchanged(t, "refused acknowledgement", before, next)
		return
	}
	if evs := newEvents(before, next); len(evs) != 1 || evs[0].Kind != EventCancelAcknowledged || evs[0].Token != token || evs[0].Renderer != renderer {
		t.Fatalf("acknowledgement recorded %+v, want one CANCEL_ACKNOWLEDGED by %s", evs, renderer)
	}
	m.acked = true
	m.commit(t, before, next)
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
		m.unchanged(t, "refused replay", before, next)
		return
	}
	if next.Phase != PhaseQueued || next.Attempt != 0 || next.Cycle != before.Cycle+1 {
		t.Fatalf("Replay gave phase %v attempt %d cycle %d, want QUEUED 0 %d", next.Phase, next.Attempt, next.Cycle, before.Cycle+1)
	}
	m.rejected, m.cancelRejected, m.undelivered, m.handedBack = nil, false, 0, 0
	m.cycleStart = len(m.leases)
	m.commit(t, before, next)
}

// check asserts the invariants of docs/invariants.md that concern one job, and that
// the record agrees with the model.
func (m *model) check(t *rapid.T) {
	j := m.j
	if j.Attempt > j.Policy.MaxAttempts {
		t.Fatalf("attempt %d exceeds the maximum %d", j.Attempt, j.Policy.MaxAttempts)
	}

	// The record agrees with what the model saw happen.
	if diff := cmp.Diff(m.leases, j.Leases); diff != "" {
		t.Fatalf("Leases (-model +record):\n%s", diff)
	}
	if diff := cmp.Diff(m.rejected, j.Rejected); diff != "" {
		t.Fatalf("Rejected (-model +record):\n%s", diff)
	}
	if j.RejectedCompletions != m.rejections || j.CancelRejected != m.cancelRejected || j.Undelivered != m.undelivered {
		t.Fatalf("counters: rejected %d cancel rejected %v undelivered %d; want %d %v %d", j.RejectedCompletions, j.CancelRejected, j.Undelivered, m.rejections, m.cancelRejected, m.undelivered)
	}
	if j.Undelivered > j.Policy.MaxAttempts || len(j.Rejected) > MaxRejectionEvents {
		t.Fatalf("undelivered %d (max %d), %d rejections kept (max %d)", j.Undelivered, j.Policy.MaxAttempts, len(j.Rejected), MaxRejectionEvents)
	}
	if n := len(m.history); j.EventSeq != m.history[n-1].Seq {
		t.Fatalf("EventSeq %d, last event %d", j.EventSeq, m.history[n-1].Seq)
	}
	if n := len(j.Events); n > len(m.history) || !slices.Equal(j.Events, m.history[len(m.history)-n:]) {
		t.Fatalf("the record's events are not the tail of the history: %v", kinds(j))
	}

	// Attempts count the cycle's leases that did not go back uncounted, and
	// at most one lease is live: the current one.
	var counted uint32
	for _, l := range m.leases[m.cycleStart:] {
		if l.Kind != LeaseReleased {
			counted++
		}
	}
	if j.Attempt != counted {
		t.Fatalf("attempt %d, but %d leases of the cycle counted: %+v", j.Attempt, counted, m.leases[m.cycleStart:])
	}
	var live []uint64
	for _, l := range j.Leases {
		if l.Kind == LeaseLive {
			live = append(live, l.Token)
		}
	}
	if j.Phase == PhaseLeased {
		if len(live) != 1 || live[0] != j.Lease.Token || !j.Lease.Deadline.Equal(m.deadline) {
			t.Fatalf("LEASED under %d until %v with live leases %v, want exactly it until %v", j.Lease.Token, j.Lease.Deadline, live, m.deadline)
		}
	} else if len(live) != 0 {
		t.Fatalf("live leases %v in phase %v", live, j.Phase)
	}

	terminal, lastToken := 0, uint64(0)
	var succeededBy uint64
	var rejections, cancelRejections int
	for i, ev := range m.history {
		if ev.Seq != uint32(i)+1 {
			t.Fatalf("event %d has sequence %d", i, ev.Seq)
		}
		switch ev.Kind {
		case EventReplayed:
			terminal, succeededBy, rejections, cancelRejections = 0, 0, 0, 0
		case EventSucceeded:
			terminal++
			succeededBy = ev.Token
		case EventFailed, EventCancelled:
			terminal++
		case EventCompletionRejected:
			rejections++
		case EventCancelRejected:
			cancelRejections++
		case EventLeased:
			if ev.Token <= lastToken {
				t.Fatalf("LEASED token %d after %d: tokens must strictly increase", ev.Token, lastToken)
			}
			lastToken = ev.Token
		}
		if terminal > 1 {
			t.Fatalf("%d terminal transitions in one cycle: %v", terminal, historyKinds(m.history))
		}
	}
	if j.Phase.Terminal() != (terminal == 1) {
		t.Fatalf("phase %v with %d terminal events in the cycle", j.Phase, terminal)
	}
	if rejections != len(j.Rejected) {
		t.Fatalf("%d COMPLETION_REJECTED events in the cycle, %d rejections kept", rejections, len(j.Rejected))
	}
	if (cancelRejections == 1) != j.CancelRejected || cancelRejections > 1 {
		t.Fatalf("%d CANCEL_REJECTED events in the cycle, CancelRejected %v", cancelRejections, j.CancelRejected)
	}

	if (j.Artifact != Artifact{}) != (j.Phase == PhaseSucceeded) {
		t.Fatalf("artifact %+v in phase %v: it must be set exactly when SUCCEEDED", j.Artifact, j.Phase)
	}
	if j.Phase == PhaseSucceeded {
		if j.Artifact.Token != m.successToken || j.Artifact.Token != succeededBy || j.Artifact.Token == 0 {
			t.Fatalf("artifact token %d, succeeding completion %d, SUCCEEDED event token %d: must be equal", j.Artifact.Token, m.successToken, succeededBy)
		}
		l, _ := m.lease(j.Artifact.Token)
		if l.Kind != LeaseCompleted || l.Renderer != j.Artifact.Renderer || l.Outcome != Outcome(true, j.Artifact.Digest, 0) {
			t.Fatalf("artifact %+v from lease %+v: it must be that lease's applied success", j.Artifact, l)
		}
	}

	if m.wasCancelled {
		if j.Phase != PhaseCancelled {
			t.Fatalf("a cancelled job moved to %v", j.Phase)
		}
		seen := false
		for _, ev := range m.history {
			seen = seen || ev.Kind == EventCancelled
			if seen && ev.Kind == EventLeased {
				t.Fatalf("a cancelled job was leased again: %v", historyKinds(m.history))
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

// historyKinds returns the kinds of evs, in order.
func historyKinds(evs []Event) []EventKind {
	return kinds(Job{Events: evs})
}

// newModel draws a retry policy and a first token, and returns the model
// of a freshly submitted job.
func newModel(t *rapid.T) *model {
	base := time.Duration(rapid.Int64Range(int64(time.Millisecond), int64(2*time.Second)).Draw(t, "backoffBase"))
	policy := RetryPolicy{
		MaxAttempts: rapid.Uint32Range(1, 5).Draw(t, "maxAttempts"),
		BackoffBase: base,
		BackoffCap:  base * time.Duration(rapid.Int64Range(1, 64).Draw(t, "capFactor")),
	}
	j := New(1, 1, "team", testDoc, policy, false, t0)
	return &model{
		j:         j,
		now:       t0,
		nextToken: rapid.Uint64Range(1, 1<<40).Draw(t, "firstToken"),
		history:   slices.Clone(j.Events),
	}
}

// actions returns the model's commands by name, and its invariant check
// under "", as rapid's T.Repeat takes them.
func (m *model) actions() map[string]func(*rapid.T) {
	return map[string]func(*rapid.T){
		"grant":              m.grant,
		"advance":            m.advance,
		"loadWithoutHistory": m.loadWithoutHistory,
		"heartbeat":          m.heartbeat,
		"handBack":           m.handBack,
		"release":            m.release,
		"expire":             m.expire,
		"expireDue":          m.expireDue,
		"strayCompletions":   m.strayCompletions,
		"resendApplied":      m.resendApplied,
		"requeue":            m.requeue,
		"complete":           m.complete,
		"cancel":             m.cancel,
		"ackCancel":          m.ackCancel,
		"replay":             m.replay,
		"":                   m.check,
	}
}

func TestJobInvariantsUnderRandomCommands(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		t.Repeat(newModel(t).actions())
	})
}
