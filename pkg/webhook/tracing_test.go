package webhook_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/outbox-relay/outbox-relay/v3/examples/orders"
	"github.com/outbox-relay/outbox-relay/v3/internal/logtest"
	"github.com/outbox-relay/outbox-relay/v3/internal/telemetry"
	"github.com/outbox-relay/outbox-relay/v3/internal/tracing"
	"github.com/outbox-relay/outbox-relay/v3/internal/tracing/tracingtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/webhook"
)

// traced is a fixture whose handler records spans in rec.
func traced(t *testing.T, handler webhook.HandlerFunc) (*fixture, *tracetest.SpanRecorder, trace.Tracer) {
	t.Helper()
	rec, tr := tracingtest.New(t)
	f := newFixture(t, func(c *webhook.Config) {
		c.Tracer = tr
		if handler != nil {
			c.Handlers = webhook.Handlers{"order.created": handler}
		}
	})
	return f, rec, tr
}

// producer starts and ends a producer span and returns its context and the traceparent
// the relay would forward.
func producer(t *testing.T, tr trace.Tracer) (trace.SpanContext, string) {
	t.Helper()
	ctx, span := tr.Start(t.Context(), "place order")
	span.End()
	return span.SpanContext(), tracing.Inject(ctx, nil)[tracing.TraceparentHeader]
}

// spansNamed returns the ended spans whose name starts with prefix, in end order.
func spansNamed(rec *tracetest.SpanRecorder, prefix string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if strings.HasPrefix(s.Name(), prefix) {
			out = append(out, s)
		}
	}
	return out
}

// TestTracingFirstDeliveryAndRedelivery: the first delivery's span is the producer span's
// child and the inbox commit is its child; a redelivery (Upstash-Retried > 0) starts a new
// trace linked to the producer span. Outcome and status are on the delivery span.
func TestTracingFirstDeliveryAndRedelivery(t *testing.T) {
	t.Parallel()
	var handlerSpan trace.SpanContext
	capture := func(ctx context.Context, tx pgx.Tx, d webhook.Delivery) error {
		handlerSpan = trace.SpanContextFromContext(ctx)
		return orders.OrderCreated(ctx, tx, d)
	}
	f, rec, tr := traced(t, capture)
	prod, tp := producer(t, tr)

	r := delivery(t, orderPath, "7", order("o-7"))
	r.Header.Set("Traceparent", tp)
	if w := f.serve(r); w.Code != http.StatusOK {
		t.Fatalf("first delivery: status %d %s", w.Code, w.Body)
	}
	r = delivery(t, orderPath, "7", order("o-7"))
	r.Header.Set("Traceparent", tp)
	r.Header.Set("Upstash-Retried", "2")
	if w := f.serve(r); w.Code != http.StatusOK {
		t.Fatalf("redelivery: status %d %s", w.Code, w.Body)
	}

	deliveries := spansNamed(rec, "process ")
	commits := spansNamed(rec, "inbox commit")
	if len(deliveries) != 2 || len(commits) != 2 {
		t.Fatalf("%d delivery and %d commit spans, want 2 and 2", len(deliveries), len(commits))
	}
	first, again := deliveries[0], deliveries[1]
	if first.SpanContext().TraceID() != prod.TraceID() || first.Parent().SpanID() != prod.SpanID() || first.SpanKind() != trace.SpanKindConsumer {
		t.Fatalf("first delivery span: trace %s parent %s kind %v; want the producer's child (trace %s, span %s)",
			first.SpanContext().TraceID(), first.Parent().SpanID(), first.SpanKind(), prod.TraceID(), prod.SpanID())
	}
	if c := commits[0]; c.Parent().SpanID() != first.SpanContext().SpanID() || c.SpanContext().TraceID() != prod.TraceID() {
		t.Fatal("inbox commit span is not the first delivery span's child")
	}
	if !handlerSpan.Equal(commits[0].SpanContext()) {
		t.Fatal("the handler's context does not carry the inbox commit span")
	}
	if again.SpanContext().TraceID() == prod.TraceID() || again.Parent().IsValid() ||
		len(again.Links()) != 1 || again.Links()[0].SpanContext.SpanID() != prod.SpanID() {
		t.Fatalf("redelivery span: trace %s parent %v links %v; want a new root linked to the producer span",
			again.SpanContext().TraceID(), again.Parent(), again.Links())
	}
	for i, want := range []string{"processed", "duplicate"} {
		s := deliveries[i]
		if v, _ := tracingtest.Attr(s, webhook.InboxOutcomeKey); v.AsString() != want {
			t.Fatalf("delivery %d: %s = %q, want %q", i, webhook.InboxOutcomeKey, v.AsString(), want)
		}
		if v, _ := tracingtest.Attr(commits[i], webhook.InboxOutcomeKey); v.AsString() != want {
			t.Fatalf("commit %d: %s = %q, want %q", i, webhook.InboxOutcomeKey, v.AsString(), want)
		}
		if v, _ := tracingtest.Attr(s, "http.response.status_code"); v.AsInt64() != http.StatusOK {
			t.Fatalf("delivery %d: status code attribute %v, want 200", i, v.String())
		}
		if s.Status().Code == codes.Error {
			t.Fatalf("delivery %d has an error status", i)
		}
	}
}

