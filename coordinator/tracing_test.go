package coordinator

import (
	"context"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/leasehold/leasehold/client"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"github.com/leasehold/leasehold/renderer"
)

// recorder keeps the ended spans of one process and signals each span
// named signalOn as it ends.
type recorder struct {
	*tracetest.SpanRecorder
	signalOn string
	ended    chan sdktrace.ReadOnlySpan
}

func newRecorder(signalOn string) *recorder {
	return &recorder{SpanRecorder: tracetest.NewSpanRecorder(), signalOn: signalOn, ended: make(chan sdktrace.ReadOnlySpan, 16)}
}

// OnEnd implements sdktrace.SpanProcessor.
func (r *recorder) OnEnd(s sdktrace.ReadOnlySpan) {
	r.SpanRecorder.OnEnd(s)
	if s.Name() == r.signalOn {
		r.ended <- s
	}
}

// provider returns a tracer provider that records into r, as one
// process's would.
func (r *recorder) provider(t *testing.T) *sdktrace.TracerProvider {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(r))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	return tp
}

// span returns the ended span named name, failing the test if there is
// not exactly one.
func (r *recorder) span(t *testing.T, name string) sdktrace.ReadOnlySpan {
	t.Helper()
	var found []sdktrace.ReadOnlySpan
	for _, s := range r.Ended() {
		if s.Name() == name {
			found = append(found, s)
		}
	}
	if len(found) != 1 {
		var names []string
		for _, s := range r.Ended() {
			names = append(names, s.Name())
		}
		t.Fatalf("%d spans named %q, want 1; spans: %q", len(found), name, names)
	}
	return found[0]
}

// TestOneTraceFromSubmitToCompletion traces a client, the coordinator and
// a renderer, each with its own tracer provider as separate processes
// would have, and checks that a job's submission and its render form one
// trace: command → SubmitBatch (client) → SubmitBatch (server) → render
// and completion on the renderer, through the job's stored trace context.
func TestOneTraceFromSubmitToCompletion(t *testing.T) {
	t.Parallel()
	cli, coord, rend := newRecorder(""), newRecorder(""), newRecorder("leasehold.complete")
	s := startStack(t, Config{TracerProvider: coord.provider(t)})
	s.startRenderer(t, renderer.Config{TracerProvider: rend.provider(t)})
	cliTP := cli.provider(t)
	cl, err := client.Dial(s.addr, client.WithToken("dev-alpha"), client.WithTracerProvider(cliTP))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	cmdCtx, cmd := cliTP.Tracer("test").Start(ctx, "leasehold submit")
	submitAndWait(t, cmdCtx, cl, "alpha", &leaseholdv1.Document{Name: "a.txt", ContentType: "text/plain", Content: []byte("hello")})
	cmd.End()
	var complete sdktrace.ReadOnlySpan
	select {
	case complete = <-rend.ended:
	case <-ctx.Done():
		t.Fatal("the renderer's completion span never ended")
	}

	root := cli.span(t, "leasehold submit")
	clientSubmit := cli.span(t, "leasehold.v1.JobService/SubmitBatch")
	serverSubmit := coord.span(t, "leasehold.v1.JobService/SubmitBatch")
	render := rend.span(t, "leasehold.render")
	chain := []struct {
		name         string
		span, parent sdktrace.ReadOnlySpan
	}{
		{"client SubmitBatch under the command", clientSubmit, root},
		{"server SubmitBatch under the client's call", serverSubmit, clientSubmit},
		{"render under the submission", render, serverSubmit},
		{"completion under the submission", complete, serverSubmit},
	}
	traceID := root.SpanContext().TraceID()
	for _, c := range chain {
		if got := c.span.SpanContext().TraceID(); got != traceID {
			t.Errorf("%s: trace %s, want %s", c.name, got, traceID)
		}
		if got, want := c.span.Parent().SpanID(), c.parent.SpanContext().SpanID(); got != want {
			t.Errorf("%s: parent span %s, want %s", c.name, got, want)
		}
	}
	if got := serverSubmit.SpanKind(); got != trace.SpanKindServer {
		t.Errorf("server SubmitBatch span kind = %v, want server", got)
	}
	attrs := map[string]string{}
	for _, kv := range complete.Attributes() {
		attrs[string(kv.Key)] = kv.Value.Emit()
	}
	for k, want := range map[string]string{"leasehold.job_id": "j-1", "leasehold.result.code": "OK", "leasehold.phase": "PHASE_SUCCEEDED"} {
		if attrs[k] != want {
			t.Errorf("completion span %s = %q, want %q", k, attrs[k], want)
		}
	}
	conn, err := grpc.NewClient(s.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	for _, s := range coord.Ended() {
		if s.Name() == "grpc.health.v1.Health/Check" {
			t.Errorf("health checks are traced")
		}
	}
}

// TestUntracedByDefault checks that without a tracer provider nothing is
// stored with the job: a client that sends trace context to an untraced
// coordinator has its renderer start a trace of its own.
func TestUntracedByDefault(t *testing.T) {
	t.Parallel()
	cli, rend := newRecorder(""), newRecorder("leasehold.complete")
	s := startStack(t, Config{})
	s.startRenderer(t, renderer.Config{TracerProvider: rend.provider(t)})
	cl, err := client.Dial(s.addr, client.WithToken("dev-alpha"), client.WithTracerProvider(cli.provider(t)))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	submitAndWait(t, ctx, cl, "alpha", &leaseholdv1.Document{Name: "a.txt", Content: []byte("hello")})
	var complete sdktrace.ReadOnlySpan
	select {
	case complete = <-rend.ended:
	case <-ctx.Done():
		t.Fatal("the renderer's completion span never ended")
	}
	if complete.Parent().IsValid() {
		t.Errorf("completion span has parent %v, want none: the coordinator traced nothing", complete.Parent())
	}
	if got, other := complete.SpanContext().TraceID(), cli.span(t, "leasehold.v1.JobService/SubmitBatch").SpanContext().TraceID(); got == other {
		t.Errorf("the renderer joined the client's trace %s through an untraced coordinator", got)
	}
}
