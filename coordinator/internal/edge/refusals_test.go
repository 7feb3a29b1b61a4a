package edge

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"github.com/leasehold/leasehold/internal/testclock"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// line is one logged line, reduced to what the tests compare.
type line struct {
	Level      logging.Level
	Msg        string
	Code       string
	Suppressed int
}

// recorder is a logging.Logger that keeps its lines.
type recorder struct {
	mu    sync.Mutex
	lines []line
}

func (r *recorder) Log(_ context.Context, lvl logging.Level, msg string, fields ...any) {
	l := line{Level: lvl, Msg: msg}
	for i := 0; i+1 < len(fields); i += 2 {
		switch fields[i] {
		case "grpc.code":
			l.Code = fields[i+1].(string)
		case "suppressed":
			l.Suppressed = fields[i+1].(int)
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lines = append(r.lines, l)
}

// take returns the lines logged since the last take.
func (r *recorder) take() []line {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.lines
	r.lines = nil
	return out
}

// finished logs n "finished call" lines of code through log.
func finished(log logging.Logger, code codes.Code, n int) {
	for range n {
		log.Log(context.Background(), logging.LevelInfo, "finished call", "grpc.method", "GetJob", "grpc.code", code.String())
	}
}

// repeat returns n copies of l.
func repeat(l line, n int) []line {
	out := make([]line, n)
	for i := range out {
		out[i] = l
	}
	return out
}

// TestRefusalsLogger checks the per-code line limit and the summaries,
// with a clock moved by hand.
func TestRefusalsLogger(t *testing.T) {
	t.Parallel()
	clock := testclock.New(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC))
	rec := &recorder{}
	r := NewRefusals(RefusalsConfig{Logger: rec, LinesPerSecond: 3, Now: clock.Now})
	log := r.Logger()
	unauth := line{Level: logging.LevelInfo, Msg: "finished call", Code: "Unauthenticated"}
	denied := line{Level: logging.LevelInfo, Msg: "finished call", Code: "PermissionDenied"}

	t.Run("Lines beyond the limit of a code are dropped within a window", func(t *testing.T) {
		finished(log, codes.Unauthenticated, 10)
		finished(log, codes.PermissionDenied, 2)
		want := append(repeat(unauth, 3), repeat(denied, 2)...)
		if diff := cmp.Diff(want, rec.take()); diff != "" {
			t.Errorf("lines (-want +got):\n%s", diff)
		}
	})
	t.Run("Successful calls, server faults and other messages always pass", func(t *testing.T) {
		finished(log, codes.OK, 5)
		finished(log, codes.Internal, 5)
		log.Log(context.Background(), logging.LevelInfo, "started call", "grpc.code", "Unauthenticated")
		if got := len(rec.take()); got != 11 {
			t.Errorf("lines = %d, want 11", got)
		}
	})
	t.Run("Flush summarises only windows that ended, once", func(t *testing.T) {
		clock.Advance(999 * time.Millisecond)
		r.Summarize()
		if got := rec.take(); len(got) != 0 {
			t.Errorf("lines before the window ended = %v, want none", got)
		}
		clock.Advance(time.Millisecond)
		r.Summarize()
		r.Summarize()
		want := []line{{Level: logging.LevelWarn, Msg: "suppressed refused calls", Code: "Unauthenticated", Suppressed: 7}}
		if diff := cmp.Diff(want, rec.take()); diff != "" {
			t.Errorf("lines (-want +got):\n%s", diff)
		}
	})
	t.Run("A new window lets lines through again and its summary comes with the next line", func(t *testing.T) {
		finished(log, codes.Unauthenticated, 5)
		clock.Advance(1500 * time.Millisecond)
		finished(log, codes.Unauthenticated, 1)
		want := append(repeat(unauth, 3), line{Level: logging.LevelWarn, Msg: "suppressed refused calls", Code: "Unauthenticated", Suppressed: 2}, unauth)
		if diff := cmp.Diff(want, rec.take()); diff != "" {
			t.Errorf("lines (-want +got):\n%s", diff)
		}
	})
	t.Run("A flood of refusals logs a bounded number of lines", func(t *testing.T) {
		clock.Advance(time.Second)
		r.Summarize()
		rec.take()
		for range 20 {
			finished(log, codes.Unauthenticated, 1000)
			clock.Advance(time.Second)
		}
		r.Summarize()
		lines := rec.take()
		if len(lines) != 20*3+20 {
			t.Errorf("20 s of 1000 refusals/s logged %d lines, want %d", len(lines), 20*3+20)
		}
		total := 0
		for _, l := range lines {
			total += l.Suppressed
		}
		if total != 20*997 {
			t.Errorf("summaries count %d suppressed lines, want %d", total, 20*997)
		}
	})
}

// TestRefusalsCounter checks leasehold_refused_calls_total through the
// interceptors.
func TestRefusalsCounter(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	r := NewRefusals(RefusalsConfig{Logger: &recorder{}, Registerer: reg})
	unary := r.UnaryServerInterceptor()
	stream := r.StreamServerInterceptor()
	for _, err := range []error{
		status.Error(codes.Unauthenticated, "no"),
		status.Error(codes.Unauthenticated, "no"),
		status.Error(codes.InvalidArgument, "bad"),
		status.Error(codes.Internal, "fault"),
		status.Error(codes.Canceled, "gone"),
		nil,
	} {
		unary(context.Background(), nil, &grpc.UnaryServerInfo{}, func(context.Context, any) (any, error) { return nil, err })
		stream(nil, nil, &grpc.StreamServerInfo{}, func(any, grpc.ServerStream) error { return err })
	}
	got := refusedCounts(t, reg)
	want := map[string]float64{}
	for _, c := range refusedCodes {
		want[c.String()] = 0
	}
	want["Unauthenticated"] = 4
	want["InvalidArgument"] = 2
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("leasehold_refused_calls_total by code (-want +got):\n%s", diff)
	}
	for _, c := range []codes.Code{codes.OK, codes.Internal, codes.Unknown, codes.DataLoss, codes.Unavailable, codes.Canceled, codes.DeadlineExceeded} {
		if Refused(c) {
			t.Errorf("Refused(%v) = true", c)
		}
	}
}

