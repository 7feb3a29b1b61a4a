// Binary renderer runs a renderer pod: it keeps one session open with the
// coordinator, renders the leases it is granted with the deterministic mock
// provider and completes them with their fencing tokens.
//
// Every flag has an environment equivalent: LEASEHOLD_ and the flag name in
// upper case with dashes as underscores, except --id (LEASEHOLD_RENDERER_ID)
// and --token (LEASEHOLD_RENDERER_TOKEN; LEASEHOLD_TOKEN, which CLI users
// export, is deliberately not read). A set variable replaces the flag's
// default; a flag given on the command line wins.
//
// SIGTERM or SIGINT drains: the renderer takes no new work, lets the renders
// in flight finish for up to --drain-timeout, hands back the rest and exits
// 0. A second signal hands back at once; a third kills the process.
//
// A command line or environment that does not parse or check (TLS files
// included, and OTEL_* variables asking for an exporter this build does
// not have) prints one line and exits 2; other failures exit 1.
//
// Transport: with any of --tls, --tls-ca, --tls-cert/--tls-key or
// --tls-server-name the renderer connects over TLS (mutual TLS with a
// client certificate). Without TLS it sends its token only to a coordinator
// on loopback, unless --insecure-plaintext says the network encrypts. Logs
// are JSON lines unless stderr is a terminal (--log-format); traces are
// exported over OTLP when the standard OTEL_* variables ask for it.
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"regexp"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/leasehold/leasehold/client/limits"
	"github.com/leasehold/leasehold/internal/fdlimit"
	"github.com/leasehold/leasehold/internal/logformat"
	"github.com/leasehold/leasehold/internal/security"
	"github.com/leasehold/leasehold/internal/tracing"
	"github.com/leasehold/leasehold/renderer"
	"github.com/leasehold/leasehold/renderer/mock"
)

// defaultToken is the development renderer credential, used when neither
// --token nor LEASEHOLD_RENDERER_TOKEN is set.
const defaultToken = "dev-renderer"

// defaultGCPercent is the garbage collector's target when GOGC is not set:
// a renderer's live heap is tiny while it allocates per document, so a
// fourfold target spares most of the collector's work.
const defaultGCPercent = 400

