package outbox_test

import (
	"context"
	"encoding/json"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/outbox-relay/outbox-relay/internal/tracing"
	"github.com/outbox-relay/outbox-relay/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/pkg/postgres/pgtest"
)

// TestEnqueueRecordsTheProducerSpan: an event enqueued inside a span carries its trace
// context in the row's headers; an explicit traceparent wins; without a span nothing is
// added.
func TestEnqueueRecordsTheProducerSpan(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	tp := sdktrace.NewTracerProvider()
	defer tp.Shutdown(context.Background())
	ctx, span := tp.Tracer("test").Start(context.Background(), "place order")
	defer span.End()

	const hand = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	ev := func(h map[string]string) outbox.Event {
		return outbox.Event{Topic: "order.created", PartitionKey: "k", Payload: json.RawMessage(`{}`), Headers: h}
	}
	traced, err := outbox.Enqueue(ctx, db.Pool, ev(map[string]string{"X-Correlation-Id": "c"}))
	if err != nil {
		t.Fatal(err)
	}
	ids, err := outbox.EnqueueBatch(ctx, db.Pool, []outbox.Event{ev(map[string]string{"traceparent": hand}), ev(nil)})
	if err != nil {
		t.Fatal(err)
	}
	plain, err := outbox.Enqueue(context.Background(), db.Pool, ev(nil))
	if err != nil {
		t.Fatal(err)
	}
	headers := func(id outbox.ID) map[string]string {
		var h map[string]string
		if err := db.Pool.QueryRow(context.Background(), `SELECT headers FROM outbox WHERE id = $1`, id).Scan(&h); err != nil {
			t.Fatal(err)
		}
		return h
	}
	if sc := tracing.ProducerSpan(headers(traced)); sc.SpanID() != span.SpanContext().SpanID() || headers(traced)["X-Correlation-Id"] != "c" {
		t.Fatalf("Enqueue in a span stored %v, want its trace context and the caller's header", headers(traced))
	}
	if h := headers(ids[0]); h["traceparent"] != hand {
		t.Fatalf("explicit traceparent replaced: %v", h)
	}
	if sc := tracing.ProducerSpan(headers(ids[1])); sc.SpanID() != span.SpanContext().SpanID() {
		t.Fatalf("EnqueueBatch in a span stored %v", headers(ids[1]))
	}
	if h := headers(plain); len(h) != 0 {
		t.Fatalf("Enqueue without a span stored headers %v", h)
	}
}
