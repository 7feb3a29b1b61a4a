package lincheck_test

import (
	"errors"
	"log/slog"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/leasehold/leasehold/coordinator/lincheck"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"google.golang.org/grpc/codes"
)

// Shorthands for synthetic histories.
const (
	queued    = leaseholdv1.Phase_PHASE_QUEUED
	leased    = leaseholdv1.Phase_PHASE_LEASED
	retryWait = leaseholdv1.Phase_PHASE_RETRY_WAIT
	succeeded = leaseholdv1.Phase_PHASE_SUCCEEDED
	failed    = leaseholdv1.Phase_PHASE_FAILED
	cancelled = leaseholdv1.Phase_PHASE_CANCELLED

	transient = leaseholdv1.FailureClass_FAILURE_CLASS_TRANSIENT
)

var spec = lincheck.Spec{MaxAttempts: maxAttempts}

func success(digest string) lincheck.Outcome { return lincheck.Outcome{Success: true, Digest: digest} }

func failure(c leaseholdv1.FailureClass) lincheck.Outcome { return lincheck.Outcome{Class: c} }

func at(call, ret int64, r lincheck.Record) lincheck.Record {
	r.Call, r.Return = call, ret
	if r.Pending {
		r.Return = lincheck.Never
	}
	return r
}

func submitted(ids ...string) lincheck.Record {
	return lincheck.Record{Kind: lincheck.Submit, JobIDs: ids, Unsupported: make([]bool, len(ids))}
}

func granted(renderer string, gs ...lincheck.Grant) lincheck.Record {
	for i := range gs {
		gs[i].Renderer = renderer
	}
	return lincheck.Record{Kind: lincheck.Acquire, Renderer: renderer, Grants: gs}
}

func completed(job string, token uint64, renderer string, o lincheck.Outcome, code codes.Code, reason string, v *lincheck.View) lincheck.Record {
	return lincheck.Record{Kind: lincheck.Complete, Job: job, Token: token, Renderer: renderer, Outcome: o, Code: code, Reason: reason, View: v}
}

func got(job string, v lincheck.View) lincheck.Record {
	return lincheck.Record{Kind: lincheck.Get, Job: job, View: &v}
}

func cancelledBy(job string, code codes.Code, reason string, v *lincheck.View) lincheck.Record {
	return lincheck.Record{Kind: lincheck.Cancel, Job: job, Code: code, Reason: reason, View: v}
}

// baseHistory is a legal history of three jobs: j-1 succeeds (with a
// replay and a mismatched replay), j-2 is cancelled while leased and its
// holder's completion refused, j-3 fails three transient attempts.
func baseHistory() []lincheck.Record {
	ok, aborted := codes.OK, codes.Aborted
	j1Done := &lincheck.View{Phase: succeeded, Attempt: 1, Reason: leaseholdv1.TerminalReason_TERMINAL_REASON_SUCCEEDED, ArtifactToken: 5, ArtifactDigest: "d5"}
	j2Cancelled := &lincheck.View{Phase: cancelled, Attempt: 1, Reason: leaseholdv1.TerminalReason_TERMINAL_REASON_CANCELLED, CancelFrom: leased, CancelRenderer: "r2", RevokedToken: 6}
	cancelJ2 := cancelledBy("j-2", ok, "", j2Cancelled)
	cancelJ2.RunningRenderer = "r2"
	again := cancelledBy("j-2", ok, "", j2Cancelled)
	again.AlreadyCancelled = true
	replay := completed("j-1", 5, "r1", success("d5"), ok, "", j1Done)
	replay.Replayed = true
	upload := lincheck.Record{Kind: lincheck.Upload, Job: "j-1", Renderer: "r1", Token: 5}
	return []lincheck.Record{
		at(0, 10, submitted("j-1", "j-2", "j-3")),
		at(20, 30, granted("r1", lincheck.Grant{Job: "j-1", Token: 5, Attempt: 1})),
		at(20, 31, granted("r2", lincheck.Grant{Job: "j-2", Token: 6, Attempt: 1})),
		at(35, 40, got("j-1", lincheck.View{Phase: leased, Attempt: 1, LeaseToken: 5, LeaseRenderer: "r1"})),
		at(41, 45, upload),
		at(50, 60, completed("j-1", 5, "r1", success("d5"), ok, "", j1Done)),
		at(70, 80, replay),
		at(81, 85, completed("j-1", 5, "r1", failure(transient), aborted, lincheck.OutcomeMismatch, nil)),
		at(90, 95, cancelledBy("j-1", codes.FailedPrecondition, lincheck.AlreadyTerminal, nil)),
		at(100, 110, got("j-1", *j1Done)),

		at(40, 50, cancelJ2),
		at(45, 55, completed("j-2", 6, "r2", success("d6"), aborted, lincheck.JobCancelled, nil)),
		at(60, 65, again),

		at(30, 40, granted("r3", lincheck.Grant{Job: "j-3", Token: 7, Attempt: 1})),
		at(41, 45, completed("j-3", 7, "r3", failure(transient), ok, "", &lincheck.View{Phase: retryWait, Attempt: 1})),
		at(46, 47, got("j-3", lincheck.View{Phase: queued, Attempt: 1})),
		at(48, 50, granted("r3", lincheck.Grant{Job: "j-3", Token: 8, Attempt: 2})),
		at(51, 52, completed("j-3", 8, "r3", failure(transient), ok, "", &lincheck.View{Phase: retryWait, Attempt: 2})),
		at(53, 55, granted("r1", lincheck.Grant{Job: "j-3", Token: 9, Attempt: 3})),
		at(56, 58, replayed(completed("j-3", 7, "r3", failure(transient), ok, "", &lincheck.View{Phase: leased, Attempt: 3, LeaseToken: 9, LeaseRenderer: "r1"}))),
		at(60, 62, completed("j-3", 9, "r1", failure(transient), ok, "", &lincheck.View{Phase: failed, Attempt: 3, Reason: leaseholdv1.TerminalReason_TERMINAL_REASON_ATTEMPTS_EXHAUSTED})),
		at(63, 64, completed("j-3", 8, "r3", failure(leaseholdv1.FailureClass_FAILURE_CLASS_INVALID_DOCUMENT), aborted, lincheck.OutcomeMismatch, nil)),
	}
}

