package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/leasehold/leasehold/client"
	"github.com/leasehold/leasehold/client/limits"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
)

// submitOpts are the options of "leasehold submit".
type submitOpts struct {
	Team        string
	RequestID   string
	Wait        bool
	MaxAttempts int
	// The batch limits: the coordinator's defaults unless it was
	// configured with others.
	MaxBatchDocuments   int
	MaxBatchInlineBytes byteSize
	MaxBatchBytes       byteSize
	Paths               []string
}

func (o *submitOpts) flags(fs *flag.FlagSet, env Env) {
	fs.StringVar(&o.Team, "team", getenv(env, "LEASEHOLD_TEAM"), "`team` that owns the batch (env LEASEHOLD_TEAM)")
	fs.StringVar(&o.RequestID, "request-id", "", "idempotency key `ID` (default: random); batch i is sent as ID-i")
	fs.BoolVar(&o.Wait, "wait", false, "watch the batches until every job is terminal; exit 3 if any FAILED or was CANCELLED")
	fs.IntVar(&o.MaxAttempts, "max-attempts", 0, "attempts per job, `N` (default: the coordinator's)")
	fs.IntVar(&o.MaxBatchDocuments, "max-batch-documents", client.DefaultMaxBatchDocuments, "split into batches of at most `N` documents (the coordinator's --max-documents)")
	o.MaxBatchInlineBytes = client.DefaultMaxBatchInlineBytes
	fs.Var(&o.MaxBatchInlineBytes, "max-batch-inline-bytes", "split into batches of at most `SIZE` of inline content, such as 16MiB (the coordinator's limit)")
	o.MaxBatchBytes = client.DefaultMaxBatchDeclaredBytes
	fs.Var(&o.MaxBatchBytes, "max-batch-bytes", "split into batches declaring at most `SIZE` in all, such as 200MiB (the coordinator's --max-batch-bytes)")
}

func (o *submitOpts) setArgs(args []string) { o.Paths = args }

// Validate checks that there is something to submit and the numbers make sense.
func (o *submitOpts) Validate() error {
	if len(o.Paths) == 0 {
		return usagef("submit needs at least one FILE or DIR")
	}
	if o.MaxAttempts < 0 {
		return usagef("--max-attempts must not be negative")
	}
	if len(client.BatchRequestID(o.RequestID, 0)) > limits.MaxRequestIDBytes {
		return usagef("--request-id must be at most %d bytes", limits.MaxRequestIDBytes-len(client.BatchRequestID("", 0)))
	}
	if o.MaxBatchDocuments <= 0 {
		return usagef("--max-batch-documents must be positive")
	}
	if o.MaxBatchInlineBytes <= 0 || o.MaxBatchBytes <= 0 {
		return usagef("--max-batch-inline-bytes and --max-batch-bytes must be positive")
	}
	return nil
}

// clientOptions gives the client the batch limits to split by.
func (o *submitOpts) clientOptions() []client.Option {
	return []client.Option{client.WithBatchLimits(client.BatchLimits{
		MaxDocuments:     o.MaxBatchDocuments,
		MaxInlineBytes:   int64(o.MaxBatchInlineBytes),
		MaxDeclaredBytes: int64(o.MaxBatchBytes),
	})}
}

// expandPaths returns the files to submit: each file argument, and the
// regular files of each directory argument (not recursive) sorted by name.
// Document names are base names, so two files with the same base name are
// an error.
func expandPaths(args []string) ([]string, error) {
	var files []string
	seen := map[string]string{}
	add := func(path string) error {
		name := filepath.Base(path)
		if prev, dup := seen[name]; dup {
			return fmt.Errorf("%s and %s would both be submitted as %q; document names must be unique", prev, path, name)
		}
		seen[name] = path
		files = append(files, path)
		return nil
	}
	for _, arg := range args {
		info, err := os.Stat(arg)
		if err != nil {
			return nil, err
		}
		switch {
		case info.Mode().IsRegular():
			if err := add(arg); err != nil {
				return nil, err
			}
		case info.IsDir():
			entries, err := os.ReadDir(arg) // sorted by name
			if err != nil {
				return nil, err
			}
			for _, e := range entries {
				p := filepath.Join(arg, e.Name())
				fi, err := os.Stat(p) // follows symlinks to files
				if err != nil || !fi.Mode().IsRegular() {
					continue
				}
				if err := add(p); err != nil {
					return nil, err
				}
			}
		default:
			return nil, fmt.Errorf("%s is neither a regular file nor a directory", arg)
		}
	}
	if len(files) == 0 {
		return nil, errors.New("no files to submit")
	}
	return files, nil
}

