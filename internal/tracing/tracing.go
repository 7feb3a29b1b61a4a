// Package tracing sets up OpenTelemetry traces for the Leasehold processes
// and carries a job's trace context from its submission to the renderer
// that works on it.
//
// Tracing is off unless the standard OpenTelemetry variables ask for an
// exporter: OTEL_TRACES_EXPORTER=otlp, or, with OTEL_TRACES_EXPORTER unset,
// an OTLP endpoint (OTEL_EXPORTER_OTLP_ENDPOINT or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT). OTEL_TRACES_EXPORTER=none and
// OTEL_SDK_DISABLED=true turn it off. When it is off, Setup returns no
// tracer provider and the processes install no gRPC stats handler, so
// tracing costs nothing. When it is on, spans go through a batching
// processor to the OTLP exporter named by OTEL_EXPORTER_OTLP_PROTOCOL (or
// its _TRACES_ form): http/protobuf (the default) or grpc. The exporter,
// the sampler (OTEL_TRACES_SAMPLER, parent-based always-on by default), the
// batch processor (OTEL_BSP_*) and the resource (OTEL_SERVICE_NAME,
// OTEL_RESOURCE_ATTRIBUTES) read their own variables.
//
// Trace context crosses gRPC calls as W3C traceparent metadata (the
// otelgrpc stats handlers of ServerOption and DialOption), and crosses the
// queue as a job's stored traceparent (TraceParent, ContextWithTraceParent):
// the coordinator records the SubmitBatch span's context with each job and
// sends it in every grant, so that a renderer's spans are children of the
// submission.
package tracing

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/stats"
)

// propagator carries W3C trace context, and only that: baggage is not
// forwarded.
var propagator = propagation.TraceContext{}

// traceParentKey is the W3C header that holds a span context.
const traceParentKey = "traceparent"

// Tracing is the tracer provider of a process, when tracing is on.
type Tracing struct {
	// Provider is the tracer provider, or nil when tracing is off.
	Provider trace.TracerProvider
	// shutdown flushes and stops the provider; nil when off.
	shutdown func(context.Context) error
}

// Enabled reports whether tracing is on.
func (t *Tracing) Enabled() bool { return t != nil && t.Provider != nil }

// Shutdown exports the spans still buffered and stops the exporter, within
// ctx. It does nothing when tracing is off. Call it once, before the
// process exits.
func (t *Tracing) Shutdown(ctx context.Context) error {
	if t == nil || t.shutdown == nil {
		return nil
	}
	return t.shutdown(ctx)
}

// Setup reads the OTEL_* variables through lookup (os.LookupEnv in the
// commands) and starts an exporter if they ask for one; service is the
// default service.name, which OTEL_SERVICE_NAME overrides. An unsupported
// value of OTEL_TRACES_EXPORTER or of the OTLP protocol is an error naming
// the variable; the commands report it as a usage error. With tracing off
// it returns a Tracing without a provider and no error.
func Setup(ctx context.Context, service string, lookup func(string) (string, bool)) (*Tracing, error) {
	get := func(name string) string {
		v, _ := lookup(name)
		return strings.TrimSpace(v)
	}
	if strings.EqualFold(get("OTEL_SDK_DISABLED"), "true") {
		return &Tracing{}, nil
	}
	switch exp := strings.ToLower(get("OTEL_TRACES_EXPORTER")); exp {
	case "none":
		return &Tracing{}, nil
	case "":
		if get("OTEL_EXPORTER_OTLP_ENDPOINT") == "" && get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") == "" {
			return &Tracing{}, nil
		}
	case "otlp":
	default:
		return nil, fmt.Errorf("OTEL_TRACES_EXPORTER=%q: want otlp or none", exp)
	}
	protoVar := "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
	protocol := get(protoVar)
	if protocol == "" {
		protoVar = "OTEL_EXPORTER_OTLP_PROTOCOL"
		protocol = get(protoVar)
	}
	var (
		exporter sdktrace.SpanExporter
		err      error
	)
	switch protocol {
	case "", "http/protobuf":
		exporter, err = otlptracehttp.New(ctx)
	case "grpc":
		exporter, err = otlptracegrpc.New(ctx)
	default:
		return nil, fmt.Errorf("%s=%q: want http/protobuf or grpc", protoVar, protocol)
	}
	if err != nil {
		return nil, fmt.Errorf("starting the OTLP trace exporter: %w", err)
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(attribute.String("service.name", service)),
		resource.WithTelemetrySDK(),
		resource.WithFromEnv(),
	)
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, fmt.Errorf("OTEL_RESOURCE_ATTRIBUTES: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exporter), sdktrace.WithResource(res))
	return &Tracing{Provider: tp, shutdown: tp.Shutdown}, nil
}

// handlerOptions configures the otelgrpc handlers: tp, W3C trace context,
// no metrics (Prometheus has them), and no spans for health checks and
// reflection, which load balancers and tools call all the time.
func handlerOptions(tp trace.TracerProvider) []otelgrpc.Option {
	return []otelgrpc.Option{
		otelgrpc.WithTracerProvider(tp),
		otelgrpc.WithPropagators(propagator),
		otelgrpc.WithMeterProvider(metricnoop.NewMeterProvider()),
		otelgrpc.WithFilter(func(info *stats.RPCTagInfo) bool { return !Untraced(info.FullMethodName) }),
	}
}

// Untraced reports whether calls of a method are left out of traces: the
// health and reflection services.
func Untraced(fullMethod string) bool {
	return strings.HasPrefix(fullMethod, "/grpc.health.v1.Health/") || strings.HasPrefix(fullMethod, "/grpc.reflection.")
}

// ServerOption returns the stats handler that traces a gRPC server's calls
// with tp, continuing the caller's trace.
func ServerOption(tp trace.TracerProvider) grpc.ServerOption {
	return grpc.StatsHandler(otelgrpc.NewServerHandler(handlerOptions(tp)...))
}

// DialOption returns the stats handler that traces a client's calls with
// tp and sends their trace context to the server.
func DialOption(tp trace.TracerProvider) grpc.DialOption {
	return grpc.WithStatsHandler(otelgrpc.NewClientHandler(handlerOptions(tp)...))
}

// TraceParent returns the W3C traceparent of the span in ctx, or "" when
// ctx carries no valid span context.
func TraceParent(ctx context.Context) string {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return ""
	}
	carrier := propagation.MapCarrier{}
	propagator.Inject(ctx, carrier)
	return carrier[traceParentKey]
}

// ContextWithTraceParent returns ctx carrying the remote span context of a
// W3C traceparent, so that spans started from it are its children. An
// empty or malformed traceparent returns ctx unchanged.
func ContextWithTraceParent(ctx context.Context, traceParent string) context.Context {
	if traceParent == "" {
		return ctx
	}
	return propagator.Extract(ctx, propagation.MapCarrier{traceParentKey: traceParent})
}