// lostAfter returns the Pending r with the times its client saw: called,
// then given up on.
func lostAfter(call, gaveUp int64, r lincheck.Record) lincheck.Record {
	r.Call, r.Return = call, gaveUp
	return r
}

// replayed returns r marked replayed.
func replayed(r lincheck.Record) lincheck.Record {
	r.Replayed = true
	return r
}

// verdict checks records with the model, the cross-job checks and the
// stale-read checks.
func verdict(t *testing.T, spec lincheck.Spec, records []lincheck.Record) (porcupine.CheckResult, error) {
	t.Helper()
	res := porcupine.CheckOperationsTimeout(lincheck.Model(spec), lincheck.Operations(records), time.Minute)
	return res, errors.Join(lincheck.CheckHistory(records), lincheck.CheckStaleReads(records))
}

// notLeader returns r refused UNAVAILABLE NOT_LEADER.
func notLeader(r lincheck.Record) lincheck.Record {
	r.Code, r.Reason, r.View, r.Grants = codes.Unavailable, lincheck.NotLeader, nil, nil
	return r
}

// stale returns r as a stale read from node 2.
func stale(r lincheck.Record) lincheck.Record {
	r.Stale, r.Node, r.AppliedIndex = true, 2, 7
	return r
}

// TestModelAcceptsLegalHistories keeps the model honest the other way: the
// base history, and the answers a concurrent or lost call may legally get,
// are accepted.
func TestModelAcceptsLegalHistories(t *testing.T) {
	t.Parallel()
	ok := codes.OK
	j4Leased := lincheck.View{Phase: leased, Attempt: 1, LeaseToken: 20, LeaseRenderer: "r4"}
	j4Done := &lincheck.View{Phase: succeeded, Attempt: 1, Reason: leaseholdv1.TerminalReason_TERMINAL_REASON_SUCCEEDED, ArtifactToken: 20, ArtifactDigest: "d20"}
	j4Cancelled := &lincheck.View{Phase: cancelled, Attempt: 1, Reason: leaseholdv1.TerminalReason_TERMINAL_REASON_CANCELLED, CancelFrom: leased, CancelRenderer: "r4", RevokedToken: 20}
	lostComplete := completed("j-4", 20, "r4", success("d20"), ok, "", nil)
	lostComplete.Pending = true
	lostAcquire := lincheck.Record{Kind: lincheck.Acquire, Renderer: "r9", Pending: true}
	running := cancelledBy("j-4", ok, "", j4Cancelled)
	running.RunningRenderer = "r4"
	j4 := func(rs ...lincheck.Record) []lincheck.Record {
		return append([]lincheck.Record{
			at(200, 210, submitted("j-4")),
			at(220, 230, granted("r4", lincheck.Grant{Job: "j-4", Token: 20, Attempt: 1})),
		}, rs...)
	}
	tests := []struct {
		name    string
		records []lincheck.Record
	}{
		{"The base history is linearizable", baseHistory()},
		{"A completion whose answer was lost may have taken effect", j4(
			at(240, 0, lostComplete),
			at(300, 310, got("j-4", *j4Done)),
		)},
		{"A completion whose answer was lost may not have taken effect", j4(
			at(240, 0, lostComplete),
			at(300, 310, got("j-4", j4Leased)),
			at(320, 330, replayed(completed("j-4", 20, "r4", success("d20"), ok, "", j4Done))),
		)},
		{"A cancel that overlaps a completion may win", j4(
			at(240, 260, running),
			at(241, 259, completed("j-4", 20, "r4", success("d20"), codes.Aborted, lincheck.JobCancelled, nil)),
		)},
		{"A completion that overlaps a cancel may win", j4(
			at(240, 260, cancelledBy("j-4", codes.FailedPrecondition, lincheck.AlreadyTerminal, nil)),
			at(241, 259, completed("j-4", 20, "r4", success("d20"), ok, "", j4Done)),
		)},
		{"A completion whose answer was lost may take effect after the client gave up", j4(
			lostAfter(240, 250, lostComplete),
			at(260, 270, got("j-4", j4Leased)),
			at(300, 310, got("j-4", *j4Done)),
		)},
		{"A completion refused NOT_LEADER changed nothing, and its repeat is applied", j4(
			at(240, 250, notLeader(completed("j-4", 20, "r4", success("d20"), ok, "", nil))),
			at(255, 258, got("j-4", j4Leased)),
			at(260, 270, completed("j-4", 20, "r4", success("d20"), ok, "", j4Done)),
		)},
		{"An Acquire and a read refused NOT_LEADER are no violation", j4(
			at(240, 250, notLeader(granted("r5"))),
			at(240, 250, notLeader(got("j-4", j4Leased))),
		)},
		{"A stale read shows a job as it was before an answered write", j4(
			at(240, 250, completed("j-4", 20, "r4", success("d20"), ok, "", j4Done)),
			at(260, 270, stale(got("j-4", j4Leased))),
			at(261, 262, stale(lincheck.Record{Kind: lincheck.Get, Job: "j-4", Code: codes.NotFound, Reason: lincheck.JobNotFound})),
		)},
		{"A stale read shows a write sent before it returned", j4(
			at(240, 0, lostComplete),
			at(235, 245, stale(got("j-4", *j4Done))),
		)},
		{"A lease granted by an Acquire whose answer was lost shows, then is handed back", []lincheck.Record{
			at(200, 210, submitted("j-4")),
			at(215, 0, lostAcquire),
			at(220, 230, got("j-4", lincheck.View{Phase: leased, Attempt: 1, LeaseToken: 19, LeaseRenderer: "r9"})),
			at(240, 250, got("j-4", lincheck.View{Phase: queued})),
			at(260, 270, granted("r4", lincheck.Grant{Job: "j-4", Token: 20, Attempt: 1})),
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			res, err := verdict(t, spec, tt.records)
			if res != porcupine.Ok || err != nil {
				t.Errorf("got %s, %v; want Ok, no cross-job error", res, err)
			}
		})
	}
}

