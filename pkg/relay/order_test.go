package relay_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/v3/internal/health"
	"github.com/outbox-relay/outbox-relay/v3/internal/metrics"
	"github.com/outbox-relay/outbox-relay/v3/internal/outboxtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/publish"
	"github.com/outbox-relay/outbox-relay/v3/pkg/relay"
)

// callLog records the ids of every Publish call.
type callLog struct {
	mu    sync.Mutex
	calls [][]outbox.Message
	inner relay.Publisher
}

func (c *callLog) Publish(ctx context.Context, msgs []outbox.Message) []publish.Result {
	c.mu.Lock()
	c.calls = append(c.calls, append([]outbox.Message(nil), msgs...))
	c.mu.Unlock()
	return c.inner.Publish(ctx, msgs)
}

func (c *callLog) get() [][]outbox.Message {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([][]outbox.Message(nil), c.calls...)
}

// Publish mode: a batch of 1,000 rows over 20 keys is one Publish call, each key's events
// in id order inside it; fifo mode sends the same batch in 50 waves.
func TestPublishModeOneCallPerBatch(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		ordering publish.Ordering
		calls    int
	}{{publish.OrderingPublish, 1}, {publish.OrderingFIFO, 50}} {
		t.Run(string(tc.ordering), func(t *testing.T) {
			t.Parallel()
			db := pgtest.New(t)
			seed(t, db, 1000, func(i int) string { return fmt.Sprintf("key-%d", i%20) })
			pub := &callLog{inner: &fakePublisher{}}
			st := drain(t.Context(), t, newRelay(t, db, pub, relay.Config{BatchSize: 1000, Ordering: tc.ordering, Logger: quiet()}))
			calls := pub.get()
			if st.Batches != 1 || st.Dispatched != 1000 || len(calls) != tc.calls || st.PublishCalls != tc.calls {
				t.Fatalf("%s: stats %+v, %d calls, want 1 batch in %d calls", tc.ordering, st, len(calls), tc.calls)
			}
			last := map[string]outbox.ID{}
			for _, call := range calls {
				keys := map[string]bool{}
				for _, m := range call {
					if tc.ordering == publish.OrderingFIFO && keys[m.PartitionKey] {
						t.Fatalf("fifo call carries two events of key %s", m.PartitionKey)
					}
					keys[m.PartitionKey] = true
					if m.ID <= last[m.PartitionKey] {
						t.Fatalf("key %s: event %d handed over after %d", m.PartitionKey, m.ID, last[m.PartitionKey])
					}
					last[m.PartitionKey] = m.ID
				}
			}
		})
	}
}

// Fifo mode: a permanent failure at the head of a key holds the key's later events back
// exactly like a retryable one: they are not sent in the same batch (the failed event's dead
// letter is recorded first), and they go out in order afterwards.
func TestFIFOPermanentFailureHoldsKey(t *testing.T) {
	t.Parallel()
	for _, fail := range []struct {
		name string
		err  error
		max  int
	}{
		{"permanent", &httpError{status: 400}, 0},
		{"retry budget exhausted", &httpError{status: 503}, 1},
	} {
		t.Run(fail.name, func(t *testing.T) {
			t.Parallel()
			db := pgtest.New(t)
			ids := seed(t, db, 30, outboxtest.Mod(3)) // 10 per key
			head := ids[0]                            // k0's head
			var deadAt int
			var mu sync.Mutex
			var calls [][]outbox.ID
			fake := &fakePublisher{fail: func(m outbox.Message) error {
				if m.ID == head {
					return fail.err
				}
				return nil
			}}
			pub := &callLog{inner: fake}
			fake.before = func(_ context.Context, msgs []outbox.Message) {
				mu.Lock()
				defer mu.Unlock()
				var c []outbox.ID
				for _, m := range msgs {
					c = append(c, m.ID)
					if m.PartitionKey == "k0" && m.ID != head && deadAt == 0 {
						// The first successor of the failed head: its dead letter must exist.
						deadAt = db.Count(t, "SELECT count(*) FROM dead_letters")
						if deadAt == 0 {
							deadAt = -1
						}
					}
				}
				calls = append(calls, c)
			}
			cfg := relay.Config{BatchSize: 100, Ordering: publish.OrderingFIFO, Logger: quiet()}
			if fail.max > 0 {
				cfg.MaxAttempts = fail.max
			}
			st := drain(t.Context(), t, newRelay(t, db, pub, cfg))
			if deadAt != 1 {
				t.Fatalf("a successor of the failed head was published before its dead letter was recorded (dead letters then: %d)", deadAt)
			}
			first := pub.get()[:10] // the first batch's waves: one event per key each
			for i, call := range first[1:] {
				for _, m := range call {
					if m.PartitionKey == "k0" {
						t.Fatalf("wave %d of the failing batch sent %d of the held key", i+2, m.ID)
					}
				}
			}
			if st.Dispatched != 29 || st.DeadLettered != 1 || st.Released != 9 {
				t.Fatalf("stats %+v: want 29 dispatched, 1 dead, 9 released then sent", st)
			}
			assertKeyOrder(t, fake.records())
		})
	}
}

