package renderer

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"

	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"github.com/leasehold/leasehold/internal/tracing"
)

// tracerName is the instrumentation scope of the worker's spans.
const tracerName = "github.com/leasehold/leasehold/renderer"

// The worker's spans. Both are children of the trace context the grant
// carries (the job's submission), so that a job's render belongs to the
// trace of its submission.
const (
	// spanRender covers the provider's render.
	spanRender = "leasehold.render"
	// spanComplete runs from a render's end to the coordinator's answer to
	// its completion, uploads included; it ends early when the lease is
	// lost or the result dropped.
	spanComplete = "leasehold.complete"
)

// leaseContext returns the parent context of a granted lease's work:
// parent, carrying the grant's trace context when the worker traces.
func (w *Worker) leaseContext(parent context.Context, g *leaseholdv1.Grant) context.Context {
	if w.tracer == nil {
		return parent
	}
	return tracing.ContextWithTraceParent(parent, g.GetTraceParent())
}

// startSpan starts span name of the lease key granted by g as a child of
// ctx. Without a tracer it starts nothing and returns ctx and a span that
// records nothing.
func (w *Worker) startSpan(ctx context.Context, key leaseKey, g *leaseholdv1.Grant, name string) (context.Context, trace.Span) {
	if w.tracer == nil {
		return ctx, trace.SpanFromContext(ctx)
	}
	return w.tracer.Start(ctx, name, trace.WithAttributes(
		attribute.String("leasehold.job_id", key.jobID),
		attribute.Int64("leasehold.lease.token", int64(key.token)),
		attribute.Int64("leasehold.lease.attempt", int64(g.GetLease().GetAttempt())),
		attribute.String("leasehold.renderer_id", w.cfg.ID),
	))
}

// spanContext returns ctx carrying span, for the calls made under it.
func (w *Worker) spanContext(ctx context.Context, span trace.Span) context.Context {
	if w.tracer == nil || span == nil {
		return ctx
	}
	return trace.ContextWithSpan(ctx, span)
}

// endRender ends a render span with the render's outcome.
func endRender(span trace.Span, err error) {
	if err != nil {
		span.SetStatus(otelcodes.Error, err.Error())
	}
	span.End()
}

// endCompleted ends a completion span with the coordinator's answer.
func endCompleted(span trace.Span, c *completion, r *leaseholdv1.CompletionResult) {
	if span == nil {
		return
	}
	code := codes.Code(r.GetCode())
	span.SetAttributes(
		attribute.String("leasehold.outcome", c.outcome),
		attribute.String("leasehold.result.code", code.String()),
		attribute.String("leasehold.phase", r.GetPhase().String()),
	)
	if r.GetReason() != "" {
		span.SetAttributes(attribute.String("leasehold.result.reason", r.GetReason()))
	}
	if code != codes.OK {
		span.SetStatus(otelcodes.Error, code.String()+" "+r.GetReason())
	}
	span.End()
}

// endDropped ends a completion span whose result was never answered: the
// lease was lost or handed back, or the worker stopped.
func endDropped(span trace.Span, cause error) {
	if span == nil {
		return
	}
	msg := "result dropped"
	if cause != nil {
		msg += ": " + cause.Error()
	}
	span.SetStatus(otelcodes.Error, msg)
	span.End()
}
