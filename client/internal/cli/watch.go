package cli

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"time"

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
	final, err := followBatch(ctx, a, o.BatchID, client.FollowOptions{Batched: true}, nil, func(u client.Update) error {
		if a.jsonOutput() {
			return a.printJSON(updateMessage(u))
		}
		_, err := fmt.Fprintln(a.out, eventLine(u))
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

// followBatch follows batchID until every job is terminal (see
// client.FollowBatch: lost streams are resumed without repeating or
// missing events), calling onUpdate for every update, and returns the
// batch's final counts. Each time the stream is lost it says so on stderr,
// first clearing bar's line if a progress bar is drawn.
func followBatch(ctx context.Context, a *app, batchID string, opts client.FollowOptions, bar *progressBar, onUpdate func(client.Update) error) (*leaseholdv1.Batch, error) {
	opts.OnReconnect = func(err error, delay time.Duration) {
		cause := "the stream ended early"
		if err != nil {
			cause = err.Error()
		}
		if bar != nil {
			bar.clear()
		}
		fmt.Fprintf(a.env.Stderr, "leasehold: lost the watch of batch %s (%s); watching again in %s\n", batchID, cause, delay)
	}
	var last *leaseholdv1.Batch
	for u, err := range a.c.FollowBatch(ctx, batchID, opts) {
		if err != nil {
			return nil, err
		}
		if u.Batch != nil {
			last = u.Batch
		}
		if err := onUpdate(u); err != nil {
			return nil, err
		}
	}
	if last.GetDone() {
		return last, nil
	}
	return a.c.GetBatch(ctx, batchID)
}

// updateMessage is u as the watch stream's single-update message, the
// shape -o json prints: job_id, phase, event and batch.
func updateMessage(u client.Update) *leaseholdv1.WatchBatchResponse {
	return &leaseholdv1.WatchBatchResponse{JobId: u.JobID, Phase: u.Phase, Event: u.Event, Batch: u.Batch}
}

// eventLine renders one update as "job j-12 SUCCEEDED", followed by the
// event kind when it says more than the phase (COMPLETION_REJECTED), and
// the event's reason and message.
func eventLine(u client.Update) string {
	var b strings.Builder
	fmt.Fprintf(&b, "job %s %s", u.JobID, phaseName(u.Phase))
	if ev := u.Event; ev != nil {
		if k := kindName(ev.GetKind()); k != phaseName(u.Phase) && k != "-" {
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
