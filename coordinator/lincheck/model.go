package lincheck

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/anishathalye/porcupine"
	"github.com/leasehold/leasehold/client/reason"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"google.golang.org/grpc/codes"
)

// The phases and terminal reasons, shortened.
const (
	none      = leaseholdv1.Phase_PHASE_UNSPECIFIED
	queued    = leaseholdv1.Phase_PHASE_QUEUED
	leased    = leaseholdv1.Phase_PHASE_LEASED
	retryWait = leaseholdv1.Phase_PHASE_RETRY_WAIT
	succeeded = leaseholdv1.Phase_PHASE_SUCCEEDED
	failed    = leaseholdv1.Phase_PHASE_FAILED
	cancelled = leaseholdv1.Phase_PHASE_CANCELLED

	noReason          = leaseholdv1.TerminalReason_TERMINAL_REASON_UNSPECIFIED
	reasonSucceeded   = leaseholdv1.TerminalReason_TERMINAL_REASON_SUCCEEDED
	reasonUnsupported = leaseholdv1.TerminalReason_TERMINAL_REASON_UNSUPPORTED_FORMAT
	reasonInvalid     = leaseholdv1.TerminalReason_TERMINAL_REASON_INVALID_DOCUMENT
	reasonExhausted   = leaseholdv1.TerminalReason_TERMINAL_REASON_ATTEMPTS_EXHAUSTED
	reasonCancelled   = leaseholdv1.TerminalReason_TERMINAL_REASON_CANCELLED
)

// The ErrorInfo reasons the model expects, by the names its histories use.
const (
	StaleLease      = string(reason.StaleLease)
	LeaseExpired    = string(reason.LeaseExpired)
	JobCancelled    = string(reason.JobCancelled)
	NotLeaseHolder  = string(reason.NotLeaseHolder)
	OutcomeMismatch = string(reason.OutcomeMismatch)
	AlreadyTerminal = string(reason.AlreadyTerminal)
	JobNotFound     = string(reason.JobNotFound)
	// NotLeader is a replicated coordinator's refusal of a call it did not
	// apply and will not (UNAVAILABLE): any operation may get it, and it
	// changes nothing.
	NotLeader = string(reason.NotLeader)
)

// Spec is what the model needs to know of the coordinator's configuration.
type Spec struct {
	// MaxAttempts is the attempts per cycle (the coordinator's default
	// retry policy; the workload never overrides it per batch).
	MaxAttempts uint32
}

// Input is one operation on one job, as porcupine sees it.
type Input struct {
	Kind Kind
	Job  string
	// Renderer is the caller's renderer id (Acquire, Upload, Complete).
	Renderer string
	// Token is the lease an Upload or Complete names.
	Token   uint64
	Outcome Outcome
	// Unsupported is a Submit's: the document's format is known unsupported.
	Unsupported bool
	// Foreign marks a Get or Cancel by a submitter of another team.
	Foreign bool
	// Node is the node a Get or Cancel was sent to straight (0: the
	// leader), for the visualisation; the model does not look at it.
	Node int
}

// Output is one operation's answer for one job.
type Output struct {
	Pending bool
	Code    codes.Code
	Reason  string
	Err     string
	// Replayed is a Submit's or Complete's.
	Replayed bool
	// Grant is the lease an Acquire granted on this job.
	Grant Grant
	// AlreadyCancelled and RunningRenderer are a Cancel's.
	AlreadyCancelled bool
	RunningRenderer  string
	// View is the job returned by a Get or an applied Complete or Cancel.
	View *View
}

