// Command coordinator runs the Leasehold coordinator: the single owner of
// job state, serving the leasehold.v1 gRPC API and Prometheus metrics.
//
// Every flag can also be set in the environment as LEASEHOLD_<NAME>, with
// the flag name upper-cased and dashes turned into underscores
// (--lease-ttl is LEASEHOLD_LEASE_TTL); a flag on the command line wins.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/leasehold/leasehold/coordinator"
	"github.com/leasehold/leasehold/coordinator/internal/jobs"
)

func main() {
	err := run(os.Args[1:], os.Stderr)
	switch {
	case errors.Is(err, flag.ErrHelp):
		os.Exit(0)
	case err != nil:
		fmt.Fprintln(os.Stderr, "coordinator:", err)
		os.Exit(1)
	}
}

// run parses flags, starts the coordinator and serves until SIGINT or
// SIGTERM.
func run(args []string, stderr io.Writer) error {
	cfg, level, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	cfg.Logger = log

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	c, err := coordinator.New(cfg)
	if err != nil {
		return err
	}
	lis, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		c.Close()
		return fmt.Errorf("listening on %s: %w", cfg.Listen, err)
	}
	served := make(chan error, 1)
	go func() { served <- c.Serve(lis) }()
	select {
	case <-ctx.Done():
		log.Info("signal received; shutting down")
		err = c.Close()
		<-served
		return err
	case err := <-served:
		c.Close()
		return err
	}
}

// parseFlags turns flags (with LEASEHOLD_* defaults) into a Config.
func parseFlags(args []string, stderr io.Writer) (coordinator.Config, slog.Level, error) {
	fs := flag.NewFlagSet("coordinator", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		cfg            coordinator.Config
		teamWeights    string
		unsupported    string
		runningCancel  bool
		level          slog.Level
		maxAttempts    uint
		maxInlineBytes int
	)
	fs.StringVar(&cfg.Listen, "listen", "127.0.0.1:7070", "gRPC listen address")
	fs.StringVar(&cfg.DataDir, "data-dir", "./data", "directory of the bbolt file and the artifacts")
	fs.StringVar(&cfg.MetricsListen, "metrics-listen", "127.0.0.1:9090", "HTTP address of /metrics (empty: none)")
	fs.StringVar(&cfg.TokensFile, "tokens", "", "principals file (JSON); without it the development tokens are used, on loopback only")
	fs.DurationVar(&cfg.LeaseTTL, "lease-ttl", 15e9, "lease time to live without a heartbeat")
	fs.UintVar(&maxAttempts, "max-attempts", 5, "attempts per job cycle, including the first")
	fs.DurationVar(&cfg.BackoffBase, "backoff-base", 1e9, "retry backoff before the second attempt (doubles, with full jitter)")
	fs.DurationVar(&cfg.BackoffCap, "backoff-cap", 300e9, "longest retry backoff")
	fs.IntVar(&cfg.MaxDocuments, "max-documents", jobs.DefaultMaxDocuments, "most documents in one batch")
	fs.Int64Var(&cfg.MaxDocumentBytes, "max-document-bytes", jobs.DefaultMaxDocumentBytes, "largest declared document size")
	fs.Int64Var(&cfg.MaxBatchBytes, "max-batch-bytes", jobs.DefaultMaxBatchBytes, "largest declared size of one batch")
	fs.IntVar(&maxInlineBytes, "max-inline-bytes", jobs.DefaultMaxInlineBytes, "most inline content per document")
	fs.IntVar(&cfg.MaxTeamQueue, "max-team-queue", jobs.DefaultMaxTeamQueue, "most non-terminal jobs per team")
	fs.StringVar(&teamWeights, "team-weights", "", `dispatch weights per team, as "alpha=3,beta=1" (others weigh 1)`)
	fs.Float64Var(&cfg.TeamShare, "team-share", 0.75, "share of live renderer capacity one team may hold while another waits (1 disables the cap)")
	fs.BoolVar(&cfg.FIFO, "fifo", false, "dispatch in global arrival order (fairness off)")
	fs.BoolVar(&runningCancel, "running-cancel", true, "allow cancelling LEASED jobs (their lease is revoked)")
	fs.IntVar(&cfg.ReplayLimit, "replay-limit", 1000, "most jobs one operator replay may touch")
	fs.StringVar(&unsupported, "unsupported", strings.Join(jobs.DefaultUnsupported, ","), "comma-separated formats (extensions, MIME types) failed at submission as UNSUPPORTED_FORMAT")
	fs.TextVar(&level, "log-level", slog.LevelInfo, "log level: debug, info, warn or error")

	var envErr error
	fs.VisitAll(func(f *flag.Flag) {
		name := "LEASEHOLD_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		f.Usage += " (env " + name + ")"
		if v, ok := os.LookupEnv(name); ok {
			if err := f.Value.Set(v); err != nil && envErr == nil {
				envErr = fmt.Errorf("%s=%q: %w", name, v, err)
			}
			f.DefValue = v
		}
	})
	if envErr != nil {
		return cfg, level, envErr
	}
	if err := fs.Parse(args); err != nil {
		return cfg, level, err
	}
	if fs.NArg() > 0 {
		return cfg, level, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	weights, err := parseWeights(teamWeights)
	if err != nil {
		return cfg, level, err
	}
	cfg.TeamWeights = weights
	cfg.MaxAttempts = uint32(maxAttempts)
	cfg.MaxInlineBytes = maxInlineBytes
	cfg.DisableRunningCancel = !runningCancel
	cfg.Unsupported = []string{}
	for _, f := range strings.Split(unsupported, ",") {
		if f = strings.TrimSpace(f); f != "" {
			cfg.Unsupported = append(cfg.Unsupported, f)
		}
	}
	return cfg, level, nil
}

// parseWeights parses "alpha=3,beta=1".
func parseWeights(s string) (map[string]int, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	out := make(map[string]int)
	for _, pair := range strings.Split(s, ",") {
		team, w, ok := strings.Cut(strings.TrimSpace(pair), "=")
		n, err := strconv.Atoi(strings.TrimSpace(w))
		if !ok || team == "" || err != nil || n < 1 {
			return nil, fmt.Errorf("--team-weights: %q is not team=<positive weight>", pair)
		}
		out[strings.TrimSpace(team)] = n
	}
	return out, nil
}
