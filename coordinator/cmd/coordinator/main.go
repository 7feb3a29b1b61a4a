// Command coordinator runs the Leasehold coordinator: the single owner of
// job state, serving the leasehold.v1 gRPC API and Prometheus metrics.
//
// Every flag can also be set in the environment as LEASEHOLD_<NAME>, with
// the flag name upper-cased and dashes turned into underscores
// (--lease-ttl is LEASEHOLD_LEASE_TTL); a flag on the command line wins.
//
// Every flag is checked before anything is opened: an invalid value, from
// the command line or the environment, prints one line naming the flag (or
// the variable) and what is wrong with it, and exits with status 2 without
// creating the data directory or binding a port. TLS files that cannot be
// read or parsed, and OTEL_* variables asking for an exporter this build
// does not have, are invalid values too. Other failures to start exit with
// status 1.
//
// It needs its principals: --tokens FILE, or --dev for the public
// development tokens, which it serves only on loopback addresses and
// accepts only from this machine. Neither, or both, is a usage error.
//
// With --tls-cert and --tls-key the coordinator serves TLS only; with
// --tls-client-ca as well, every client must present a certificate signed
// by one of those CAs (mutual TLS). A cluster node (--node-id, --raft-listen,
// --peers) with TLS speaks mutual TLS to its peers under a peer CA of its
// own (--tls-peer-ca, never --tls-client-ca), with a peer certificate
// naming its node id (--tls-peer-cert, by default --tls-cert); without TLS
// its raft listener and peers must be on loopback, unless
// --raft-insecure-plaintext-trusted-network says the network encrypts and
// authenticates by itself. Logs are JSON lines unless stderr is a
// terminal (--log-format). Traces are exported over OTLP when the standard
// OTEL_* variables ask for it (see package internal/tracing).
//
// Three subcommands work on the data directory of a stopped coordinator,
// and refuse one a running coordinator holds:
//
//	coordinator check [--data-dir DIR] [--artifact-store URL] [--json]
//	                                                check the database and that the artifact store holds what it names,
//	                                                read-only; exit 0 when consistent, 1 otherwise (see coordinator.Check)
//	coordinator compact --data-dir DIR              rewrite the database without its free pages
//	coordinator restore --data-dir DIR --from FILE [--artifact-store URL]
//	                                                put a backup (leasehold backup) in place, and say which
//	                                                previews of the artifact store it cannot bring back
//
// and "coordinator cluster" operates a replicated cluster: status,
// transfer-leader, add and remove call a running node over gRPC with an
// operator's token, recover rewrites the raft state of a stopped node
// after the cluster lost its quorum (see runCluster).
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"os"
	"os/signal"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/leasehold/leasehold/coordinator"
	"github.com/leasehold/leasehold/coordinator/internal/cluster"
	"github.com/leasehold/leasehold/coordinator/internal/engine"
	"github.com/leasehold/leasehold/coordinator/internal/hostcheck"
	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	"github.com/leasehold/leasehold/coordinator/internal/maintenance"
	"github.com/leasehold/leasehold/coordinator/internal/server"
	"github.com/leasehold/leasehold/internal/connlimit"
	"github.com/leasehold/leasehold/internal/fdlimit"
	"github.com/leasehold/leasehold/internal/logformat"
	"github.com/leasehold/leasehold/internal/security"
	"github.com/leasehold/leasehold/internal/tracing"
)

// Exit statuses.
const (
	exitFailure = 1
	exitUsage   = 2
)

// defaultGCPercent is the garbage collector's target when GOGC is not set.
// The coordinator's live heap is small (tens of MiB: the ready queues and
// the lease index) while it allocates fast, so Go's default of collecting
// each time the heap doubles spends about a tenth of its CPU in the
// collector; a fourfold target trades a little memory for most of that.
const defaultGCPercent = 400

func main() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(defaultGCPercent)
	}
	var err error
	switch {
	case len(os.Args) > 1 && os.Args[1] == "check":
		err = runCheck(os.Args[2:], os.Stdout, os.Stderr)
	case len(os.Args) > 1 && os.Args[1] == "cluster":
		err = runCluster(os.Args[2:], os.Stdout, os.Stderr)
	default:
		err = run(os.Args[1:], os.Stderr)
	}
	var uerr *usageError
	switch {
	case err == nil:
	case errors.Is(err, flag.ErrHelp):
		os.Exit(0)
	case errors.As(err, &uerr):
		fmt.Fprintln(os.Stderr, "coordinator:", err)
		os.Exit(exitUsage)
	default:
		fmt.Fprintln(os.Stderr, "coordinator:", err)
		os.Exit(exitFailure)
	}
}

