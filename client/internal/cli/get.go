package cli

import (
	"context"
	"flag"
	"fmt"

	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
)

// getOpts are the options of "leasehold get JOB".
type getOpts struct {
	args  []string
	JobID string
}

func (o *getOpts) flags(*flag.FlagSet, Env) {}

func (o *getOpts) setArgs(args []string) {
	o.args = args
	if len(args) == 1 {
		o.JobID = args[0]
	}
}

// Validate checks that exactly one job id was given.
func (o *getOpts) Validate() error {
	if len(o.args) != 1 || o.JobID == "" {
		return usagef("get takes exactly one JOB id")
	}
	return nil
}

func (o *getOpts) run(ctx context.Context, a *app) error {
	job, err := a.c.GetJob(ctx, o.JobID)
	if err != nil {
		return err
	}
	if a.jsonOutput() {
		return a.printJSON(job)
	}
	return printJob(a, job)
}

// printJob writes a job as key/value lines followed by its history.
func printJob(a *app, j *leaseholdv1.Job) error {
	t := newTable(a.out)
	kv := func(k, format string, args ...any) { fmt.Fprintf(t, "%s:\t"+format+"\n", append([]any{k}, args...)...) }
	kv("id", "%s", j.GetId())
	kv("batch", "%s", j.GetBatchId())
	kv("team", "%s", j.GetTeam())
	kv("phase", "%s", phaseName(j.GetPhase()))
	kv("attempt", "%s", attemptString(j.GetAttempt(), j.GetMaxAttempts()))
	kv("cycle", "%d", j.GetCycle())
	if d := j.GetDocument(); d != nil {
		kv("document", "%s (%s, %d bytes)", d.GetName(), orDash(d.GetContentType()), d.GetSizeBytes())
		if d.GetSourceUri() != "" {
			kv("source", "%s", d.GetSourceUri())
		}
		if d.GetContentSha256() != "" {
			kv("content sha256", "%s", d.GetContentSha256())
		}
	}
	if l := j.GetLease(); l != nil {
		kv("lease", "token %d, renderer %s, attempt %d, granted %s, deadline %s", l.GetToken(), orDash(l.GetRendererId()), l.GetAttempt(), formatTime(l.GetGrantedAt()), formatTime(l.GetDeadline()))
	}
	if j.GetNextAttemptAt() != nil {
		kv("next attempt", "%s", formatTime(j.GetNextAttemptAt()))
	}
	if j.GetTerminalReason() != leaseholdv1.TerminalReason_TERMINAL_REASON_UNSPECIFIED {
		kv("terminal reason", "%s", reasonName(j.GetTerminalReason()))
	}
	if j.GetTerminalMessage() != "" {
		kv("terminal message", "%s", j.GetTerminalMessage())
	}
	if j.GetFinishedAt() != nil {
		kv("finished", "%s", formatTime(j.GetFinishedAt()))
	}
	if art := j.GetArtifact(); art != nil {
		kv("artifact", "sha256 %s, %d bytes, %s, token %d, renderer %s", art.GetDigest(), art.GetSizeBytes(), orDash(art.GetContentType()), art.GetToken(), orDash(art.GetRendererId()))
	}
	if c := j.GetCancellation(); c != nil {
		kv("cancelled", "by %s at %s from %s: %s", orDash(c.GetPrincipal()), formatTime(c.GetAt()), phaseName(c.GetFromPhase()), orDash(c.GetReason()))
		if c.GetRendererId() != "" {
			ack := "not acknowledged"
			if c.GetAcknowledged() {
				ack = "acknowledged at " + formatTime(c.GetAcknowledgedAt())
			}
			kv("revoked lease", "token %d, renderer %s, %s", c.GetRevokedToken(), c.GetRendererId(), ack)
		}
	}
	if j.GetRejectedCompletions() > 0 {
		kv("rejected completions", "%d", j.GetRejectedCompletions())
	}
	kv("created", "%s", formatTime(j.GetCreatedAt()))
	kv("updated", "%s", formatTime(j.GetUpdatedAt()))
	if err := t.Flush(); err != nil {
		return err
	}
	if len(j.GetEvents()) == 0 {
		return nil
	}
	fmt.Fprintln(a.out, "\nhistory:")
	t = newTable(a.out)
	fmt.Fprintln(t, "SEQ\tAT\tEVENT\tPHASE\tATTEMPT\tTOKEN\tRENDERER\tREASON\tBY\tMESSAGE")
	for _, e := range j.GetEvents() {
		token := "-"
		if e.GetToken() != 0 {
			token = fmt.Sprint(e.GetToken())
		}
		fmt.Fprintf(t, "%d\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\n", e.GetSeq(), formatTime(e.GetAt()), kindName(e.GetKind()), phaseName(e.GetPhase()),
			e.GetAttempt(), token, orDash(e.GetRendererId()), orDash(e.GetReason()), orDash(e.GetPrincipal()), e.GetMessage())
	}
	return t.Flush()
}
