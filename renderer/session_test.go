package renderer

import (
	"context"
	"log/slog"
	"testing"
	"testing/synctest"
	"time"
)

// TestSilenceFiringLateIsTheRenderersOwnStop checks silenced on both
// sides of its guard: a silence timer that fires more than half a silence
// behind its time says this process was the one stopped (SIGSTOP, a long
// pause), so the session goes on and the coordinator gets a whole silence
// again; one that fires on time, or up to half a silence late, ends the
// session. The bubble's clock stands still between the calls, so the
// lateness is exactly what each case sets.
func TestSilenceFiringLateIsTheRenderersOwnStop(t *testing.T) {
	t.Parallel()
	const after = 3 * time.Second
	synctest.Test(t, func(t *testing.T) {
		// silence runs silenced on a welcomed session whose timer was due
		// late ago, and returns the session and its stream's context.
		silence := func(late time.Duration) (*session, context.Context) {
			ctx, cancel := context.WithCancel(t.Context())
			l := &loop{w: &Worker{log: slog.New(slog.DiscardHandler)}}
			l.sess = &session{cancel: cancel, welcomed: true, silenceAfter: after,
				silence: time.NewTimer(after), silenceDue: time.Now().Add(-late)}
			l.silenced()
			return l.sess, ctx
		}

		s, ctx := silence(after/2 + time.Millisecond)
		if s.silent || ctx.Err() != nil {
			t.Fatalf("a timer %v late ended the session (silent=%t, %v); want it kept: the renderer was the one stopped", after/2+time.Millisecond, s.silent, ctx.Err())
		}
		if want := time.Now().Add(after); !s.silenceDue.Equal(want) {
			t.Errorf("after a late timer the silence is due at %v, want %v (a whole silence from now)", s.silenceDue, want)
		}
		time.Sleep(after)
		select {
		case <-s.silence.C:
		default:
			t.Errorf("the silence timer was not set again to fire a whole silence later")
		}

		for _, late := range []time.Duration{0, after / 2} {
			s, ctx := silence(late)
			if !s.silent || ctx.Err() == nil {
				t.Errorf("a timer %v late left the session open (silent=%t); want it ended: the coordinator was silent", late, s.silent)
			}
		}
	})
}