// usageError is an invalid command line or environment: main prints it on
// one line and exits with status 2.
type usageError struct {
	msg string
}

func (e *usageError) Error() string { return e.msg + " (see --help)" }

// usagef returns a usageError.
func usagef(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// run parses and checks flags, starts the coordinator and serves until
// SIGINT or SIGTERM, reloading the principals file on SIGHUP; or runs an
// offline subcommand.
func run(args []string, stderr io.Writer) error {
	if len(args) > 0 {
		if sub, ok := offlineCommands[args[0]]; ok {
			return sub(args[1:], stderr)
		}
	}
	cfg, _, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	log := cfg.Logger

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	tr, err := tracing.Setup(ctx, "leasehold-coordinator", os.LookupEnv)
	if err != nil {
		return &usageError{msg: err.Error()}
	}
	defer shutdownTracing(tr, log)
	cfg.TracerProvider = tr.Provider
	lim, err := fdlimit.Raise()
	checkFileLimit(log, lim, err, cfg.FileDescriptors())

	c, err := coordinator.New(cfg)
	if err != nil {
		return err
	}
	lis, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		c.Close()
		return fmt.Errorf("listening on %s: %w", cfg.Listen, err)
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	served := make(chan error, 1)
	go func() { served <- c.Serve(lis) }()
	for {
		select {
		case <-hup:
			_ = c.ReloadPrincipals() // it logs the outcome
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
}

// checkFileLimit logs the limit on open files that fdlimit.Raise left in
// force, and warns when it is below need, the descriptors the
// coordinator's connection caps may take (Config.FileDescriptors): past
// the limit, accepting a connection fails with "too many open files",
// whoever holds the others.
func checkFileLimit(log *slog.Logger, lim fdlimit.Limit, err error, need int) {
	switch {
	case err != nil:
		log.Warn("could not raise the open file limit", "err", err, "soft", lim.Soft, "hard", lim.Hard)
	case lim.Hard == 0:
		return // no such limit here
	default:
		log.Info("open file limit", "limit", lim.Soft)
	}
	if lim.Soft > 0 && lim.Soft < uint64(need) {
		log.Warn("the open file limit is below what the connection caps may take: raise the hard limit "+
			"(ulimit -Hn, systemd's LimitNOFILE, the container runtime's nofile) or lower --max-connections",
			"limit", lim.Soft, "need", need)
	}
}

// tracingShutdownTimeout bounds the export of the last spans at exit.
const tracingShutdownTimeout = 5 * time.Second

// shutdownTracing exports the spans still buffered, if tracing is on.
func shutdownTracing(tr *tracing.Tracing, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), tracingShutdownTimeout)
	defer cancel()
	if err := tr.Shutdown(ctx); err != nil {
		log.Warn("exporting the last spans", "err", err)
	}
}

// Bounds the flags are checked against.
const (
	// minLeaseTTL is the shortest lease TTL: renderers heartbeat every
	// third of it.
	minLeaseTTL = 100 * time.Millisecond
	// minRetention is the shortest retention but 0 (forever): a client
	// must find its finished batch a while after it ended.
	minRetention = time.Hour
	// Retention defaults.
	day                       = 24 * time.Hour
	defaultRetention          = 7 * day
	defaultRejectionRetention = 30 * day
	defaultAuditRetention     = 365 * day
	// defaultMetricsListen is the default metrics address. It is not 9090,
	// the port of Prometheus itself, which often runs on the same host.
	defaultMetricsListen = "127.0.0.1:7071"
)

// flagValues are the flags that do not map one to one onto a Config field.
type flagValues struct {
	teamWeights    string
	unsupported    string
	runningCancel  bool
	maxAttempts    uint
	maxInlineBytes int
	tlsCert        string
	tlsKey         string
	tlsClientCA    string
	dev            bool
	// The cluster flags (see clusterConfig).
	nodeID, raftListen, raftAdvertise, peers, grpcAdvertise string
	tlsPeerCA, tlsPeerCert, tlsPeerKey                      string
	join, raftInsecurePlaintext                             bool
}

// parseFlags turns flags (with LEASEHOLD_* defaults) into a Config and
// checks every value. The Config's Logger writes to stderr in the format
// and at the level the flags ask for, and its TLS holds the certificates
// the TLS flags name, read and checked. All its errors but flag.ErrHelp
// are usageErrors.
func parseFlags(args []string, stderr io.Writer) (coordinator.Config, slog.Level, error) {
	fs := flag.NewFlagSet("coordinator", flag.ContinueOnError)
	var (
		cfg    coordinator.Config
		fv     flagValues
		level  slog.Level
		format = logformat.Auto
	)
	fs.StringVar(&cfg.Listen, "listen", "127.0.0.1:7070", "gRPC listen address")
	fs.StringVar(&cfg.DataDir, "data-dir", "./data", "directory of the bbolt file and the artifacts")
	fs.StringVar(&cfg.MetricsListen, "metrics-listen", defaultMetricsListen, "HTTP address of /metrics, profiles and the console, HTTPS with --tls-cert (empty: none); not 9090, which is Prometheus's own")
	fs.StringVar(&cfg.TokensFile, "tokens", "", "principals file (JSON), read again on SIGHUP; required unless --dev")
	fs.BoolVar(&fv.dev, "dev", false, "use the public development tokens (dev-alpha, dev-operator, ...) instead of --tokens: "+
		"only on loopback addresses, the console's too, and only from this machine")
	fs.IntVar(&cfg.MaxConnections, "max-connections", connlimit.DefaultMaxConnections, "most gRPC connections served at once; a connection past it is closed at once")
	fs.IntVar(&cfg.MaxConnectionsPerAddress, "max-connections-per-address", 0,
		"most gRPC connections of one source address (an IPv4 address or an IPv6 /64), at most --max-connections (0: an eighth of it); "+
			"behind a proxy or sidecar that connects from one address for every client, raise it to --max-connections")
	fs.DurationVar(&cfg.ConnAuthTimeout, "conn-auth-timeout", connlimit.DefaultAuthTimeout, "close a gRPC connection that has made no call with a known token within this long")
	fs.DurationVar(&cfg.LeaseTTL, "lease-ttl", engine.DefaultLeaseTTL, "lease time to live without a heartbeat (at least 100ms; renderers heartbeat every third of it)")
	fs.UintVar(&fv.maxAttempts, "max-attempts", engine.DefaultMaxAttempts, "attempts per job cycle, including the first (at least 1)")
	fs.DurationVar(&cfg.BackoffBase, "backoff-base", engine.DefaultBackoffBase, "retry backoff before the second attempt (doubles, with full jitter; at most --backoff-cap)")
	fs.DurationVar(&cfg.BackoffCap, "backoff-cap", engine.DefaultBackoffCap, "longest retry backoff")
	fs.IntVar(&cfg.MaxDocuments, "max-documents", jobs.DefaultMaxDocuments, "most documents in one batch")
	fs.Int64Var(&cfg.MaxDocumentBytes, "max-document-bytes", jobs.DefaultMaxDocumentBytes, "largest declared document size")
	fs.Int64Var(&cfg.MaxBatchBytes, "max-batch-bytes", jobs.DefaultMaxBatchBytes, "largest declared size of one batch")
	fs.IntVar(&fv.maxInlineBytes, "max-inline-bytes", jobs.DefaultMaxInlineBytes, "most inline content per document")
	fs.Int64Var(&cfg.MaxBatchInlineBytes, "max-batch-inline-bytes", coordinator.DefaultMaxBatchInlineBytes,
		"most inline content of one batch, all documents together; the largest gRPC message received is "+
			"this + --max-documents × 4 KiB (metadata per document) + 64 KiB (at most 2 GiB)")
	fs.IntVar(&cfg.MaxTeamQueue, "max-team-queue", jobs.DefaultMaxTeamQueue, "most non-terminal jobs per team")
	fs.Int64Var(&cfg.MaxArtifactBytes, "max-artifact-bytes", server.DefaultMaxArtifactBytes, "largest preview a renderer may upload")
	fs.Int64Var(&cfg.MaxUploadBufferBytes, "max-upload-buffer-bytes", server.DefaultMaxUploadBufferBytes,
		"most bytes all uploads in progress may buffer together, at least --max-artifact-bytes, those of one renderer credential half of it; "+
			"an upload past either is refused RESOURCE_EXHAUSTED UPLOAD_BUDGET_EXHAUSTED")
	fs.StringVar(&cfg.Artifacts.Store, "artifact-store", "", "where previews above --inline-artifact-bytes go: empty for the directory "+
		"<data-dir>/artifact-store (a single node), file:///path for another directory, or s3://bucket?endpoint=URL&region=NAME "+
		"for an S3-compatible store shared by a cluster (credentials from the standard AWS environment and files); "+
		"a store that does not answer at start refuses the start")
	fs.IntVar(&cfg.Artifacts.InlineBytes, "inline-artifact-bytes", server.DefaultStoreAbove,
		"previews up to this size stay inline in the job's records; larger ones go to the artifact store")
	fs.IntVar(&cfg.Artifacts.InlineCap, "cluster-inline-cap-bytes", coordinator.DefaultClusterInlineCap,
		"in a cluster without a shared artifact store: the largest preview kept inline; larger ones are refused ARTIFACT_STORE_REQUIRED")
	fs.DurationVar(&cfg.Artifacts.SweepGrace, "artifact-sweep-grace", maintenance.SweepGraceDefault,
		"how old an object of the artifact store that no job names must be before the sweep deletes it; longer than any render")
	fs.DurationVar(&cfg.Artifacts.SweepInterval, "artifact-sweep-interval", maintenance.SweepIntervalDefault,
		"how often the sweep of the artifact store runs")
	fs.StringVar(&fv.teamWeights, "team-weights", "", `dispatch weights per team, as "alpha=3,beta=1" (others weigh 1)`)
	fs.Float64Var(&cfg.TeamShare, "team-share", 0.75, "share of live renderer capacity one team may hold while another waits, above 0 and at most 1 (1 disables the cap)")
	fs.BoolVar(&cfg.FIFO, "fifo", false, "dispatch in global arrival order (fairness off)")
	fs.BoolVar(&cfg.Pprof, "pprof", false, "serve Go runtime profiles under /debug/pprof/ on the metrics address")
	fs.BoolVar(&cfg.Console, "console", false, "serve the web console under /console/ on the metrics address (loopback only unless TLS is on)")
	fs.Var((*hostList)(&cfg.ConsoleHosts), "console-host", "a `name` (host or host:port) the metrics address (metrics, health, profiles, the console) answers to "+
		"besides localhost and the address a request came in on, as browsers or Prometheus reach it through DNS or a proxy; "+
		"repeat it or separate names with commas (others are refused 421)")
	fs.BoolVar(&fv.runningCancel, "running-cancel", true, "allow cancelling LEASED jobs (their lease is revoked)")
	fs.IntVar(&cfg.ReplayLimit, "replay-limit", engine.DefaultReplayLimit, "most jobs one operator replay may touch")
	fs.StringVar(&fv.unsupported, "unsupported", strings.Join(jobs.DefaultUnsupported, ","), "comma-separated formats (extensions, MIME types) failed at submission as UNSUPPORTED_FORMAT")
	fs.DurationVar(&cfg.ShutdownTimeout, "shutdown-timeout", coordinator.DefaultShutdownTimeout, "how long a shutdown waits for calls in flight before cutting them")
	cfg.Retention, cfg.RejectionRetention, cfg.AuditRetention = defaultRetention, defaultRejectionRetention, defaultAuditRetention
	fs.Var((*days)(&cfg.Retention), "retention", "how long a terminal job is kept after it ended, with its history, preview and document (a `duration` such as 7d or 36h; 0: forever)")
	fs.Var((*days)(&cfg.RejectionRetention), "rejection-retention", "how long a rejected completion is listed (a `duration`; 0: forever)")
	fs.Var((*days)(&cfg.AuditRetention), "audit-retention", "how long an audit record is kept; a replay's request id is remembered as long (a `duration`; 0: forever)")
	fs.TextVar(&level, "log-level", slog.LevelInfo, "log level: debug, info, warn or error")
	fs.Var(&format, "log-format", "log format: text, json, or auto (the default: JSON unless stderr is a terminal)")
	fs.StringVar(&fv.tlsCert, "tls-cert", "", "PEM certificate chain of the gRPC server; with --tls-key, serve TLS only")
	fs.StringVar(&fv.tlsKey, "tls-key", "", "PEM private key of --tls-cert")
	fs.StringVar(&fv.tlsClientCA, "tls-client-ca", "", "PEM CA certificates that sign client certificates; requires every client to present one (mutual TLS)")
	fs.StringVar(&fv.nodeID, "node-id", "", "this node's id among --peers: run as one voter of a replicated cluster (needs --raft-listen and --peers)")
	fs.StringVar(&fv.raftListen, "raft-listen", "", "address of this node's raft listener (peer traffic; with --node-id)")
	fs.StringVar(&fv.raftAdvertise, "raft-advertise", "", "raft address peers dial (default: this node's address in --peers)")
	fs.StringVar(&fv.peers, "peers", "", "every voter, the same on every node: id=raft_address[/grpc_address],... (1, 3 or 5 of them)")
	fs.StringVar(&fv.grpcAdvertise, "grpc-advertise", "", "gRPC address this node announces when it leads, for followers to name (default: its gRPC address in --peers, or else --listen)")
	fs.StringVar(&fv.tlsPeerCA, "tls-peer-ca", "", "PEM CA of the nodes' peer certificates, required with --tls-cert in a cluster: peers speak mutual TLS under it; "+
		"a CA of its own that signs nothing else, never --tls-client-ca")
	fs.StringVar(&fv.tlsPeerCert, "tls-peer-cert", "", "PEM certificate this node presents to its peers (default: --tls-cert): signed by --tls-peer-ca, "+
		"for client and server authentication, naming the URI spiffe://leasehold/node/<node-id>")
	fs.StringVar(&fv.tlsPeerKey, "tls-peer-key", "", "PEM private key of --tls-peer-cert")
	fs.BoolVar(&fv.raftInsecurePlaintext, cluster.InsecurePlaintextFlag, false, "without TLS, let raft listen and dial off loopback: only where the network "+
		"encrypts and authenticates every peer by itself, since whoever reaches the raft port can write into the cluster's log; every start warns of it")
	fs.BoolVar(&fv.join, "join", false, "with an empty data directory, wait to be added to a running cluster (coordinator cluster add) instead of bootstrapping one")

	source, err := parseWithEnv(fs, args, "coordinator", stderr)
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(stderr, "\nOn the data directory of a stopped coordinator: \"coordinator check\", \"coordinator compact\" and \"coordinator restore\" (each takes --help).")
		fmt.Fprintln(stderr, "A replicated cluster: \"coordinator cluster status|transfer-leader|add|remove|recover\" (coordinator cluster --help).")
	}
	if err != nil {
		return cfg, level, err
	}

	if err := fillConfig(&cfg, fv); err != nil {
		return cfg, level, usagef("%s=%q: %v", source["team-weights"], fv.teamWeights, err)
	}
	if err := checkFlags(cfg, fv, source); err != nil {
		return cfg, level, err
	}
	tlsCfg, err := loadTLS(fv, source)
	if err != nil {
		return cfg, level, err
	}
	if err := checkAccess(cfg, fv, source); err != nil {
		return cfg, level, err
	}
	if cfg.Cluster, err = clusterConfig(cfg, fv, source); err != nil {
		return cfg, level, err
	}
	cfg.TLS = tlsCfg
	if tlsCfg != nil {
		// The metrics address (metrics, profiles, the console) serves
		// HTTPS with the same certificate, but asks for no client
		// certificate: Prometheus and browsers come without one, and the
		// console signs in with bearer tokens.
		h := tlsCfg.Clone()
		h.ClientAuth, h.ClientCAs = tls.NoClientCert, nil
		cfg.HTTPTLS = h
	}
	cfg.Logger = slog.New(logformat.NewHandler(stderr, format, level))
	return cfg, level, nil
}

