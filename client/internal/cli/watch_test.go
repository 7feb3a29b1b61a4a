package cli

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/leasehold/leasehold/client/internal/fakeserver"
)

// breakWatchOnce ends watch call 0 with UNAVAILABLE before its message msg.
func breakWatchOnce(msg int) func(*fakeserver.Server) {
	return func(f *fakeserver.Server) {
		f.WatchFault = func(_ context.Context, call, m int) error {
			if call == 0 && m == msg {
				return status.Error(codes.Unavailable, "coordinator restarting")
			}
			return nil
		}
	}
}

// submitted submits files named names in one batch, b-1.
func (b *testBundle) submitted(t *testing.T, names ...string) {
	t.Helper()
	dir := t.TempDir()
	writeFiles(t, dir, names...)
	if code, _, errOut := b.run(t, "submit", dir); code != ExitOK {
		t.Fatalf("submit exit status = %d; stderr:\n%s", code, errOut)
	}
}

func TestWatchResumesAfterALostStream(t *testing.T) {
	t.Parallel()

	t.Run("watch prints every event once across a lost stream", func(t *testing.T) {
		t.Parallel()
		b := setup(t, func(f *fakeserver.Server) { f.LeaseFirst = true; f.UpdatesPerMessage = 1 }, breakWatchOnce(5))
		b.submitted(t, "a.pdf", "b-fail.pdf")
		// Call 0 sends the snapshots and the leases, then breaks before
		// j-1's outcome.
		code, out, errOut := b.run(t, "watch", "b-1")
		if code != ExitOK {
			t.Fatalf("exit status = %d; stderr:\n%s", code, errOut)
		}
		want := "job j-1 QUEUED\njob j-2 QUEUED\njob j-1 LEASED\njob j-2 LEASED\njob j-1 SUCCEEDED\njob j-2 FAILED\n" +
			"batch b-1 done: 1 succeeded, 1 failed, 0 cancelled\n"
		if diff := cmp.Diff(want, out); diff != "" {
			t.Errorf("output mismatch (-want +got):\n%s", diff)
		}
		if !strings.Contains(errOut, "lost the watch of batch b-1 (coordinator restarting (UNAVAILABLE)); watching again in 100ms") {
			t.Errorf("stderr does not tell about the lost stream:\n%s", errOut)
		}
		watches := b.fake.Watches()
		if len(watches) != 2 || len(watches[1].GetResume()) != 2 || !watches[1].GetBatched() {
			t.Errorf("watch requests = %v, want a second one, batched, resuming both jobs", watches)
		}
	})

	t.Run("submit --wait prints each outcome once across a lost stream", func(t *testing.T) {
		t.Parallel()
		b := setup(t, func(f *fakeserver.Server) { f.UpdatesPerMessage = 1 }, breakWatchOnce(4))
		dir := t.TempDir()
		writeFiles(t, dir, "a.pdf", "b-fail.pdf", "c.pdf")
		// Call 0: three snapshots and j-1's outcome, then it breaks.
		code, out, _ := b.run(t, "submit", "--wait", "--request-id", "R", dir)
		if code != ExitJobsFailed {
			t.Errorf("exit status = %d, want %d", code, ExitJobsFailed)
		}
		want := "batch b-1: 3 jobs (request id R-0)\njob j-1 SUCCEEDED\njob j-2 FAILED\njob j-3 SUCCEEDED\ndone: 2 succeeded, 1 failed, 0 cancelled\n"
		if diff := cmp.Diff(want, out); diff != "" {
			t.Errorf("output mismatch (-want +got):\n%s", diff)
		}
		if w := b.fake.Watches(); len(w) != 2 || !w[0].GetTerminalOnly() {
			t.Errorf("watch requests = %v, want two asking for terminal events only", w)
		}
	})
}

// interruptAt makes the fake act as Ctrl-C pressed while watch call 0 is
// about to send message msg: it cancels the command's context with
// errInterrupted, as Main does on SIGINT, and waits for the call to end.
func interruptAt(msg int, cancel context.CancelCauseFunc) func(*fakeserver.Server) {
	return func(f *fakeserver.Server) {
		f.WatchFault = func(ctx context.Context, call, m int) error {
			if call == 0 && m == msg {
				cancel(errInterrupted)
				<-ctx.Done()
				return ctx.Err()
			}
			return nil
		}
	}
}

func TestInterrupt(t *testing.T) {
	t.Parallel()

	t.Run("Ctrl-C during submit --wait says the batch goes on and exits 130", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithCancelCause(t.Context())
		defer cancel(nil)
		b := setup(t, interruptAt(1, cancel))
		b.terminal = true
		dir := t.TempDir()
		writeFiles(t, dir, "a.pdf", "b.pdf")
		code, out, errOut := b.runContext(ctx, "submit", "--wait", dir)
		if code != ExitInterrupted {
			t.Errorf("exit status = %d, want %d", code, ExitInterrupted)
		}
		want := "leasehold: interrupted; batch b-1 continues on the server.\n" +
			"  follow it:  leasehold watch b-1\n" +
			"  cancel it:  leasehold cancel --batch b-1\n"
		if diff := cmp.Diff(want, errOut); diff != "" {
			t.Errorf("stderr mismatch (-want +got):\n%s", diff)
		}
		if !strings.HasSuffix(out, "\n") {
			t.Errorf("the progress line was not ended before the message:\n%q", out)
		}
	})

	t.Run("every batch not seen done is named, with the address given", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithCancelCause(t.Context())
		defer cancel(nil)
		b := setup(t, interruptAt(0, cancel))
		dir := t.TempDir()
		writeFiles(t, dir, "a.pdf", "b.pdf")
		code, _, errOut := b.runContext(ctx, "--addr", "coord:7", "submit", "--wait", "--max-batch-documents", "1", dir)
		if code != ExitInterrupted {
			t.Errorf("exit status = %d, want %d", code, ExitInterrupted)
		}
		for _, s := range []string{"batches b-1, b-2 continue on the server", "leasehold --addr coord:7 watch b-2", "leasehold --addr coord:7 cancel --batch b-1"} {
			if !strings.Contains(errOut, s) {
				t.Errorf("stderr lacks %q:\n%s", s, errOut)
			}
		}
	})

	t.Run("Ctrl-C during another command exits 130", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithCancelCause(t.Context())
		defer cancel(nil)
		b := setup(t, interruptAt(0, cancel))
		b.submitted(t, "a.pdf")
		code, _, errOut := b.runContext(ctx, "watch", "b-1")
		if code != ExitInterrupted || errOut != "leasehold: interrupted\n" {
			t.Errorf("exit status %d, stderr %q; want %d and the interruption", code, errOut, ExitInterrupted)
		}
	})

	t.Run("a plain cancellation is still an error", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithCancelCause(t.Context())
		defer cancel(nil)
		b := setup(t, func(f *fakeserver.Server) {
			f.WatchFault = func(ctx context.Context, _, _ int) error {
				cancel(fmt.Errorf("deadline of the caller"))
				<-ctx.Done()
				return ctx.Err()
			}
		})
		b.submitted(t, "a.pdf")
		if code, _, _ := b.runContext(ctx, "watch", "b-1"); code != ExitError {
			t.Errorf("exit status = %d, want %d", code, ExitError)
		}
	})
}