// State is one job in the model. It is a comparable value; the model
// never mutates a State it was given.
type State struct {
	Phase   leaseholdv1.Phase
	Attempt uint32
	// Token and Holder are the lease while LEASED. Token is 0 while it is
	// unknown: the lease was granted by an Acquire whose answer was lost.
	Token  uint64
	Holder string
	// Lost marks a lease granted by an Acquire whose answer was lost: the
	// coordinator may hand it back at any time.
	Lost bool
	// LastToken is the largest token the job is known to have been granted.
	LastToken uint64
	// Grants lists the leases the job is known to have been granted,
	// "token@renderer;" each: a fenced call under a token granted to
	// another renderer is NOT_LEASE_HOLDER, whatever became of that lease.
	Grants string
	Reason leaseholdv1.TerminalReason
	// ArtifactToken and ArtifactDigest are the artifact reference.
	ArtifactToken  uint64
	ArtifactDigest string
	// Applied lists the applied completions, "token=outcome;" each, oldest
	// first.
	Applied string
	// Latest is the token of the latest applied completion.
	Latest uint64
	// CancelFrom, RevokedBy and Revoked are the cancellation. Revoked is 0
	// while unknown (a lost lease was cancelled).
	CancelFrom leaseholdv1.Phase
	RevokedBy  string
	Revoked    uint64
}

// String implements fmt.Stringer.
func (s State) String() string {
	if s.Phase == none {
		return "-"
	}
	b := &strings.Builder{}
	fmt.Fprintf(b, "%s a%d", phaseName(s.Phase), s.Attempt)
	if s.Phase == leased {
		tok := "t?"
		if s.Token != 0 {
			tok = "t" + strconv.FormatUint(s.Token, 10)
		}
		fmt.Fprintf(b, " lease %s@%s", tok, s.Holder)
		if s.Lost {
			b.WriteString(" (lost answer)")
		}
	}
	if s.Reason != noReason {
		b.WriteString(" " + reasonName(s.Reason))
	}
	if s.ArtifactDigest != "" {
		fmt.Fprintf(b, " artifact t%d %s", s.ArtifactToken, short(s.ArtifactDigest))
	}
	if s.CancelFrom != none {
		b.WriteString(" from " + phaseName(s.CancelFrom))
		if s.RevokedBy != "" {
			fmt.Fprintf(b, " revoked t%d@%s", s.Revoked, s.RevokedBy)
		}
	}
	if s.Applied != "" {
		b.WriteString(" applied{" + strings.TrimSuffix(s.Applied, ";") + "}")
	}
	return b.String()
}

// grantedTo returns the renderer the lease under token was granted to, if
// the model knows it.
func (s State) grantedTo(token uint64) (string, bool) {
	prefix := strconv.FormatUint(token, 10) + "@"
	for _, e := range strings.Split(s.Grants, ";") {
		if rest, ok := strings.CutPrefix(e, prefix); ok {
			return rest, true
		}
	}
	return "", false
}

// granted returns s with the lease under token known to be renderer's.
func (s State) granted(token uint64, renderer string) State {
	s.Grants += strconv.FormatUint(token, 10) + "@" + renderer + ";"
	return s
}

// applied returns the outcome applied under token, if any.
func (s State) applied(token uint64) (string, bool) {
	prefix := strconv.FormatUint(token, 10) + "="
	for _, e := range strings.Split(s.Applied, ";") {
		if rest, ok := strings.CutPrefix(e, prefix); ok {
			return rest, true
		}
	}
	return "", false
}

func terminal(p leaseholdv1.Phase) bool {
	return p == succeeded || p == failed || p == cancelled
}

// Model returns the porcupine model of one job's history under spec,
// partitioned by job id.
func Model(spec Spec) porcupine.Model {
	m := model{spec: spec}
	nm := porcupine.NondeterministicModel{
		Partition: partitionByJob,
		Init:      func() []any { return []any{State{}} },
		Step: func(state, input, output any) []any {
			var next []any
			for _, s := range silent(state.(State)) {
				for _, n := range m.step(s, input.(Input), output.(Output)) {
					next = append(next, n)
				}
			}
			return next
		},
		DescribeOperation: describeOperation,
		DescribeState:     func(s any) string { return s.(State).String() },
	}
	return nm.ToModel()
}

