package tracing_test

import (
	"context"
	"net/http"
	"testing"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/outbox-relay/outbox-relay/v3/internal/tracing"
	"github.com/outbox-relay/outbox-relay/v3/internal/tracing/tracingtest"
)

func recorder(t *testing.T) (*tracetest.SpanRecorder, trace.Tracer) {
	t.Helper()
	return tracingtest.New(t)
}

func TestInject(t *testing.T) { // not parallel: AllocsPerRun
	_, tr := recorder(t)
	ctx, span := tr.Start(context.Background(), "business tx")
	defer span.End()

	h := tracing.Inject(ctx, map[string]string{"X-Correlation-Id": "c-1"})
	if h["traceparent"] == "" || h["X-Correlation-Id"] != "c-1" {
		t.Fatalf("Inject = %v, want traceparent added and the caller's header kept", h)
	}
	if got := tracing.ProducerSpan(h); got.TraceID() != span.SpanContext().TraceID() || got.SpanID() != span.SpanContext().SpanID() {
		t.Fatalf("ProducerSpan = %v, want the enqueueing span %v", got, span.SpanContext())
	}

	explicit := map[string]string{"Traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
	if got := tracing.Inject(ctx, explicit); len(got) != 1 || got["Traceparent"] != explicit["Traceparent"] {
		t.Fatalf("an explicit traceparent must win; got %v", got)
	}
	if sc := tracing.ProducerSpan(explicit); sc.TraceID().String() != "0af7651916cd43dd8448eb211c80319c" {
		t.Fatalf("ProducerSpan of a header written by hand = %v", sc)
	}

	plain := map[string]string{"a": "b"}
	if allocs := testing.AllocsPerRun(100, func() { _ = tracing.Inject(context.Background(), plain) }); allocs != 0 {
		t.Fatalf("Inject without a span allocates %.0f times; tracing off must cost nothing", allocs)
	}
	if got := tracing.Inject(context.Background(), nil); got != nil {
		t.Fatalf("Inject without a span = %v, want nil back", got)
	}
}

func TestStartBatchLinksEveryProducer(t *testing.T) { // not parallel: AllocsPerRun
	rec, tr := recorder(t)
	var headers []map[string]string
	var producers []trace.SpanContext
	for range 3 {
		ctx, s := tr.Start(context.Background(), "producer")
		headers = append(headers, tracing.Inject(ctx, nil))
		producers = append(producers, s.SpanContext())
		s.End()
	}
	headers = append(headers, map[string]string{"x": "no trace"})
	_, span := tracing.StartBatch(context.Background(), tr, "https://hooks.example.com/events", headers)
	span.End()

	ended := rec.Ended()
	batch := ended[len(ended)-1]
	if batch.SpanKind() != trace.SpanKindProducer || len(batch.Links()) != 3 {
		t.Fatalf("batch span kind %v with %d links, want producer with 3", batch.SpanKind(), len(batch.Links()))
	}
	for i, l := range batch.Links() {
		if l.SpanContext.SpanID() != producers[i].SpanID() {
			t.Fatalf("link %d = %v, want producer %v", i, l.SpanContext, producers[i])
		}
	}
	if allocs := testing.AllocsPerRun(100, func() {
		_, s := tracing.StartBatch(context.Background(), nil, "d", headers)
		s.End()
	}); allocs != 0 {
		t.Fatalf("StartBatch with a nil tracer allocates %.0f times", allocs)
	}
}

func TestStartDelivery(t *testing.T) { // not parallel: AllocsPerRun
	rec, tr := recorder(t)
	pctx, producer := tr.Start(context.Background(), "producer")
	producer.End()
	h := http.Header{}
	propagation.TraceContext{}.Inject(pctx, propagation.HeaderCarrier(h))

	_, first := tracing.StartDelivery(context.Background(), tr, h, "order.created", "42", 0)
	first.End()
	_, again := tracing.StartDelivery(context.Background(), tr, h, "order.created", "42", 2)
	again.End()

	ended := rec.Ended()
	f, r := ended[len(ended)-2], ended[len(ended)-1]
	if f.Parent().SpanID() != producer.SpanContext().SpanID() || f.SpanContext().TraceID() != producer.SpanContext().TraceID() {
		t.Fatalf("first delivery: parent %v, want the producer span %v", f.Parent(), producer.SpanContext())
	}
	if r.SpanContext().TraceID() == producer.SpanContext().TraceID() || r.Parent().IsValid() {
		t.Fatalf("redelivery must start a new trace; got trace %v parent %v", r.SpanContext().TraceID(), r.Parent())
	}
	if len(r.Links()) != 1 || r.Links()[0].SpanContext.SpanID() != producer.SpanContext().SpanID() {
		t.Fatalf("redelivery links %v, want the producer span", r.Links())
	}
	if allocs := testing.AllocsPerRun(100, func() {
		_, s := tracing.StartDelivery(context.Background(), nil, h, "t", "1", 0)
		s.End()
	}); allocs != 0 {
		t.Fatalf("StartDelivery with a nil tracer allocates %.0f times", allocs)
	}
}
