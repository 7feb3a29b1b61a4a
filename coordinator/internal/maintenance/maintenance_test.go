package maintenance

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/engine"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// logSink keeps what a logger wrote.
type logSink struct{ strings.Builder }

func TestRetention(t *testing.T) {
	t.Parallel()

	t.Run("ARunPurgesStepByStepUntilNothingIsDue", func(t *testing.T) {
		t.Parallel()
		steps := []engine.PurgeResult{{Jobs: 2, More: true}, {Jobs: 2, Batches: 1, More: true}, {Rejections: 1}}
		var calls int
		sink := &logSink{}
		r := NewRetention(RetentionConfig{Logger: slog.New(slog.NewTextHandler(sink, nil)),
			Purge: func(context.Context) (engine.PurgeResult, error) {
				res := steps[calls]
				calls++
				return res, nil
			}})
		sum := r.runOnce(make(chan struct{}))
		if calls != 3 || sum != (engine.PurgeResult{Jobs: 4, Batches: 1, Rejections: 1}) {
			t.Fatalf("a run made %d steps and purged %+v; want 3 steps, 4 jobs, 1 batch, 1 rejection", calls, sum)
		}
		if !strings.Contains(sink.String(), "jobs=4") {
			t.Errorf("the run's log: %q", sink.String())
		}
	})

	t.Run("AFollowerRunIsQuiet", func(t *testing.T) {
		t.Parallel()
		sink := &logSink{}
		r := NewRetention(RetentionConfig{Logger: slog.New(slog.NewTextHandler(sink, nil)),
			Purge: func(context.Context) (engine.PurgeResult, error) { return engine.PurgeResult{}, engine.ErrNotLeader }})
		r.runOnce(make(chan struct{}))
		if sink.Len() != 0 {
			t.Errorf("a run refused NOT_LEADER logged %q", sink.String())
		}
		r = NewRetention(RetentionConfig{Logger: slog.New(slog.NewTextHandler(sink, nil)),
			Purge: func(context.Context) (engine.PurgeResult, error) { return engine.PurgeResult{}, errors.New("boom") }})
		r.runOnce(make(chan struct{}))
		if !strings.Contains(sink.String(), "retention step failed") {
			t.Errorf("a failed step was not logged: %q", sink.String())
		}
	})

	t.Run("RunsEveryIntervalUntilStopped", func(t *testing.T) {
		t.Parallel()
		synctest.Test(t, func(t *testing.T) {
			var runs atomic.Int32
			r := NewRetention(RetentionConfig{Interval: time.Minute,
				Purge: func(context.Context) (engine.PurgeResult, error) { runs.Add(1); return engine.PurgeResult{}, nil }})
			r.Start()
			time.Sleep(3*time.Minute + time.Second)
			synctest.Wait()
			if got := runs.Load(); got != 3 {
				t.Errorf("%d runs in three minutes, want 3", got)
			}
			r.Stop()
			r.Stop()
		})
	})

	t.Run("StopsMidRunAndWithoutStart", func(t *testing.T) {
		t.Parallel()
		NewRetention(RetentionConfig{}).Stop()
		synctest.Test(t, func(t *testing.T) {
			stop := make(chan struct{})
			var calls int
			r := NewRetention(RetentionConfig{Pause: time.Hour,
				Purge: func(context.Context) (engine.PurgeResult, error) {
					calls++
					return engine.PurgeResult{Jobs: 1, More: true}, nil
				}})
			done := make(chan engine.PurgeResult)
			go func() { done <- r.runOnce(stop) }()
			synctest.Wait()
			close(stop)
			if sum := <-done; calls != 1 || sum.Jobs != 1 {
				t.Fatalf("a run stopped during its pause made %d steps, purged %+v", calls, sum)
			}
		})
	})
}

func TestSummarizer(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		var n atomic.Int32
		f := NewSummarizer(func() { n.Add(1) }, time.Second)
		f.Start()
		time.Sleep(2*time.Second + time.Millisecond)
		synctest.Wait()
		f.Stop()
		if got := n.Load(); got != 3 {
			t.Errorf("%d summaries over two seconds and a stop, want 3 (the last at the stop)", got)
		}
	})
}

func TestFailureWatcher(t *testing.T) {
	t.Parallel()
	failed := make(chan struct{})
	told := make(chan struct{})
	w := NewFailureWatcher(failed, func() { close(told) })
	w.Start()
	close(failed)
	<-told
	w.Stop()

	quiet := NewFailureWatcher(make(chan struct{}), func() { t.Error("told of a failure that never happened") })
	quiet.Start()
	quiet.Stop()
}
