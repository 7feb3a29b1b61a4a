package cli

import (
	"context"
	"flag"
	"fmt"
	"strings"
)

// renderersOpts are the options of "leasehold renderers".
type renderersOpts struct {
	args []string
}

func (o *renderersOpts) flags(*flag.FlagSet, Env) {}

func (o *renderersOpts) setArgs(args []string) { o.args = args }

// Validate checks that no argument was given.
func (o *renderersOpts) Validate() error {
	if len(o.args) > 0 {
		return usagef("renderers takes no arguments, got %q", o.args[0])
	}
	return nil
}

func (o *renderersOpts) run(ctx context.Context, a *app) error {
	rs, err := a.c.ListRenderers(ctx)
	if err != nil {
		return err
	}
	if a.jsonOutput() {
		for _, r := range rs {
			if err := a.printJSON(r); err != nil {
				return err
			}
		}
		return nil
	}
	t := newTable(a.out)
	fmt.Fprintln(t, "RENDERER\tSTATE\tCAPACITY\tLEASES\tLAST SEEN\tHOLDING")
	for _, r := range rs {
		var held []string
		for _, l := range r.GetLeases() {
			held = append(held, fmt.Sprintf("%s#%d", l.GetJobId(), l.GetToken()))
		}
		fmt.Fprintf(t, "%s\t%s\t%d\t%d\t%s\t%s\n", r.GetRendererId(), rendererState(r.GetConnected(), r.GetDraining()),
			r.GetCapacity(), len(r.GetLeases()), formatTime(r.GetLastSeenAt()), orDash(strings.Join(held, " ")))
	}
	return t.Flush()
}

// rendererState names a renderer's connection state.
func rendererState(connected, draining bool) string {
	switch {
	case draining:
		return "draining"
	case connected:
		return "connected"
	}
	return "not connected"
}