// parseWithEnv sets fs's flags from their LEASEHOLD_* variables, then
// from args, and returns where each value came from (the flag or the
// variable), for the messages. --help prints the usage of the command
// named name; any other error is a one-line usageError.
func parseWithEnv(fs *flag.FlagSet, args []string, name string, stderr io.Writer) (map[string]string, error) {
	source := make(map[string]string)
	var envErr error
	fs.VisitAll(func(f *flag.Flag) {
		source[f.Name] = "--" + f.Name
		name := envName(f.Name)
		f.Usage += " (env " + name + ")"
		if v, ok := os.LookupEnv(name); ok {
			source[f.Name] = name
			if err := f.Value.Set(v); err != nil && envErr == nil {
				envErr = usagef("%s=%q: %v", name, v, err)
			}
			f.DefValue = v
		}
	})
	if envErr != nil {
		return source, envErr
	}
	// The flag package would print its error and the whole usage; print
	// the usage for --help only, and the error on one line.
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(stderr)
			fmt.Fprintf(stderr, "Usage of %s:\n", name)
			fs.PrintDefaults()
			return source, err
		}
		return source, &usageError{msg: err.Error()}
	}
	if fs.NArg() > 0 {
		return source, usagef("unexpected arguments: %v", fs.Args())
	}
	fs.Visit(func(f *flag.Flag) { source[f.Name] = "--" + f.Name })
	return source, nil
}

