package chaos

import (
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/leasehold/leasehold/client/reason"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
)

// submitAck is a SubmitBatch the coordinator answered: what it said it
// stored.
type submitAck struct {
	RequestID string   `json:"request_id"`
	Batch     string   `json:"batch"`
	Jobs      []string `json:"jobs"`
	Names     []string `json:"names"`
	// Retried is set when the answer came to a second or later attempt
	// with the same request id; Replayed when the coordinator said it had
	// stored the batch already (the first answer was lost to a crash).
	Retried  bool `json:"retried,omitempty"`
	Replayed bool `json:"replayed,omitempty"`
}

// terminalSeen is a terminal event a watch delivered: published, so
// committed.
type terminalSeen struct {
	Job  string                `json:"job"`
	Seq  uint32                `json:"seq"`
	Kind leaseholdv1.EventKind `json:"kind"`
}

// cancelAck is a CancelJob the coordinator answered: cancelled (now or
// before), or refused because the job had ended.
type cancelAck struct {
	Job             string `json:"job"`
	Cancelled       bool   `json:"cancelled,omitempty"`
	AlreadyTerminal bool   `json:"already_terminal,omitempty"`
}

// replayAck is a ReplayJobs the coordinator answered, with the jobs it
// re-queued.
type replayAck struct {
	RequestID string   `json:"request_id"`
	Requeued  []string `json:"requeued"`
	AuditID   uint64   `json:"audit_id"`
	Replayed  bool     `json:"replayed,omitempty"`
}

// grant is one line of a renderer's --record file: a lease it received.
type grant struct {
	Renderer string
	Job      string
	Token    uint64
}

// lifetime is one coordinator process, from its exec to its end and the check
// of its data file that followed.
type lifetime struct {
	N    int
	Exec time.Time
	// Ready is the time from exec to the first SERVING answer.
	Ready time.Duration
	// End says how it ended: "SIGKILL", "failpoint", "SIGTERM", or what
	// went wrong.
	End string
	// Failpoint is the failpoint armed in it, if any, and Fired whether it
	// killed the process.
	Failpoint string
	Fired     bool
	// Counter is the token counter the check found after the process
	// ended; Jobs the job records; Problems what the check reported.
	Counter  uint64
	Jobs     int
	Problems []string
}

// evidence is everything a crash run gathered: the coordinator processes,
// the load generator's journal, the renderers' grants, and the final state
// read from the coordinator after the drain.
type evidence struct {
	// raft says the coordinator ran on raft (-raft): see checkGrantTime.
	raft      bool
	runs      []lifetime
	submits   []submitAck
	terminals []terminalSeen
	cancels   []cancelAck
	replays   []replayAck
	grants    []grant
	jobs      []*leaseholdv1.Job
	audit     []*leaseholdv1.AuditRecord
}

// findings are the invariants' verdicts: every count but the first block
// must be zero.
type findings struct {
	AckedBatches, AckedJobs, RetriedSubmits, ReplayedSubmits int
	Grants, Terminals, Cancels, Replays, ReplayedJobs        int

	// Lost: acknowledged jobs missing from the store, or stored otherwise
	// than acknowledged (another batch, another document).
	Lost int
	// Unacknowledged: stored jobs of batches no one was told of.
	Unacknowledged int
	// DuplicateTokens: a token granted twice (in the store's histories, or
	// received by renderers for two jobs).
	DuplicateTokens int
	// TokensBack: a grant whose token is not above the counter the
	// previous process left, or above the counter its own process left; or
	// a counter that went down between processes.
	TokensBack int
	// GrantsNotStored: grants a renderer received that the store does not
	// know: published before it was durable.
	GrantsNotStored int
	// DoubleTerminal: a job cycle with more than one terminal event.
	DoubleTerminal int
	// Stuck: jobs not terminal after the drain.
	Stuck int
	// AttemptsOver: a job whose attempt, or uncounted re-queues of a cycle,
	// passed its maximum.
	AttemptsOver int
	// Contradicted: answers and published events the final store denies (a
	// watched terminal event absent, a cancelled job not CANCELLED, a
	// replay not in the history or the audit).
	Contradicted int
	// CheckProblems: problems the consistency check reported, over Checks
	// checks.
	Checks, CheckProblems int

	// Problems describes the first violations found.
	Problems []string
	omitted  int
}

// maxProblems bounds the violations described one by one.
const maxProblems = 30

