package edge

import (
	"cmp"
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// DefaultLinesPerSecond is how many "finished call" lines of one refusal
// code Refusals lets through per second by default.
const DefaultLinesPerSecond = 10

// refusalWindow is the window of the line limit and of the summaries.
const refusalWindow = time.Second

// The go-grpc-middleware logging interceptor's message and field for the
// end of a call, which Refusals.Logger rate-limits.
const (
	finishedCallMsg = "finished call"
	codeField       = "grpc.code"
)

// refusedCodes are the codes of calls refused on the caller's account: a
// request the coordinator will not serve as sent, however often it is
// repeated. Server faults (INTERNAL, UNKNOWN, DATA_LOSS), unavailability
// and the caller's own cancellations and deadlines are not refusals.
var refusedCodes = []codes.Code{
	codes.InvalidArgument, codes.NotFound, codes.AlreadyExists, codes.PermissionDenied,
	codes.ResourceExhausted, codes.FailedPrecondition, codes.Aborted, codes.OutOfRange,
	codes.Unimplemented, codes.Unauthenticated,
}

// refusedByName maps the names the logging interceptor writes
// (codes.Code.String) to the refused codes.
var refusedByName = func() map[string]codes.Code {
	m := make(map[string]codes.Code, len(refusedCodes))
	for _, c := range refusedCodes {
		m[c.String()] = c
	}
	return m
}()

// Refused reports whether code is a refusal, which Refusals counts and
// rate-limits: INVALID_ARGUMENT, NOT_FOUND, ALREADY_EXISTS,
// PERMISSION_DENIED, RESOURCE_EXHAUSTED, FAILED_PRECONDITION, ABORTED,
// OUT_OF_RANGE, UNIMPLEMENTED and UNAUTHENTICATED.
func Refused(code codes.Code) bool { return slices.Contains(refusedCodes, code) }

// RefusalsConfig configures Refusals.
type RefusalsConfig struct {
	// Logger receives the lines let through and the summaries.
	Logger logging.Logger
	// Registerer registers leasehold_refused_calls_total; nil registers
	// nothing.
	Registerer prometheus.Registerer
	// LinesPerSecond is how many "finished call" lines of one refusal code
	// pass per second; 0 means DefaultLinesPerSecond.
	LinesPerSecond int
	// Now is the clock of the windows; nil means time.Now.
	Now func() time.Time
}

// Refusals counts refused calls and limits how many of them are logged, so
// that a flood of refused calls (an unauthenticated client in a loop) costs
// a counter increment each, not a log line each. It is safe for concurrent
// use.
type Refusals struct {
	log   logging.Logger
	limit int
	now   func() time.Time
	total *prometheus.CounterVec

	mu      sync.Mutex
	windows map[codes.Code]*refusalWindowState
}

// refusalWindowState is one code's current window.
type refusalWindowState struct {
	start      time.Time
	lines      int
	suppressed int
}

// summary is a pending "suppressed refused calls" line.
type summary struct {
	code       codes.Code
	suppressed int
	since      time.Time
}

// NewRefusals returns a Refusals writing to cfg.Logger. It panics if
// cfg.Logger is nil or the counter cannot be registered.
func NewRefusals(cfg RefusalsConfig) *Refusals {
	if cfg.Logger == nil {
		panic("edge: RefusalsConfig.Logger is required")
	}
	r := &Refusals{
		log:     cfg.Logger,
		limit:   cfg.LinesPerSecond,
		now:     cfg.Now,
		windows: make(map[codes.Code]*refusalWindowState),
		total: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "leasehold_refused_calls_total",
			Help: "Calls refused on the caller's account (invalid, unauthenticated, denied, over a limit, ...), by gRPC code.",
		}, []string{"code"}),
	}
	if r.limit <= 0 {
		r.limit = DefaultLinesPerSecond
	}
	if r.now == nil {
		r.now = time.Now
	}
	for _, c := range refusedCodes {
		r.total.WithLabelValues(c.String())
	}
	if cfg.Registerer != nil {
		cfg.Registerer.MustRegister(r.total)
	}
	return r
}

// UnaryServerInterceptor returns the interceptor that counts refused unary
// calls. It must come before (outside) every interceptor that refuses
// calls, authentication included.
func (r *Refusals) UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		resp, err := handler(ctx, req)
		r.count(err)
		return resp, err
	}
}

// StreamServerInterceptor returns the interceptor that counts refused
// streaming calls, placed as UnaryServerInterceptor.
func (r *Refusals) StreamServerInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		err := handler(srv, ss)
		r.count(err)
		return err
	}
}