// loadTLS reads the server's TLS configuration from the files the TLS
// flags name: none of them means plaintext (nil); --tls-cert and --tls-key
// go together, and --tls-client-ca needs them. A file that cannot be read
// or parsed is a usageError naming its flag.
func loadTLS(fv flagValues, source map[string]string) (*tls.Config, error) {
	switch {
	case fv.tlsCert == "" && fv.tlsKey == "" && fv.tlsClientCA == "":
		return nil, nil
	case fv.tlsCert == "" && fv.tlsKey == "":
		return nil, usagef("%s needs --tls-cert and --tls-key: the server's own certificate comes first", source["tls-client-ca"])
	case fv.tlsCert == "" || fv.tlsKey == "":
		return nil, usagef("%s and %s go together: give both or neither", source["tls-cert"], source["tls-key"])
	}
	if fv.tlsClientCA != "" {
		if _, err := security.LoadCertPool(fv.tlsClientCA); err != nil {
			return nil, usagef("%s=%q: %v", source["tls-client-ca"], fv.tlsClientCA, err)
		}
	}
	cfg, err := security.ServerTLS(fv.tlsCert, fv.tlsKey, fv.tlsClientCA)
	if err != nil {
		return nil, usagef("%s=%q, %s=%q: %v", source["tls-cert"], fv.tlsCert, source["tls-key"], fv.tlsKey, err)
	}
	return cfg, nil
}