// TestTracingErrorsAndSecrets: a handler failure marks the delivery span (500) and the
// commit span as errors by class, a conflict is an outcome not an error, and no span
// carries the payload, the signature or the handler's error text.
func TestTracingErrorsAndSecrets(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	secret := "card 4111-1111 declined"
	flaky := func(ctx context.Context, tx pgx.Tx, d webhook.Delivery) error {
		if calls.Add(1) == 1 {
			return errors.New(secret)
		}
		return orders.OrderCreated(ctx, tx, d)
	}
	f, rec, tr := traced(t, flaky)
	_, tp := producer(t, tr)

	var sigs []string
	serve := func(id, orderID string, want int) {
		t.Helper()
		r := delivery(t, orderPath, id, order(orderID))
		r.Header.Set("Traceparent", tp)
		sigs = append(sigs, r.Header.Get("Upstash-Signature"))
		if w := f.serve(r); w.Code != want {
			t.Fatalf("delivery %s: status %d, want %d", id, w.Code, want)
		}
	}
	serve("11", "o-secret", http.StatusInternalServerError)
	serve("11", "o-secret", http.StatusOK)
	serve("11", "o-other", webhook.StatusNonRetryable) // another payload under the same id

	deliveries := spansNamed(rec, "process ")
	commits := spansNamed(rec, "inbox commit")
	if len(deliveries) != 3 || len(commits) != 3 {
		t.Fatalf("%d delivery and %d commit spans, want 3 and 3", len(deliveries), len(commits))
	}
	failed := deliveries[0]
	if failed.Status().Code != codes.Error || commits[0].Status().Code != codes.Error {
		t.Fatalf("failed delivery: span status %v, commit %v; want both errors", failed.Status(), commits[0].Status())
	}
	if v, _ := tracingtest.Attr(failed, "http.response.status_code"); v.AsInt64() != http.StatusInternalServerError {
		t.Fatalf("failed delivery status attribute %s", v.String())
	}
	if v, _ := tracingtest.Attr(commits[0], "error.type"); v.AsString() != "transient" {
		t.Fatalf("failed commit error.type %q, want transient", v.AsString())
	}
	if _, ok := tracingtest.Attr(failed, webhook.InboxOutcomeKey); ok {
		t.Fatal("a rolled-back delivery has an inbox outcome")
	}
	conflict := deliveries[2]
	if v, _ := tracingtest.Attr(conflict, webhook.InboxOutcomeKey); v.AsString() != "conflict" || conflict.Status().Code == codes.Error {
		t.Fatalf("conflict: outcome %q status %v; want conflict, not an error (489 is QStash's answer, not a fault here)", v.AsString(), conflict.Status())
	}

	for _, s := range rec.Ended() {
		text := s.Status().Description
		for _, kv := range s.Attributes() {
			text += " " + kv.Value.String()
		}
		for _, e := range s.Events() {
			text += " " + e.Name
			for _, kv := range e.Attributes {
				text += " " + kv.Value.String()
			}
		}
		for _, leak := range append([]string{"o-secret", "o-other", "4111", "amount_cents"}, sigs...) {
			if strings.Contains(text, leak) {
				t.Fatalf("span %q carries %q: %s", s.Name(), leak, text)
			}
		}
	}
}

// TestTracingNoSpanBeforeTheSignature: an unsigned request makes no span, so a client
// without the key cannot fill the trace backend.
func TestTracingNoSpanBeforeTheSignature(t *testing.T) {
	t.Parallel()
	f, rec, _ := traced(t, nil)
	r := delivery(t, orderPath, "12", order("o-12"))
	r.Header.Set("Upstash-Signature", "forged")
	if w := f.serve(r); w.Code != http.StatusUnauthorized {
		t.Fatalf("status %d, want 401", w.Code)
	}
	if n := len(rec.Ended()) + len(rec.Started()); n != 0 {
		t.Fatalf("an unsigned request made %d spans", n)
	}
}

// TestTracingLogLinesCarryTheDeliverySpan: with the functions' log handler, the line a
// delivery logs carries its span's trace and span ids; the line of a request refused
// before any span starts carries none.
func TestTracingLogLinesCarryTheDeliverySpan(t *testing.T) {
	t.Parallel()
	rec, tr := tracingtest.New(t)
	logs := &logtest.Buffer{}
	f := newFixture(t, func(c *webhook.Config) {
		c.Tracer = tr
		c.Logger = slog.New(telemetry.LogHandler(slog.NewJSONHandler(logs, nil)))
	})
	if w := f.serve(delivery(t, orderPath, "13", order("o-13"))); w.Code != http.StatusOK {
		t.Fatalf("delivery: status %d %s", w.Code, w.Body)
	}
	forged := delivery(t, orderPath, "14", order("o-14"))
	forged.Header.Set("Upstash-Signature", "forged")
	if w := f.serve(forged); w.Code != http.StatusUnauthorized {
		t.Fatalf("forged delivery: status %d, want 401", w.Code)
	}

	spans := spansNamed(rec, "process ")
	if len(spans) != 1 {
		t.Fatalf("%d delivery spans, want 1", len(spans))
	}
	sc := spans[0].SpanContext()
	lines := logs.Lines()
	if len(lines) != 2 {
		t.Fatalf("%d log lines, want 2: %v", len(lines), lines)
	}
	if l := lines[0]; l["msg"] != "webhook delivery processed" || l["trace_id"] != sc.TraceID().String() || l["span_id"] != sc.SpanID().String() {
		t.Fatalf("delivery line %v; want trace_id %s span_id %s", l, sc.TraceID(), sc.SpanID())
	}
	if l := lines[1]; l["trace_id"] != nil || l["span_id"] != nil {
		t.Fatalf("the refused request's line carries a span: %v", l)
	}
}
