package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/leasehold/leasehold/client"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
)

// throughputConfig is what one end-to-end throughput measurement needs.
type throughputConfig struct {
	addr    string
	team    string
	token   string
	n       int
	batch   int
	label   string
	output  string
	timeout time.Duration
	poll    time.Duration
}

// throughputResult is one throughput measurement. Durations are in
// milliseconds.
type throughputResult struct {
	Label     string `json:"label,omitempty"`
	Documents int    `json:"documents"`
	Batches   int    `json:"batches"`
	// SubmitMS is how long submitting every batch took.
	SubmitMS float64 `json:"submit_ms"`
	// WallMS is from the first submission to the moment the client saw every
	// batch done (to within the poll interval).
	WallMS float64 `json:"wall_ms"`
	// WallDocsPerSecond is Documents over WallMS.
	WallDocsPerSecond float64 `json:"wall_docs_per_second"`
	// ServerMS is from the first SUBMITTED event to the last SUCCEEDED event
	// in the jobs' histories.
	ServerMS float64 `json:"server_ms"`
	// ServerDocsPerSecond is Documents over ServerMS.
	ServerDocsPerSecond float64 `json:"server_docs_per_second"`
}

// runThroughput parses the throughput subcommand's flags, measures and
// prints the result.
func runThroughput(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var cfg throughputConfig
	fs := flag.NewFlagSet("benchfair throughput", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.addr, "coordinator", "127.0.0.1:7070", "coordinator gRPC address")
	fs.StringVar(&cfg.team, "team", "alpha", "team that submits")
	fs.StringVar(&cfg.token, "token", "dev-alpha", "bearer token of a submitter for the team")
	fs.IntVar(&cfg.n, "n", 5000, "documents to submit")
	fs.IntVar(&cfg.batch, "batch", 500, "documents per batch (at most the coordinator's -max-documents)")
	fs.StringVar(&cfg.label, "label", "", "name of this run in the report")
	fs.StringVar(&cfg.output, "o", "text", "output format: text or json")
	fs.DurationVar(&cfg.timeout, "timeout", 10*time.Minute, "longest the measurement may take")
	fs.DurationVar(&cfg.poll, "poll", 20*time.Millisecond, "interval of the completion check")
	if err := fs.Parse(args); err != nil {
		return err
	}
	switch {
	case fs.NArg() > 0:
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	case cfg.n < 1 || cfg.batch < 1:
		return errors.New("-n and -batch must be at least 1")
	case cfg.output != "text" && cfg.output != "json":
		return fmt.Errorf("-o %q: want text or json", cfg.output)
	case cfg.poll <= 0 || cfg.timeout <= 0:
		return errors.New("-poll and -timeout must be above zero")
	}
	res, err := measureThroughput(ctx, cfg, stderr)
	if err != nil {
		return err
	}
	if cfg.output == "json" {
		return writeJSON(stdout, res)
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	title := "benchfair throughput"
	if res.Label != "" {
		title += ": " + res.Label
	}
	fmt.Fprintln(tw, title)
	fmt.Fprintf(tw, "documents\t%d in %d batches, submitted in %s\n", res.Documents, res.Batches, formatMS(res.SubmitMS))
	fmt.Fprintf(tw, "client clock\t%s from first submission to all SUCCEEDED: %.0f docs/s\n", formatMS(res.WallMS), res.WallDocsPerSecond)
	fmt.Fprintf(tw, "job histories\t%s from first SUBMITTED to last SUCCEEDED: %.0f docs/s\n", formatMS(res.ServerMS), res.ServerDocsPerSecond)
	return tw.Flush()
}

// measureThroughput submits cfg.n documents and waits until every job has
// SUCCEEDED.
func measureThroughput(ctx context.Context, cfg throughputConfig, log io.Writer) (throughputResult, error) {
	ctx, cancel := context.WithTimeout(ctx, cfg.timeout)
	defer cancel()
	c, err := client.Dial(cfg.addr, client.WithToken(cfg.token))
	if err != nil {
		return throughputResult{}, err
	}
	defer c.Close()
	logf := func(format string, args ...any) {
		fmt.Fprintf(log, "%s %s: %s\n", time.Now().UTC().Format("15:04:05.000"), cmp.Or(cfg.label, "throughput"), fmt.Sprintf(format, args...))
	}

	start := time.Now()
	var batches []string
	for from := 0; from < cfg.n; from += cfg.batch {
		n := min(cfg.batch, cfg.n-from)
		reqID := fmt.Sprintf("benchfair-%s-throughput-%d", runID, len(batches)+1)
		resp, err := c.SubmitBatch(ctx, cfg.team, reqID, documents("doc", from, n), nil)
		if err != nil {
			return throughputResult{}, fmt.Errorf("submitting batch %d: %w", len(batches)+1, err)
		}
		batches = append(batches, resp.GetBatch().GetId())
	}
	submitted := time.Since(start)
	logf("submitted %d documents in %d batches in %v", cfg.n, len(batches), submitted.Round(time.Millisecond))

	// Batches finish about in submission order (a team's queue is first in,
	// first out), so only the first batch not yet done is read each time.
	tick := time.NewTicker(cfg.poll)
	defer tick.Stop()
	for i := 0; i < len(batches); {
		bt, err := c.GetBatch(ctx, batches[i])
		if err != nil {
			return throughputResult{}, fmt.Errorf("reading batch %s: %w", batches[i], err)
		}
		if bt.GetDone() {
			i++
			continue
		}
		select {
		case <-ctx.Done():
			return throughputResult{}, fmt.Errorf("waiting for batch %s: %w", batches[i], ctx.Err())
		case <-tick.C:
		}
	}
	wall := time.Since(start)
	logf("every batch done after %v", wall.Round(time.Millisecond))

	var first, last time.Time
	for _, id := range batches {
		for j, err := range c.AllJobs(ctx, &leaseholdv1.ListJobsRequest{BatchId: id, PageSize: 1000}) {
			if err != nil {
				return throughputResult{}, fmt.Errorf("listing batch %s: %w", id, err)
			}
			if j.GetPhase() != leaseholdv1.Phase_PHASE_SUCCEEDED {
				return throughputResult{}, fmt.Errorf("job %s ended %s, want PHASE_SUCCEEDED", j.GetId(), j.GetPhase())
			}
			for _, ev := range j.GetEvents() {
				at := ev.GetAt().AsTime()
				switch ev.GetKind() {
				case leaseholdv1.EventKind_EVENT_KIND_SUBMITTED:
					if first.IsZero() || at.Before(first) {
						first = at
					}
				case leaseholdv1.EventKind_EVENT_KIND_SUCCEEDED:
					if at.After(last) {
						last = at
					}
				}
			}
		}
	}
	server := last.Sub(first)
	return throughputResult{
		Label:               cfg.label,
		Documents:           cfg.n,
		Batches:             len(batches),
		SubmitMS:            ms(submitted),
		WallMS:              ms(wall),
		WallDocsPerSecond:   float64(cfg.n) / wall.Seconds(),
		ServerMS:            ms(server),
		ServerDocsPerSecond: float64(cfg.n) / server.Seconds(),
	}, nil
}
