package chaos

import (
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
)

var t0 = time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)

const (
	kSubmitted = leaseholdv1.EventKind_EVENT_KIND_SUBMITTED
	kLeased    = leaseholdv1.EventKind_EVENT_KIND_LEASED
	kSucceeded = leaseholdv1.EventKind_EVENT_KIND_SUCCEEDED
	kFailed    = leaseholdv1.EventKind_EVENT_KIND_FAILED
	kCancelled = leaseholdv1.EventKind_EVENT_KIND_CANCELLED
	kReplayed  = leaseholdv1.EventKind_EVENT_KIND_REPLAYED
	kRequeued  = leaseholdv1.EventKind_EVENT_KIND_REQUEUED
)

// event is one history entry at t0+after.
func event(seq uint32, kind leaseholdv1.EventKind, token uint64, after time.Duration, attempt uint32) *leaseholdv1.JobEvent {
	return &leaseholdv1.JobEvent{Seq: seq, Kind: kind, Token: token, At: timestamppb.New(t0.Add(after)), Attempt: attempt}
}

// consistentRun is a run in which nothing went wrong: two processes (the
// first left the token counter at 2, the second at 3), one batch of two
// jobs; j-1 succeeded under token 1, j-2 failed under token 2, was
// replayed, and succeeded under token 3 in the second process.
func consistentRun() *evidence {
	return &evidence{
		runs: []lifetime{
			{N: 1, Exec: t0, End: "SIGKILL", Counter: 2},
			{N: 2, Exec: t0.Add(time.Second), End: "SIGTERM", Counter: 3},
		},
		submits: []submitAck{{RequestID: "r", Batch: "b-1", Jobs: []string{"j-1", "j-2"}, Names: []string{"a.txt", "b.txt"}}},
		jobs: []*leaseholdv1.Job{
			{Id: "j-1", BatchId: "b-1", Document: &leaseholdv1.DocumentInfo{Name: "a.txt"}, Phase: leaseholdv1.Phase_PHASE_SUCCEEDED,
				Attempt: 1, MaxAttempts: 3, Events: []*leaseholdv1.JobEvent{
					event(1, kSubmitted, 0, 0, 0), event(2, kLeased, 1, 100*time.Millisecond, 1), event(3, kSucceeded, 1, 200*time.Millisecond, 1)}},
			{Id: "j-2", BatchId: "b-1", Document: &leaseholdv1.DocumentInfo{Name: "b.txt"}, Phase: leaseholdv1.Phase_PHASE_SUCCEEDED,
				Attempt: 1, MaxAttempts: 3, Events: []*leaseholdv1.JobEvent{
					event(1, kSubmitted, 0, 0, 0), event(2, kLeased, 2, 300*time.Millisecond, 1), event(3, kFailed, 2, 400*time.Millisecond, 1),
					event(4, kReplayed, 0, 1500*time.Millisecond, 0), event(5, kLeased, 3, 1600*time.Millisecond, 1),
					event(6, kSucceeded, 3, 1700*time.Millisecond, 1)}},
		},
		grants:    []grant{{"r-1", "j-1", 1}, {"r-1", "j-2", 2}, {"r-2", "j-2", 3}, {"r-2", "j-2", 3}},
		terminals: []terminalSeen{{"j-1", 3, kSucceeded}, {"j-2", 3, kFailed}, {"j-2", 6, kSucceeded}},
		cancels:   []cancelAck{{Job: "j-1", AlreadyTerminal: true}},
		replays:   []replayAck{{RequestID: "replay-1", Requeued: []string{"j-2"}}},
		audit:     []*leaseholdv1.AuditRecord{{Action: "REPLAY", RequestId: "replay-1"}},
	}
}

