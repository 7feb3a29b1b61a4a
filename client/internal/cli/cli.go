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
	"sort"
	"strings"
	"syscall"
	"time"

	"golang.org/x/term"

	"github.com/leasehold/leasehold/client"
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
}

// DefaultEnv returns the environment of a real process writing to the
// given streams.
func DefaultEnv(stdin io.Reader, stdout, stderr io.Writer) Env {
	return Env{
		Stdin:        stdin,
		Stdout:       stdout,
		Stderr:       stderr,
		Getenv:       os.Getenv,
		Dial:         client.Dial,
		IsTerminal:   isTerminal,
		NewRequestID: randomRequestID,
	}
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

func randomRequestID() string {
	var b [12]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return "cli-" + hex.EncodeToString(b[:])
}

// Main runs the command line args (without the program name) and returns
// the exit status. An interrupt or SIGTERM cancels the command's context.
func Main(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return Run(ctx, DefaultEnv(stdin, stdout, stderr), args)
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

// command describes a subcommand for dispatch and help.
type command struct {
	name    string
	args    string // the synopsis after the name
	summary string
	new     func() subcommand
}

var commands = []command{
	{"submit", "[--team T] [--request-id ID] [--wait] [--max-attempts N] FILE|DIR...", "Submit documents for preview, in batches of at most 500.", func() subcommand { return &submitOpts{} }},
	{"get", "JOB", "Show a job: phase, attempt, lease, terminal reason and history.", func() subcommand { return &getOpts{} }},
	{"list", "[--batch B] [--team T] [--phase P] [--limit N]", "List jobs in id order.", func() subcommand { return &listOpts{} }},
	{"watch", "BATCH", "Print a batch's job events until every job is terminal.", func() subcommand { return &watchOpts{} }},
	{"artifact", "JOB [-f FILE]", "Download a job's preview and verify its SHA-256 digest.", func() subcommand { return &artifactOpts{} }},
	{"cancel", "JOB | --batch B [--reason R]", "Cancel a job or every unfinished job of a batch.", func() subcommand { return &cancelOpts{} }},
	{"replay", "(--job J ... | --batch B [--terminal-reason R]) --reason TEXT [--include-permanent] [--yes] [--request-id ID]", "Re-queue FAILED jobs: always a dry run first; --yes performs it.", func() subcommand { return &replayOpts{} }},
	{"rejections", "[--job J] [--renderer R] [--since RFC3339] [--limit N]", "List completions refused by the fencing check, newest first.", func() subcommand { return &rejectionsOpts{} }},
	{"audit", "[--limit N]", "List operator audit records, newest first.", func() subcommand { return &auditOpts{} }},
	{"pause", "--reason R", "Pause dispatch: no new leases are granted.", func() subcommand { return &pauseOpts{} }},
	{"resume", "--reason R", "Resume dispatch.", func() subcommand { return &resumeOpts{} }},
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

// Run executes args in env and returns the exit status.
func Run(ctx context.Context, env Env, args []string) int {
	if len(args) == 0 {
		printUsage(env.Stderr)
		return ExitUsage
	}
	name := args[0]
	switch name {
	case "help", "-h", "-help", "--help":
		if len(args) > 1 && name == "help" {
			c, ok := findCommand(args[1])
			if !ok {
				fmt.Fprintf(env.Stderr, "leasehold: unknown command %q\n", args[1])
				return ExitUsage
			}
			printCommandUsage(env.Stdout, c, newFlagSet(c, env, c.new(), &globalOpts{}))
			return ExitOK
		}
		printUsage(env.Stdout)
		return ExitOK
	}
	c, ok := findCommand(name)
	if !ok {
		fmt.Fprintf(env.Stderr, "leasehold: unknown command %q\nRun 'leasehold help' for usage.\n", name)
		return ExitUsage
	}
	sub := c.new()
	var g globalOpts
	fs := newFlagSet(c, env, sub, &g)
	pos, err := parseInterspersed(fs, args[1:])
	if errors.Is(err, flag.ErrHelp) {
		printCommandUsage(env.Stdout, c, fs)
		return ExitOK
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
		return ExitUsage
	}

	var opts []client.Option
	if g.Token != "" {
		opts = append(opts, client.WithToken(g.Token))
	}
	cl, err := env.Dial(g.Addr, opts...)
	if err != nil {
		return report(env.Stderr, err)
	}
	defer cl.Close()
	if g.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, g.Timeout)
		defer cancel()
	}
	a := &app{env: env, g: g, c: cl, out: env.Stdout}
	return report(env.Stderr, sub.run(ctx, a))
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
}

func (g *globalOpts) register(fs *flag.FlagSet, env Env) {
	addr := DefaultAddr
	if v := getenv(env, "LEASEHOLD_ADDR"); v != "" {
		addr = v
	}
	fs.StringVar(&g.Addr, "addr", addr, "coordinator `address` (env LEASEHOLD_ADDR)")
	fs.StringVar(&g.Token, "token", getenv(env, "LEASEHOLD_TOKEN"), "bearer `token` (env LEASEHOLD_TOKEN)")
	fs.StringVar(&g.Output, "output", "table", "output `format`: table or json (one JSON object per line)")
	fs.StringVar(&g.Output, "o", "table", "shorthand for --output")
	fs.DurationVar(&g.Timeout, "timeout", 0, "give up after this `duration` (0: no limit)")
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
	return nil
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
	g.register(fs, env)
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

usage: leasehold <command> [flags] [arguments]

commands:
`

const usageFooter = `
global flags (every command):
  --addr ADDR        coordinator address (env LEASEHOLD_ADDR, default ` + DefaultAddr + `)
  --token TOKEN      bearer token (env LEASEHOLD_TOKEN)
  -o, --output FMT   table (default) or json: one JSON object per line, snake_case field names
  --timeout DUR      give up after DUR, e.g. 30s (default: no limit)

exit status: 0 success, 1 error, 2 usage error, 3 submit --wait saw jobs end FAILED or CANCELLED.
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

func printCommandUsage(w io.Writer, c command, fs *flag.FlagSet) {
	fmt.Fprintf(w, "usage: leasehold %s %s\n\n%s\n\nflags:\n", c.name, c.args, c.summary)
	var b strings.Builder
	fs.SetOutput(&b)
	fs.PrintDefaults()
	fs.SetOutput(io.Discard)
	io.WriteString(w, b.String())
}