// partitionByJob splits a history into one partition per job, in order of
// first appearance.
func partitionByJob(history []porcupine.Operation) [][]porcupine.Operation {
	index := map[string]int{}
	var parts [][]porcupine.Operation
	for _, op := range history {
		job := op.Input.(Input).Job
		i, ok := index[job]
		if !ok {
			i = len(parts)
			index[job] = i
			parts = append(parts, nil)
		}
		parts[i] = append(parts[i], op)
	}
	return parts
}

// silent returns s and the states the writer may have moved s to on its
// own: a RETRY_WAIT job whose backoff elapsed is QUEUED again, and a lease
// whose Acquire answer was lost may have been handed back (QUEUED, the
// attempt not counted).
func silent(s State) []State {
	out := []State{s}
	switch {
	case s.Phase == retryWait:
		q := s
		q.Phase = queued
		out = append(out, q)
	case s.Phase == leased && s.Lost:
		q := s
		q.Phase, q.Token, q.Holder, q.Lost = queued, 0, "", false
		q.Attempt--
		out = append(out, q)
	}
	return out
}

type model struct{ spec Spec }

// step returns the states s may move to under in with the answer out; none
// when the answer is not one the specification allows.
func (m model) step(s State, in Input, out Output) []State {
	if !out.Pending && out.Code == codes.Unavailable && out.Reason == NotLeader {
		return []State{s}
	}
	switch in.Kind {
	case Submit:
		return m.submit(s, in, out)
	case Acquire:
		return m.acquire(s, in, out)
	case Upload:
		return m.upload(s, in, out)
	case Complete:
		return m.complete(s, in, out)
	case Cancel:
		return m.cancel(s, in, out)
	case Get:
		return m.get(s, in, out)
	}
	return nil
}

// either returns the states of a Pending call: not applied, or applied.
func either(s, next State) []State {
	if s == next {
		return []State{s}
	}
	return []State{s, next}
}

func (m model) submit(s State, in Input, out Output) []State {
	created := s.Phase == none
	next := s
	if created {
		next = State{Phase: queued}
		if in.Unsupported {
			next = State{Phase: failed, Reason: reasonUnsupported}
		}
	}
	if out.Pending {
		return either(s, next)
	}
	if out.Code != codes.OK || out.Replayed == created {
		return nil
	}
	return []State{next}
}

func (m model) acquire(s State, in Input, out Output) []State {
	if s.Phase != queued {
		if out.Pending {
			return []State{s}
		}
		return nil
	}
	next := s
	next.Phase, next.Holder = leased, in.Renderer
	next.Attempt++
	if out.Pending {
		next.Token, next.Lost = 0, true
		return either(s, next)
	}
	g := out.Grant
	if out.Code != codes.OK || g.Token <= s.LastToken || g.Renderer != in.Renderer ||
		g.Attempt != next.Attempt || g.Attempt > m.spec.MaxAttempts {
		return nil
	}
	next.Token, next.LastToken = g.Token, g.Token
	return []State{next.granted(g.Token, in.Renderer)}
}

// holds reports whether renderer holds the job's lease under token.
func holds(s State, token uint64, renderer string) bool {
	return s.Phase == leased && s.Token != 0 && s.Token == token && s.Holder == renderer
}

// refusals returns the ABORTED reasons allowed for a fenced call under a
// token that is not renderer's current lease (and, for a completion, not
// an applied one).
func refusals(s State, token uint64, renderer string) []string {
	holder, known := s.grantedTo(token)
	switch {
	case known && holder != renderer:
		return []string{NotLeaseHolder}
	case s.Phase == leased && s.Token == token && s.Holder != renderer:
		return []string{NotLeaseHolder}
	case s.Phase == cancelled && s.CancelFrom == leased && s.Revoked == token:
		return []string{JobCancelled}
	case s.Phase == cancelled:
		return []string{StaleLease, JobCancelled}
	}
	return []string{StaleLease}
}