func TestExamine(t *testing.T) {
	t.Parallel()

	t.Run("A consistent run has no violations", func(t *testing.T) {
		t.Parallel()
		f := examine(consistentRun())
		if f.violations() != 0 || f.AckedJobs != 2 || f.Checks != 2 || f.ReplayedJobs != 1 {
			t.Errorf("examine() = %+v, want no violations, 2 acknowledged jobs, 2 checks, 1 replayed job", f)
		}
	})

	// On raft, a process killed while it applies its predecessor's log
	// (an apply failpoint) leaves a store without some of the grants the
	// log holds: the tokens of the process before it are bounded by the
	// first token a later process granted.
	t.Run("On raft a store left mid-replay does not bound the tokens before it", func(t *testing.T) {
		t.Parallel()
		ev := consistentRun()
		ev.raft = true
		ev.runs = []lifetime{
			{N: 1, Exec: t0, End: "SIGKILL", Counter: 1},
			{N: 2, Exec: t0.Add(time.Second), End: "failpoint", Counter: 1},
			{N: 3, Exec: t0.Add(1200 * time.Millisecond), End: "SIGTERM", Counter: 3},
		}
		if f := examine(ev); f.violations() != 0 {
			t.Errorf("examine() = %+v, want no violations", f)
		}
	})
	t.Run("On raft a token above a later process's first token went back", func(t *testing.T) {
		t.Parallel()
		ev := consistentRun()
		ev.raft = true
		ev.runs[0].Counter = 1
		// j-2 leased under 3 by the first process and under 2 by the
		// second.
		ev.jobs[1].Events[1].Token, ev.jobs[1].Events[4].Token = 3, 2
		ev.grants = []grant{{"r-1", "j-1", 1}, {"r-1", "j-2", 3}, {"r-2", "j-2", 2}}
		if f := examine(ev); f.TokensBack != 1 || f.violations() != 1 {
			t.Errorf("examine() = %+v, want the one token that went back", f)
		}
	})

	for _, tc := range []struct {
		name    string
		corrupt func(ev *evidence)
		got     func(f *findings) int
		want    int
	}{
		{"An acknowledged job missing from the store is lost",
			func(ev *evidence) { ev.jobs = ev.jobs[1:] }, func(f *findings) int { return f.Lost }, 1},
		{"A job stored under another name is lost",
			func(ev *evidence) { ev.jobs[0].Document.Name = "z.txt" }, func(f *findings) int { return f.Lost }, 1},
		{"A stored job of no acknowledged batch is found",
			func(ev *evidence) {
				ev.jobs = append(ev.jobs, &leaseholdv1.Job{Id: "j-9", BatchId: "b-9", Phase: leaseholdv1.Phase_PHASE_CANCELLED, MaxAttempts: 3,
					Events: []*leaseholdv1.JobEvent{event(1, kSubmitted, 0, 0, 0), event(2, kCancelled, 0, 0, 0)}})
			}, func(f *findings) int { return f.Unacknowledged }, 1},
		{"A token in two histories is a duplicate",
			func(ev *evidence) { ev.jobs[1].Events[1].Token = 1 }, func(f *findings) int { return f.DuplicateTokens }, 1},
		{"A token received for two jobs is a duplicate",
			func(ev *evidence) { ev.grants = append(ev.grants, grant{"r-2", "j-2", 1}) }, func(f *findings) int { return f.DuplicateTokens }, 1},
		{"A token not above the previous process's counter went back",
			func(ev *evidence) { ev.runs[0].Counter = 3 }, func(f *findings) int { return f.TokensBack }, 1},
		{"A counter that goes down and a token above its process's counter go back",
			func(ev *evidence) { ev.runs[1].Counter = 1 }, func(f *findings) int { return f.TokensBack }, 2},
		{"A grant received that the store lacks is found",
			func(ev *evidence) { ev.grants = append(ev.grants, grant{"r-1", "j-1", 7}) }, func(f *findings) int { return f.GrantsNotStored }, 1},
		{"Two terminal events in one cycle are a double transition",
			func(ev *evidence) {
				ev.jobs[0].Events = append(ev.jobs[0].Events, event(4, kCancelled, 0, time.Second, 1))
			},
			func(f *findings) int { return f.DoubleTerminal }, 1},
		{"A job left LEASED is stuck",
			func(ev *evidence) { ev.jobs[0].Phase = leaseholdv1.Phase_PHASE_LEASED }, func(f *findings) int { return f.Stuck }, 1},
		{"An attempt over the maximum is found",
			func(ev *evidence) { ev.jobs[0].Attempt = 4 }, func(f *findings) int { return f.AttemptsOver }, 1},
		{"Uncounted re-queues over the maximum are found",
			func(ev *evidence) {
				for i := range 4 {
					e := event(uint32(10+i), kRequeued, 0, 0, 1)
					e.Reason = "LEASE_NEVER_HEARD"
					ev.jobs[0].Events = append(ev.jobs[0].Events, e)
				}
			}, func(f *findings) int { return f.AttemptsOver }, 1},
		{"A watched event the store lacks is contradicted",
			func(ev *evidence) { ev.terminals = append(ev.terminals, terminalSeen{"j-2", 9, kSucceeded}) },
			func(f *findings) int { return f.Contradicted }, 1},
		{"A job answered cancelled that did not end CANCELLED is contradicted",
			func(ev *evidence) { ev.cancels = append(ev.cancels, cancelAck{Job: "j-1", Cancelled: true}) },
			func(f *findings) int { return f.Contradicted }, 1},
		{"An acknowledged replay missing from the history is contradicted",
			func(ev *evidence) {
				ev.replays = append(ev.replays, replayAck{RequestID: "replay-2", Requeued: []string{"j-1"}})
				ev.audit = append(ev.audit, &leaseholdv1.AuditRecord{Action: "REPLAY", RequestId: "replay-2"})
			}, func(f *findings) int { return f.Contradicted }, 1},
		{"A replay audited twice is contradicted",
			func(ev *evidence) { ev.audit = append(ev.audit, ev.audit[0]) }, func(f *findings) int { return f.Contradicted }, 1},
		{"A problem the consistency check reported is counted",
			func(ev *evidence) { ev.runs[0].Problems = []string{"bbolt: page 3: unreachable unfreed"} },
			func(f *findings) int { return f.CheckProblems }, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ev := consistentRun()
			tc.corrupt(ev)
			f := examine(ev)
			if got := tc.got(f); got != tc.want {
				t.Errorf("count = %d, want %d; findings %+v", got, tc.want, f)
			}
			if len(f.Problems) == 0 {
				t.Errorf("no problem described; findings %+v", f)
			}
		})
	}
}

