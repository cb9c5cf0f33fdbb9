package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/v3/internal/outboxtest"
	"github.com/outbox-relay/outbox-relay/v3/internal/tracing"
	"github.com/outbox-relay/outbox-relay/v3/internal/tracing/tracingtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
)

func validEvent() outbox.Event {
	return outbox.Event{
		Topic:        "order.created",
		PartitionKey: "order:1",
		Payload:      json.RawMessage(`{"order_id":"1","amount_cents":100,"currency":"EUR"}`),
		Headers:      map[string]string{"traceparent": "00-abc-def-01", "X-Correlation-Id": "c-1"},
	}
}

// assertOutboxRows fails the test unless the outbox holds want rows; when says at which
// point of the test.
func assertOutboxRows(t *testing.T, db *pgtest.DB, want int, when string) {
	t.Helper()
	if n := db.Count(t, "SELECT count(*) FROM outbox"); n != want {
		t.Fatalf("%d outbox rows %s, want %d", n, when, want)
	}
}

func TestEnqueueRollsBackWithBusinessTransaction(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := t.Context()
	if _, err := db.Pool.Exec(ctx, "CREATE TABLE orders (id text PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}

	// Rolled back: neither the order nor its event exists.
	err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "INSERT INTO orders VALUES ('1')"); err != nil {
			return err
		}
		if _, err := outbox.Enqueue(ctx, tx, validEvent()); err != nil {
			return err
		}
		return errors.New("business rule failed")
	})
	if err == nil || err.Error() != "business rule failed" {
		t.Fatalf("BeginFunc: %v", err)
	}
	assertOutboxRows(t, db, 0, "after the rolled-back transaction")

	// Committed: exactly one event.
	var id outbox.ID
	err = pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "INSERT INTO orders VALUES ('1')"); err != nil {
			return err
		}
		id, err = outbox.Enqueue(ctx, tx, validEvent())
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	assertOutboxRows(t, db, 1, "after the committed transaction")
	var topic, key string
	var headers map[string]string
	if err := db.Pool.QueryRow(ctx, "SELECT topic, partition_key, headers FROM outbox WHERE id=$1", id).Scan(&topic, &key, &headers); err != nil {
		t.Fatal(err)
	}
	if topic != "order.created" || key != "order:1" || headers["traceparent"] != "00-abc-def-01" {
		t.Fatalf("stored row = %q %q %v", topic, key, headers)
	}
}

