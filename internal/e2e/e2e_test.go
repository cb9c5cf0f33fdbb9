package e2e_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"

	"github.com/outbox-relay/outbox-relay/v3/examples/orders"
	"github.com/outbox-relay/outbox-relay/v3/internal/localstack"
	"github.com/outbox-relay/outbox-relay/v3/pkg/deadletter"
	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash/qstashtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/relay"
	"github.com/outbox-relay/outbox-relay/v3/pkg/webhook"
)

// stack is the pipeline (localstack.Pipeline: the local QStash server, the webhook and the
// failure-callback recorder on loopback, a publisher) over a test schema, and a relay.
type stack struct {
	db         *pgtest.DB
	qs         *qstashtest.Server
	failureURL string
	relay      *relay.Relay
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func newStack(t *testing.T, handlers webhook.Handlers, retries int) *stack {
	t.Helper()
	return newStackTraced(t, handlers, retries, nil)
}

// newStackTraced is newStack with tr (nil: off) tracing the receivers and the relay.
func newStackTraced(t *testing.T, handlers webhook.Handlers, retries int, tr trace.Tracer) *stack {
	t.Helper()
	s := &stack{db: pgtest.New(t)}
	if err := orders.Migrate(t.Context(), s.db.Pool); err != nil {
		t.Fatal(err)
	}
	s.start(t, s.db.Pool, handlers, retries, tr)
	return s
}

// start runs the local QStash, the receivers and a relay, all on pool.
func (s *stack) start(t *testing.T, pool *pgxpool.Pool, handlers webhook.Handlers, retries int, tr trace.Tracer) {
	t.Helper()
	pl, err := localstack.StartPipeline(context.Background(), localstack.PipelineConfig{
		Pool: pool, Handlers: handlers,
		// TimeScale shrinks QStash's backoff (12 s, 2.5 min, ...) to milliseconds.
		QStash:    qstashtest.Options{TimeScale: 0.0001},
		Publisher: qstash.PublisherConfig{Retries: retries},
		Logger:    quiet(),
		Tracer:    tr,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pl.Close)
	s.qs, s.failureURL = pl.QStash, pl.FailureURL
	if s.relay, err = pl.NewRelay(pool, relay.Config{Logger: quiet()}); err != nil {
		t.Fatal(err)
	}
}

// deliver drains the outbox once and waits until QStash has nothing pending (deliveries,
// retries and failure callbacks all done).
func (s *stack) deliver(t *testing.T) relay.Stats {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	st, err := s.relay.Drain(ctx)
	if err != nil {
		t.Fatalf("drain: %v", err)
	}
	if err := s.qs.WaitIdle(ctx); err != nil {
		t.Fatalf("wait for QStash to go idle: %v", err)
	}
	return st
}

func (s *stack) count(t *testing.T, q string, args ...any) int {
	t.Helper()
	return s.db.Count(t, q, args...)
}

// enqueue writes ev to the outbox outside any business transaction.
func (s *stack) enqueue(t *testing.T, ev outbox.Event) outbox.ID {
	t.Helper()
	id, err := outbox.Enqueue(t.Context(), s.db.Pool, ev)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// onlyLetter returns the one dead letter, failing the test unless there is exactly one.
func (s *stack) onlyLetter(t *testing.T) deadletter.Letter {
	t.Helper()
	letters, err := deadletter.List(t.Context(), s.db.Pool, deadletter.Filter{})
	if err != nil || len(letters) != 1 {
		t.Fatalf("letters %+v %v", letters, err)
	}
	return letters[0]
}

// attempts returns the delivery attempts to the webhook and the failure callbacks.
func (s *stack) attempts() (deliveries, callbacks []qstashtest.Attempt) {
	for _, a := range s.qs.Attempts() {
		if a.FailureCallback {
			callbacks = append(callbacks, a)
		} else {
			deliveries = append(deliveries, a)
		}
	}
	return deliveries, callbacks
}

func orderEvent(orderID string, cents int) outbox.Event {
	p, _ := json.Marshal(map[string]any{"order_id": orderID, "amount_cents": cents, "currency": "EUR"})
	return outbox.Event{Topic: "order.created", PartitionKey: "order:" + orderID, Payload: p, Headers: map[string]string{"X-Correlation-Id": "corr-" + orderID}}
}

var orderHandlers = webhook.Handlers{"order.created": orders.OrderCreated}

// TestEventAppliedOnce: an event enqueued in a business transaction travels relay ->
// local QStash -> webhook and is applied once, even though QStash delivers it twice; an
// event whose transaction rolled back is never delivered.
func TestEventAppliedOnce(t *testing.T) {
	t.Parallel()
	s := newStack(t, orderHandlers, 3)
	ctx := t.Context()
	if _, err := s.db.Pool.Exec(ctx, `CREATE TABLE orders (id text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	// QStash's at-least-once delivery: every successful delivery is repeated once.
	s.qs.SetFaults(qstashtest.Faults{DuplicateRate: 1})

	var id outbox.ID
	err := pgx.BeginFunc(ctx, s.db.Pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO orders (id) VALUES ('o-1')`); err != nil {
			return err
		}
		var err error
		id, err = outbox.Enqueue(ctx, tx, orderEvent("o-1", 1250))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	rollback := errors.New("business rule failed")
	err = pgx.BeginFunc(ctx, s.db.Pool, func(tx pgx.Tx) error {
		if _, err := outbox.Enqueue(ctx, tx, orderEvent("o-rolled-back", 100)); err != nil {
			return err
		}
		return rollback
	})
	if !errors.Is(err, rollback) {
		t.Fatal(err)
	}

	st := s.deliver(t)
	if st.Dispatched != 1 {
		t.Fatalf("relay stats %+v, want 1 dispatched", st)
	}
	deliveries, callbacks := s.attempts()
	if len(deliveries) < 2 || len(callbacks) != 0 {
		t.Fatalf("%d deliveries, %d callbacks; want the duplicate delivery and no callback", len(deliveries), len(callbacks))
	}
	for _, a := range deliveries {
		if a.Status != http.StatusOK || a.Header.Get("X-Outbox-Id") != id.String() || a.Header.Get("X-Correlation-Id") != "corr-o-1" {
			t.Fatalf("delivery %+v", a)
		}
	}
	if n := s.count(t, `SELECT count(*) FROM billing_charges WHERE order_id = 'o-1' AND outbox_id = $1 AND amount_cents = 1250`, id.String()); n != 1 {
		t.Fatalf("%d charges for o-1, want 1", n)
	}
	if n := s.count(t, `SELECT count(*) FROM billing_charges`); n != 1 {
		t.Fatalf("%d charges in total, want 1 (the rolled-back event must not be delivered)", n)
	}
	if n := s.count(t, `SELECT count(*) FROM processed_messages WHERE message_id = $1`, id.String()); n != 1 {
		t.Fatalf("%d dedupe records, want 1", n)
	}
	if n := s.count(t, `SELECT count(*) FROM outbox WHERE id = $1 AND dispatched_at IS NOT NULL AND dead_lettered_at IS NULL`, id); n != 1 {
		t.Fatal("outbox row not dispatched")
	}
}

// TestPoisonEventDeadLetteredAndRedriven: a poison event travels relay -> local QStash ->
// 489 -> failure callback -> dead_letters; the callback replayed adds nothing and a forged
// one is refused; after the handler is fixed, redrive delivers it and it is applied once.
func TestPoisonEventDeadLetteredAndRedriven(t *testing.T) {
	t.Parallel()
	// The handler rejects the event permanently until "fixed" (a deploy, in real life):
	// a poison event stays poison, so redrive needs the cause removed.
	var fixed atomic.Bool
	handlers := webhook.Handlers{"order.created": func(ctx context.Context, tx pgx.Tx, d webhook.Delivery) error {
		if !fixed.Load() {
			return webhook.Permanent(errors.New("customer is blocked"))
		}
		return orders.OrderCreated(ctx, tx, d)
	}}
	s := newStack(t, handlers, 3)
	ctx := t.Context()
	id := s.enqueue(t, orderEvent("o-poison", 990))

	s.deliver(t)
	deliveries, callbacks := s.attempts()
	// 489 + Upstash-NonRetryable-Error: no retries despite a budget of 3.
	if len(deliveries) != 1 || deliveries[0].Status != webhook.StatusNonRetryable {
		t.Fatalf("deliveries %+v, want one 489", deliveries)
	}
	if len(callbacks) != 1 || callbacks[0].Status != http.StatusOK {
		t.Fatalf("failure callbacks %+v, want one answered 200", callbacks)
	}
	l := s.onlyLetter(t)
	var p map[string]any
	if json.Unmarshal(l.Payload, &p) != nil || p["order_id"] != "o-poison" || l.OutboxID != id ||
		l.Source != deadletter.SourceDelivery || l.StatusCode != webhook.StatusNonRetryable ||
		l.QStashMessageID != deliveries[0].MessageID || l.QStashDLQID == "" || l.Topic != "order.created" || l.PartitionKey != "order:o-poison" {
		t.Fatalf("letter %+v", l)
	}
	// The handler's reason, through the 489's body and QStash's failure callback, is the
	// letter's: in its error (so its group, dlq show and the console say why) and body.
	if want := "qstash delivery failed: HTTP 489 after 0 of 3 retries: customer is blocked"; l.Error != want ||
		l.ResponseBody != `{"error":"rejected","message":"customer is blocked"}`+"\n" {
		t.Fatalf("letter error %q, response body %q; want %q and the handler's message", l.Error, l.ResponseBody, want)
	}
	if n := s.count(t, `SELECT count(*) FROM outbox WHERE id = $1 AND dead_lettered_at IS NOT NULL`, id); n != 1 {
		t.Fatal("outbox row not marked dead-lettered")
	}
	if n := s.count(t, `SELECT count(*) FROM billing_charges`) + s.count(t, `SELECT count(*) FROM processed_messages`); n != 0 {
		t.Fatal("rejected event left writes behind")
	}

	// The same callback again (QStash retries callbacks too): 200, still one letter.
	// A forged one (body changed, signature kept): 401, nothing written.
	replay := func(body []byte) int {
		req, _ := http.NewRequest(http.MethodPost, s.failureURL, bytes.NewReader(body))
		req.Header = callbacks[0].Header.Clone()
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if st := replay(callbacks[0].Body); st != http.StatusOK {
		t.Fatalf("replayed callback: %d", st)
	}
	forged := bytes.Replace(callbacks[0].Body, []byte(deliveries[0].MessageID), []byte("msg_forged"), 1)
	if st := replay(forged); st != http.StatusUnauthorized {
		t.Fatalf("forged callback: %d", st)
	}
	if n := s.count(t, `SELECT count(*) FROM dead_letters`); n != 1 {
		t.Fatalf("%d letters after replay and forgery, want 1", n)
	}

	fixed.Store(true)
	res, err := deadletter.Redrive(ctx, s.db.Pool, deadletter.Filter{IDs: []int64{l.ID}}, nil)
	if err != nil || len(res.Redriven) != 1 || res.Redriven[0].Generation != 1 {
		t.Fatalf("redrive %+v %v", res, err)
	}
	s.deliver(t)
	deliveries, _ = s.attempts()
	last := deliveries[len(deliveries)-1]
	if len(deliveries) != 2 || last.Status != http.StatusOK || last.MessageID == deliveries[0].MessageID {
		t.Fatalf("deliveries after redrive %+v, want a new QStash message answered 200", deliveries)
	}
	if n := s.count(t, `SELECT count(*) FROM billing_charges WHERE order_id = 'o-poison' AND outbox_id = $1`, id.String()); n != 1 {
		t.Fatalf("%d charges after redrive, want 1", n)
	}
	if n := s.count(t, `SELECT count(*) FROM outbox WHERE id = $1 AND dispatched_at IS NOT NULL AND dead_lettered_at IS NULL AND generation = 1`, id); n != 1 {
		t.Fatal("outbox row not dispatched after redrive")
	}
	if got, _ := deadletter.Get(ctx, s.db.Pool, l.ID); !got.Resolved() || got.Resolution != deadletter.ResolutionRedriven {
		t.Fatalf("letter after redrive %+v", got)
	}

	// Redriving again is a no-op that says so; nothing is published.
	res, err = deadletter.Redrive(ctx, s.db.Pool, deadletter.Filter{IDs: []int64{l.ID}}, nil)
	if err != nil || len(res.AlreadyResolved) != 1 || len(res.Redriven) != 0 {
		t.Fatalf("second redrive %+v %v", res, err)
	}
	if st := s.deliver(t); st.Claimed != 0 {
		t.Fatalf("second redrive published again: %+v", st)
	}
}

// TestRetriesExhaustedGoesBackToTheOutbox: a consumer that answers 500 to every attempt
// until QStash's retries run out is down, not the event's fault: the failure callback puts
// the event back in the outbox under its next generation and opens its topic's circuit,
// and no dead letter is written (docs/reliability.md, Consumer outage).
func TestRetriesExhaustedGoesBackToTheOutbox(t *testing.T) {
	t.Parallel()
	handlers := webhook.Handlers{"order.created": func(context.Context, pgx.Tx, webhook.Delivery) error {
		return errors.New("downstream unavailable")
	}}
	s := newStack(t, handlers, 2)
	id := s.enqueue(t, orderEvent("o-flaky", 10))
	s.deliver(t)
	deliveries, callbacks := s.attempts()
	if len(deliveries) != 3 || len(callbacks) != 1 {
		t.Fatalf("%d deliveries, %d callbacks; want 3 (1 + 2 retries) and 1", len(deliveries), len(callbacks))
	}
	for i, a := range deliveries {
		if a.Status != http.StatusInternalServerError || a.Retried != i {
			t.Fatalf("delivery %d: %+v", i, a)
		}
	}
	if n := s.count(t, `SELECT count(*) FROM dead_letters`); n != 0 {
		t.Fatalf("%d dead letters for a consumer that was down, want 0", n)
	}
	if n := s.count(t, `SELECT count(*) FROM outbox WHERE id = $1 AND generation = 1
		AND dispatched_at IS NULL AND dead_lettered_at IS NULL`, id); n != 1 {
		t.Fatalf("event %d is not pending again under generation 1", id)
	}
	if n := s.count(t, `SELECT count(*) FROM outbox_circuits WHERE topic = 'order.created'`); n != 1 {
		t.Fatalf("no open circuit for order.created")
	}
}

// TestRedriveOfProcessedEventIsNotAppliedTwice: when an event was in fact applied but its
// outbox row still ended up dead-lettered (e.g. the relay lost the publish response), a
// redrive delivers it again and the consumer's dedupe keeps it from being applied twice.
func TestRedriveOfProcessedEventIsNotAppliedTwice(t *testing.T) {
	t.Parallel()
	s := newStack(t, orderHandlers, 3)
	ctx := t.Context()
	id := s.enqueue(t, orderEvent("o-twice", 500))
	s.deliver(t)
	// Simulate the ambiguous failure: the row dead-lettered by the relay after delivery.
	var letterID int64
	err := s.db.Pool.QueryRow(ctx, `WITH o AS (UPDATE outbox SET dead_lettered_at = now(), dispatched_at = NULL WHERE id = $1 RETURNING id, topic, partition_key, payload)
		INSERT INTO dead_letters (source, outbox_id, topic, partition_key, payload, error) SELECT 'relay', id, topic, partition_key, payload, 'publish timed out' FROM o RETURNING id`, id).Scan(&letterID)
	if err != nil {
		t.Fatal(err)
	}
	if res, err := deadletter.Redrive(ctx, s.db.Pool, deadletter.Filter{Topic: "order.created"}, nil); err != nil || len(res.Redriven) != 1 {
		t.Fatalf("redrive %+v %v", res, err)
	}
	s.deliver(t)
	deliveries, _ := s.attempts()
	if len(deliveries) != 2 || deliveries[1].Status != http.StatusOK || !bytes.Contains(deliveries[1].Body, []byte("o-twice")) {
		t.Fatalf("deliveries %+v", deliveries)
	}
	if n := s.count(t, `SELECT count(*) FROM billing_charges WHERE outbox_id = $1`, id.String()); n != 1 {
		t.Fatalf("%d charges, want 1", n)
	}
}
