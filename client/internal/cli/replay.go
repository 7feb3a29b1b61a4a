package cli

import (
	"context"
	"flag"
	"fmt"
	"strings"

	"google.golang.org/protobuf/proto"

	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
)

// replayOpts are the options of "leasehold replay". A replay always runs
// as a dry run first and prints the plan; only --yes then performs it, with
// the same selection.
type replayOpts struct {
	args             []string
	JobIDs           stringList
	BatchID          string
	TerminalReason   string
	Reason           string
	IncludePermanent bool
	Yes              bool
	RequestID        string

	terminalReason leaseholdv1.TerminalReason
}

func (o *replayOpts) flags(fs *flag.FlagSet, _ Env) {
	fs.Var(&o.JobIDs, "job", "replay `JOB` (repeatable, or comma-separated)")
	fs.StringVar(&o.BatchID, "batch", "", "replay the FAILED jobs of `BATCH`")
	fs.StringVar(&o.TerminalReason, "terminal-reason", "", "with --batch: only jobs that ended with `REASON` (e.g. ATTEMPTS_EXHAUSTED)")
	fs.StringVar(&o.Reason, "reason", "", "why: recorded in the audit trail (required)")
	fs.BoolVar(&o.IncludePermanent, "include-permanent", false, "also replay permanent failures (UNSUPPORTED_FORMAT, INVALID_DOCUMENT)")
	fs.BoolVar(&o.Yes, "yes", false, "perform the replay after showing the dry run")
	fs.StringVar(&o.RequestID, "request-id", "", "idempotency key `ID` of the real run (default: random)")
}

func (o *replayOpts) setArgs(args []string) { o.args = args }

// Validate checks that exactly one selection and a reason were given.
func (o *replayOpts) Validate() error {
	switch {
	case len(o.args) > 0:
		return usagef("replay takes no arguments (use --job %s)", o.args[0])
	case len(o.JobIDs) == 0 && o.BatchID == "":
		return usagef("replay needs --job or --batch")
	case len(o.JobIDs) > 0 && o.BatchID != "":
		return usagef("give either --job or --batch, not both")
	case o.TerminalReason != "" && o.BatchID == "":
		return usagef("--terminal-reason narrows --batch; it needs --batch")
	case strings.TrimSpace(o.Reason) == "":
		return usagef("replay needs --reason: it is recorded in the audit trail")
	}
	if o.TerminalReason != "" {
		r, err := parseTerminalReason(o.TerminalReason)
		if err != nil {
			return err
		}
		o.terminalReason = r
	}
	return nil
}

func (o *replayOpts) run(ctx context.Context, a *app) error {
	req := &leaseholdv1.ReplayJobsRequest{
		JobIds:           o.JobIDs,
		BatchId:          o.BatchID,
		TerminalReason:   o.terminalReason,
		Reason:           o.Reason,
		IncludePermanent: o.IncludePermanent,
		DryRun:           true,
	}
	plan, err := a.c.ReplayJobs(ctx, req)
	if err != nil {
		return fmt.Errorf("replay dry run: %w", err)
	}
	if a.jsonOutput() {
		err = a.printJSON(plan)
	} else {
		err = printReplayPlan(a, plan)
	}
	if err != nil {
		return err
	}
	if !o.Yes {
		if !a.jsonOutput() {
			_, err = fmt.Fprintln(a.out, "dry run: nothing was changed. Run again with --yes to replay.")
		}
		return err
	}
	if plan.GetRequeued() == 0 {
		if !a.jsonOutput() {
			_, err = fmt.Fprintln(a.out, "nothing to replay.")
		}
		return err
	}

	realReq := proto.CloneOf(req)
	realReq.DryRun = false
	realReq.RequestId = o.RequestID
	if realReq.RequestId == "" {
		realReq.RequestId = a.env.NewRequestID()
	}
	res, err := a.c.ReplayJobs(ctx, realReq)
	if err != nil {
		return fmt.Errorf("replay (request id %s): %w", realReq.RequestId, err)
	}
	if a.jsonOutput() {
		return a.printJSON(res)
	}
	fmt.Fprintf(a.out, "replayed (request id %s, audit record %d): %d requeued, %d skipped, %d out of scope\n",
		realReq.RequestId, res.GetAuditId(), res.GetRequeued(), res.GetSkipped(), res.GetOutOfScope())
	if res.GetReplayed() {
		fmt.Fprintf(a.out, "request id %s had been used: this is the earlier call's answer; nothing new was replayed\n", realReq.RequestId)
	}
	if res.GetTruncated() {
		fmt.Fprintf(a.out, "the selection was cut at the limit of %d jobs: run the replay again for the rest\n", res.GetLimit())
	}
	return nil
}

// printReplayPlan writes the dry run: one row per selected job in scope,
// then the counts and a notice when the selection was truncated.
func printReplayPlan(a *app, p *leaseholdv1.ReplayJobsResponse) error {
	t := newTable(a.out)
	fmt.Fprintln(t, "JOB\tBATCH\tTEAM\tPHASE\tREASON\tATTEMPT\tACTION\tSKIP REASON")
	for _, it := range p.GetItems() {
		fmt.Fprintf(t, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", it.GetJobId(), orDash(it.GetBatchId()), orDash(it.GetTeam()), phaseName(it.GetPhase()),
			reasonName(it.GetTerminalReason()), it.GetAttempt(), actionName(it.GetAction()), orDash(it.GetSkipReason()))
	}
	if err := t.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(a.out, "selected %d: %d to requeue, %d to skip, %d out of scope (limit %d per call)\n",
		p.GetSelected(), p.GetRequeued(), p.GetSkipped(), p.GetOutOfScope(), p.GetLimit())
	if p.GetTruncated() {
		fmt.Fprintf(a.out, "truncated: the selection is larger than the limit of %d; only the first %d jobs in id order are shown and would be replayed\n", p.GetLimit(), p.GetLimit())
	}
	return nil
}