// refusedCounts returns leasehold_refused_calls_total by code.
func refusedCounts(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := make(map[string]float64)
	for _, mf := range mfs {
		if mf.GetName() != "leasehold_refused_calls_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "code" {
					out[l.GetValue()] = m.GetCounter().GetValue()
				}
			}
		}
	}
	return out
}

// fieldRecorder keeps every line's fields.
type fieldRecorder struct {
	mu    sync.Mutex
	lines []map[string]any
}

func (r *fieldRecorder) Log(_ context.Context, lvl logging.Level, msg string, fields ...any) {
	l := map[string]any{"level": lvl, "msg": msg}
	for i := 0; i+1 < len(fields); i += 2 {
		l[fields[i].(string)] = fields[i+1]
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lines = append(r.lines, l)
}

// TestRefusalsEarly checks that a call refused before the interceptors
// (by the authentication tap) is counted and logged as they would, within
// the same line limit.
func TestRefusalsEarly(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	clock := testclock.New(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC))
	rec := &fieldRecorder{}
	r := NewRefusals(RefusalsConfig{Logger: rec, Registerer: reg, LinesPerSecond: 2, Now: clock.Now})
	ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{IP: net.IPv4(192, 0, 2, 7), Port: 4242}})
	for range 3 {
		r.Early(ctx, "/leasehold.v1.JobService/SubmitBatch", status.Error(codes.Unauthenticated, "missing bearer token"))
	}
	if got := refusedCounts(t, reg)["Unauthenticated"]; got != 3 {
		t.Errorf("leasehold_refused_calls_total{code=Unauthenticated} = %v, want 3", got)
	}
	if len(rec.lines) != 2 {
		t.Fatalf("logged %d lines, want the limit of 2: %v", len(rec.lines), rec.lines)
	}
	want := map[string]any{
		"level": logging.LevelInfo, "msg": "finished call", "protocol": "grpc", "grpc.component": "server",
		"grpc.service": "leasehold.v1.JobService", "grpc.method": "SubmitBatch", "peer.address": "192.0.2.7:4242",
		"grpc.code": "Unauthenticated", "grpc.error": "missing bearer token", "grpc.time_ms": "0", "refused": "before the request was read",
	}
	if diff := cmp.Diff(want, rec.lines[0]); diff != "" {
		t.Errorf("the line (-want +got):\n%s", diff)
	}
}
