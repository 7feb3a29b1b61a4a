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

// batchesOpts are the options of "leasehold batches".
type batchesOpts struct {
	args      []string
	Team      string
	State     string
	Since     string
	Until     string
	Limit     int
	PageToken string

	state        leaseholdv1.BatchState
	since, until time.Time
}

func (o *batchesOpts) flags(fs *flag.FlagSet, _ Env) {
	fs.StringVar(&o.Team, "team", "", "only batches of `TEAM`")
	fs.StringVar(&o.State, "state", "", "only `running` or `done` batches")
	fs.StringVar(&o.Since, "since", "", "only batches created at or after `WHEN`: an RFC 3339 time, or a duration ago such as 1h")
	fs.StringVar(&o.Until, "until", "", "only batches created before `WHEN` (as --since)")
	fs.IntVar(&o.Limit, "limit", 50, "show at most `N` batches (0: all)")
	fs.StringVar(&o.PageToken, "page-token", "", "start at `TOKEN`, as printed after a listing cut by --limit")
}

func (o *batchesOpts) setArgs(args []string) { o.args = args }

// Validate checks the filters.
func (o *batchesOpts) Validate() error {
	if len(o.args) > 0 {
		return usagef("batches takes no arguments, got %q", o.args[0])
	}
	if o.Limit < 0 {
		return usagef("--limit must not be negative")
	}
	switch o.State {
	case "":
	case "running":
		o.state = leaseholdv1.BatchState_BATCH_STATE_RUNNING
	case "done":
		o.state = leaseholdv1.BatchState_BATCH_STATE_DONE
	default:
		return usagef("--state must be running or done, not %q", o.State)
	}
	var err error
	if o.since, err = parseWhen("--since", o.Since); err != nil {
		return err
	}
	if o.until, err = parseWhen("--until", o.Until); err != nil {
		return err
	}
	return nil
}

// parseWhen parses an RFC 3339 time or a duration before now; "" is the
// zero time.
func parseWhen(flagName, s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if d, err := time.ParseDuration(s); err == nil && d >= 0 {
		return time.Now().Add(-d), nil
	}
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return time.Time{}, usagef("%s must be an RFC 3339 time such as 2026-01-02T15:04:05Z or a duration such as 1h", flagName)
	}
	return t, nil
}

func (o *batchesOpts) run(ctx context.Context, a *app) error {
	req := &leaseholdv1.ListBatchesRequest{Team: o.Team, State: o.state, PageToken: o.PageToken}
	if !o.since.IsZero() {
		req.CreatedAfter = timestamppb.New(o.since)
	}
	if !o.until.IsZero() {
		req.CreatedBefore = timestamppb.New(o.until)
	}
	t := newTable(a.out)
	if !a.jsonOutput() {
		fmt.Fprintln(t, "BATCH\tTEAM\tCREATED\tSTATE\tJOBS\tQUEUED\tLEASED\tRETRY\tSUCCEEDED\tFAILED\tCANCELLED")
	}
	n := 0
	for {
		if o.Limit > 0 {
			req.PageSize = int32(min(o.Limit-n, limits.MaxPageSize))
		}
		resp, err := a.c.ListBatches(ctx, req)
		if err != nil {
			t.Flush()
			return err
		}
		for _, b := range resp.GetBatches() {
			if a.jsonOutput() {
				if err := a.printJSON(b); err != nil {
					return err
				}
				continue
			}
			c := countsOf(b)
			state := "running"
			if b.GetDone() {
				state = "done"
			}
			fmt.Fprintf(t, "%s\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\n", b.GetId(), b.GetTeam(), formatTime(b.GetCreatedAt()), state, b.GetJobCount(),
				c[leaseholdv1.Phase_PHASE_QUEUED], c[leaseholdv1.Phase_PHASE_LEASED], c[leaseholdv1.Phase_PHASE_RETRY_WAIT],
				c[leaseholdv1.Phase_PHASE_SUCCEEDED], c[leaseholdv1.Phase_PHASE_FAILED], c[leaseholdv1.Phase_PHASE_CANCELLED])
		}
		n += len(resp.GetBatches())
		next := resp.GetNextPageToken()
		if next == "" {
			return t.Flush()
		}
		if o.Limit > 0 && n >= o.Limit {
			if err := t.Flush(); err != nil {
				return err
			}
			if !a.jsonOutput() {
				_, err := fmt.Fprintf(a.out, "more: leasehold batches --page-token %s\n", next)
				return err
			}
			return nil
		}
		req.PageToken = next
	}
}
