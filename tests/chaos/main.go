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
	case err == nil, errors.Is(err, flag.ErrHelp):
	default:
		fmt.Fprintln(os.Stderr, "chaos:", err)
		os.Exit(1)
	}
}

// config is a crash run's settings, from the command line.
type config struct {
	cycles         int
	seed           uint64
	minUptime      time.Duration
	maxUptime      time.Duration
	failpointEvery int
	fireTimeout    time.Duration
	drainTimeout   time.Duration
	renderers      int
	leaseTTL       time.Duration
	tmp            string
	keep           bool
}

// errFailed reports a run that found a violation; the report says which.
var errFailed = errors.New("invariants violated")

// run parses the command line and runs the mode it names.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	usage := func() {
		fmt.Fprintln(stderr, "usage: go run ./scripts/chaos crash [flags]   (from the repository root; crash --help for the flags)")
	}
	if len(args) == 0 || args[0] != "crash" {
		usage()
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
			return flag.ErrHelp
		}
		return errors.New("unknown or missing mode")
	}
	fs := flag.NewFlagSet("chaos crash", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg config
	fs.IntVar(&cfg.cycles, "cycles", 20, "crashes of the coordinator, each followed by a check of its data file and a restart")
	fs.Uint64Var(&cfg.seed, "seed", 0, "seed of the kill schedule, failpoint counts and load (0: from the clock); timing still varies between runs")
	fs.DurationVar(&cfg.minUptime, "min-uptime", 50*time.Millisecond, "shortest time a coordinator serves before its SIGKILL")
	fs.DurationVar(&cfg.maxUptime, "max-uptime", 500*time.Millisecond, "longest time a coordinator serves before its SIGKILL")
	fs.IntVar(&cfg.failpointEvery, "failpoint-every", 4, "every Nth crash is a failpoint's instead of a SIGKILL, the failpoints in turn (0: none)")
	fs.DurationVar(&cfg.fireTimeout, "fire-timeout", 20*time.Second, "how long an armed failpoint may take to fire before the coordinator is killed instead")
	fs.DurationVar(&cfg.drainTimeout, "drain-timeout", time.Minute, "how long the load may take to drain after the last restart")
	fs.IntVar(&cfg.renderers, "renderers", 2, "renderer processes")
	fs.DurationVar(&cfg.leaseTTL, "lease-ttl", 2*time.Second, "the coordinator's lease TTL")
	fs.StringVar(&cfg.tmp, "tmp", "", "parent of the run's temporary directory (default: the system's)")
	fs.BoolVar(&cfg.keep, "keep", false, "keep the run's directory (data, logs, journal) even when it passes")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	switch {
	case fs.NArg() > 0:
		return fmt.Errorf("unexpected arguments: %q", fs.Args())
	case cfg.cycles < 1:
		return errors.New("--cycles must be at least 1")
	case cfg.minUptime <= 0 || cfg.maxUptime < cfg.minUptime:
		return errors.New("--min-uptime must be positive and at most --max-uptime")
	case cfg.renderers < 1:
		return errors.New("--renderers must be at least 1")
	case cfg.failpointEvery < 0:
		return errors.New("--failpoint-every must not be negative")
	}
	if cfg.seed == 0 {
		cfg.seed = uint64(time.Now().UnixNano())
	}
	res, err := crash(ctx, cfg, stderr)
	if res != nil {
		res.print(stdout)
	}
	if err != nil {
		return err
	}
	if !res.passed() {
		return errFailed
	}
	return nil
}
