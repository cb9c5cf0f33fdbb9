package relay_test

import (
	"encoding/json"
	"fmt"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/outbox-relay/outbox-relay/v3/internal/tracing/tracingtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/relay"
)

// TestDrainTraced: a traced drain records one batch span per batch ("send qstash" for a
// publisher that does not name its destination), started at the claim and linked to the
// producer span of every event in it, exactly once over the drain; each has claim, publish
// and mark children, and its outcome counts add up to the drain's stats. A retryable
// failure shows in the counts; untraced events (no traceparent) add no link.
func TestDrainTraced(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	rec, tr := tracingtest.New(t)
	ctx := t.Context()

	const n = 25
	producers := map[trace.SpanID]outbox.ID{}
	var failing outbox.ID
	for i := range n {
		pctx := ctx
		var span trace.Span
		if i != 7 { // one event enqueued without a span
			pctx, span = tr.Start(ctx, "place order")
		}
		id, err := outbox.Enqueue(pctx, db.Pool, outbox.Event{Topic: "order.created", PartitionKey: fmt.Sprintf("k-%d", i),
			Payload: json.RawMessage(`{"n":1}`)})
		if err != nil {
			t.Fatal(err)
		}
		if span != nil {
			span.End()
			producers[span.SpanContext().SpanID()] = id
		}
		if i == 3 {
			failing = id
		}
	}
	pub := &fakePublisher{fail: func(m outbox.Message) error {
		if m.ID == failing {
			return &httpError{status: 503}
		}
		return nil
	}}
	r := newRelay(t, db, pub, relay.Config{BatchSize: 10, Tracer: tr})
	st, err := r.Drain(ctx)
	if err != nil || st.Dispatched != n-1 || st.Retried != 1 {
		t.Fatalf("drain: %+v, %v", st, err)
	}

	children := map[trace.SpanID][]sdktrace.ReadOnlySpan{}
	var batches []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		children[s.Parent().SpanID()] = append(children[s.Parent().SpanID()], s)
		if s.Name() == "send qstash" {
			batches = append(batches, s)
		}
	}
	if len(batches) != st.Batches {
		t.Fatalf("%d batch spans for %d batches", len(batches), st.Batches)
	}
	linked := map[trace.SpanID]int{}
	sums := map[string]int64{}
	for _, b := range batches {
		if b.SpanKind() != trace.SpanKindProducer || b.Parent().IsValid() {
			t.Fatalf("batch span kind %v parent %v: want a producer-kind root", b.SpanKind(), b.Parent())
		}
		for _, l := range b.Links() {
			linked[l.SpanContext.SpanID()]++
		}
		names := map[string]int{}
		for _, c := range children[b.SpanContext().SpanID()] {
			names[c.Name()]++
			if c.StartTime().Before(b.StartTime()) {
				t.Fatalf("child %q starts before its batch span", c.Name())
			}
		}
		if names["claim"] != 1 || names["publish"] < 1 || names["mark"] != 1 {
			t.Fatalf("batch span children %v, want one claim, at least one publish, one mark", names)
		}
		keys := []string{"outbox.relay.deferred"}
		for name := range st.Counts() {
			keys = append(keys, "outbox.relay."+name)
		}
		for _, k := range keys {
			v, ok := tracingtest.Attr(b, attribute.Key(k))
			if !ok {
				t.Fatalf("batch span lacks %s", k)
			}
			sums[k] += v.AsInt64()
		}
		if b.Status().Code == codes.Error {
			t.Fatalf("batch span is an error: %v", b.Status())
		}
	}
	if len(linked) != len(producers) {
		t.Fatalf("batch spans link %d producer spans, want %d", len(linked), len(producers))
	}
	for sp, id := range producers {
		if linked[sp] != 1 {
			// The retried event is published in one batch and linked by it: a retry in a
			// later drain would link again, but this drain does not reach its backoff.
			t.Fatalf("event %d's producer span linked %d times, want 1", id, linked[sp])
		}
	}
	if sums["outbox.relay.dispatched"] != int64(st.Dispatched) || sums["outbox.relay.retried"] != 1 {
		t.Fatalf("outcome attributes %v, stats %+v", sums, st)
	}
	// The batch spans' counts add up to the drain's, under the names the logs use.
	for name, n := range st.Counts() {
		if sums["outbox.relay."+name] != int64(n) {
			t.Fatalf("batch spans' outbox.relay.%s add up to %d, the drain's %s is %d", name, sums["outbox.relay."+name], name, n)
		}
	}
}

// TestDrainUntracedRecordsNothing: without a Tracer the relay records no span even though
// the events carry producer spans and a provider exists.
func TestDrainUntracedRecordsNothing(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	rec, tr := tracingtest.New(t)
	pctx, span := tr.Start(t.Context(), "place order")
	if _, err := outbox.Enqueue(pctx, db.Pool, outbox.Event{Topic: "order.created", PartitionKey: "k", Payload: json.RawMessage(`{}`)}); err != nil {
		t.Fatal(err)
	}
	span.End()
	r := newRelay(t, db, &fakePublisher{}, relay.Config{})
	if st, err := r.Drain(t.Context()); err != nil || st.Dispatched != 1 {
		t.Fatalf("drain: %+v, %v", st, err)
	}
	if n := len(rec.Ended()); n != 1 {
		t.Fatalf("%d spans, want only the producer's", n)
	}
}
