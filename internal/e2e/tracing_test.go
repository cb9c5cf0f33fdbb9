package e2e_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/outbox-relay/outbox-relay/v3/examples/orders"
	"github.com/outbox-relay/outbox-relay/v3/internal/tracing/tracingtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash/qstashtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/webhook"
)

// TestTraceFromProducerToCommit: every event is enqueued inside its own producer span and
// travels relay -> local QStash -> webhook with tracing on. Every third event's handler
// fails its first attempt (QStash redelivers it with Upstash-Retried 1), and QStash
// repeats every successful delivery (DuplicateRate 1). Then, per event:
//   - every delivery span with Upstash-Retried 0 is the producer span's child (same
//     trace), every redelivery's span a new trace linked to the producer span;
//   - exactly one delivery span says processed, and its inbox commit is its child;
//   - the relay's batch spans ("send <destination base>") link every event's producer
//     span exactly once, and each batch span's message count is its number of links.
func TestTraceFromProducerToCommit(t *testing.T) {
	t.Parallel()
	const events = 12
	rec, tr := tracingtest.New(t)
	s := newTracedStack(t, tr)
	s.qs.SetFaults(qstashtest.Faults{DuplicateRate: 1})

	ctx := context.Background()
	producers := map[string]trace.SpanContext{} // outbox id -> producer span
	for i := range events {
		pctx, span := tr.Start(ctx, "place order")
		var id outbox.ID
		err := pgx.BeginFunc(pctx, s.db.Pool, func(tx pgx.Tx) error {
			var err error
			id, err = outbox.Enqueue(pctx, tx, orderEvent("o-"+strconv.Itoa(i), 100+i))
			return err
		})
		span.End()
		if err != nil {
			t.Fatal(err)
		}
		producers[strconv.FormatInt(int64(id), 10)] = span.SpanContext()
	}
	if st := s.deliver(t); st.Dispatched != events {
		t.Fatalf("dispatched %d of %d", st.Dispatched, events)
	}

	spans := rec.Ended()
	byID := map[trace.SpanID]sdktrace.ReadOnlySpan{}
	for _, sp := range spans {
		byID[sp.SpanContext().SpanID()] = sp
	}
	processed := map[string]int{}
	redelivered := map[string]bool{}
	for _, sp := range spans {
		if sp.Name() != "process order.created" {
			continue
		}
		id := attrString(sp, "messaging.message.id")
		producer, ok := producers[id]
		if !ok {
			t.Fatalf("delivery span for unknown message %q", id)
		}
		retried, _ := tracingtest.Attr(sp, "messaging.qstash.retried")
		if retried.AsInt64() == 0 {
			if sp.SpanContext().TraceID() != producer.TraceID() || sp.Parent().SpanID() != producer.SpanID() {
				t.Fatalf("event %s: first-delivery span is in trace %s under %s, want the producer's child (trace %s, span %s)",
					id, sp.SpanContext().TraceID(), sp.Parent().SpanID(), producer.TraceID(), producer.SpanID())
			}
		} else {
			redelivered[id] = true
			if sp.SpanContext().TraceID() == producer.TraceID() || len(sp.Links()) != 1 || sp.Links()[0].SpanContext.SpanID() != producer.SpanID() {
				t.Fatalf("event %s: redelivery span (retried %d) in trace %s with links %v, want a new trace linked to producer %s",
					id, retried.AsInt64(), sp.SpanContext().TraceID(), sp.Links(), producer.SpanID())
			}
		}
		if attrString(sp, "outbox.inbox_outcome") == "processed" {
			processed[id]++
			if !hasChild(spans, sp, "inbox commit") {
				t.Fatalf("event %s: the processing delivery has no inbox commit child", id)
			}
		}
	}
	for id := range producers {
		if processed[id] != 1 {
			t.Fatalf("event %s: %d delivery spans say processed, want 1", id, processed[id])
		}
	}
	for id := range producers {
		if n, _ := strconv.Atoi(id); redelivered[id] != (n%3 == 0) {
			t.Fatalf("event %s: redelivered %v; want a redelivery exactly for the events whose first attempt failed", id, redelivered[id])
		}
	}
	if len(redelivered) == 0 {
		t.Fatal("no redelivery happened: the test would not see the linked case")
	}

	linked := map[trace.SpanID]int{}
	batches := 0
	for _, sp := range spans {
		if sp.SpanKind() != trace.SpanKindProducer || len(sp.Links()) == 0 {
			continue
		}
		batches++
		if !strings.HasPrefix(sp.Name(), "send http://127.0.0.1:") {
			t.Fatalf("batch span %q: want it named after the publisher's destination base", sp.Name())
		}
		if n, _ := tracingtest.Attr(sp, "messaging.batch.message_count"); n.AsInt64() != int64(len(sp.Links())) {
			t.Fatalf("batch span %q counts %d messages but links %d", sp.Name(), n.AsInt64(), len(sp.Links()))
		}
		for _, l := range sp.Links() {
			linked[l.SpanContext.SpanID()]++
		}
	}
	for id, p := range producers {
		if linked[p.SpanID()] != 1 {
			t.Fatalf("event %s: linked from %d batch spans, want 1 (of %d batch spans)", id, linked[p.SpanID()], batches)
		}
	}
}

// TestTracingOffRecordsNothing: the same pipeline with no tracer configured records no span
// even though the producer's context carries one (the recorder sees only the producer's).
func TestTracingOffRecordsNothing(t *testing.T) {
	t.Parallel()
	rec, tr := tracingtest.New(t)
	s := newTracedStack(t, nil)
	pctx, span := tr.Start(context.Background(), "place order")
	if _, err := outbox.Enqueue(pctx, s.db.Pool, orderEvent("o-off", 100)); err != nil {
		t.Fatal(err)
	}
	span.End()
	if st := s.deliver(t); st.Dispatched != 1 {
		t.Fatalf("dispatched %d", st.Dispatched)
	}
	if n := len(rec.Ended()); n != 1 {
		t.Fatalf("%d spans ended, want only the producer's", n)
	}
	deliveries, _ := s.attempts()
	if len(deliveries) != 1 || deliveries[0].Status != 200 {
		t.Fatalf("deliveries %+v", deliveries)
	}
}

// newTracedStack is newStack with tracer (nil: off) on the webhook, the failure callback
// and the relay, and a handler that fails the first attempt of every third event.
func newTracedStack(t *testing.T, tr trace.Tracer) *stack {
	t.Helper()
	var mu sync.Mutex
	seen := map[string]bool{}
	flaky := func(ctx context.Context, tx pgx.Tx, d webhook.Delivery) error {
		n, _ := strconv.Atoi(d.MessageID)
		mu.Lock()
		first := !seen[d.MessageID]
		seen[d.MessageID] = true
		mu.Unlock()
		if n%3 == 0 && first {
			return errors.New("first attempt fails")
		}
		return orders.OrderCreated(ctx, tx, d)
	}
	return newStackTraced(t, webhook.Handlers{"order.created": flaky}, 3, tr)
}

func attrString(s sdktrace.ReadOnlySpan, key string) string {
	v, _ := tracingtest.Attr(s, attribute.Key(key))
	return v.String()
}

func hasChild(spans []sdktrace.ReadOnlySpan, parent sdktrace.ReadOnlySpan, name string) bool {
	for _, s := range spans {
		if s.Name() == name && s.Parent().SpanID() == parent.SpanContext().SpanID() {
			return true
		}
	}
	return false
}