func main() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(defaultGCPercent)
	}
	// A renderer holds few descriptors; it takes what it may all the same,
	// as the coordinator does, so that no soft limit stops it first.
	_, _ = fdlimit.Raise()
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "renderer:", err)
		if _, ok := errors.AsType[*usageError](err); ok {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

// usageError is a command line or environment that does not parse or
// check: main exits 2.
type usageError struct{ err error }

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

// options is the parsed command line.
type options struct {
	worker     renderer.Config
	mock       mock.Config
	httpListen string
	logLevel   slog.Level
	logFormat  logformat.Format
}

// errHelp reports that --help was asked for and printed.
var errHelp = errors.New("help requested")

// parseOptions parses args with lookupEnv as the environment; usage and
// parse errors are written to stderr. Its errors other than errHelp are
// *usageError.
func parseOptions(args []string, lookupEnv func(string) (string, bool), stderr io.Writer) (*options, error) {
	o, err := parseArgs(args, lookupEnv, stderr)
	if err != nil && !errors.Is(err, errHelp) {
		return nil, &usageError{err: err}
	}
	return o, err
}

// parseArgs does the work of parseOptions.
func parseArgs(args []string, lookupEnv func(string) (string, bool), stderr io.Writer) (*options, error) {
	fs := flag.NewFlagSet("renderer", flag.ContinueOnError)
	fs.SetOutput(stderr)
	e := &envReader{lookup: lookupEnv}
	env, envDur, envUint, envNum := e.str, e.dur, e.uint, e.num
	coordinator := fs.String("coordinator", env("LEASEHOLD_COORDINATOR", "127.0.0.1:7070"), "coordinator gRPC address; for a cluster, every replica as host:port,host:port,... or a dns:///name:port target, and the session follows the leader (LEASEHOLD_COORDINATOR)")
	id := fs.String("id", env("LEASEHOLD_RENDERER_ID", defaultID()), "renderer id, allowed for the token and used by one process at a time (LEASEHOLD_RENDERER_ID)")
	token := fs.String("token", env("LEASEHOLD_RENDERER_TOKEN", defaultToken), "bearer token of a principal with the renderer role (LEASEHOLD_RENDERER_TOKEN; LEASEHOLD_TOKEN is not read)")
	capacity := fs.Int("capacity", int(envUint("LEASEHOLD_CAPACITY", renderer.DefaultCapacity)), fmt.Sprintf("leases held at most at once, 1 to %d (LEASEHOLD_CAPACITY)", renderer.MaxCapacity))
	hbInterval := fs.Duration("heartbeat-interval", envDur("LEASEHOLD_HEARTBEAT_INTERVAL", 0), "heartbeat interval; 0 uses the coordinator's (LEASEHOLD_HEARTBEAT_INTERVAL)")
	drainTimeout := fs.Duration("drain-timeout", envDur("LEASEHOLD_DRAIN_TIMEOUT", renderer.DefaultDrainTimeout), "on SIGTERM or SIGINT, how long renders in flight may finish before the rest is handed back (LEASEHOLD_DRAIN_TIMEOUT)")
	maxMessage := fs.Int("max-message-bytes", int(envUint("LEASEHOLD_MAX_MESSAGE_BYTES", renderer.DefaultMaxReceiveBytes)), "largest message received from the coordinator; bounds each batch of grants (LEASEHOLD_MAX_MESSAGE_BYTES)")
	httpListen := fs.String("http-listen", env("LEASEHOLD_HTTP_LISTEN", ""), "address serving /healthz, /readyz and /metrics, such as :9091; empty serves none (LEASEHOLD_HTTP_LISTEN)")
	_ = fs.Duration("acquire-wait", envDur("LEASEHOLD_ACQUIRE_WAIT", 0), "ignored: the renderer no longer long-polls; accepted so that existing command lines still start (LEASEHOLD_ACQUIRE_WAIT)")
	latency := fs.Duration("latency", envDur("LEASEHOLD_LATENCY", 0), "time every render takes (LEASEHOLD_LATENCY)")
	jitter := fs.Duration("latency-jitter", envDur("LEASEHOLD_LATENCY_JITTER", 0), "random extra render time below this bound (LEASEHOLD_LATENCY_JITTER)")
	failRate := fs.Float64("fail-rate", envNum("LEASEHOLD_FAIL_RATE", 0), "probability 0..1 that a render fails transiently (LEASEHOLD_FAIL_RATE)")
	pause := fs.Duration("pause-before-complete", envDur("LEASEHOLD_PAUSE_BEFORE_COMPLETE", 0), "stall this long after rendering, before completing, as a frozen process would: the lease is not heartbeated meanwhile (LEASEHOLD_PAUSE_BEFORE_COMPLETE)")
	crashOn := fs.String("crash-on", env("LEASEHOLD_CRASH_ON", ""), "exit with code 3 when rendering a document whose name contains this (LEASEHOLD_CRASH_ON)")
	unsupported := fs.String("unsupported", env("LEASEHOLD_UNSUPPORTED", strings.Join(mock.DefaultUnsupported(), ",")), "comma-separated refused extensions and MIME types (LEASEHOLD_UNSUPPORTED)")
	seed := fs.Uint64("seed", envUint("LEASEHOLD_SEED", 0), "seed of every injected random decision (LEASEHOLD_SEED)")
	previewBytes := fs.Int("preview-bytes", int(envUint("LEASEHOLD_PREVIEW_BYTES", 0)), "pad every preview to this many bytes with incompressible data (still a valid PNG, the same per document and lease); 0 keeps the mock's 0.4 KiB (LEASEHOLD_PREVIEW_BYTES)")
	record := fs.String("record", env("LEASEHOLD_RECORD", ""), "append every lease handed to this renderer as \"job_id token\" lines to this file (LEASEHOLD_RECORD)")
	logLevel := fs.String("log-level", env("LEASEHOLD_LOG_LEVEL", "info"), "debug, info, warn or error (LEASEHOLD_LOG_LEVEL)")
	logFormat := fs.String("log-format", env("LEASEHOLD_LOG_FORMAT", string(logformat.Auto)), "text, json, or auto: JSON unless stderr is a terminal (LEASEHOLD_LOG_FORMAT)")
	useTLS := fs.Bool("tls", envBool(e, "LEASEHOLD_TLS"), "connect over TLS, verifying the coordinator with the system's roots unless --tls-ca is given; implied by the other --tls-* flags (LEASEHOLD_TLS)")
	tlsCA := fs.String("tls-ca", env("LEASEHOLD_TLS_CA", ""), "PEM CA certificates that verify the coordinator (LEASEHOLD_TLS_CA)")
	tlsCert := fs.String("tls-cert", env("LEASEHOLD_TLS_CERT", ""), "PEM client certificate, for a coordinator that requires mutual TLS (LEASEHOLD_TLS_CERT)")
	tlsKey := fs.String("tls-key", env("LEASEHOLD_TLS_KEY", ""), "PEM private key of --tls-cert (LEASEHOLD_TLS_KEY)")
	tlsServerName := fs.String("tls-server-name", env("LEASEHOLD_TLS_SERVER_NAME", ""), "name the coordinator's certificate must carry, if not the host of --coordinator (of each replica listed) (LEASEHOLD_TLS_SERVER_NAME)")
	insecurePlaintext := fs.Bool("insecure-plaintext", envBool(e, "LEASEHOLD_INSECURE_PLAINTEXT"), "send the token without TLS to a coordinator not on loopback; only where the network itself encrypts, such as a service mesh (LEASEHOLD_INSECURE_PLAINTEXT)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, errHelp
		}
		return nil, err
	}
	if e.err != nil {
		return nil, e.err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	o := &options{httpListen: *httpListen}
	if err := o.logLevel.UnmarshalText([]byte(*logLevel)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	format, err := logformat.Parse(*logFormat)
	if err != nil {
		return nil, fmt.Errorf("--log-format: %w", err)
	}
	o.logFormat = format
	tlsCfg, err := clientTLS(*useTLS, *tlsCA, *tlsCert, *tlsKey, *tlsServerName, *insecurePlaintext)
	if err != nil {
		return nil, err
	}
	formats := []string{}
	for f := range strings.SplitSeq(*unsupported, ",") {
		if f = strings.TrimSpace(f); f != "" {
			formats = append(formats, f)
		}
	}
	o.mock = mock.Config{
		Latency:             *latency,
		LatencyJitter:       *jitter,
		FailRate:            *failRate,
		PauseBeforeComplete: *pause,
		CrashOn:             *crashOn,
		Unsupported:         formats,
		Seed:                *seed,
		PreviewBytes:        *previewBytes,
	}
	o.worker = renderer.Config{
		Coordinator:       *coordinator,
		ID:                *id,
		Token:             *token,
		Capacity:          *capacity,
		HeartbeatInterval: *hbInterval,
		RecordFile:        *record,
		MaxReceiveBytes:   *maxMessage,
		DrainTimeout:      *drainTimeout,
		TLS:               tlsCfg,
		InsecurePlaintext: *insecurePlaintext,
	}
	return o, nil
}

// clientTLS returns the TLS configuration the TLS flags ask for, nil for
// plaintext. TLS is on with --tls or any other --tls-* flag; it excludes
// --insecure-plaintext, and --tls-cert and --tls-key go together.
func clientTLS(on bool, ca, cert, key, serverName string, insecurePlaintext bool) (*tls.Config, error) {
	on = on || ca != "" || cert != "" || key != "" || serverName != ""
	switch {
	case !on:
		return nil, nil
	case insecurePlaintext:
		return nil, errors.New("--insecure-plaintext excludes --tls and the --tls-* flags")
	case (cert == "") != (key == ""):
		return nil, errors.New("--tls-cert and --tls-key go together: give both or neither")
	}
	cfg, err := security.ClientTLS(ca, cert, key, serverName)
	if err != nil {
		return nil, fmt.Errorf("--tls-ca=%q, --tls-cert=%q, --tls-key=%q: %w", ca, cert, key, err)
	}
	return cfg, nil
}

func run(args []string) error {
	o, err := parseOptions(args, os.LookupEnv, os.Stderr)
	if errors.Is(err, errHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	logger := slog.New(logformat.NewHandler(os.Stderr, o.logFormat, o.logLevel))
	provider, err := mock.New(o.mock)
	if err != nil {
		return &usageError{err: err}
	}
	tr, err := tracing.Setup(context.Background(), "leasehold-renderer", os.LookupEnv)
	if err != nil {
		return &usageError{err: err}
	}
	defer shutdownTracing(tr, logger)
	o.worker.TracerProvider = tr.Provider
	o.worker.Provider = provider
	o.worker.Logger = logger
	w, err := renderer.New(o.worker)
	if errors.Is(err, security.ErrPlaintextToken) {
		err = fmt.Errorf("%w (pass --tls-ca or --tls, or --insecure-plaintext)", err)
	}
	if err != nil {
		// New only checks the configuration.
		return &usageError{err: err}
	}

	if o.httpListen != "" {
		lis, err := net.Listen("tcp", o.httpListen)
		if err != nil {
			return fmt.Errorf("--http-listen: %w", err)
		}
		lis = w.ListenHTTP(lis)
		srv := w.HTTPServer()
		go func() {
			if err := srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
				logger.Error("http server", "err", err)
			}
		}()
		logger.Info("http listening", "addr", lis.Addr().String())
		defer func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			_ = srv.Shutdown(ctx)
		}()
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	done := make(chan struct{})
	defer close(done)
	go cutDrainOnSecondSignal(ctx, stop, w, logger, done)
	return w.Run(ctx)
}

// shutdownTracing exports the spans still buffered, if tracing is on,
// within five seconds.
func shutdownTracing(tr *tracing.Tracing, logger *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := tr.Shutdown(ctx); err != nil {
		logger.Warn("exporting the last spans", "err", err)
	}
}

// cutDrainOnSecondSignal waits for the first signal (ctx done), then for a
// second one, which ends the drain at once; after that the default handling
// comes back, so a third signal kills the process. It returns when done is
// closed.
func cutDrainOnSecondSignal(ctx context.Context, stop func(), w *renderer.Worker, logger *slog.Logger, done <-chan struct{}) {
	select {
	case <-ctx.Done():
	case <-done:
		return
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	stop() // sigs is registered first, so no signal falls through to the default
	defer signal.Stop(sigs)
	select {
	case s := <-sigs:
		logger.Warn("second signal: handing back unfinished leases now", "signal", s.String())
		w.EndDrain()
	case <-done:
	}
}

// envReader reads flag defaults from the environment and keeps the first
// malformed value's error.
type envReader struct {
	lookup func(string) (string, bool)
	err    error
}

func (e *envReader) str(name, def string) string {
	if v, ok := e.lookup(name); ok {
		return v
	}
	return def
}

// parsed returns parse(v) for a set variable, def otherwise.
func parsed[T any](e *envReader, name string, def T, parse func(string) (T, error)) T {
	v, ok := e.lookup(name)
	if !ok {
		return def
	}
	x, err := parse(v)
	if err != nil && e.err == nil {
		e.err = fmt.Errorf("%s: %w", name, err)
	}
	return x
}

func (e *envReader) dur(name string, def time.Duration) time.Duration {
	return parsed(e, name, def, time.ParseDuration)
}

func (e *envReader) uint(name string, def uint64) uint64 {
	return parsed(e, name, def, func(v string) (uint64, error) { return strconv.ParseUint(v, 10, 64) })
}

// envBool returns the boolean variable name, false when unset.
func envBool(e *envReader, name string) bool {
	return parsed(e, name, false, strconv.ParseBool)
}

func (e *envReader) num(name string, def float64) float64 {
	return parsed(e, name, def, func(v string) (float64, error) { return strconv.ParseFloat(v, 64) })
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
	if len(id) > limits.MaxRendererIDBytes {
		id = id[len(id)-limits.MaxRendererIDBytes:]
	}
	return id
}
