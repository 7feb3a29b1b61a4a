package tracing_test

import (
	"context"
	"strings"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/goleak"

	"github.com/leasehold/leasehold/internal/tracing"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// envOf returns a lookup over a fixed environment.
func envOf(vars map[string]string) func(string) (string, bool) {
	return func(name string) (string, bool) {
		v, ok := vars[name]
		return v, ok
	}
}

// TestSetup checks when the OTEL_* variables turn tracing on, and that
// values this build cannot honour are errors naming the variable.
func TestSetup(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		env     map[string]string
		enabled bool
		wantErr string
	}{
		{"nothing set: off", nil, false, ""},
		{"an OTLP endpoint: on", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, true, ""},
		{"a traces endpoint: on", map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, true, ""},
		{"otlp exporter without an endpoint: on", map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, true, ""},
		{"otlp over gRPC: on", map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, true, ""},
		{"exporter none wins over an endpoint", map[string]string{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318"}, false, ""},
		{"the SDK disabled wins over everything", map[string]string{"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}, false, ""},
		{"an exporter this build lacks", map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"}, false, "OTEL_TRACES_EXPORTER"},
		{"a protocol this build lacks", map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json"}, false, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tr, err := tracing.Setup(context.Background(), "test", envOf(tc.env))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Setup = %v, want an error naming %s", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := tr.Enabled(); got != tc.enabled {
				t.Errorf("Enabled = %v, want %v", got, tc.enabled)
			}
			// Nothing was recorded, so nothing is exported: Shutdown
			// does not reach for the endpoint.
			if err := tr.Shutdown(context.Background()); err != nil {
				t.Errorf("Shutdown: %v", err)
			}
		})
	}
}

// TestTraceParent checks that a span's context survives the trip through
// a stored traceparent, and that nothing is made up without one.
func TestTraceParent(t *testing.T) {
	t.Parallel()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(tracetest.NewSpanRecorder()))
	defer tp.Shutdown(context.Background())
	ctx, span := tp.Tracer("test").Start(context.Background(), "submit")
	defer span.End()

	stored := tracing.TraceParent(ctx)
	if len(stored) != 55 || !strings.HasPrefix(stored, "00-") {
		t.Fatalf("TraceParent = %q, want a W3C traceparent", stored)
	}
	got := trace.SpanContextFromContext(tracing.ContextWithTraceParent(context.Background(), stored))
	if want := span.SpanContext(); got.TraceID() != want.TraceID() || got.SpanID() != want.SpanID() || !got.IsRemote() || !got.IsSampled() {
		t.Errorf("restored span context = %v, want remote %v", got, want)
	}
	if got := tracing.TraceParent(context.Background()); got != "" {
		t.Errorf("TraceParent without a span = %q, want empty", got)
	}
	for _, bad := range []string{"", "00-garbage"} {
		if sc := trace.SpanContextFromContext(tracing.ContextWithTraceParent(context.Background(), bad)); sc.IsValid() {
			t.Errorf("ContextWithTraceParent(%q) has span context %v, want none", bad, sc)
		}
	}
}

func TestUntraced(t *testing.T) {
	t.Parallel()
	for method, want := range map[string]bool{
		"/grpc.health.v1.Health/Check":                              true,
		"/grpc.reflection.v1.ServerReflection/ServerReflectionInfo": true,
		"/leasehold.v1.JobService/SubmitBatch":                      false,
	} {
		if got := tracing.Untraced(method); got != want {
			t.Errorf("Untraced(%s) = %v, want %v", method, got, want)
		}
	}
}
