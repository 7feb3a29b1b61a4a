package cli

import (
	"context"
	"flag"
	"fmt"

	"github.com/leasehold/leasehold/client/limits"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
)

// auditOpts are the options of "leasehold audit".
type auditOpts struct {
	args  []string
	Limit int
}

func (o *auditOpts) flags(fs *flag.FlagSet, _ Env) {
	fs.IntVar(&o.Limit, "limit", 50, "show at most `N` records (0: all)")
}

func (o *auditOpts) setArgs(args []string) { o.args = args }

// Validate checks the limit.
func (o *auditOpts) Validate() error {
	if len(o.args) > 0 {
		return usagef("audit takes no arguments, got %q", o.args[0])
	}
	if o.Limit < 0 {
		return usagef("--limit must not be negative")
	}
	return nil
}

func (o *auditOpts) run(ctx context.Context, a *app) error {
	req := &leaseholdv1.GetAuditRequest{}
	if o.Limit > 0 {
		req.PageSize = int32(min(o.Limit, limits.MaxPageSize))
	}
	return printAll(a, a.c.AllAudit(ctx, req), o.Limit, "ID\tAT\tPRINCIPAL\tACTION\tREQUEST\tBATCH\tJOBS\tSKIPPED\tOUT OF SCOPE\tREASON",
		func(r *leaseholdv1.AuditRecord) string {
			batch := orDash(r.GetBatchId())
			if r.GetTerminalReason() != leaseholdv1.TerminalReason_TERMINAL_REASON_UNSPECIFIED {
				batch += " (" + reasonName(r.GetTerminalReason()) + ")"
			}
			action := r.GetAction()
			if r.GetIncludePermanent() {
				action += " +permanent"
			}
			if r.GetTarget() != "" {
				action += " " + r.GetTarget()
			}
			return fmt.Sprintf("%d\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t%s", r.GetId(), formatTime(r.GetAt()), orDash(r.GetPrincipal()), orDash(action),
				orDash(r.GetRequestId()), batch, len(r.GetJobIds()), r.GetSkipped(), r.GetOutOfScope(), r.GetReason())
		})
}