// TestModelRejectsInjectedViolations shows the checker bites: each case
// injects one violation of the contract into the legal base history.
func TestModelRejectsInjectedViolations(t *testing.T) {
	t.Parallel()
	ok, aborted := codes.OK, codes.Aborted
	j1Other := &lincheck.View{Phase: succeeded, Attempt: 1, Reason: leaseholdv1.TerminalReason_TERMINAL_REASON_SUCCEEDED, ArtifactToken: 50, ArtifactDigest: "d50"}
	j1Done := lincheck.View{Phase: succeeded, Attempt: 1, Reason: leaseholdv1.TerminalReason_TERMINAL_REASON_SUCCEEDED, ArtifactToken: 5, ArtifactDigest: "d5"}
	tests := []struct {
		name   string
		inject func([]lincheck.Record) []lincheck.Record
		// crossJob is set when the violation is one only CheckHistory sees.
		crossJob bool
	}{
		{"A second successful completion under another token", func(h []lincheck.Record) []lincheck.Record {
			return append(h, at(120, 130, completed("j-1", 50, "r1", success("d50"), ok, "", j1Other)))
		}, false},
		{"A read reports SUCCEEDED before the completion was sent", func(h []lincheck.Record) []lincheck.Record {
			return append(h, at(46, 48, got("j-1", j1Done)))
		}, false},
		{"A read after the completion returned still shows the lease", func(h []lincheck.Record) []lincheck.Record {
			return append(h, at(61, 65, got("j-1", lincheck.View{Phase: leased, Attempt: 1, LeaseToken: 5, LeaseRenderer: "r1"})))
		}, false},
		{"A replay is answered as a fresh application", func(h []lincheck.Record) []lincheck.Record {
			h[6].Replayed = false
			return h
		}, false},
		{"A cancel after success answers OK", func(h []lincheck.Record) []lincheck.Record {
			h[8] = at(90, 95, cancelledBy("j-1", ok, "", &lincheck.View{Phase: cancelled, Attempt: 1, Reason: leaseholdv1.TerminalReason_TERMINAL_REASON_CANCELLED, CancelFrom: leased}))
			return h
		}, false},
		{"The revoked holder's completion is applied after the cancel returned", func(h []lincheck.Record) []lincheck.Record {
			return append(h, at(70, 75, completed("j-2", 6, "r2", success("d6"), ok, "", &lincheck.View{Phase: succeeded, Attempt: 1, Reason: leaseholdv1.TerminalReason_TERMINAL_REASON_SUCCEEDED, ArtifactToken: 6, ArtifactDigest: "d6"})))
		}, false},
		{"A leased job is granted again", func(h []lincheck.Record) []lincheck.Record {
			return append(h, at(32, 34, granted("r9", lincheck.Grant{Job: "j-1", Token: 10, Attempt: 2})))
		}, false},
		{"A completion under the current token is refused", func(h []lincheck.Record) []lincheck.Record {
			return append(h, at(220, 230, granted("r4", lincheck.Grant{Job: "j-9", Token: 30, Attempt: 1})),
				at(200, 210, submitted("j-9")),
				at(240, 250, completed("j-9", 30, "r4", failure(transient), aborted, lincheck.StaleLease, nil)))
		}, false},
		{"A lease expires although its TTL is far away", func(h []lincheck.Record) []lincheck.Record {
			return append(h, at(120, 130, completed("j-1", 4, "r1", failure(transient), aborted, lincheck.LeaseExpired, nil)))
		}, false},
		{"The last attempt's transient failure waits to retry instead of failing", func(h []lincheck.Record) []lincheck.Record {
			h[len(h)-2] = at(60, 62, completed("j-3", 9, "r1", failure(transient), ok, "", &lincheck.View{Phase: retryWait, Attempt: 3}))
			return h
		}, false},
		{"A later grant gets a smaller token than an answered one", func(h []lincheck.Record) []lincheck.Record {
			return append(h, at(200, 210, submitted("j-9")), at(220, 230, granted("r4", lincheck.Grant{Job: "j-9", Token: 4, Attempt: 1})))
		}, true},
		{"A token is granted twice", func(h []lincheck.Record) []lincheck.Record {
			return append(h, at(200, 210, submitted("j-9")), at(20, 30, granted("r4", lincheck.Grant{Job: "j-9", Token: 5, Attempt: 1})))
		}, true},
		{"A job no submission created is granted", func(h []lincheck.Record) []lincheck.Record {
			return append(h, at(220, 230, granted("r4", lincheck.Grant{Job: "j-99", Token: 40, Attempt: 1})))
		}, false},
		{"A completion refused NOT_LEADER was applied", func(h []lincheck.Record) []lincheck.Record {
			h[5] = notLeader(h[5])
			return h
		}, false},
		{"A linearizable read from a follower shows the job before an answered completion", func(h []lincheck.Record) []lincheck.Record {
			r := got("j-1", lincheck.View{Phase: leased, Attempt: 1, LeaseToken: 5, LeaseRenderer: "r1"})
			r.Node = 2
			return append(h, at(61, 65, r))
		}, false},
		{"A stale read shows a success before its completion was sent", func(h []lincheck.Record) []lincheck.Record {
			return append(h, at(46, 48, stale(got("j-1", j1Done))))
		}, true},
		{"A stale read shows a lease before its Acquire was sent", func(h []lincheck.Record) []lincheck.Record {
			return append(h, at(10, 15, stale(got("j-1", lincheck.View{Phase: leased, Attempt: 1, LeaseToken: 5, LeaseRenderer: "r1"}))))
		}, true},
		{"A stale read shows a cancellation before the Cancel was sent", func(h []lincheck.Record) []lincheck.Record {
			return append(h, at(32, 35, stale(got("j-2", lincheck.View{Phase: cancelled, Attempt: 1, Reason: leaseholdv1.TerminalReason_TERMINAL_REASON_CANCELLED, CancelFrom: leased, CancelRenderer: "r2", RevokedToken: 6}))))
		}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			res, err := verdict(t, spec, tt.inject(baseHistory()))
			if tt.crossJob {
				if err == nil {
					t.Errorf("CheckHistory accepted the injected violation")
				}
				return
			}
			if res != porcupine.Illegal {
				t.Errorf("porcupine: got %s, want Illegal", res)
			}
		})
	}
}

