package localstack_test

import (
	"context"
	"strings"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/outbox-relay/outbox-relay/v3/internal/localstack"
	"github.com/outbox-relay/outbox-relay/v3/internal/tracing"
)

// TestRenderTraces: the producer's span is the root; the batch span that links it and the
// delivery (its child) and the commit (the delivery's child) appear under it.
func TestRenderTraces(t *testing.T) {
	t.Parallel()
	spans := sampleSpans(t)
	producer := spans[0]

	var b strings.Builder
	localstack.RenderTraces(&b, spans, 5)
	out := b.String()
	for _, want := range []string{"trace " + producer.SpanContext().TraceID().String(), "place order", "~ linked from send http://127.0.0.1/events  [producer",
		"  └ process order.created  [consumer", "    └ inbox commit", "messaging.message.id=1"} {
		if !strings.Contains(out, want) {
			t.Fatalf("rendered traces lack %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "unrelated") || strings.Count(out, "trace ") != 2 {
		t.Fatalf("want exactly the producer's trace (and the batch's trace id in its link):\n%s", out)
	}
}

// sampleSpans records one event's trace (the producer's span first, the relay's batch span
// linking it, the first delivery as its child, the inbox commit under that) and an
// unrelated span.
func sampleSpans(t *testing.T) []sdktrace.ReadOnlySpan {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	tr := tp.Tracer("test")
	ctx := context.Background()

	pctx, producer := tr.Start(ctx, "place order", trace.WithSpanKind(trace.SpanKindInternal))
	headers := tracing.Inject(pctx, nil)
	producer.End()
	_, batch := tracing.StartBatch(ctx, tr, "http://127.0.0.1/events", []map[string]string{headers})
	batch.End()
	h := map[string][]string{"Traceparent": {headers["traceparent"]}}
	dctx, delivery := tracing.StartDelivery(ctx, tr, h, "order.created", "1", 0)
	_, commit := tr.Start(dctx, "inbox commit")
	commit.End()
	delivery.End()
	_, lonely := tr.Start(ctx, "unrelated")
	lonely.End()

	return rec.Ended()
}
