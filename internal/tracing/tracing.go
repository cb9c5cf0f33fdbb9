// Package tracing carries one OpenTelemetry trace from the producer's transaction to the
// consumer's commit, across the outbox table and QStash, where no peer carries it:
//
//   - Inject records the caller's span context (W3C traceparent and tracestate, through
//     the global propagator) in an event's headers when the enqueueing context has one;
//   - the relay forwards those headers through QStash (Upstash-Forward-traceparent) and
//     records one span per batch (StartBatch), linked to every event's producer span;
//   - the webhook runs the handler inside StartDelivery's consumer span: the producer
//     span's child on the first delivery, a new trace linked to it on a redelivery;
//   - the failure callback and a redrive link to the same producer span (Link).
//
// This package needs only the OpenTelemetry API. Package telemetry sets the SDK up from
// the standard OTEL_* variables; tracing is off unless it finds an exporter there. Every
// component takes a trace.Tracer in its config and does nothing when it is nil, so off
// costs nothing.
package tracing

import (
	"context"
	"net/http"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
)

// InstrumentationName names the tracer of every span this project records.
const InstrumentationName = "github.com/outbox-relay/outbox-relay/v3"

// Header names of the W3C trace context, as stored in an outbox row's headers and
// forwarded to the consumer.
const (
	TraceparentHeader = "traceparent"
	TracestateHeader  = "tracestate"
)

// MessagingSystem is the messaging.system attribute of every span.
const MessagingSystem = "qstash"

// propagator is W3C trace context: what the outbox stores does not depend on what the
// process configured globally for its own RPCs.
var propagator = propagation.TraceContext{}

// Inject returns headers with the W3C trace context of ctx's span added, when ctx has a
// valid span context and headers has no traceparent of its own (an explicit header wins).
// headers is not modified; without a span it is returned as is, with no allocation.
func Inject(ctx context.Context, headers map[string]string) map[string]string {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() || hasHeader(headers, TraceparentHeader) {
		return headers
	}
	out := make(map[string]string, len(headers)+2)
	for k, v := range headers {
		out[k] = v
	}
	otel.GetTextMapPropagator().Inject(ctx, propagation.MapCarrier(out))
	if _, ok := out[TraceparentHeader]; !ok {
		// The global propagator is not W3C (or none was set): record W3C regardless, the
		// format the relay forwards and the consumer reads.
		propagator.Inject(ctx, propagation.MapCarrier(out))
	}
	return out
}

// ProducerSpan returns the producer's span context recorded in an event's headers, if any.
func ProducerSpan(headers map[string]string) trace.SpanContext {
	tp, ok := lookup(headers, TraceparentHeader)
	if !ok {
		return trace.SpanContext{}
	}
	c := propagation.MapCarrier{TraceparentHeader: tp}
	if ts, ok := lookup(headers, TracestateHeader); ok {
		c[TracestateHeader] = ts
	}
	return trace.SpanContextFromContext(propagator.Extract(context.Background(), c))
}

// Link is a link to the producer span recorded in headers, or false when there is none.
func Link(headers map[string]string) (trace.Link, bool) {
	sc := ProducerSpan(headers)
	if !sc.IsValid() {
		return trace.Link{}, false
	}
	return trace.Link{SpanContext: sc}, true
}

// StartBatch starts the relay's span for one batch ("send <destination>"), linked to every
// producer span found in the batch's headers; opts add to the span's options (the relay
// passes the claim's start time). With a nil tracer it returns ctx and a no-op span without
// allocating.
func StartBatch(ctx context.Context, tr trace.Tracer, destination string, headers []map[string]string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	if tr == nil {
		return ctx, trace.SpanFromContext(context.Background())
	}
	links := make([]trace.Link, 0, len(headers))
	for _, h := range headers {
		if l, ok := Link(h); ok {
			links = append(links, l)
		}
	}
	return tr.Start(ctx, "send "+destination, append([]trace.SpanStartOption{
		trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithLinks(links...),
		trace.WithAttributes(
			semconv.MessagingSystemKey.String(MessagingSystem),
			semconv.MessagingOperationTypeSend,
			semconv.MessagingOperationName("send"),
			semconv.MessagingDestinationName(destination),
			semconv.MessagingBatchMessageCount(len(headers)),
		)}, opts...)...)
}

// StartDelivery starts the consumer's span for one QStash delivery of topic. On the first
// attempt (retried 0) it is the producer span's child, so the trace reads producer ->
// consumer; on a redelivery it starts a new trace linked to the producer span, so retries
// hours later do not stretch the original trace. With a nil tracer it returns ctx and a
// no-op span without allocating.
func StartDelivery(ctx context.Context, tr trace.Tracer, h http.Header, topic, messageID string, retried int) (context.Context, trace.Span) {
	if tr == nil {
		return ctx, trace.SpanFromContext(context.Background())
	}
	opts := []trace.SpanStartOption{
		trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(
			semconv.MessagingSystemKey.String(MessagingSystem),
			semconv.MessagingOperationTypeProcess,
			semconv.MessagingOperationName("process"),
			semconv.MessagingDestinationName(topic),
			semconv.MessagingMessageID(messageID),
			attribute.Int("messaging.qstash.retried", retried),
		),
	}
	producer := trace.SpanContextFromContext(propagator.Extract(context.Background(), propagation.HeaderCarrier(h)))
	if producer.IsValid() {
		if retried == 0 {
			ctx = trace.ContextWithRemoteSpanContext(ctx, producer)
		} else {
			opts = append(opts, trace.WithNewRoot(), trace.WithLinks(trace.Link{SpanContext: producer}))
		}
	}
	return tr.Start(ctx, "process "+topic, opts...)
}

func hasHeader(h map[string]string, name string) bool {
	_, ok := lookup(h, name)
	return ok
}

// lookup finds name in h case-insensitively (producers may write Traceparent).
func lookup(h map[string]string, name string) (string, bool) {
	if v, ok := h[name]; ok {
		return v, true
	}
	for k, v := range h {
		if strings.EqualFold(k, name) {
			return v, true
		}
	}
	return "", false
}
