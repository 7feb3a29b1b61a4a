// Package cli implements the leasehold command: one file per subcommand,
// each an options struct with flags, a Validate method and a run method
// that writes to the injected output. Main is the entry point of the
// binary; Run is the same with every dependency injected, for tests.
package cli

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"sort"
	"strings"
	"syscall"
	"time"

	"go.opentelemetry.io/otel/trace"
	"golang.org/x/term"

	"github.com/leasehold/leasehold/client"
	"github.com/leasehold/leasehold/internal/leaderdial"
)

// Exit statuses of the leasehold command.
const (
	// ExitOK means the command did what was asked.
	ExitOK = 0
	// ExitError means the command failed; the error is on stderr.
	ExitError = 1
	// ExitUsage means the command line was wrong; nothing was sent.
	ExitUsage = 2
	// ExitJobsFailed means submit --wait saw jobs end FAILED or CANCELLED.
	ExitJobsFailed = 3
	// ExitInterrupted means the command was stopped with Ctrl-C (SIGINT),
	// 128 + SIGINT as shells report it. Work already accepted by the
	// coordinator goes on.
	ExitInterrupted = 130
)

// DefaultAddr is the coordinator address used when neither --addr nor
// LEASEHOLD_ADDR is set.
const DefaultAddr = "127.0.0.1:7070"

// Env is everything the command touches outside itself. Tests replace Dial
// to reach an in-process server and IsTerminal to choose the output style.
type Env struct {
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
	// Getenv reads an environment variable (LEASEHOLD_ADDR, LEASEHOLD_TOKEN, LEASEHOLD_TEAM).
	Getenv func(string) string
	// Dial connects to the coordinator.
	Dial func(addr string, opts ...client.Option) (*client.Client, error)
	// IsTerminal reports whether w is an interactive terminal, which makes
	// submit --wait draw a progress bar instead of printing lines.
	IsTerminal func(w io.Writer) bool
	// NewRequestID returns a fresh idempotency key.
	NewRequestID func() string
	// TerminalWidth returns the width of terminal w in columns, or 0 when
	// unknown; nil means unknown. It is asked before each progress redraw.
	TerminalWidth func(w io.Writer) int
	// Now reads the clock, for the progress bar's rate and ETA; nil means time.Now.
	Now func() time.Time
	// BuildInfo returns the binary's build information; nil means
	// runtime/debug.ReadBuildInfo.
	BuildInfo func() (*debug.BuildInfo, bool)
	// TracerProvider traces the command and its calls; nil means the one
	// the OTEL_* variables configure, if any (see package
	// internal/tracing).
	TracerProvider trace.TracerProvider
}

// DefaultEnv returns the environment of a real process writing to the
// given streams.
func DefaultEnv(stdin io.Reader, stdout, stderr io.Writer) Env {
	return Env{
		Stdin:         stdin,
		Stdout:        stdout,
		Stderr:        stderr,
		Getenv:        os.Getenv,
		Dial:          client.Dial,
		IsTerminal:    isTerminal,
		NewRequestID:  randomRequestID,
		TerminalWidth: terminalWidth,
		Now:           time.Now,
		BuildInfo:     debug.ReadBuildInfo,
	}
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

func terminalWidth(w io.Writer) int {
	f, ok := w.(*os.File)
	if !ok {
		return 0
	}
	width, _, err := term.GetSize(int(f.Fd()))
	if err != nil {
		return 0
	}
	return width
}

// now reads env's clock.
func (env Env) now() time.Time {
	if env.Now == nil {
		return time.Now()
	}
	return env.Now()
}

func randomRequestID() string {
	var b [12]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return "cli-" + hex.EncodeToString(b[:])
}

// Main runs the command line args (without the program name) and returns
// the exit status. The first SIGINT or SIGTERM cancels the command's
// context, with errInterrupted or errTerminated as its cause, and restores
// the signals' default action, so that a second Ctrl-C kills at once.
func Main(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	ctx, stop := cancelOnSignal(context.Background(), sigs, func() { signal.Stop(sigs) })
	defer stop()
	defer signal.Stop(sigs)
	return Run(ctx, DefaultEnv(stdin, stdout, stderr), args)
}

// The causes of the command context's cancellation by a signal.
var (
	// errInterrupted is the cause when the user pressed Ctrl-C (SIGINT).
	errInterrupted = errors.New("interrupted")
	// errTerminated is the cause of SIGTERM.
	errTerminated = errors.New("terminated")
)

// cancelOnSignal returns a context that is cancelled when the first signal
// arrives on sigs, with errInterrupted (os.Interrupt) or errTerminated
// (anything else) as its cause; afterFirst is then called. stop releases
// the watching goroutine and cancels the context; call it when done.
func cancelOnSignal(parent context.Context, sigs <-chan os.Signal, afterFirst func()) (ctx context.Context, stop func()) {
	ctx, cancel := context.WithCancelCause(parent)
	done := make(chan struct{})
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		select {
		case sig := <-sigs:
			cause := errTerminated
			if sig == os.Interrupt {
				cause = errInterrupted
			}
			cancel(cause)
			if afterFirst != nil {
				afterFirst()
			}
		case <-done:
		case <-ctx.Done():
		}
	}()
	return ctx, func() {
		close(done)
		<-exited
		cancel(context.Canceled)
	}
}