func TestEnqueueRejectsInvalidEventsAndWritesNothing(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := t.Context()
	mod := func(f func(*outbox.Event)) outbox.Event { ev := validEvent(); f(&ev); return ev }
	cases := []struct {
		name string
		ev   outbox.Event
		want error
	}{
		{"empty topic", mod(func(e *outbox.Event) { e.Topic = "" }), outbox.ErrInvalidTopic},
		{"slash in topic", mod(func(e *outbox.Event) { e.Topic = "order/created" }), outbox.ErrInvalidTopic},
		{"dotdot topic", mod(func(e *outbox.Event) { e.Topic = ".." }), outbox.ErrInvalidTopic},
		{"dotdot inside topic", mod(func(e *outbox.Event) { e.Topic = "a..b" }), outbox.ErrInvalidTopic},
		{"space in topic", mod(func(e *outbox.Event) { e.Topic = "order created" }), outbox.ErrInvalidTopic},
		{"percent-encoded slash", mod(func(e *outbox.Event) { e.Topic = "a%2Fb" }), outbox.ErrInvalidTopic},
		{"control char topic", mod(func(e *outbox.Event) { e.Topic = "a\nb" }), outbox.ErrInvalidTopic},
		{"topic over 128", mod(func(e *outbox.Event) { e.Topic = strings.Repeat("a", 129) }), outbox.ErrInvalidTopic},
		{"empty key", mod(func(e *outbox.Event) { e.PartitionKey = "" }), outbox.ErrInvalidPartitionKey},
		{"oversized key", mod(func(e *outbox.Event) { e.PartitionKey = strings.Repeat("k", 257) }), outbox.ErrInvalidPartitionKey},
		{"invalid utf8 key", mod(func(e *outbox.Event) { e.PartitionKey = "\xff\xfe" }), outbox.ErrInvalidPartitionKey},
		{"control char key", mod(func(e *outbox.Event) { e.PartitionKey = "a\x00b" }), outbox.ErrInvalidPartitionKey},
		{"empty payload", mod(func(e *outbox.Event) { e.Payload = nil }), outbox.ErrInvalidPayload},
		{"non-JSON payload", mod(func(e *outbox.Event) { e.Payload = json.RawMessage(`{"a":`) }), outbox.ErrInvalidPayload},
		{"invalid utf8 payload", mod(func(e *outbox.Event) { e.Payload = []byte("\"\xff\"") }), outbox.ErrInvalidPayload},
		{"NUL in payload", mod(func(e *outbox.Event) { e.Payload = json.RawMessage(`{"a":"\u0000"}`) }), outbox.ErrInvalidPayload},
		{"unpaired surrogate", mod(func(e *outbox.Event) { e.Payload = json.RawMessage(`{"a":"\ud800"}`) }), outbox.ErrInvalidPayload},
		{"lone low surrogate", mod(func(e *outbox.Event) { e.Payload = json.RawMessage(`"\udc00x"`) }), outbox.ErrInvalidPayload},
		{"number beyond numeric", mod(func(e *outbox.Event) { e.Payload = json.RawMessage(`{"a":1e1000000}`) }), outbox.ErrInvalidPayload},
		{"fraction beyond numeric", mod(func(e *outbox.Event) { e.Payload = json.RawMessage(`[1e-16384]`) }), outbox.ErrInvalidPayload},
		{"deep nesting", mod(func(e *outbox.Event) {
			e.Payload = json.RawMessage(strings.Repeat("[", 65) + strings.Repeat("]", 65))
		}), outbox.ErrInvalidPayload},
		{"oversized payload", mod(func(e *outbox.Event) {
			e.Payload = json.RawMessage(`"` + strings.Repeat("x", outbox.DefaultMaxPayloadBytes) + `"`)
		}), outbox.ErrPayloadTooLarge},
		{"bad header name", mod(func(e *outbox.Event) { e.Headers = map[string]string{"bad name": "v"} }), outbox.ErrInvalidHeaders},
		{"reserved header", mod(func(e *outbox.Event) { e.Headers = map[string]string{"Upstash-Retries": "99"} }), outbox.ErrInvalidHeaders},
		{"reserved outbox header", mod(func(e *outbox.Event) { e.Headers = map[string]string{"X-Outbox-Id": "1"} }), outbox.ErrInvalidHeaders},
		{"CRLF in header value", mod(func(e *outbox.Event) { e.Headers = map[string]string{"X-A": "v\r\nX-Evil: 1"} }), outbox.ErrInvalidHeaders},
		{"oversized headers", mod(func(e *outbox.Event) { e.Headers = map[string]string{"X-A": strings.Repeat("v", 9000)} }), outbox.ErrInvalidHeaders},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := outbox.Enqueue(ctx, db.Pool, tc.ev)
			if !errors.Is(err, tc.want) {
				t.Fatalf("Enqueue error = %v, want %v", err, tc.want)
			}
			var ve *outbox.ValidationError
			if !errors.As(err, &ve) || ve.Reason == "" {
				t.Fatalf("error %v is not a *ValidationError with a reason", err)
			}
			// The batch form rejects the whole batch and reports the index.
			_, err = outbox.EnqueueBatch(ctx, db.Pool, []outbox.Event{validEvent(), tc.ev})
			if !errors.Is(err, tc.want) || !errors.As(err, &ve) || ve.Index != 1 {
				t.Fatalf("EnqueueBatch error = %v, want %v at index 1", err, tc.want)
			}
		})
	}
	assertOutboxRows(t, db, 0, "after the invalid events")
}