func (o *submitOpts) run(ctx context.Context, a *app) error {
	files, err := expandPaths(o.Paths)
	if err != nil {
		return fmt.Errorf("submit: %w", err)
	}
	requestID := o.RequestID
	if requestID == "" {
		requestID = a.env.NewRequestID()
	}
	opts := client.SubmitOptions{OnBatch: func(_, _ int, resp *leaseholdv1.SubmitBatchResponse) error {
		return printSubmitted(a, resp)
	}}
	if o.MaxAttempts > 0 {
		opts.RetryPolicy = &leaseholdv1.RetryPolicy{MaxAttempts: uint32(o.MaxAttempts)}
	}
	resps, err := a.c.SubmitFiles(ctx, o.Team, requestID, files, opts)
	if err != nil {
		var se *client.SubmitError
		if errors.As(err, &se) && se.Accepted > 0 {
			fmt.Fprintf(a.env.Stderr, "leasehold: %d of %d batches were accepted; run the same command with --request-id %s to submit the rest without duplicates\n", se.Accepted, se.Batches, requestID)
		}
		return err
	}
	batches := make([]*leaseholdv1.Batch, len(resps))
	for i, r := range resps {
		batches[i] = r.GetBatch()
	}
	if !a.jsonOutput() && len(batches) > 1 {
		fmt.Fprintf(a.out, "submitted %d jobs in %d batches\n", len(files), len(batches))
	}
	if !o.Wait {
		return nil
	}
	return waitForBatches(ctx, a, batches, len(files))
}

// printSubmitted reports one accepted batch.
func printSubmitted(a *app, resp *leaseholdv1.SubmitBatchResponse) error {
	if a.jsonOutput() {
		return a.printJSON(resp)
	}
	note := ""
	if resp.GetReplayed() {
		note = " (already submitted with this request id; nothing new stored)"
	}
	_, err := fmt.Fprintf(a.out, "batch %s: %d jobs (request id %s)%s\n", resp.GetBatch().GetId(), resp.GetBatch().GetJobCount(), resp.GetBatch().GetRequestId(), note)
	return err
}

// waitForBatches follows the batches one after another until each is
// done, asking only for outcomes, drawing a progress bar on a terminal and
// printing one line per finished job otherwise, and fails with
// ExitJobsFailed when any job ended FAILED or CANCELLED. Interrupted by
// Ctrl-C, it says which batches go on and how to follow or cancel them.
func waitForBatches(ctx context.Context, a *app, batches []*leaseholdv1.Batch, total int) error {
	var bar *progressBar
	if !a.jsonOutput() && a.env.IsTerminal != nil && a.env.IsTerminal(a.out) {
		bar = newProgressBar(a.out, a.env, total)
	}
	finished := map[leaseholdv1.Phase]uint32{} // counts of the batches already done
	opts := client.FollowOptions{TerminalOnly: true, Batched: true}
	for i, b := range batches {
		final, err := followBatch(ctx, a, b.GetId(), opts, bar, func(u client.Update) error {
			switch {
			case a.jsonOutput():
				return a.printJSON(updateMessage(u))
			case bar != nil:
				bar.draw(finished, countsOf(u.Batch))
				return nil
			case u.Event != nil || terminalPhase(u.Phase):
				// Snapshots of jobs still on their way are noise right after
				// submitting; terminal ones (rejected formats) are news.
				_, err := fmt.Fprintln(a.out, eventLine(u))
				return err
			}
			return nil
		})
		if err != nil {
			if bar != nil {
				bar.finish()
			}
			if interrupted(ctx) {
				return stillRunning(a, batches[i:])
			}
			return err
		}
		for p, n := range countsOf(final) {
			finished[p] += n
		}
	}
	if bar != nil {
		bar.draw(finished, nil)
		bar.finish()
	}
	failed := finished[leaseholdv1.Phase_PHASE_FAILED]
	cancelled := finished[leaseholdv1.Phase_PHASE_CANCELLED]
	if !a.jsonOutput() {
		fmt.Fprintf(a.out, "done: %s\n", summarize(finished))
	}
	if failed+cancelled > 0 {
		return &exitError{code: ExitJobsFailed, msg: fmt.Sprintf("%d jobs failed and %d were cancelled", failed, cancelled)}
	}
	return nil
}

// stillRunning is the ExitInterrupted error of a wait stopped by Ctrl-C:
// the batches not yet seen done go on on the server, and it says how to
// follow or cancel each.
func stillRunning(a *app, batches []*leaseholdv1.Batch) error {
	var b strings.Builder
	if len(batches) == 1 {
		fmt.Fprintf(&b, "interrupted; batch %s continues on the server.", batches[0].GetId())
	} else {
		ids := make([]string, len(batches))
		for i, bt := range batches {
			ids[i] = bt.GetId()
		}
		fmt.Fprintf(&b, "interrupted; batches %s continue on the server.", strings.Join(ids, ", "))
	}
	addr := ""
	if a.g.Addr != newGlobalOpts(a.env).Addr {
		addr = " --addr " + a.g.Addr
	}
	for _, bt := range batches {
		fmt.Fprintf(&b, "\n  follow it:  leasehold%s watch %s\n  cancel it:  leasehold%s cancel --batch %s", addr, bt.GetId(), addr, bt.GetId())
	}
	return &exitError{code: ExitInterrupted, msg: b.String()}
}

// terminalPhase reports whether p is SUCCEEDED, FAILED or CANCELLED.
func terminalPhase(p leaseholdv1.Phase) bool {
	switch p {
	case leaseholdv1.Phase_PHASE_SUCCEEDED, leaseholdv1.Phase_PHASE_FAILED, leaseholdv1.Phase_PHASE_CANCELLED:
		return true
	}
	return false
}