// TestModelRefusesTheEarlierContract checks that the answers of the
// coordinator as built before the current contract are violations: a
// PERMISSION_DENIED that reveals another team's job exists, and an earlier
// applied completion refused as stale instead of answered as a replay.
func TestModelRefusesTheEarlierContract(t *testing.T) {
	t.Parallel()
	h := baseHistory()
	foreign := lincheck.Record{Kind: lincheck.Get, Job: "j-1", Foreign: true, Code: codes.PermissionDenied, Reason: "PERMISSION_DENIED"}
	h = append(h,
		at(120, 130, foreign),
		// j-3's first transient failure, replayed after a later one was applied.
		at(120, 130, completed("j-3", 7, "r3", failure(transient), codes.Aborted, lincheck.StaleLease, nil)))
	if res, _ := verdict(t, spec, h); res != porcupine.Illegal {
		t.Errorf("got %s, want Illegal", res)
	}
}

// TestRecordedHistoryWithInjectedViolation records a real history, checks
// that it passes, then injects into it a second successful completion
// under another token and a read that reports SUCCEEDED before the
// completion was sent, and checks that porcupine rejects each.
func TestRecordedHistoryWithInjectedViolation(t *testing.T) {
	t.Parallel()
	addr, stop := startCoordinator(t, t.TempDir(), slog.New(slog.DiscardHandler))
	w := run(t, addr, options{ops: 400, clients: 8, cutRate: 0.02, liveJobs: 32, seed: 1})
	stop()
	records := w.rec.Records()
	if res, err := verdict(t, spec, records); res != porcupine.Ok || err != nil {
		t.Fatalf("the recorded history: got %s, %v; want Ok", res, err)
	}

	i := slices.IndexFunc(records, func(r lincheck.Record) bool {
		return r.Kind == lincheck.Complete && !r.Pending && r.Code == codes.OK && !r.Replayed && r.View != nil && r.View.Phase == succeeded
	})
	if i < 0 {
		t.Fatal("the recorded history has no applied successful completion")
	}
	done := records[i]
	var end int64 // the last answer's return
	for _, r := range records {
		if r.Return != lincheck.Never {
			end = max(end, r.Return)
		}
	}

	second := done
	second.Token += 1 << 40
	second.Outcome = success(digestOf(preview(done.Job, second.Token)))
	view := *done.View
	view.ArtifactToken, view.ArtifactDigest = second.Token, second.Outcome.Digest
	second.View = &view
	second.Call, second.Return = end+1, end+2

	early := lincheck.Record{Client: done.Client, Kind: lincheck.Get, Job: done.Job, View: done.View, Call: done.Call - 2, Return: done.Call - 1}

	for name, injected := range map[string]lincheck.Record{
		"a second successful completion under another token": second,
		"a read reporting SUCCEEDED before the completion":   early,
	} {
		model := lincheck.Model(spec)
		ops := lincheck.Operations(append(slices.Clone(records), injected))
		if res := porcupine.CheckOperationsTimeout(model, ops, time.Minute); res != porcupine.Illegal {
			t.Errorf("%s: got %s, want Illegal", name, res)
			continue
		}
		bad := failing(model, ops)
		jobs := model.Partition(bad)
		if len(jobs) != 1 || jobs[0][0].Input.(lincheck.Input).Job != done.Job {
			t.Errorf("%s: failing jobs %d, want only %s", name, len(jobs), done.Job)
		}
		path := visualize(t, model, bad, t.TempDir())
		if b, err := os.ReadFile(path); err != nil || !strings.Contains(string(b), "<html") {
			t.Errorf("%s: visualisation %s not written: %v", name, path, err)
		}
	}
}