func (f *findings) problemf(format string, args ...any) {
	if len(f.Problems) == maxProblems {
		f.omitted++
		return
	}
	f.Problems = append(f.Problems, fmt.Sprintf(format, args...))
}

// violations is the number of invariant violations found.
func (f *findings) violations() int {
	return f.Lost + f.Unacknowledged + f.DuplicateTokens + f.TokensBack + f.GrantsNotStored + f.DoubleTerminal +
		f.Stuck + f.AttemptsOver + f.Contradicted + f.CheckProblems
}

// terminalKind reports whether an event ends a job's cycle.
func terminalKind(k leaseholdv1.EventKind) bool {
	return k == leaseholdv1.EventKind_EVENT_KIND_SUCCEEDED || k == leaseholdv1.EventKind_EVENT_KIND_FAILED ||
		k == leaseholdv1.EventKind_EVENT_KIND_CANCELLED
}

// terminalPhase reports whether a job's phase is terminal.
func terminalPhase(p leaseholdv1.Phase) bool {
	return p == leaseholdv1.Phase_PHASE_SUCCEEDED || p == leaseholdv1.Phase_PHASE_FAILED || p == leaseholdv1.Phase_PHASE_CANCELLED
}

// examine checks the invariants against the evidence.
func examine(ev *evidence) *findings {
	f := &findings{Grants: len(ev.grants), Terminals: len(ev.terminals), Cancels: len(ev.cancels), Replays: len(ev.replays)}
	byID := make(map[string]*leaseholdv1.Job, len(ev.jobs))
	for _, j := range ev.jobs {
		byID[j.GetId()] = j
	}
	checkSubmits(ev, f, byID)
	checkTokens(ev, f)
	for _, j := range ev.jobs {
		checkHistory(j, f)
	}
	checkObservations(ev, f, byID)
	for _, r := range ev.runs {
		if r.End == "" || r.Exec.IsZero() {
			continue
		}
		f.Checks++
		f.CheckProblems += len(r.Problems)
		for _, p := range r.Problems {
			f.problemf("check after process %d: %s", r.N, p)
		}
	}
	return f
}

// checkSubmits: every acknowledged batch is stored whole, as acknowledged,
// and nothing else is stored.
func checkSubmits(ev *evidence, f *findings, byID map[string]*leaseholdv1.Job) {
	acked := map[string]bool{}
	for _, s := range ev.submits {
		f.AckedBatches++
		f.AckedJobs += len(s.Jobs)
		if s.Retried {
			f.RetriedSubmits++
		}
		if s.Replayed {
			f.ReplayedSubmits++
		}
		acked[s.Batch] = true
		for i, id := range s.Jobs {
			j := byID[id]
			switch {
			case j == nil:
				f.Lost++
				f.problemf("job %s of acknowledged batch %s (request %s) is not stored", id, s.Batch, s.RequestID)
			case j.GetBatchId() != s.Batch || j.GetDocument().GetName() != nameAt(s.Names, i):
				f.Lost++
				f.problemf("job %s is stored as %s in batch %s, acknowledged as %s in batch %s",
					id, j.GetDocument().GetName(), j.GetBatchId(), nameAt(s.Names, i), s.Batch)
			}
		}
	}
	for _, j := range ev.jobs {
		if !acked[j.GetBatchId()] {
			f.Unacknowledged++
			f.problemf("job %s of batch %s is stored, but no submit of it was acknowledged", j.GetId(), j.GetBatchId())
		}
	}
}

// nameAt returns names[i], or "" past its end.
func nameAt(names []string, i int) string {
	if i < len(names) {
		return names[i]
	}
	return ""
}