// Edge values Postgres does accept must not be rejected.
func TestEnqueueAcceptsWhatPostgresStores(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := t.Context()
	for _, p := range []string{`"\\u0000"`, `"\ud83d\ude00"`, `[1e131071, 1e-16383, -0.5e3]`, `{"k\u00e9":"\u00e9"}`} {
		ev := validEvent()
		ev.Payload = json.RawMessage(p)
		if _, err := outbox.Enqueue(ctx, db.Pool, ev); err != nil {
			t.Errorf("payload %s: %v", p, err)
		}
	}
}

func TestEnqueueInsideTransactionLeavesItUsableAfterRejection(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := t.Context()
	err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		if _, err := outbox.Enqueue(ctx, tx, outbox.Event{Topic: "bad/topic", PartitionKey: "k", Payload: json.RawMessage(`{}`)}); !errors.Is(err, outbox.ErrInvalidTopic) {
			t.Fatalf("want ErrInvalidTopic, got %v", err)
		}
		// Validation happens before any SQL, so the caller's transaction is not aborted.
		_, err := outbox.Enqueue(ctx, tx, validEvent())
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	assertOutboxRows(t, db, 1, "after the rejected and the valid event")
}

func TestEnqueueBatchReturnsIDsInInputOrder(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	evs := make([]outbox.Event, 50)
	for i := range evs {
		evs[i] = validEvent()
		evs[i].PartitionKey = "k" + strings.Repeat("x", i%5)
		evs[i].Payload = json.RawMessage(`{"n":` + string(rune('0'+i%10)) + `}`)
	}
	ids, err := outbox.EnqueueBatch(t.Context(), db.Pool, evs)
	if err != nil {
		t.Fatal(err)
	}
	// The stored key of each id, in the order of ids.
	keys := outboxtest.Column[string](t, db.Pool, `SELECT o.partition_key
FROM unnest($1::bigint[]) WITH ORDINALITY AS u(id, ord) JOIN outbox o USING (id) ORDER BY u.ord`, ids)
	if len(ids) != 50 || len(keys) != 50 {
		t.Fatalf("got %d ids, %d of them stored", len(ids), len(keys))
	}
	for i, id := range ids {
		if keys[i] != evs[i].PartitionKey {
			t.Fatalf("id %d has key %q, want %q", id, keys[i], evs[i].PartitionKey)
		}
	}
}

func TestEnqueueDelay(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := t.Context()
	ev := validEvent()
	ev.AvailableAt = time.Now().Add(time.Hour)
	id, err := outbox.Enqueue(ctx, db.Pool, ev)
	if err != nil {
		t.Fatal(err)
	}
	var delayed bool
	if err := db.Pool.QueryRow(ctx, "SELECT available_at > now() + interval '59 minutes' FROM outbox WHERE id=$1", id).Scan(&delayed); err != nil {
		t.Fatal(err)
	}
	if !delayed {
		t.Fatal("AvailableAt was not stored")
	}
}

