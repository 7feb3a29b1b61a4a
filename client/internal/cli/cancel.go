package cli

import (
	"context"
	"flag"
	"fmt"
	"strings"

	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
)

// cancelOpts are the options of "leasehold cancel".
type cancelOpts struct {
	args    []string
	JobID   string
	BatchID string
	Reason  string
}

func (o *cancelOpts) flags(fs *flag.FlagSet, _ Env) {
	fs.StringVar(&o.BatchID, "batch", "", "cancel every unfinished job of `BATCH` instead of one job")
	fs.StringVar(&o.Reason, "reason", "", "free `text` recorded with the cancellation")
}

func (o *cancelOpts) setArgs(args []string) {
	o.args = args
	if len(args) == 1 {
		o.JobID = args[0]
	}
}

// Validate checks that exactly one of a job id and --batch was given.
func (o *cancelOpts) Validate() error {
	switch {
	case len(o.args) > 1:
		return usagef("cancel takes one JOB id")
	case o.JobID == "" && o.BatchID == "":
		return usagef("cancel needs a JOB id or --batch")
	case o.JobID != "" && o.BatchID != "":
		return usagef("give either a JOB id or --batch, not both")
	}
	return nil
}

func (o *cancelOpts) run(ctx context.Context, a *app) error {
	if o.BatchID != "" {
		resp, err := a.c.CancelBatch(ctx, o.BatchID, o.Reason)
		if err != nil {
			return err
		}
		if a.jsonOutput() {
			return a.printJSON(resp)
		}
		return printCancelBatch(a, o.BatchID, resp)
	}
	resp, err := a.c.CancelJob(ctx, o.JobID, o.Reason)
	if err != nil {
		return err
	}
	if a.jsonOutput() {
		return a.printJSON(resp)
	}
	if resp.GetAlreadyCancelled() {
		_, err = fmt.Fprintf(a.out, "job %s was already cancelled\n", o.JobID)
		return err
	}
	line := fmt.Sprintf("job %s %s", o.JobID, phaseName(resp.GetJob().GetPhase()))
	if from := resp.GetJob().GetCancellation().GetFromPhase(); from != leaseholdv1.Phase_PHASE_UNSPECIFIED {
		line += fmt.Sprintf(" (was %s)", phaseName(from))
	}
	if r := resp.GetRunningRendererId(); r != "" {
		line += fmt.Sprintf("; renderer %s held the lease and %s", r, ackText(resp.GetAcknowledged()))
	}
	_, err = fmt.Fprintln(a.out, line)
	return err
}

func ackText(acknowledged bool) string {
	if acknowledged {
		return "has acknowledged the revocation"
	}
	return "may still be working until it sees the revocation"
}

func printCancelBatch(a *app, batchID string, r *leaseholdv1.CancelBatchResponse) error {
	var b strings.Builder
	fmt.Fprintf(&b, "batch %s: cancelled %d queued and %d running; already ended: %d succeeded, %d failed, %d cancelled\n",
		batchID, r.GetCancelledQueued(), r.GetCancelledRunning(), r.GetAlreadySucceeded(), r.GetAlreadyFailed(), r.GetAlreadyCancelled())
	if n := r.GetSkippedRunning(); n > 0 {
		fmt.Fprintf(&b, "%d running jobs were left running: cancelling running jobs is disabled\n", n)
	}
	for _, rc := range r.GetRunning() {
		fmt.Fprintf(&b, "job %s: renderer %s may still be working until it sees the revocation of token %d\n", rc.GetJobId(), rc.GetRendererId(), rc.GetRevokedToken())
	}
	_, err := fmt.Fprint(a.out, b.String())
	return err
}