func (m model) upload(s State, in Input, out Output) []State {
	if out.Pending {
		return []State{s}
	}
	held := holds(s, in.Token, in.Renderer)
	switch {
	case out.Code == codes.OK && held:
		return []State{s}
	case out.Code == codes.Aborted && !held && contains(refusals(s, in.Token, in.Renderer), out.Reason):
		return []State{s}
	}
	return nil
}

func (m model) complete(s State, in Input, out Output) []State {
	outcome := in.Outcome.String()
	if holder, known := s.grantedTo(in.Token); known && holder != in.Renderer {
		return refuse(s, out, NotLeaseHolder)
	}
	if prev, ok := s.applied(in.Token); ok {
		if prev != outcome {
			return refuse(s, out, OutcomeMismatch)
		}
		if out.Pending {
			return []State{s}
		}
		if out.Code != codes.OK || !out.Replayed {
			return nil
		}
		return observe(s, out.View)
	}
	if !holds(s, in.Token, in.Renderer) {
		return refuse(s, out, refusals(s, in.Token, in.Renderer)...)
	}
	next := m.finish(s, in.Token, in.Outcome)
	if out.Pending {
		return either(s, next)
	}
	if out.Code != codes.OK || out.Replayed {
		return nil
	}
	return observe(next, out.View)
}

// finish applies the holder's completion under token.
func (m model) finish(s State, token uint64, o Outcome) State {
	n := s
	n.Applied += strconv.FormatUint(token, 10) + "=" + o.String() + ";"
	n.Latest = token
	n.Token, n.Holder, n.Lost = 0, "", false
	switch {
	case o.Success:
		n.Phase, n.Reason = succeeded, reasonSucceeded
		n.ArtifactToken, n.ArtifactDigest = token, o.Digest
	case o.Class == leaseholdv1.FailureClass_FAILURE_CLASS_UNSUPPORTED_FORMAT:
		n.Phase, n.Reason = failed, reasonUnsupported
	case o.Class == leaseholdv1.FailureClass_FAILURE_CLASS_INVALID_DOCUMENT:
		n.Phase, n.Reason = failed, reasonInvalid
	case n.Attempt >= m.spec.MaxAttempts:
		n.Phase, n.Reason = failed, reasonExhausted
	default:
		n.Phase = retryWait
	}
	return n
}

// refuse accepts a refusal with one of reasons (or a Pending call), which
// changes nothing.
func refuse(s State, out Output, reasons ...string) []State {
	if out.Pending || out.Code == codes.Aborted && contains(reasons, out.Reason) {
		return []State{s}
	}
	return nil
}

func (m model) cancel(s State, in Input, out Output) []State {
	if in.Foreign {
		return m.notFound(s, out)
	}
	next := s
	wantRunning := ""
	switch s.Phase {
	case queued, retryWait:
		next.Phase, next.Reason, next.CancelFrom = cancelled, reasonCancelled, s.Phase
	case leased:
		next.Phase, next.Reason, next.CancelFrom = cancelled, reasonCancelled, leased
		next.RevokedBy, next.Revoked = s.Holder, s.Token
		next.Token, next.Holder, next.Lost = 0, "", false
		wantRunning = s.Holder
	case cancelled:
		if out.Pending {
			return []State{s}
		}
		if out.Code != codes.OK || !out.AlreadyCancelled {
			return nil
		}
		return observe(s, out.View)
	case succeeded, failed:
		return refuseWith(s, out, codes.FailedPrecondition, AlreadyTerminal)
	default:
		return nil
	}
	if out.Pending {
		return either(s, next)
	}
	if out.Code != codes.OK || out.AlreadyCancelled || out.RunningRenderer != wantRunning {
		return nil
	}
	return observe(next, out.View)
}

// refuseWith accepts a refusal with code and reason (or a Pending call),
// which changes nothing.
func refuseWith(s State, out Output, code codes.Code, reason string) []State {
	if out.Pending || out.Code == code && out.Reason == reason {
		return []State{s}
	}
	return nil
}