// While a relay sleeps, one wake-up per transaction however many rows it enqueues; while
// none sleeps, none at all (migration 0014: producers' commits skip the notify lock).
func TestEnqueueNotifiesOncePerTransaction(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := t.Context()
	lc, err := db.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lc.Release()
	// Other tests' schemas share the database and its channel; use this test's own one by
	// retargeting the trigger function.
	channel := "outbox_" + db.Schema
	if _, err := db.Pool.Exec(ctx, `CREATE OR REPLACE FUNCTION outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN PERFORM pg_notify('`+channel+`', ''); RETURN NULL; END; $$`); err != nil {
		t.Fatal(err)
	}
	if _, err := lc.Exec(ctx, `LISTEN "`+channel+`"`); err != nil {
		t.Fatal(err)
	}
	enqueueSix := func() int {
		err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			evs := []outbox.Event{validEvent(), validEvent(), validEvent()}
			if _, err := outbox.EnqueueBatch(ctx, tx, evs); err != nil {
				return err
			}
			for range 3 {
				if _, err := outbox.Enqueue(ctx, tx, validEvent()); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		got := 0
		for {
			wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			_, err := lc.Conn().WaitForNotification(wctx)
			cancel()
			if err != nil {
				return got
			}
			got++
		}
	}
	// The sleeper lock a sleeping relay holds on its listening session (pkg/relay).
	const sleeper = `(1868724343, 'outbox'::regclass::oid::int)`
	if _, err := lc.Exec(ctx, `SELECT pg_advisory_lock`+sleeper); err != nil {
		t.Fatal(err)
	}
	if got := enqueueSix(); got != 1 {
		t.Fatalf("relay asleep: got %d notifications for one transaction of 6 events, want 1", got)
	}
	if _, err := lc.Exec(ctx, `SELECT pg_advisory_unlock`+sleeper); err != nil {
		t.Fatal(err)
	}
	if got := enqueueSix(); got != 0 {
		t.Fatalf("no relay asleep: got %d notifications, want none", got)
	}
}

// An event becomes ready at the time it was written, not at the start of the producer's
// transaction: the relay's claim walks the ready index from a second before the present
// (internal/outboxstore, walk.go), so an event stamped with the start of a transaction
// that worked for longer than that before writing it would wait for the relay's probe.
// Enqueue, EnqueueBatch and a plain INSERT (migration 0017's default) alike.
func TestAvailableAtIsTheWriteNotTheTransactionStart(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := t.Context()
	const work = 300 * time.Millisecond
	var ids []outbox.ID
	err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_sleep($1)", work.Seconds()); err != nil {
			return err
		}
		id, err := outbox.Enqueue(ctx, tx, validEvent())
		if err != nil {
			return err
		}
		batch, err := outbox.EnqueueBatch(ctx, tx, []outbox.Event{validEvent()})
		if err != nil {
			return err
		}
		var plain outbox.ID
		if err := tx.QueryRow(ctx, `INSERT INTO outbox (topic, partition_key, payload) VALUES ('t', 'k', '{}') RETURNING id`).Scan(&plain); err != nil {
			return err
		}
		ids = append([]outbox.ID{id, plain}, batch...)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	rows, err := db.Pool.Query(ctx, `SELECT id, extract(epoch FROM available_at - created_at) FROM outbox WHERE id = ANY($1) ORDER BY id`, ids)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for rows.Next() {
		var id outbox.ID
		var lag float64
		if err := rows.Scan(&id, &lag); err != nil {
			t.Fatal(err)
		}
		// created_at is the transaction's start (now()); available_at comes after the work.
		if lag < work.Seconds() {
			t.Errorf("event %d: available_at %.3f s after the transaction's start, want at least %v", id, lag, work)
		}
		n++
	}
	if err := rows.Err(); err != nil || n != len(ids) {
		t.Fatalf("read %d of %d events: %v", n, len(ids), err)
	}
}

// TestEnqueueRecordsTheProducerSpan: an event enqueued inside a span carries its trace
// context in the row's headers; an explicit traceparent wins; without a span nothing is
// added.
func TestEnqueueRecordsTheProducerSpan(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	_, tr := tracingtest.New(t)
	ctx, span := tr.Start(t.Context(), "place order")
	defer span.End()

	const hand = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	ev := func(h map[string]string) outbox.Event {
		e := validEvent()
		e.Headers = h
		return e
	}
	traced, err := outbox.Enqueue(ctx, db.Pool, ev(map[string]string{"X-Correlation-Id": "c"}))
	if err != nil {
		t.Fatal(err)
	}
	ids, err := outbox.EnqueueBatch(ctx, db.Pool, []outbox.Event{ev(map[string]string{"traceparent": hand}), ev(nil)})
	if err != nil {
		t.Fatal(err)
	}
	plain, err := outbox.Enqueue(t.Context(), db.Pool, ev(nil))
	if err != nil {
		t.Fatal(err)
	}
	headers := func(id outbox.ID) map[string]string {
		var h map[string]string
		if err := db.Pool.QueryRow(t.Context(), `SELECT headers FROM outbox WHERE id = $1`, id).Scan(&h); err != nil {
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