// count counts err if it is a refusal.
func (r *Refusals) count(err error) {
	if err == nil {
		return
	}
	if code := status.Code(err); Refused(code) {
		r.total.WithLabelValues(code.String()).Inc()
	}
}

// Logger returns the logger to give the logging interceptor. It passes
// every line to RefusalsConfig.Logger except the "finished call" lines of
// refused calls beyond LinesPerSecond per code in a window; those are
// counted, and summarised in one Warn line "suppressed refused calls"
// (fields grpc.code, suppressed, since) when the window has ended: at the
// next line of that code or at Summarize, whichever comes first.
func (r *Refusals) Logger() logging.Logger {
	return logging.LoggerFunc(func(ctx context.Context, lvl logging.Level, msg string, fields ...any) {
		if msg == finishedCallMsg {
			if code, ok := refusedCode(fields); ok {
				pass, pending := r.allow(code)
				if pending != nil {
					r.logSummary(ctx, *pending)
				}
				if !pass {
					return
				}
			}
		}
		r.log.Log(ctx, lvl, msg, fields...)
	})
}

// refusedCode returns the refusal code among the logging interceptor's
// key-value fields.
func refusedCode(fields []any) (codes.Code, bool) {
	for i := 0; i+1 < len(fields); i += 2 {
		if k, ok := fields[i].(string); ok && k == codeField {
			name, _ := fields[i+1].(string)
			c, ok := refusedByName[name]
			return c, ok
		}
	}
	return codes.OK, false
}

// allow decides whether one more line of code passes, and returns the
// summary of code's previous window if that window has ended with lines
// suppressed.
func (r *Refusals) allow(code codes.Code) (bool, *summary) {
	now := r.now()
	r.mu.Lock()
	defer r.mu.Unlock()
	w := r.windows[code]
	if w == nil {
		w = &refusalWindowState{start: now}
		r.windows[code] = w
	}
	var pending *summary
	if now.Sub(w.start) >= refusalWindow {
		if w.suppressed > 0 {
			pending = &summary{code: code, suppressed: w.suppressed, since: w.start}
		}
		*w = refusalWindowState{start: now}
	}
	if w.lines >= r.limit {
		w.suppressed++
		return false, pending
	}
	w.lines++
	return true, pending
}

// Summarize writes the summary of every window that has ended with lines
// suppressed. The coordinator calls it once per second from one goroutine,
// so that the summary of a flood that stopped is not held back until the
// next refusal; tests call it directly.
func (r *Refusals) Summarize() {
	now := r.now()
	var pending []summary
	r.mu.Lock()
	for code, w := range r.windows {
		if now.Sub(w.start) < refusalWindow {
			continue
		}
		if w.suppressed > 0 {
			pending = append(pending, summary{code: code, suppressed: w.suppressed, since: w.start})
		}
		delete(r.windows, code)
	}
	r.mu.Unlock()
	slices.SortFunc(pending, func(a, b summary) int { return cmp.Compare(a.code, b.code) })
	for _, s := range pending {
		r.logSummary(context.Background(), s)
	}
}

// logSummary writes one "suppressed refused calls" line.
func (r *Refusals) logSummary(ctx context.Context, s summary) {
	r.log.Log(ctx, logging.LevelWarn, "suppressed refused calls",
		codeField, s.code.String(), "suppressed", s.suppressed, "since", s.since.Format(time.RFC3339Nano))
}

// Early reports a call refused before any interceptor ran, by the
// authentication tap (auth.Set.InTapHandle), which the interceptors never
// see: it counts the call as they would and writes its "finished call"
// line through Logger's limit, with the method, the peer, the code and
// the error, at Info. It does not block beyond writing that line, so that
// it may run on a connection's reading goroutine.
func (r *Refusals) Early(ctx context.Context, fullMethod string, err error) {
	r.count(err)
	service, method := splitMethod(fullMethod)
	fields := []any{"protocol", "grpc", "grpc.component", "server", "grpc.service", service, "grpc.method", method}
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		fields = append(fields, "peer.address", p.Addr.String())
	}
	st := status.Convert(err)
	fields = append(fields, codeField, st.Code().String(), "grpc.error", st.Message(), "grpc.time_ms", "0", "refused", "before the request was read")
	r.Logger().Log(ctx, logging.LevelInfo, finishedCallMsg, fields...)
}

// splitMethod splits "/package.Service/Method" into the service and the
// method, as the logging interceptor names them.
func splitMethod(fullMethod string) (service, method string) {
	s, m, ok := strings.Cut(strings.TrimPrefix(fullMethod, "/"), "/")
	if !ok {
		return "unknown", fullMethod
	}
	return s, m
}