// envName is the environment variable of a flag.
func envName(flagName string) string {
	return "LEASEHOLD_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// fillConfig sets the Config fields that need converting from the flags;
// its one error is malformed team weights.
func fillConfig(cfg *coordinator.Config, fv flagValues) error {
	weights, err := parseWeights(fv.teamWeights)
	if err != nil {
		return err
	}
	cfg.TeamWeights = weights
	cfg.MaxAttempts = uint32(min(fv.maxAttempts, math.MaxUint32))
	cfg.MaxInlineBytes = fv.maxInlineBytes
	cfg.DisableRunningCancel = !fv.runningCancel
	cfg.Unsupported = []string{}
	for _, f := range strings.Split(fv.unsupported, ",") {
		if f = strings.TrimSpace(f); f != "" {
			cfg.Unsupported = append(cfg.Unsupported, f)
		}
	}
	return nil
}

// checkFlags checks every value and returns a usageError for the first
// that is wrong, naming it as it was given (flag or variable): source maps
// a flag name to where its value came from.
func checkFlags(cfg coordinator.Config, fv flagValues, source map[string]string) error {
	// recvBytes is the receive limit the batch limits give (see
	// coordinator.Config.MaxRecvMsgSize); it must fit gRPC's 32-bit
	// message length.
	recvBytes := float64(cfg.MaxBatchInlineBytes) + float64(cfg.MaxDocuments)*coordinator.PerDocumentRecvAllowance + coordinator.RecvOverheadBytes
	checks := []struct {
		flag  string
		value any
		ok    bool
		want  string
	}{
		{"listen", strconv.Quote(cfg.Listen), hostPort(cfg.Listen), "a host:port address"},
		{"metrics-listen", strconv.Quote(cfg.MetricsListen), cfg.MetricsListen == "" || hostPort(cfg.MetricsListen), "a host:port address, or empty for no metrics"},
		{"metrics-listen", strconv.Quote(cfg.MetricsListen), cfg.MetricsListen == "" || cfg.MetricsListen != cfg.Listen, "an address other than --listen"},
		{"data-dir", strconv.Quote(cfg.DataDir), strings.TrimSpace(cfg.DataDir) != "", "a directory"},
		{"lease-ttl", cfg.LeaseTTL, cfg.LeaseTTL >= minLeaseTTL, "at least " + minLeaseTTL.String()},
		{"max-attempts", fv.maxAttempts, fv.maxAttempts >= 1 && fv.maxAttempts <= math.MaxUint32, "from 1 to 4294967295"},
		{"backoff-base", cfg.BackoffBase, cfg.BackoffBase > 0, "a positive duration"},
		{"backoff-cap", cfg.BackoffCap, cfg.BackoffCap > 0, "a positive duration"},
		{"backoff-base", cfg.BackoffBase, cfg.BackoffBase <= cfg.BackoffCap, "at most --backoff-cap (" + cfg.BackoffCap.String() + ")"},
		{"max-documents", cfg.MaxDocuments, cfg.MaxDocuments >= 1, "at least 1"},
		{"max-document-bytes", cfg.MaxDocumentBytes, cfg.MaxDocumentBytes >= 1, "at least 1"},
		{"max-batch-bytes", cfg.MaxBatchBytes, cfg.MaxBatchBytes >= 1, "at least 1"},
		{"max-inline-bytes", fv.maxInlineBytes, fv.maxInlineBytes >= 1, "at least 1"},
		{"max-batch-inline-bytes", cfg.MaxBatchInlineBytes, cfg.MaxBatchInlineBytes >= 1, "at least 1"},
		{"max-batch-inline-bytes", cfg.MaxBatchInlineBytes, recvBytes <= math.MaxInt32,
			"a size that with --max-documents keeps the largest gRPC message (this + documents × 4 KiB + 64 KiB) within 2 GiB"},
		{"max-team-queue", cfg.MaxTeamQueue, cfg.MaxTeamQueue >= 1, "at least 1"},
		{"max-artifact-bytes", cfg.MaxArtifactBytes, cfg.MaxArtifactBytes >= 1, "at least 1"},
		{"max-upload-buffer-bytes", cfg.MaxUploadBufferBytes, cfg.MaxUploadBufferBytes >= cfg.MaxArtifactBytes, "at least --max-artifact-bytes"},
		{"inline-artifact-bytes", cfg.Artifacts.InlineBytes, cfg.Artifacts.InlineBytes >= 1, "at least 1"},
		{"cluster-inline-cap-bytes", cfg.Artifacts.InlineCap, cfg.Artifacts.InlineCap >= 1, "at least 1"},
		{"artifact-sweep-grace", cfg.Artifacts.SweepGrace, cfg.Artifacts.SweepGrace > 0, "a positive duration"},
		{"artifact-sweep-interval", cfg.Artifacts.SweepInterval, cfg.Artifacts.SweepInterval > 0, "a positive duration"},
		{"team-share", cfg.TeamShare, cfg.TeamShare > 0 && cfg.TeamShare <= 1, "a share above 0 and at most 1"},
		{"replay-limit", cfg.ReplayLimit, cfg.ReplayLimit >= 1, "at least 1"},
		{"max-connections", cfg.MaxConnections, cfg.MaxConnections >= 1, "at least 1"},
		{"max-connections-per-address", cfg.MaxConnectionsPerAddress, cfg.MaxConnectionsPerAddress >= 0, "0 (an eighth of --max-connections) or more"},
		{"max-connections-per-address", cfg.MaxConnectionsPerAddress, cfg.MaxConnectionsPerAddress <= cfg.MaxConnections, "at most --max-connections"},
		{"conn-auth-timeout", cfg.ConnAuthTimeout, cfg.ConnAuthTimeout >= 100*time.Millisecond, "at least 100ms"},
		{"shutdown-timeout", cfg.ShutdownTimeout, cfg.ShutdownTimeout > 0, "a positive duration"},
		{"retention", days(cfg.Retention), validRetention(cfg.Retention), retentionWant},
		{"rejection-retention", days(cfg.RejectionRetention), validRetention(cfg.RejectionRetention), retentionWant},
		{"audit-retention", days(cfg.AuditRetention), validRetention(cfg.AuditRetention), retentionWant},
	}
	for _, c := range checks {
		if !c.ok {
			return usagef("%s=%v: want %s", source[c.flag], c.value, c.want)
		}
	}
	return nil
}

// checkAccess requires one source of principals: --tokens or --dev, not
// both and not neither, so that the public development tokens are never
// served by accident (a principals file that went missing from a
// deployment's arguments). --console-host needs a metrics address, and
// names.
func checkAccess(cfg coordinator.Config, fv flagValues, source map[string]string) error {
	switch {
	case fv.dev && cfg.TokensFile != "":
		return usagef("%s and %s exclude each other: the development tokens or a principals file", source["dev"], source["tokens"])
	case !fv.dev && cfg.TokensFile == "":
		return usagef("no principals: pass --tokens FILE (a principals file), or --dev for the public development tokens on loopback")
	case len(cfg.ConsoleHosts) > 0 && cfg.MetricsListen == "":
		return usagef("%s needs a metrics address (--metrics-listen)", source["console-host"])
	}
	if err := hostcheck.CheckHosts(cfg.ConsoleHosts); err != nil {
		return usagef("%s=%q: %v", source["console-host"], strings.Join(cfg.ConsoleHosts, ","), err)
	}
	return nil
}

// hostList is a flag of names, repeatable and comma-separated.
type hostList []string

// String implements flag.Value.
func (l *hostList) String() string { return strings.Join(*l, ",") }

// Set implements flag.Value: it adds each comma-separated name.
func (l *hostList) Set(s string) error {
	for _, n := range strings.Split(s, ",") {
		n = strings.TrimSpace(n)
		if n != "" {
			*l = append(*l, n)
		}
	}
	return nil
}

// hostPort reports whether s is a host:port address.
func hostPort(s string) bool {
	_, _, err := net.SplitHostPort(s)
	return err == nil
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
		if !ok || strings.TrimSpace(team) == "" || err != nil || n < 1 {
			return nil, fmt.Errorf("%q is not team=<positive weight>", pair)
		}
		out[strings.TrimSpace(team)] = n
	}
	return out, nil
}

