package cli

import (
	"context"
	"flag"
	"fmt"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/leasehold/leasehold/client/limits"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
)

// rejectionsOpts are the options of "leasehold rejections".
type rejectionsOpts struct {
	args       []string
	JobID      string
	RendererID string
	Since      string
	Limit      int

	since time.Time
}

func (o *rejectionsOpts) flags(fs *flag.FlagSet, _ Env) {
	fs.StringVar(&o.JobID, "job", "", "only completions for `JOB`")
	fs.StringVar(&o.RendererID, "renderer", "", "only completions from `RENDERER`")
	fs.StringVar(&o.Since, "since", "", "only completions at or after `TIME` (RFC 3339)")
	fs.IntVar(&o.Limit, "limit", 50, "show at most `N` (0: all)")
}

func (o *rejectionsOpts) setArgs(args []string) { o.args = args }

// Validate checks the filters.
func (o *rejectionsOpts) Validate() error {
	if len(o.args) > 0 {
		return usagef("rejections takes no arguments, got %q", o.args[0])
	}
	if o.Limit < 0 {
		return usagef("--limit must not be negative")
	}
	if o.Since != "" {
		t, err := time.Parse(time.RFC3339, o.Since)
		if err != nil {
			return usagef("--since must be an RFC 3339 time such as 2026-01-02T15:04:05Z: %v", err)
		}
		o.since = t
	}
	return nil
}

func (o *rejectionsOpts) run(ctx context.Context, a *app) error {
	req := &leaseholdv1.ListRejectedCompletionsRequest{JobId: o.JobID, RendererId: o.RendererID}
	if !o.since.IsZero() {
		req.Since = timestamppb.New(o.since)
	}
	if o.Limit > 0 {
		req.PageSize = int32(min(o.Limit, limits.MaxPageSize))
	}
	return printAll(a, a.c.AllRejectedCompletions(ctx, req), o.Limit, "AT\tJOB\tTEAM\tTOKEN\tCURRENT\tRENDERER\tREASON\tOUTCOME\tDIGEST",
		func(r *leaseholdv1.RejectedCompletion) string {
			return fmt.Sprintf("%s\t%s\t%s\t%d\t%d %s\t%s\t%s\t%s\t%s", formatTime(r.GetAt()), r.GetJobId(), orDash(r.GetTeam()), r.GetToken(),
				r.GetCurrentToken(), phaseName(r.GetCurrentPhase()), orDash(r.GetRendererId()), orDash(r.GetReason()), orDash(r.GetOutcome()), orDash(r.GetArtifactDigest()))
		})
}