func TestPercentile(t *testing.T) {
	t.Parallel()
	var ds []time.Duration
	for i := 1; i <= 200; i++ {
		ds = append(ds, time.Duration(i)*time.Millisecond)
	}
	for _, tc := range []struct {
		p    float64
		want time.Duration
	}{{50, 100 * time.Millisecond}, {99, 198 * time.Millisecond}, {100, 200 * time.Millisecond}} {
		if got := percentile(ds, tc.p); got != tc.want {
			t.Errorf("percentile(1..200 ms, %v) = %v, want %v", tc.p, got, tc.want)
		}
	}
	if got := percentile(ds[:20], 99); got != 20*time.Millisecond {
		t.Errorf("percentile of 20 samples at 99 = %v, want the largest, 20ms", got)
	}
}

func TestFailpointSchedule(t *testing.T) {
	t.Parallel()
	h := &harness{cfg: config{failpointEvery: 4}}
	var got []string
	for n := 1; n <= 20; n++ {
		got = append(got, h.failpointFor(n))
	}
	want := []string{"", "", "", "beforeCommit", "", "", "", "grantsUnpublished", "", "", "", "afterCommit",
		"", "", "", "replayMidway", "", "", "", "beforeCommit"}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("crash %d arms %q, want %q", i+1, got[i], want[i])
		}
	}
}
