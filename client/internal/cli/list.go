package cli

import (
	"context"
	"flag"
	"strings"

	"github.com/leasehold/leasehold/client/limits"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
)

// listOpts are the options of "leasehold list".
type listOpts struct {
	args    []string
	BatchID string
	Team    string
	Phase   string
	Limit   int

	phase leaseholdv1.Phase
}

func (o *listOpts) flags(fs *flag.FlagSet, _ Env) {
	fs.StringVar(&o.BatchID, "batch", "", "only jobs of `BATCH`")
	fs.StringVar(&o.Team, "team", "", "only jobs of `TEAM`")
	fs.StringVar(&o.Phase, "phase", "", "only jobs in `PHASE` (QUEUED, LEASED, RETRY_WAIT, SUCCEEDED, FAILED, CANCELLED)")
	fs.IntVar(&o.Limit, "limit", 0, "stop after `N` jobs (0: all, following every page)")
}

func (o *listOpts) setArgs(args []string) { o.args = args }

// Validate checks the filters.
func (o *listOpts) Validate() error {
	if len(o.args) > 0 {
		return usagef("list takes no arguments, got %q", o.args[0])
	}
	if o.Limit < 0 {
		return usagef("--limit must not be negative")
	}
	if o.Phase != "" {
		p, err := parsePhase(o.Phase)
		if err != nil {
			return err
		}
		o.phase = p
	}
	return nil
}

func (o *listOpts) run(ctx context.Context, a *app) error {
	req := &leaseholdv1.ListJobsRequest{
		BatchId:    o.BatchID,
		Team:       o.Team,
		Phase:      o.phase,
		OmitEvents: !a.jsonOutput(), // the table shows no history
	}
	if o.Limit > 0 {
		req.PageSize = int32(min(o.Limit, limits.MaxPageSize))
	}
	return printAll(a, a.c.AllJobs(ctx, req), o.Limit, "ID\tBATCH\tTEAM\tPHASE\tATTEMPT\tREASON\tDOCUMENT",
		func(job *leaseholdv1.Job) string {
			return strings.Join([]string{job.GetId(), job.GetBatchId(), job.GetTeam(), phaseName(job.GetPhase()),
				attemptString(job.GetAttempt(), job.GetMaxAttempts()), reasonName(job.GetTerminalReason()), orDash(job.GetDocument().GetName())}, "\t")
		})
}