// days is a duration flag that also takes whole days ("7d").
type days time.Duration

// String implements flag.Value: whole days as "7d", other durations as Go
// writes them.
func (d days) String() string {
	if v := time.Duration(d); v != 0 && v%day == 0 {
		return strconv.FormatInt(int64(v/day), 10) + "d"
	}
	return time.Duration(d).String()
}

// Set implements flag.Value.
func (d *days) Set(s string) error {
	if n, ok := strings.CutSuffix(s, "d"); ok {
		v, err := strconv.ParseUint(n, 10, 16)
		if err != nil {
			return fmt.Errorf("%q is not a whole number of days", s)
		}
		*d = days(time.Duration(v) * day)
		return nil
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("%q is neither a number of days (7d) nor a duration (36h)", s)
	}
	*d = days(v)
	return nil
}

// validRetention reports whether d is 0 (forever) or at least minRetention.
func validRetention(d time.Duration) bool { return d == 0 || d >= minRetention }

// retentionWant is what a retention flag takes.
const retentionWant = "0 (keep forever) or at least 1h"

// offlineCommands are the subcommands that work on a data directory
// without serving.
var offlineCommands = map[string]func(args []string, stderr io.Writer) error{
	"compact": runCompact,
	"restore": runRestore,
}

// runCompact runs "coordinator compact --data-dir DIR".
func runCompact(args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("coordinator compact", flag.ContinueOnError)
	dataDir := fs.String("data-dir", "./data", "data directory of the database to compact; no coordinator may be running on it")
	source, err := parseWithEnv(fs, args, "coordinator compact", stderr)
	if err != nil {
		return err
	}
	if strings.TrimSpace(*dataDir) == "" {
		return usagef("%s=\"\": want a directory", source["data-dir"])
	}
	res, err := coordinator.Compact(*dataDir)
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "compacted %s: %d bytes, now %d\n", res.Path, res.Before, res.After)
	return nil
}