// interrupted reports whether ctx was cancelled by Ctrl-C.
func interrupted(ctx context.Context) bool {
	return errors.Is(context.Cause(ctx), errInterrupted)
}

// subcommand is one leasehold subcommand. The framework registers its flags
// and the global ones, parses the command line (flags may follow
// positional arguments), hands over the positional arguments, calls
// Validate, dials, and runs it.
type subcommand interface {
	// flags registers the subcommand's own flags.
	flags(fs *flag.FlagSet, env Env)
	// setArgs receives the positional arguments.
	setArgs(args []string)
	// Validate checks the options before anything is sent; its error is a usage error.
	Validate() error
	// run executes the subcommand.
	run(ctx context.Context, a *app) error
}

// clientOptioner is implemented by subcommands whose flags configure the
// client they run with (submit's batch limits).
type clientOptioner interface {
	clientOptions() []client.Option
}

// command describes a subcommand for dispatch and help.
type command struct {
	name    string
	args    string // the synopsis after the name
	summary string
	new     func() subcommand
	// offline commands run without a coordinator; their app has no client.
	offline bool
}

var commands = []command{
	{"submit", "[--team T] [--request-id ID] [--wait] [--max-attempts N] [--max-batch-documents N] [--max-batch-inline-bytes SIZE] [--max-batch-bytes SIZE] FILE|DIR...", "Submit documents for preview, in batches within the coordinator's limits.", func() subcommand { return &submitOpts{} }, false},
	{"get", "JOB", "Show a job: phase, attempt, lease, terminal reason and history.", func() subcommand { return &getOpts{} }, false},
	{"list", "[--batch B] [--team T] [--phase P] [--limit N]", "List jobs in id order.", func() subcommand { return &listOpts{} }, false},
	{"watch", "BATCH", "Print a batch's job events until every job is terminal, across coordinator restarts.", func() subcommand { return &watchOpts{} }, false},
	{"artifact", "JOB [-f FILE] [--presign]", "Download a job's preview and verify its SHA-256 digest.", func() subcommand { return &artifactOpts{} }, false},
	{"cancel", "JOB | --batch B [--reason R]", "Cancel a job or every unfinished job of a batch.", func() subcommand { return &cancelOpts{} }, false},
	{"replay", "(--job J ... | --batch B [--terminal-reason R]) --reason TEXT [--include-permanent] [--yes] [--request-id ID]", "Re-queue FAILED jobs: always a dry run first; --yes performs it.", func() subcommand { return &replayOpts{} }, false},
	{"rejections", "[--job J] [--renderer R] [--since RFC3339] [--limit N]", "List completions refused by the fencing check, newest first.", func() subcommand { return &rejectionsOpts{} }, false},
	{"audit", "[--limit N]", "List operator audit records, newest first.", func() subcommand { return &auditOpts{} }, false},
	{"top", "[--team T] [--interval 2s] [--count N] [--renderers=false]", "Show live per-team queues, throughput and renderers, and a cluster's members and lag to an operator of every team; plain tables when not a terminal.", func() subcommand { return &topOpts{} }, false},
	{"batches", "[--team T] [--state running|done] [--since WHEN] [--until WHEN] [--limit N] [--page-token T]", "List batches newest first with their counts per phase.", func() subcommand { return &batchesOpts{} }, false},
	{"renderers", "", "List the renderers with their capacity, leases and last contact.", func() subcommand { return &renderersOpts{} }, false},
	{"pause", "--reason R", "Pause dispatch: no new leases are granted.", func() subcommand { return &pauseOpts{} }, false},
	{"resume", "--reason R", "Resume dispatch.", func() subcommand { return &resumeOpts{} }, false},
	{"backup", "-f FILE [--force]", "Download a consistent copy of the database, every team's documents included, and verify its size and SHA-256; needs a token with the backup role.", func() subcommand { return &backupOpts{} }, false},
	{"version", "", "Print the version and VCS revision this binary was built from.", func() subcommand { return &versionOpts{} }, true},
	{"completion", "bash|zsh|fish", "Print a shell completion script for leasehold.", func() subcommand { return &completionOpts{} }, true},
}