// checkTokens: no token granted twice; each grant's token above the
// counter the previous process left and at most the one its own process
// left; counters never go down; every grant a renderer received is
// stored.
func checkTokens(ev *evidence, f *findings) {
	runs := slices.Clone(ev.runs)
	slices.SortFunc(runs, func(a, b lifetime) int { return a.Exec.Compare(b.Exec) })
	for i := 1; i < len(runs); i++ {
		if runs[i].Counter < runs[i-1].Counter {
			f.TokensBack++
			f.problemf("the token counter went from %d after process %d down to %d after process %d",
				runs[i-1].Counter, runs[i-1].N, runs[i].Counter, runs[i].N)
		}
	}
	type lease struct {
		job string
		seq uint32
	}
	stored := map[uint64]lease{}
	bounds := tokenBounds(runs, ev)
	for _, j := range ev.jobs {
		for _, e := range j.GetEvents() {
			if e.GetKind() != leaseholdv1.EventKind_EVENT_KIND_LEASED {
				continue
			}
			tok := e.GetToken()
			if prev, dup := stored[tok]; dup {
				f.DuplicateTokens++
				f.problemf("token %d granted twice: job %s event %d and job %s event %d", tok, prev.job, prev.seq, j.GetId(), e.GetSeq())
				continue
			}
			stored[tok] = lease{j.GetId(), e.GetSeq()}
			checkGrantTime(runs, bounds, e, j.GetId(), f)
		}
	}
	received := map[uint64]grant{}
	for _, g := range ev.grants {
		if prev, seen := received[g.Token]; seen {
			if prev.Job != g.Job || prev.Renderer != g.Renderer {
				f.DuplicateTokens++
				f.problemf("token %d received for job %s by %s and for job %s by %s", g.Token, prev.Job, prev.Renderer, g.Job, g.Renderer)
			}
			continue
		}
		received[g.Token] = g
		if l, ok := stored[g.Token]; !ok || l.job != g.Job {
			f.GrantsNotStored++
			f.problemf("renderer %s received job %s under token %d, which the store does not hold", g.Renderer, g.Job, g.Token)
		}
	}
}

// runAt returns the index in runs, sorted by exec, of the process that
// granted a lease at at: the last one started at or before it; -1 before
// the first.
func runAt(runs []lifetime, at time.Time) int {
	i, found := slices.BinarySearchFunc(runs, at, func(r lifetime, t time.Time) int { return r.Exec.Compare(t) })
	if !found {
		i-- // the last run started before at
	}
	return i
}

// tokenBounds returns, for each process of runs (sorted by exec), the
// highest token it may have granted: the counter the check of its store
// found after it.
//
// On raft, a process's durable state is its store and its raft log: a
// crash between an entry's append to the log and its apply to the store
// leaves committed grants that the check of the stopped store does not
// count, and a later process applies them before it grants anything; a
// process killed while it applies them (an apply failpoint) may leave a
// store that still lacks some. So there the bound of a process's tokens is
// the smallest token any later process granted, less one, and at most the
// counter the last process left, which applied the whole log.
func tokenBounds(runs []lifetime, ev *evidence) []uint64 {
	first := make([]uint64, len(runs)) // each process's smallest token; 0 for none
	for _, j := range ev.jobs {
		for _, e := range j.GetEvents() {
			if e.GetKind() != leaseholdv1.EventKind_EVENT_KIND_LEASED {
				continue
			}
			if i := runAt(runs, e.GetAt().AsTime()); i >= 0 && (first[i] == 0 || e.GetToken() < first[i]) {
				first[i] = e.GetToken()
			}
		}
	}
	bounds := make([]uint64, len(runs))
	later := uint64(math.MaxUint64) // the smallest token after process i, less one
	for i := len(runs) - 1; i >= 0; i-- {
		bounds[i] = runs[i].Counter
		if ev.raft && i+1 < len(runs) {
			bounds[i] = min(runs[len(runs)-1].Counter, later)
		}
		if first[i] > 0 {
			later = min(later, first[i]-1)
		}
	}
	return bounds
}

// checkGrantTime checks a LEASED event's token against the counter of the
// process before the one that granted it (the last one started at or
// before the event), which the log only raises, and against the bound of
// the granting process's tokens (tokenBounds).
func checkGrantTime(runs []lifetime, bounds []uint64, e *leaseholdv1.JobEvent, job string, f *findings) {
	at := e.GetAt().AsTime()
	i := runAt(runs, at)
	if i < 0 {
		f.TokensBack++
		f.problemf("job %s was leased under token %d at %s, before the first process started", job, e.GetToken(), at.Format(time.RFC3339Nano))
		return
	}
	var floor uint64
	if i > 0 {
		floor = runs[i-1].Counter
	}
	if tok := e.GetToken(); tok <= floor || (runs[i].End != "" && tok > bounds[i]) {
		f.TokensBack++
		f.problemf("job %s leased under token %d by process %d, whose predecessor left the counter at %d and whose tokens end at %d",
			job, tok, runs[i].N, floor, bounds[i])
	}
}

