package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"

	"github.com/leasehold/leasehold/client"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
)

// watchOpts are the options of "leasehold watch BATCH".
type watchOpts struct {
	args    []string
	BatchID string
}

func (o *watchOpts) flags(*flag.FlagSet, Env) {}

func (o *watchOpts) setArgs(args []string) {
	o.args = args
	if len(args) == 1 {
		o.BatchID = args[0]
	}
}

// Validate checks that exactly one batch id was given.
func (o *watchOpts) Validate() error {
	if len(o.args) != 1 || o.BatchID == "" {
		return usagef("watch takes exactly one BATCH id")
	}
	return nil
}

func (o *watchOpts) run(ctx context.Context, a *app) error {
	final, err := followBatch(ctx, a.c, o.BatchID, func(m *leaseholdv1.WatchBatchResponse) error {
		if a.jsonOutput() {
			return a.printJSON(m)
		}
		_, err := fmt.Fprintln(a.out, eventLine(m))
		return err
	})
	if err != nil {
		return err
	}
	if !a.jsonOutput() {
		state := "done"
		if !final.GetDone() {
			state = "not done"
		}
		_, err = fmt.Fprintf(a.out, "batch %s %s: %s\n", o.BatchID, state, summarize(countsOf(final)))
	}
	return err
}

// maxRewatch bounds how many times followBatch watches again after the
// coordinator ended the stream because the watcher fell behind.
const maxRewatch = 5

// followBatch watches batchID until the coordinator ends the stream because
// the batch is done, calling onMsg for every message, and returns the batch
// as GetBatch then reports it. A stream ended for falling behind
// (SLOW_WATCHER) is opened again; onMsg then sees the snapshots again.
func followBatch(ctx context.Context, c *client.Client, batchID string, onMsg func(*leaseholdv1.WatchBatchResponse) error) (*leaseholdv1.Batch, error) {
	for attempt := 0; ; attempt++ {
		err := c.WatchBatch(ctx, batchID, onMsg)
		if err == nil {
			break
		}
		if !errors.Is(err, client.ErrSlowWatcher) || attempt >= maxRewatch {
			return nil, err
		}
	}
	return c.GetBatch(ctx, batchID)
}

// eventLine renders one watch message as "job j-12 SUCCEEDED", followed by
// the event kind when it says more than the phase (COMPLETION_REJECTED),
// and the event's reason and message.
func eventLine(m *leaseholdv1.WatchBatchResponse) string {
	var b strings.Builder
	fmt.Fprintf(&b, "job %s %s", m.GetJobId(), phaseName(m.GetPhase()))
	if ev := m.GetEvent(); ev != nil {
		if k := kindName(ev.GetKind()); k != phaseName(m.GetPhase()) && k != "-" {
			b.WriteString(" " + k)
		}
		if ev.GetReason() != "" {
			b.WriteString(" " + ev.GetReason())
		}
		if ev.GetMessage() != "" {
			b.WriteString(": " + ev.GetMessage())
		}
	}
	return b.String()
}

// summarize renders phase counts as "3 succeeded, 1 failed, 0 cancelled",
// naming other phases only when some job is in them.
func summarize(counts map[leaseholdv1.Phase]uint32) string {
	parts := []string{
		fmt.Sprintf("%d succeeded", counts[leaseholdv1.Phase_PHASE_SUCCEEDED]),
		fmt.Sprintf("%d failed", counts[leaseholdv1.Phase_PHASE_FAILED]),
		fmt.Sprintf("%d cancelled", counts[leaseholdv1.Phase_PHASE_CANCELLED]),
	}
	for _, p := range []leaseholdv1.Phase{leaseholdv1.Phase_PHASE_QUEUED, leaseholdv1.Phase_PHASE_LEASED, leaseholdv1.Phase_PHASE_RETRY_WAIT} {
		if n := counts[p]; n > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", n, strings.ToLower(phaseName(p))))
		}
	}
	return strings.Join(parts, ", ")
}