func findCommand(name string) (command, bool) {
	for _, c := range commands {
		if c.name == name {
			return c, true
		}
	}
	return command{}, false
}

// usageError is a command-line mistake: it exits with ExitUsage.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// exitError ends the command with a specific status after printing msg.
type exitError struct {
	code int
	msg  string
}

func (e *exitError) Error() string { return e.msg }

// Run executes args in env and returns the exit status. The global flags
// may come before the command as well as after it
// (leasehold --addr X -o json list); a command's own flags follow it.
func Run(ctx context.Context, env Env, args []string) int {
	inv, code, ok := parseCommandLine(env, args)
	if !ok {
		return code
	}
	a := &app{env: env, g: inv.g, out: env.Stdout}
	endSpan := func(error) {}
	if !inv.c.offline {
		tp, flush, err := startTracing(ctx, env)
		if err != nil {
			return report(env.Stderr, err)
		}
		defer flush()
		ctx, endSpan = startCommandSpan(ctx, tp, inv.c.name)
		cl, err := dialFor(env, inv, tp)
		if err != nil {
			endSpan(err)
			return report(env.Stderr, unreachable(plaintextHint(err), inv.g.Addr, inv.g.tr.config != nil))
		}
		defer cl.Close()
		a.c = cl
	}
	if inv.g.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, inv.g.Timeout)
		defer cancel()
	}
	err := inv.sub.run(ctx, a)
	endSpan(err)
	var ee *exitError
	if err != nil && interrupted(ctx) && !errors.As(err, &ee) {
		err = &exitError{code: ExitInterrupted, msg: "interrupted"}
	}
	return report(env.Stderr, unreachable(err, inv.g.Addr, inv.g.tr.config != nil))
}

// invocation is a parsed and validated command line.
type invocation struct {
	c   command
	sub subcommand
	g   globalOpts
}

// parseCommandLine parses the global flags before the command, the command,
// and its flags and arguments, and validates them. When there is nothing to
// run (help, or a usage error, reported on env's streams) it returns ok
// false and the exit status.
func parseCommandLine(env Env, args []string) (inv invocation, code int, ok bool) {
	g := newGlobalOpts(env)
	pre := flag.NewFlagSet("leasehold", flag.ContinueOnError)
	pre.SetOutput(io.Discard)
	pre.Usage = func() {}
	g.register(pre)
	if err := pre.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printUsage(env.Stdout)
			return inv, ExitOK, false
		}
		fmt.Fprintf(env.Stderr, "leasehold: %v\nOnly the global flags (--addr, --token, --tls*, --insecure-plaintext, -o, --timeout, --stale) may come before the command.\nRun 'leasehold help' for usage.\n", err)
		return inv, ExitUsage, false
	}
	args = pre.Args()
	switch {
	case len(args) == 0:
		printUsage(env.Stderr)
		return inv, ExitUsage, false
	case args[0] == "help":
		return inv, runHelp(env, args[1:]), false
	}
	c, found := findCommand(args[0])
	if !found {
		fmt.Fprintf(env.Stderr, "leasehold: unknown command %q\nRun 'leasehold help' for usage.\n", args[0])
		return inv, ExitUsage, false
	}
	sub := c.new()
	fs := newFlagSet(c, env, sub, &g)
	pos, err := parseInterspersed(fs, args[1:])
	if errors.Is(err, flag.ErrHelp) {
		printCommandUsage(env.Stdout, c, fs)
		return inv, ExitOK, false
	}
	if err == nil {
		sub.setArgs(pos)
		err = g.Validate()
	}
	if err == nil {
		err = sub.Validate()
	}
	if err != nil {
		fmt.Fprintf(env.Stderr, "leasehold %s: %v\nusage: leasehold %s %s\nRun 'leasehold help %s' for details.\n", c.name, err, c.name, c.args, c.name)
		return inv, ExitUsage, false
	}
	return invocation{c: c, sub: sub, g: g}, ExitOK, true
}