// checkHistory: at most one terminal event per cycle (cycles begin at
// REPLAYED), the phase the history ends in, and attempts within the
// maximum.
func checkHistory(j *leaseholdv1.Job, f *findings) {
	if !terminalPhase(j.GetPhase()) {
		f.Stuck++
		f.problemf("job %s is %s after the drain (attempt %d)", j.GetId(), j.GetPhase(), j.GetAttempt())
	}
	maxAttempts := j.GetMaxAttempts()
	if j.GetAttempt() > maxAttempts {
		f.AttemptsOver++
		f.problemf("job %s is at attempt %d of %d", j.GetId(), j.GetAttempt(), maxAttempts)
	}
	terminals, neverHeard := 0, uint32(0)
	for _, e := range j.GetEvents() {
		switch {
		case e.GetKind() == leaseholdv1.EventKind_EVENT_KIND_REPLAYED:
			terminals, neverHeard = 0, 0
		case terminalKind(e.GetKind()):
			terminals++
			if terminals == 2 {
				f.DoubleTerminal++
				f.problemf("job %s ended twice in one cycle: event %d is %s", j.GetId(), e.GetSeq(), e.GetKind())
			}
		case e.GetKind() == leaseholdv1.EventKind_EVENT_KIND_REQUEUED && e.GetReason() == string(reason.LeaseNeverHeard):
			neverHeard++
			if neverHeard == maxAttempts+1 {
				f.AttemptsOver++
				f.problemf("job %s was re-queued uncounted more than %d times in one cycle", j.GetId(), maxAttempts)
			}
		}
		if e.GetAttempt() > maxAttempts {
			f.AttemptsOver++
			f.problemf("job %s event %d is at attempt %d of %d", j.GetId(), e.GetSeq(), e.GetAttempt(), maxAttempts)
		}
	}
	if terminalPhase(j.GetPhase()) && terminals == 0 {
		f.Contradicted++
		f.problemf("job %s is %s, but its last cycle has no terminal event", j.GetId(), j.GetPhase())
	}
}

// checkObservations: what watches delivered and what cancels and replays
// were answered stands in the final store.
func checkObservations(ev *evidence, f *findings, byID map[string]*leaseholdv1.Job) {
	for _, t := range ev.terminals {
		j := byID[t.Job]
		var e *leaseholdv1.JobEvent
		if j != nil {
			e = eventAt(j, t.Seq)
		}
		if e == nil || e.GetKind() != t.Kind {
			f.Contradicted++
			f.problemf("a watch delivered event %d of job %s, %s, which the store does not hold", t.Seq, t.Job, t.Kind)
		}
	}
	for _, c := range ev.cancels {
		j := byID[c.Job]
		switch {
		case j == nil:
			// Reported as lost.
		case c.Cancelled && j.GetPhase() != leaseholdv1.Phase_PHASE_CANCELLED:
			f.Contradicted++
			f.problemf("job %s was answered cancelled, but is %s", c.Job, j.GetPhase())
		case c.AlreadyTerminal && !slices.ContainsFunc(j.GetEvents(), func(e *leaseholdv1.JobEvent) bool { return terminalKind(e.GetKind()) }):
			f.Contradicted++
			f.problemf("a cancel of job %s was refused as too late, but its history has no end", c.Job)
		}
	}
	requeued := map[string]int{}
	for _, r := range ev.replays {
		f.ReplayedJobs += len(r.Requeued)
		for _, id := range r.Requeued {
			requeued[id]++
		}
	}
	for _, j := range ev.jobs {
		n := 0
		for _, e := range j.GetEvents() {
			if e.GetKind() == leaseholdv1.EventKind_EVENT_KIND_REPLAYED {
				n++
			}
		}
		if n != requeued[j.GetId()] {
			f.Contradicted++
			f.problemf("job %s has %d REPLAYED events, but acknowledged replays re-queued it %d times", j.GetId(), n, requeued[j.GetId()])
		}
	}
	audited := map[string]int{}
	for _, a := range ev.audit {
		if a.GetAction() == "REPLAY" {
			audited[a.GetRequestId()]++
		}
	}
	for _, r := range ev.replays {
		if audited[r.RequestID] != 1 {
			f.Contradicted++
			f.problemf("replay %s was acknowledged, and audited %d times", r.RequestID, audited[r.RequestID])
		}
	}
}

// eventAt returns the job's event with sequence number seq, or nil.
func eventAt(j *leaseholdv1.Job, seq uint32) *leaseholdv1.JobEvent {
	evs := j.GetEvents()
	if i, ok := slices.BinarySearchFunc(evs, seq, func(e *leaseholdv1.JobEvent, s uint32) int { return int(e.GetSeq()) - int(s) }); ok {
		return evs[i]
	}
	return nil
}
