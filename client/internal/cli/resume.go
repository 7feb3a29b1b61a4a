package cli

import (
	"context"
	"flag"
	"fmt"
	"strings"
)

// resumeOpts are the options of "leasehold resume".
type resumeOpts struct {
	args   []string
	Reason string
}

func (o *resumeOpts) flags(fs *flag.FlagSet, _ Env) {
	fs.StringVar(&o.Reason, "reason", "", "why: recorded in the audit trail (required)")
}

func (o *resumeOpts) setArgs(args []string) { o.args = args }

// Validate checks that a reason was given.
func (o *resumeOpts) Validate() error {
	if len(o.args) > 0 {
		return usagef("resume takes no arguments, got %q", o.args[0])
	}
	if strings.TrimSpace(o.Reason) == "" {
		return usagef("resume needs --reason: it is recorded in the audit trail")
	}
	return nil
}

func (o *resumeOpts) run(ctx context.Context, a *app) error {
	resp, err := a.c.ResumeDispatch(ctx, o.Reason)
	if err != nil {
		return err
	}
	if a.jsonOutput() {
		return a.printJSON(resp)
	}
	_, err = fmt.Fprintln(a.out, "dispatch resumed")
	return err
}