// runHelp prints the usage, or with a command name that command's, and
// returns the exit status.
func runHelp(env Env, args []string) int {
	if len(args) == 0 {
		printUsage(env.Stdout)
		return ExitOK
	}
	c, ok := findCommand(args[0])
	if !ok {
		fmt.Fprintf(env.Stderr, "leasehold: unknown command %q\n", args[0])
		return ExitUsage
	}
	g := newGlobalOpts(env)
	printCommandUsage(env.Stdout, c, newFlagSet(c, env, c.new(), &g))
	return ExitOK
}

// dialFor connects to the coordinator with the invocation's token and
// transport, tracing with tp when set, and the client options its
// subcommand asks for.
func dialFor(env Env, inv invocation, tp trace.TracerProvider) (*client.Client, error) {
	opts := inv.g.tr.clientOptions()
	if inv.g.Token != "" {
		opts = append(opts, client.WithToken(inv.g.Token))
	}
	if inv.g.Stale {
		opts = append(opts, client.WithStaleReads())
	}
	if tp != nil {
		opts = append(opts, client.WithTracerProvider(tp))
	}
	if co, ok := inv.sub.(clientOptioner); ok {
		opts = append(opts, co.clientOptions()...)
	}
	return env.Dial(inv.g.Addr, opts...)
}

// report prints err as "leasehold: <message> (CODE REASON)", with any field
// violations on the following lines, and returns the exit status.
func report(w io.Writer, err error) int {
	if err == nil {
		return ExitOK
	}
	var ee *exitError
	if errors.As(err, &ee) {
		fmt.Fprintf(w, "leasehold: %s\n", ee.msg)
		return ee.code
	}
	var ue *usageError
	if errors.As(err, &ue) {
		fmt.Fprintf(w, "leasehold: %s\n", ue.msg)
		return ExitUsage
	}
	fmt.Fprintf(w, "leasehold: %v\n", err)
	var ce *client.Error
	if errors.As(err, &ce) {
		for _, v := range ce.Violations {
			fmt.Fprintf(w, "  %s: %s\n", v.Field, v.Description)
		}
	}
	return ExitError
}

// globalOpts are the flags every subcommand accepts.
type globalOpts struct {
	Addr    string
	Token   string
	Output  string
	Timeout time.Duration
	// Stale lets reads be served by any replica (client.WithStaleReads).
	Stale bool
	// tr holds the transport flags (TLS).
	tr transportOpts
}

// newGlobalOpts returns the global options before any flag: the address
// and token from the environment, table output, no timeout.
func newGlobalOpts(env Env) globalOpts {
	g := globalOpts{Addr: DefaultAddr, Token: getenv(env, "LEASEHOLD_TOKEN"), Output: "table", tr: newTransportOpts(env)}
	if v := getenv(env, "LEASEHOLD_ADDR"); v != "" {
		g.Addr = v
	}
	return g
}

