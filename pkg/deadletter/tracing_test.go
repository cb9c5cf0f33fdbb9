package deadletter_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/outbox-relay/outbox-relay/v3/internal/tracing"
	"github.com/outbox-relay/outbox-relay/v3/internal/tracing/tracingtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/deadletter"
	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
)

// enqueueTraced enqueues an event inside a producer span, as a traced service does, and
// returns its id and the producer span.
func enqueueTraced(t *testing.T, db *pgtest.DB, tr trace.Tracer, n int) (int64, trace.SpanContext) {
	t.Helper()
	ctx, span := tr.Start(context.Background(), "place order")
	defer span.End()
	id, err := outbox.Enqueue(ctx, db.Pool, outbox.Event{Topic: "order.created", PartitionKey: "order:" + itoa(int64(n)),
		Payload: json.RawMessage(`{"order_id":"o-` + itoa(int64(n)) + `","amount_cents":0,"currency":"EUR"}`)})
	if err != nil {
		t.Fatal(err)
	}
	return int64(id), span.SpanContext()
}

func attrOf(s sdktrace.ReadOnlySpan, key attribute.Key) attribute.Value {
	v, _ := tracingtest.Attr(s, key)
	return v
}

// TestCallbackSpanLinksProducer: a traced callback is a span of its own trace linked to
// the producer span named by the traceparent among the source headers, as QStash reports
// them (delivered name or Upstash-Forward- name), with the letter's id and the status.
func TestCallbackSpanLinksProducer(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	rec, tr := tracingtest.New(t)
	h := newCallbackHandler(t, db, func(c *deadletter.CallbackConfig) { c.Tracer = tr })

	for i, name := range []string{"Traceparent", "upstash-forward-traceparent"} {
		id, producer := enqueueTraced(t, db, tr, i)
		dispatch(t, db, id)
		var cb map[string]any
		if err := json.Unmarshal(callbackBody(id, "msg-"+itoa(id)), &cb); err != nil {
			t.Fatal(err)
		}
		tp := tracing.Inject(trace.ContextWithSpanContext(context.Background(), producer), nil)[tracing.TraceparentHeader]
		cb["sourceHeader"].(map[string]any)[name] = []string{tp}
		body, _ := json.Marshal(cb)
		if w := serveCallback(h, signedCallback(t, failureURL, body)); w.Code != http.StatusOK {
			t.Fatalf("callback: status %d %s", w.Code, w.Body)
		}
		spans := rec.Ended()
		s := spans[len(spans)-1]
		if !strings.HasPrefix(s.Name(), "dead_letter") || s.Parent().IsValid() || s.SpanContext().TraceID() == producer.TraceID() {
			t.Fatalf("callback span %q parent %v trace %s: want a root of a new trace", s.Name(), s.Parent(), s.SpanContext().TraceID())
		}
		if len(s.Links()) != 1 || s.Links()[0].SpanContext.SpanID() != producer.SpanID() {
			t.Fatalf("header %s: callback span links %v, want the producer span %s", name, s.Links(), producer.SpanID())
		}
		var letter int64
		if err := db.Pool.QueryRow(context.Background(), `SELECT id FROM dead_letters WHERE outbox_id = $1`, id).Scan(&letter); err != nil {
			t.Fatal(err)
		}
		if got := attrOf(s, "outbox.dead_letter.id").AsInt64(); got != letter {
			t.Fatalf("span names letter %d, want %d", got, letter)
		}
		if got := attrOf(s, "http.response.status_code").AsInt64(); got != http.StatusOK {
			t.Fatalf("span status code %d", got)
		}
		for _, kv := range s.Attributes() {
			if strings.Contains(kv.Value.String(), "o-") || strings.Contains(kv.Value.String(), "rejected") {
				t.Fatalf("span carries a body: %s=%s", kv.Key, kv.Value.String())
			}
		}
	}

	// Without a traceparent there is nothing to link: a span with no links.
	id := enqueue(t, db, "order.created", "order:9", `{"order_id":"o-9","amount_cents":0,"currency":"EUR"}`)
	dispatch(t, db, id)
	if w := serveCallback(h, signedCallback(t, failureURL, callbackBody(id, "msg-plain"))); w.Code != http.StatusOK {
		t.Fatalf("status %d", w.Code)
	}
	spans := rec.Ended()
	if s := spans[len(spans)-1]; len(s.Links()) != 0 {
		t.Fatalf("untraced event's callback links %v", s.Links())
	}
}

// TestRedriveSpanLinksProducers: a traced redrive links the producer span of every event it
// redrove, and only those; untraced Redrive records nothing.
func TestRedriveSpanLinksProducers(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	rec, tr := tracingtest.New(t)
	ctx := context.Background()

	want := map[trace.SpanID]bool{}
	var letters []int64
	for i := range 3 {
		id, producer := enqueueTraced(t, db, tr, i)
		dispatch(t, db, id)
		r, err := deadletter.Record(ctx, db.Pool, failure(id, "msg-"+itoa(id)))
		if err != nil {
			t.Fatal(err)
		}
		letters = append(letters, r.LetterID)
		if i < 2 {
			want[producer.SpanID()] = true
		}
	}
	// Untraced redrive of the third: no span, and it is resolved, so the traced redrive of
	// all three below redrives two.
	before := len(rec.Ended())
	if res, err := deadletter.Redrive(ctx, db.Pool, deadletter.Filter{IDs: letters[2:]}, nil); err != nil || len(res.Redriven) != 1 {
		t.Fatalf("untraced redrive: %+v, %v", res, err)
	}
	if len(rec.Ended()) != before {
		t.Fatal("an untraced redrive recorded a span")
	}

	res, err := deadletter.Redrive(ctx, db.Pool, deadletter.Filter{IDs: letters}, tr)
	if err != nil || len(res.Redriven) != 2 || len(res.AlreadyResolved) != 1 {
		t.Fatalf("traced redrive: %+v, %v", res, err)
	}
	spans := rec.Ended()
	s := spans[len(spans)-1]
	if s.Name() != "redrive dead letters" || len(s.Links()) != 2 {
		t.Fatalf("span %q with %d links, want the redrive with 2", s.Name(), len(s.Links()))
	}
	for _, l := range s.Links() {
		if !want[l.SpanContext.SpanID()] {
			t.Fatalf("redrive links %s, not a redriven event's producer", l.SpanContext.SpanID())
		}
		delete(want, l.SpanContext.SpanID())
	}
	if got := attrOf(s, "outbox.dead_letter.redriven").AsInt64(); got != 2 {
		t.Fatalf("redriven attribute %d, want 2", got)
	}
}