// One claimed row whose headers cannot be decoded (a non-string value, written around
// Enqueue) does not halt the relay: it is dead-lettered alone, saying why, and the other
// 99 rows of its batch are published.
func TestUndecodableRowIsDeadLetteredAlone(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := t.Context()
	dropHeadersConstraint(t, db)
	seed(t, db, 50, outboxtest.Mod(10))
	var bad outbox.ID
	if err := db.Pool.QueryRow(ctx, `INSERT INTO outbox (topic, partition_key, payload, headers)
VALUES ('order.created', 'k3', '{"order_id":"bad"}', '{"x-n": 1}') RETURNING id`).Scan(&bad); err != nil {
		t.Fatal(err)
	}
	seed(t, db, 49, outboxtest.Mod(10))
	pub := &fakePublisher{}
	st := drain(ctx, t, newRelay(t, db, pub, relay.Config{BatchSize: 100, Logger: quiet()}))
	if st.Dispatched != 99 || st.DeadLettered != 1 || st.Claimed < 100 {
		t.Fatalf("stats %+v: want 99 dispatched and the bad row dead-lettered", st)
	}
	for _, r := range pub.records() {
		if r.id == bad {
			t.Fatal("the undecodable row was handed to the publisher")
		}
	}
	var letterID outbox.ID
	var errText string
	if err := db.Pool.QueryRow(ctx, "SELECT outbox_id, error FROM dead_letters").Scan(&letterID, &errText); err != nil {
		t.Fatal(err)
	}
	if letterID != bad || !strings.Contains(errText, "headers must be a JSON object of string values") {
		t.Fatalf("dead letter %d %q", letterID, errText)
	}
	if s := states(t, db); s.pending != 0 || s.leased != 0 || s.dispatched != 99 {
		t.Fatalf("states %+v", s)
	}
	// The bad row's key kept its order: its later events went out after it was recorded.
	assertKeyOrder(t, pub.records())
}

// dropHeadersConstraint removes a check constraint on outbox.headers, if a migration added
// one, so the test can write the row an old schema (or a non-Go producer) allowed.
func dropHeadersConstraint(t *testing.T, db *pgtest.DB) {
	t.Helper()
	names := outboxtest.Column[string](t, db.Pool, `SELECT conname FROM pg_constraint
WHERE conrelid = 'outbox'::regclass AND contype = 'c' AND pg_get_constraintdef(oid) LIKE '%headers%'`)
	for _, n := range names {
		outboxtest.Exec(t, db.Pool, "ALTER TABLE outbox DROP CONSTRAINT "+pgx.Identifier{n}.Sanitize())
	}
}

// A delayed event holds its key (its later events wait, as FIFO requires) without holding
// other keys, and the age alarm's metric stays 0 while it waits for its AvailableAt.
func TestDelayedEventHoldsKeyAndIsNotLate(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := t.Context()
	if _, err := outbox.Enqueue(ctx, db.Pool, outbox.Event{Topic: "t", PartitionKey: "k", Payload: []byte(`{"n":0}`),
		AvailableAt: time.Now().Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	seed(t, db, 5, func(int) string { return "k" })
	seed(t, db, 3, func(i int) string { return fmt.Sprintf("other-%d", i) })
	pub := &fakePublisher{}
	st := drain(ctx, t, newRelay(t, db, pub, relay.Config{Logger: quiet()}))
	if st.Dispatched != 3 {
		t.Fatalf("stats %+v: want only the other keys' 3 events", st)
	}
	for _, r := range pub.records() {
		if r.key == "k" {
			t.Fatalf("event %d of the delayed key went out before the delayed event", r.id)
		}
	}
	g, err := health.Backlog(ctx, db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	vals := metrics.Backlog(g.Pending, g.Lateness, g.OldestCreatedAge, g.OpenCircuits)
	for _, v := range vals {
		if v.Name == metrics.OldestPendingAgeSeconds && v.Values[0] != 0 {
			t.Fatalf("%s = %v while the only pending key waits for its delay", v.Name, v.Values[0])
		}
	}
	if g.Pending != 6 {
		t.Fatalf("gauge %+v", g)
	}
}
