package cli

import (
	"context"
	"flag"
	"fmt"
	"strings"
)

// pauseOpts are the options of "leasehold pause".
type pauseOpts struct {
	args   []string
	Reason string
}

func (o *pauseOpts) flags(fs *flag.FlagSet, _ Env) {
	fs.StringVar(&o.Reason, "reason", "", "why: recorded in the audit trail (required)")
}

func (o *pauseOpts) setArgs(args []string) { o.args = args }

// Validate checks that a reason was given.
func (o *pauseOpts) Validate() error {
	if len(o.args) > 0 {
		return usagef("pause takes no arguments, got %q", o.args[0])
	}
	if strings.TrimSpace(o.Reason) == "" {
		return usagef("pause needs --reason: it is recorded in the audit trail")
	}
	return nil
}

func (o *pauseOpts) run(ctx context.Context, a *app) error {
	resp, err := a.c.PauseDispatch(ctx, o.Reason)
	if err != nil {
		return err
	}
	if a.jsonOutput() {
		return a.printJSON(resp)
	}
	_, err = fmt.Fprintf(a.out, "dispatch paused since %s; completions stay fenced and submissions are still accepted\n", formatTime(resp.GetSince()))
	return err
}