// register adds the global flags to fs with g's current values as their
// defaults, so that flags parsed before the command stay in force unless
// repeated after it.
func (g *globalOpts) register(fs *flag.FlagSet) {
	fs.StringVar(&g.Addr, "addr", g.Addr, "coordinator `address`: host:port, a cluster's replicas as host:port,host:port,..., or a gRPC target such as dns:///name:port (env LEASEHOLD_ADDR)")
	fs.StringVar(&g.Token, "token", g.Token, "bearer `token` (env LEASEHOLD_TOKEN)")
	fs.StringVar(&g.Output, "output", g.Output, "output `format`: table or json (one JSON object per line)")
	fs.StringVar(&g.Output, "o", g.Output, "shorthand for --output")
	fs.DurationVar(&g.Timeout, "timeout", g.Timeout, "give up after this `duration` (0: no limit)")
	fs.BoolVar(&g.Stale, "stale", g.Stale, "let reads be served by any replica of a cluster, leader or not: they may miss the latest writes")
	g.tr.register(fs)
}

// Validate checks the global flags.
func (g *globalOpts) Validate() error {
	if g.Output != "table" && g.Output != "json" {
		return usagef("--output must be table or json, not %q", g.Output)
	}
	if g.Timeout < 0 {
		return usagef("--timeout must not be negative")
	}
	if g.Addr == "" {
		return usagef("--addr must not be empty")
	}
	if _, err := leaderdial.Parse(g.Addr); err != nil {
		return usagef("--addr: %v", err)
	}
	return g.tr.Validate()
}

func getenv(env Env, key string) string {
	if env.Getenv == nil {
		return ""
	}
	return env.Getenv(key)
}

func newFlagSet(c command, env Env, sub subcommand, g *globalOpts) *flag.FlagSet {
	fs := flag.NewFlagSet("leasehold "+c.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	sub.flags(fs, env)
	g.register(fs)
	return fs
}

// parseInterspersed parses flags that may appear before, between and after
// positional arguments, and returns the positional arguments. Everything
// after "--" is positional.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		consumed := len(args) - len(rest)
		if consumed > 0 && args[consumed-1] == "--" {
			return append(pos, rest...), nil
		}
		if len(rest) == 0 {
			return pos, nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

const usageHeader = `leasehold is the command-line client of the Leasehold preview coordinator.

usage: leasehold [global flags] <command> [flags] [arguments]

commands:
`

const usageFooter = `
global flags (before or after the command):
  --addr ADDR        coordinator address (env LEASEHOLD_ADDR, default ` + DefaultAddr + `); for a cluster, every
                     replica as host:port,host:port,... or a dns:///name:port target: calls go to the leader
  --stale            reads may be served by any replica, leader or not, and miss the latest writes
  --token TOKEN      bearer token (env LEASEHOLD_TOKEN)
  -o, --output FMT   table (default) or json: one JSON object per line, snake_case field names
  --timeout DUR      give up after DUR, e.g. 30s (default: no limit)
  --tls-ca FILE      connect over TLS, verifying the coordinator with these CAs (env LEASEHOLD_TLS_CA);
                     --tls alone uses the system's; --tls-cert/--tls-key add a client certificate (mutual TLS),
                     --tls-server-name the name to verify. Without TLS the token goes only to loopback,
                     unless --insecure-plaintext (a network that encrypts on its own, such as a service mesh)

exit status: 0 success, 1 error, 2 usage error, 3 submit --wait saw jobs end FAILED or CANCELLED,
130 interrupted (Ctrl-C); what the coordinator accepted goes on.
Run 'leasehold help <command>' for a command's flags.
`

func printUsage(w io.Writer) {
	io.WriteString(w, usageHeader)
	names := make([]string, 0, len(commands))
	byName := map[string]command{}
	for _, c := range commands {
		names = append(names, c.name)
		byName[c.name] = c
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-11s %s\n", n, byName[n].summary)
	}
	io.WriteString(w, usageFooter)
}

// longHelper is implemented by subcommands with more to say in their help
// than the summary.
type longHelper interface {
	longHelp() string
}

func printCommandUsage(w io.Writer, c command, fs *flag.FlagSet) {
	fmt.Fprintf(w, "usage: leasehold %s %s\n\n%s\n\n", c.name, c.args, c.summary)
	if h, ok := c.new().(longHelper); ok {
		fmt.Fprintf(w, "%s\n\n", h.longHelp())
	}
	io.WriteString(w, "flags:\n")
	var b strings.Builder
	fs.SetOutput(&b)
	fs.PrintDefaults()
	fs.SetOutput(io.Discard)
	io.WriteString(w, b.String())
}
