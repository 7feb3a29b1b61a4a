package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/leasehold/leasehold/client"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
)

// Batch limits the CLI applies when it splits files into batches.
const (
	// MaxBatchDocs is the most documents one SubmitBatch call carries.
	MaxBatchDocs = 500
	// MaxBatchInlineBytes is the most inline content one SubmitBatch call
	// carries, kept under gRPC's default 4 MiB message limit.
	MaxBatchInlineBytes = 3 << 20
)

// submitOpts are the options of "leasehold submit".
type submitOpts struct {
	Team        string
	RequestID   string
	Wait        bool
	MaxAttempts int
	Paths       []string
}

func (o *submitOpts) flags(fs *flag.FlagSet, env Env) {
	fs.StringVar(&o.Team, "team", getenv(env, "LEASEHOLD_TEAM"), "`team` that owns the batch (env LEASEHOLD_TEAM)")
	fs.StringVar(&o.RequestID, "request-id", "", "idempotency key `ID` (default: random); batch i is sent as ID-i")
	fs.BoolVar(&o.Wait, "wait", false, "watch the batches until every job is terminal; exit 3 if any FAILED or was CANCELLED")
	fs.IntVar(&o.MaxAttempts, "max-attempts", 0, "attempts per job, `N` (default: the coordinator's)")
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
	if len(o.RequestID) > 120 {
		return usagef("--request-id must be at most 120 bytes")
	}
	return nil
}

// expandPaths returns the files to submit: each file argument, and the
// regular files of each directory argument (not recursive) sorted by name.
// Document names are base names, so two files with the same base name are
// an error.
func expandPaths(args []string) ([]string, []int64, error) {
	var (
		files []string
		sizes []int64
	)
	seen := map[string]string{}
	add := func(path string, info os.FileInfo) error {
		name := filepath.Base(path)
		if prev, dup := seen[name]; dup {
			return fmt.Errorf("%s and %s would both be submitted as %q; document names must be unique", prev, path, name)
		}
		seen[name] = path
		files = append(files, path)
		sizes = append(sizes, info.Size())
		return nil
	}
	for _, arg := range args {
		info, err := os.Stat(arg)
		if err != nil {
			return nil, nil, err
		}
		switch {
		case info.Mode().IsRegular():
			if err := add(arg, info); err != nil {
				return nil, nil, err
			}
		case info.IsDir():
			entries, err := os.ReadDir(arg) // sorted by name
			if err != nil {
				return nil, nil, err
			}
			for _, e := range entries {
				p := filepath.Join(arg, e.Name())
				fi, err := os.Stat(p) // follows symlinks to files
				if err != nil || !fi.Mode().IsRegular() {
					continue
				}
				if err := add(p, fi); err != nil {
					return nil, nil, err
				}
			}
		default:
			return nil, nil, fmt.Errorf("%s is neither a regular file nor a directory", arg)
		}
	}
	if len(files) == 0 {
		return nil, nil, errors.New("no files to submit")
	}
	return files, sizes, nil
}

// chunkFiles splits files into batches of at most MaxBatchDocs documents
// and MaxBatchInlineBytes of inline content, keeping their order.
func chunkFiles(files []string, sizes []int64) [][]string {
	var (
		chunks [][]string
		cur    []string
		inline int64
	)
	for i, f := range files {
		n := int64(0)
		if sizes[i] <= client.InlineLimit {
			n = sizes[i]
		}
		if len(cur) == MaxBatchDocs || (len(cur) > 0 && inline+n > MaxBatchInlineBytes) {
			chunks = append(chunks, cur)
			cur, inline = nil, 0
		}
		cur = append(cur, f)
		inline += n
	}
	if len(cur) > 0 {
		chunks = append(chunks, cur)
	}
	return chunks
}

