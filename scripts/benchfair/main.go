// Command benchfair measures how long a small batch from one team waits
// behind a bulk import from another, against a running coordinator and its
// renderers.
//
// Team alpha submits a bulk import (20,000 tiny documents in batches of 500 by
// default). Once alpha holds every renderer slot, team beta submits one small
// batch (20 documents) and benchfair follows it until every document has
// SUCCEEDED. It then reports, from the jobs' histories, beta's queue wait
// (SUBMITTED to first LEASED) at p50, p99 and max, and how long beta's last
// document took from the batch's submission. It compares that completion time
// with the ideal of beta rendering at its fair share of the renderers from the
// moment it arrives:
//
//	ideal = ceil(N_beta / (C/2)) × L
//
// with C the total renderer slots (-capacity) and L the render latency
// (-latency): two teams of equal weight share C evenly. Finally it cancels
// alpha's remaining work so that the run ends quickly.
//
// Usage:
//
//	benchfair -coordinator 127.0.0.1:7070 -capacity 16 -latency 100ms [-o json]
//	benchfair compare FAIR.json FIFO.json
//
// The second form prints two results written with -o json side by side, with
// the ratio of the second to the first; scripts/bench-fairness runs the
// scenario against fair dispatch and against FIFO dispatch and compares them.
//
// Throughput, latency and CPU cost are measured by scripts/bench instead.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	switch {
	case errors.Is(err, flag.ErrHelp):
	case err != nil:
		fmt.Fprintln(os.Stderr, "benchfair:", err)
		os.Exit(1)
	}
}

// run dispatches to the compare subcommand or measures one scenario.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "compare" {
		return compareFiles(args[1:], stdout)
	}
	cfg, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	res, err := measure(ctx, cfg, stderr)
	if err != nil {
		return err
	}
	if cfg.output == "json" {
		return writeJSON(stdout, res)
	}
	return writeText(stdout, res)
}

// config is what one measurement needs, from the command line.
type config struct {
	addr         string
	alphaTeam    string
	betaTeam     string
	alphaToken   string
	betaToken    string
	nAlpha       int
	alphaBatch   int
	nBeta        int
	capacity     int
	latency      time.Duration
	label        string
	output       string
	timeout      time.Duration
	saturateWait time.Duration
	poll         time.Duration
	cancelAlpha  bool
}

// parseFlags reads the flags and checks them.
func parseFlags(args []string, stderr io.Writer) (config, error) {
	var cfg config
	fs := flag.NewFlagSet("benchfair", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.addr, "coordinator", "127.0.0.1:7070", "coordinator gRPC address")
	fs.StringVar(&cfg.alphaTeam, "alpha-team", "alpha", "team of the bulk import")
	fs.StringVar(&cfg.betaTeam, "beta-team", "beta", "team of the small batch")
	fs.StringVar(&cfg.alphaToken, "alpha-token", "dev-alpha", "bearer token of a submitter for the alpha team")
	fs.StringVar(&cfg.betaToken, "beta-token", "dev-beta", "bearer token of a submitter for the beta team")
	fs.IntVar(&cfg.nAlpha, "n-alpha", 20000, "documents in alpha's bulk import")
	fs.IntVar(&cfg.alphaBatch, "alpha-batch", 500, "documents per alpha batch (at most the coordinator's -max-documents)")
	fs.IntVar(&cfg.nBeta, "n-beta", 20, "documents in beta's batch")
	fs.IntVar(&cfg.capacity, "capacity", 0, "total renderer slots C: the sum of every renderer's -capacity (required)")
	fs.DurationVar(&cfg.latency, "latency", 0, "render latency L of every renderer (required)")
	fs.StringVar(&cfg.label, "label", "", "name of this run in the report, such as fair or fifo")
	fs.StringVar(&cfg.output, "o", "text", "output format: text or json")
	fs.DurationVar(&cfg.timeout, "timeout", 15*time.Minute, "longest the whole measurement may take")
	fs.DurationVar(&cfg.saturateWait, "saturate-timeout", time.Minute, "longest to wait for alpha to hold every renderer slot")
	fs.DurationVar(&cfg.poll, "poll", 10*time.Millisecond, "interval of the saturation check")
	fs.BoolVar(&cfg.cancelAlpha, "cancel-alpha", true, "cancel alpha's unfinished work after measuring")
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	if fs.NArg() > 0 {
		return config{}, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	switch {
	case cfg.capacity < 1:
		return config{}, errors.New("-capacity must be the total renderer slots, at least 1")
	case cfg.latency <= 0:
		return config{}, errors.New("-latency must be the renderers' render latency, above zero")
	case cfg.nAlpha < 1 || cfg.nBeta < 1 || cfg.alphaBatch < 1:
		return config{}, errors.New("-n-alpha, -n-beta and -alpha-batch must be at least 1")
	case cfg.output != "text" && cfg.output != "json":
		return config{}, fmt.Errorf("-o %q: want text or json", cfg.output)
	case cfg.alphaTeam == cfg.betaTeam:
		return config{}, errors.New("-alpha-team and -beta-team must differ")
	case cfg.poll <= 0 || cfg.timeout <= 0 || cfg.saturateWait <= 0:
		return config{}, errors.New("-poll, -timeout and -saturate-timeout must be above zero")
	}
	return cfg, nil
}
