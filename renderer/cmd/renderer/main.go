// Binary renderer runs a renderer pod: it leases preview jobs from the
// coordinator, renders them with the deterministic mock provider and
// completes them with its fencing tokens.
//
// Every flag has an environment equivalent (LEASEHOLD_ and the flag name in
// upper case with dashes as underscores; the id is LEASEHOLD_RENDERER_ID).
// A set variable replaces the flag's default; a flag given on the command
// line wins.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/leasehold/leasehold/renderer"
	"github.com/leasehold/leasehold/renderer/mock"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "renderer:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("renderer", flag.ContinueOnError)
	var envErr error
	env := func(name, def string) string {
		if v, ok := os.LookupEnv(name); ok {
			return v
		}
		return def
	}
	envDur := func(name string, def time.Duration) time.Duration {
		v, ok := os.LookupEnv(name)
		if !ok {
			return def
		}
		d, err := time.ParseDuration(v)
		if err != nil && envErr == nil {
			envErr = fmt.Errorf("%s: %w", name, err)
		}
		return d
	}
	envUint := func(name string, def uint64) uint64 {
		v, ok := os.LookupEnv(name)
		if !ok {
			return def
		}
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil && envErr == nil {
			envErr = fmt.Errorf("%s: %w", name, err)
		}
		return n
	}
	envNum := func(name string, def float64) float64 {
		v, ok := os.LookupEnv(name)
		if !ok {
			return def
		}
		f, err := strconv.ParseFloat(v, 64)
		if err != nil && envErr == nil {
			envErr = fmt.Errorf("%s: %w", name, err)
		}
		return f
	}

	coordinator := fs.String("coordinator", env("LEASEHOLD_COORDINATOR", "127.0.0.1:7070"), "coordinator gRPC address (LEASEHOLD_COORDINATOR)")
	id := fs.String("id", env("LEASEHOLD_RENDERER_ID", defaultID()), "renderer id, unique among live renderers (LEASEHOLD_RENDERER_ID)")
	token := fs.String("token", env("LEASEHOLD_TOKEN", "dev-renderer"), "bearer token of a principal with the renderer role (LEASEHOLD_TOKEN)")
	capacity := fs.Int("capacity", int(envUint("LEASEHOLD_CAPACITY", renderer.DefaultCapacity)), "leases held at most at once (LEASEHOLD_CAPACITY)")
	acquireWait := fs.Duration("acquire-wait", envDur("LEASEHOLD_ACQUIRE_WAIT", renderer.DefaultAcquireWait), "long-poll wait of one Acquire, at most 60s (LEASEHOLD_ACQUIRE_WAIT)")
	hbInterval := fs.Duration("heartbeat-interval", envDur("LEASEHOLD_HEARTBEAT_INTERVAL", 0), "heartbeat interval; 0 uses the coordinator's (LEASEHOLD_HEARTBEAT_INTERVAL)")
	latency := fs.Duration("latency", envDur("LEASEHOLD_LATENCY", 0), "time every render takes (LEASEHOLD_LATENCY)")
	jitter := fs.Duration("latency-jitter", envDur("LEASEHOLD_LATENCY_JITTER", 0), "random extra render time below this bound (LEASEHOLD_LATENCY_JITTER)")
	failRate := fs.Float64("fail-rate", envNum("LEASEHOLD_FAIL_RATE", 0), "probability 0..1 that a render fails transiently (LEASEHOLD_FAIL_RATE)")
	pause := fs.Duration("pause-before-complete", envDur("LEASEHOLD_PAUSE_BEFORE_COMPLETE", 0), "stall this long after rendering, before completing, as a frozen process would: the lease is not heartbeated meanwhile (LEASEHOLD_PAUSE_BEFORE_COMPLETE)")
	crashOn := fs.String("crash-on", env("LEASEHOLD_CRASH_ON", ""), "exit with code 3 when rendering a document whose name contains this (LEASEHOLD_CRASH_ON)")
	unsupported := fs.String("unsupported", env("LEASEHOLD_UNSUPPORTED", strings.Join(mock.DefaultUnsupported(), ",")), "comma-separated refused extensions and MIME types (LEASEHOLD_UNSUPPORTED)")
	seed := fs.Uint64("seed", envUint("LEASEHOLD_SEED", 0), "seed of every injected random decision (LEASEHOLD_SEED)")
	record := fs.String("record", env("LEASEHOLD_RECORD", ""), "append every lease handed to this renderer as \"job_id token\" lines to this file (LEASEHOLD_RECORD)")
	logLevel := fs.String("log-level", env("LEASEHOLD_LOG_LEVEL", "info"), "debug, info, warn or error (LEASEHOLD_LOG_LEVEL)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if envErr != nil {
		return envErr
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %q", fs.Args())
	}

	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))

	formats := []string{}
	for f := range strings.SplitSeq(*unsupported, ",") {
		if f = strings.TrimSpace(f); f != "" {
			formats = append(formats, f)
		}
	}
	provider, err := mock.New(mock.Config{
		Latency:             *latency,
		LatencyJitter:       *jitter,
		FailRate:            *failRate,
		PauseBeforeComplete: *pause,
		CrashOn:             *crashOn,
		Unsupported:         formats,
		Seed:                *seed,
	})
	if err != nil {
		return err
	}
	w, err := renderer.New(renderer.Config{
		Coordinator:       *coordinator,
		ID:                *id,
		Token:             *token,
		Capacity:          *capacity,
		Provider:          provider,
		Logger:            logger,
		AcquireWait:       *acquireWait,
		HeartbeatInterval: *hbInterval,
		RecordFile:        *record,
	})
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	return w.Run(ctx)
}

// defaultID is "<hostname>-<pid>", reduced to the characters renderer ids
// allow.
func defaultID() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "renderer"
	}
	host = regexp.MustCompile(`[^A-Za-z0-9._-]+`).ReplaceAllString(host, "-")
	id := fmt.Sprintf("%s-%d", host, os.Getpid())
	if len(id) > 128 {
		id = id[len(id)-128:]
	}
	return id
}