func (o *submitOpts) run(ctx context.Context, a *app) error {
	files, sizes, err := expandPaths(o.Paths)
	if err != nil {
		return fmt.Errorf("submit: %w", err)
	}
	requestID := o.RequestID
	if requestID == "" {
		requestID = a.env.NewRequestID()
	}
	var policy *leaseholdv1.RetryPolicy
	if o.MaxAttempts > 0 {
		policy = &leaseholdv1.RetryPolicy{MaxAttempts: uint32(o.MaxAttempts)}
	}

	chunks := chunkFiles(files, sizes)
	var batches []*leaseholdv1.Batch
	for i, chunk := range chunks {
		rid := fmt.Sprintf("%s-%d", requestID, i)
		docs, err := client.ReadDocuments(chunk)
		if err != nil {
			return fmt.Errorf("submit: %w", err)
		}
		resp, err := a.c.SubmitBatch(ctx, o.Team, rid, docs, policy)
		if err != nil {
			if i > 0 {
				fmt.Fprintf(a.env.Stderr, "leasehold: batches 0 to %d were accepted; run the same command with --request-id %s to submit the rest without duplicates\n", i-1, requestID)
			}
			return fmt.Errorf("submitting batch %d of %d (request id %s): %w", i+1, len(chunks), rid, err)
		}
		batches = append(batches, resp.GetBatch())
		if a.jsonOutput() {
			if err := a.printJSON(resp); err != nil {
				return err
			}
			continue
		}
		note := ""
		if resp.GetReplayed() {
			note = " (already submitted with this request id; nothing new stored)"
		}
		if _, err := fmt.Fprintf(a.out, "batch %s: %d jobs (request id %s)%s\n", resp.GetBatch().GetId(), resp.GetBatch().GetJobCount(), rid, note); err != nil {
			return err
		}
	}
	if !a.jsonOutput() && len(batches) > 1 {
		fmt.Fprintf(a.out, "submitted %d jobs in %d batches\n", len(files), len(batches))
	}
	if !o.Wait {
		return nil
	}
	return waitForBatches(ctx, a, batches, len(files))
}

// waitForBatches watches the batches one after another until each is done,
// drawing a progress bar on a terminal and printing one line per job event
// otherwise, and fails with ExitJobsFailed when any job ended FAILED or
// CANCELLED.
func waitForBatches(ctx context.Context, a *app, batches []*leaseholdv1.Batch, total int) error {
	var bar *progressBar
	if !a.jsonOutput() && a.env.IsTerminal != nil && a.env.IsTerminal(a.out) {
		bar = &progressBar{w: a.out, total: total}
	}
	finished := map[leaseholdv1.Phase]uint32{} // counts of the batches already done
	for _, b := range batches {
		final, err := followBatch(ctx, a.c, b.GetId(), func(m *leaseholdv1.WatchBatchResponse) error {
			switch {
			case a.jsonOutput():
				return a.printJSON(m)
			case bar != nil:
				bar.draw(finished, countsOf(m.GetBatch()))
				return nil
			case m.GetEvent() != nil || terminalPhase(m.GetPhase()):
				// Snapshots of jobs still on their way are noise right after
				// submitting; terminal ones (rejected formats) are news.
				_, err := fmt.Fprintln(a.out, eventLine(m))
				return err
			}
			return nil
		})
		if err != nil {
			if bar != nil {
				bar.finish()
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

// terminalPhase reports whether p is SUCCEEDED, FAILED or CANCELLED.
func terminalPhase(p leaseholdv1.Phase) bool {
	switch p {
	case leaseholdv1.Phase_PHASE_SUCCEEDED, leaseholdv1.Phase_PHASE_FAILED, leaseholdv1.Phase_PHASE_CANCELLED:
		return true
	}
	return false
}

// progressBar draws "[#####.....] 120/200 succeeded 3 failed" on one
// terminal line, redrawn in place with a carriage return.
type progressBar struct {
	w       io.Writer
	total   int
	lastLen int
}

const barWidth = 30

// draw shows the sum of two count sets: the finished batches' and the
// current batch's.
func (p *progressBar) draw(base, cur map[leaseholdv1.Phase]uint32) {
	get := func(ph leaseholdv1.Phase) int { return int(base[ph] + cur[ph]) }
	succeeded := get(leaseholdv1.Phase_PHASE_SUCCEEDED)
	failed := get(leaseholdv1.Phase_PHASE_FAILED)
	cancelled := get(leaseholdv1.Phase_PHASE_CANCELLED)
	filled := 0
	if p.total > 0 {
		filled = min(barWidth, (succeeded+failed+cancelled)*barWidth/p.total)
	}
	line := fmt.Sprintf("[%s%s] %d/%d succeeded %d failed", strings.Repeat("#", filled), strings.Repeat(".", barWidth-filled), succeeded, p.total, failed)
	if cancelled > 0 {
		line += fmt.Sprintf(" %d cancelled", cancelled)
	}
	pad := ""
	if len(line) < p.lastLen {
		pad = strings.Repeat(" ", p.lastLen-len(line))
	}
	p.lastLen = len(line)
	fmt.Fprint(p.w, "\r"+line+pad)
}

// finish ends the bar's line.
func (p *progressBar) finish() { fmt.Fprintln(p.w) }