// notFound accepts the answer to a caller who may not see the job: exactly
// that of an id that does not exist.
func (m model) notFound(s State, out Output) []State {
	return refuseWith(s, out, codes.NotFound, JobNotFound)
}

func (m model) get(s State, in Input, out Output) []State {
	if in.Foreign {
		return m.notFound(s, out)
	}
	if out.Pending {
		return []State{s}
	}
	if out.Code != codes.OK || s.Phase == none {
		return nil
	}
	return observe(s, out.View)
}

// observe checks that v shows s exactly. Tokens the model did not know (a
// lease granted by an Acquire whose answer was lost) are learnt from v.
func observe(s State, v *View) []State {
	if v == nil {
		return nil
	}
	if s.Phase == leased && s.Token == 0 && v.Phase == leased {
		if v.LeaseToken <= s.LastToken {
			return nil
		}
		s.Token, s.LastToken = v.LeaseToken, v.LeaseToken
		s = s.granted(v.LeaseToken, s.Holder)
	}
	if s.Phase == cancelled && s.CancelFrom == leased && s.Revoked == 0 && v.Phase == cancelled {
		if v.RevokedToken <= s.LastToken {
			return nil
		}
		s.Revoked, s.LastToken = v.RevokedToken, v.RevokedToken
		s = s.granted(v.RevokedToken, s.RevokedBy)
	}
	want := View{Phase: s.Phase, Attempt: s.Attempt, Reason: s.Reason}
	if s.Phase == leased {
		want.LeaseToken, want.LeaseRenderer = s.Token, s.Holder
	}
	if s.Phase == succeeded {
		want.ArtifactToken, want.ArtifactDigest = s.ArtifactToken, s.ArtifactDigest
	}
	if s.Phase == cancelled {
		want.CancelFrom, want.CancelRenderer, want.RevokedToken = s.CancelFrom, s.RevokedBy, s.Revoked
	}
	if *v != want {
		return nil
	}
	return []State{s}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// describeOperation renders one operation for the visualisation.
func describeOperation(input, output any) string {
	in, out := input.(Input), output.(Output)
	b := &strings.Builder{}
	switch in.Kind {
	case Submit:
		b.WriteString("Submit")
		if in.Unsupported {
			b.WriteString("(unsupported)")
		}
	case Acquire:
		fmt.Fprintf(b, "Acquire(%s)", in.Renderer)
	case Upload:
		fmt.Fprintf(b, "Upload(t%d@%s)", in.Token, in.Renderer)
	case Complete:
		o := in.Outcome.String()
		if in.Outcome.Success {
			o = "success:" + short(in.Outcome.Digest)
		}
		fmt.Fprintf(b, "Complete(t%d@%s %s)", in.Token, in.Renderer, o)
	case Cancel, Get:
		b.WriteString(in.Kind.String())
		if in.Foreign {
			b.WriteString("(foreign)")
		}
		if in.Node != 0 {
			fmt.Fprintf(b, "@n%d", in.Node)
		}
	}
	b.WriteString(" -> ")
	switch {
	case out.Pending:
		b.WriteString("? (" + out.Err + ")")
		return b.String()
	case out.Code != codes.OK:
		fmt.Fprintf(b, "%s %s", out.Code, out.Reason)
		return b.String()
	}
	b.WriteString("OK")
	switch in.Kind {
	case Acquire:
		fmt.Fprintf(b, " t%d a%d", out.Grant.Token, out.Grant.Attempt)
	case Submit, Complete:
		if out.Replayed {
			b.WriteString(" replayed")
		}
	case Cancel:
		if out.AlreadyCancelled {
			b.WriteString(" already")
		}
		if out.RunningRenderer != "" {
			b.WriteString(" running@" + out.RunningRenderer)
		}
	}
	if out.View != nil {
		b.WriteString(" [" + out.View.String() + "]")
	}
	return b.String()
}