// runRestore runs "coordinator restore --data-dir DIR --from FILE".
func runRestore(args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("coordinator restore", flag.ContinueOnError)
	dataDir := fs.String("data-dir", "./data", "data directory to restore into; no coordinator may be running on it")
	from := fs.String("from", "", "the backup file, as written by leasehold backup (required)")
	store := fs.String("artifact-store", "", "the coordinator's --artifact-store, where the restore looks for the objects the backup's "+
		"pointers name (empty: the directory beside the database); S3 credentials from the standard AWS environment and files")
	source, err := parseWithEnv(fs, args, "coordinator restore", stderr)
	if err != nil {
		return err
	}
	switch {
	case strings.TrimSpace(*dataDir) == "":
		return usagef("%s=\"\": want a directory", source["data-dir"])
	case *from == "":
		return usagef("--from is required: the backup file to restore")
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	res, err := coordinator.Restore(ctx, *dataDir, *from, *store, time.Now())
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "restored %s into %s (%d bytes); fencing tokens and ids go on from %d\n", *from, res.Path, res.Size, res.NextToken)
	if res.MovedAside != "" {
		fmt.Fprintf(stderr, "the database that was there is kept as %s\n", res.MovedAside)
	}
	reportRestoredObjects(stderr, res)
	return nil
}

// reportRestoredObjects says what the restore found of the objects of the
// artifact store the backup names, and which previews it cannot bring
// back.
func reportRestoredObjects(w io.Writer, res coordinator.RestoreResult) {
	switch {
	case res.Objects == 0:
	case res.ObjectsErr != nil:
		fmt.Fprintf(w, "the backup names %d objects of the artifact store %s, which did not answer: %v; run coordinator check once it does\n",
			res.Objects, res.ArtifactStore, res.ObjectsErr)
	case len(res.MissingObjects) == 0:
		fmt.Fprintf(w, "the artifact store %s holds all %d objects the backup names\n", res.ArtifactStore, res.Objects)
	default:
		fmt.Fprintf(w, "cannot bring back %d of the %d previews the backup names in the artifact store %s: their objects are missing\n",
			len(res.MissingObjects), res.Objects, res.ArtifactStore)
		for _, m := range res.MissingObjects {
			fmt.Fprintf(w, "missing: %s (%d bytes), named by %d jobs: %s\n", m.Key, m.Size, m.Count, strings.Join(m.Jobs, " "))
		}
	}
}
