package webhook_test

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/v3/internal/outboxtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/v3/pkg/webhook"
)

// effectFixture is a webhook whose order.created handler records every run in effects,
// with the legacy fallback the webhook function uses (the outbox in the same database).
func effectFixture(t *testing.T) *fixture {
	t.Helper()
	f := newFixture(t, func(c *webhook.Config) {
		c.Handlers = webhook.Handlers{"order.created": func(ctx context.Context, tx pgx.Tx, d webhook.Delivery) error {
			_, err := tx.Exec(ctx, `INSERT INTO effects (message_id) VALUES ($1)`, d.MessageID)
			return err
		}}
		c.Legacy = webhook.LegacyOutbox(c.Pool.(webhook.Querier))
	})
	outboxtest.Exec(t, f.db.Pool, `CREATE TABLE effects (message_id text NOT NULL)`)
	return f
}

func (f *fixture) strings(t *testing.T, q string) []string {
	t.Helper()
	out := outboxtest.Column[string](t, f.db.Pool, q)
	slices.Sort(out)
	return out
}

// TestReplayWithAlteredIdentityHeaders: a captured delivery replayed (inside the signature's
// five minutes) with another X-Outbox-Id, or with the forwarded id and generation both
// changed, is refused with 401 and writes nothing; replayed without them or with another
// Upstash-Message-Id it is a duplicate. The handler ran once and no dedupe record exists
// for any other id. Before the identity came from the signed URL, the first replay ran the
// handler a second time under id 6.
func TestReplayWithAlteredIdentityHeaders(t *testing.T) {
	t.Parallel()
	f := effectFixture(t)
	body := order("o-replay")
	captured := delivery(t, orderPath, "5", body)
	sig := captured.Header.Get("Upstash-Signature")
	if w := f.serve(captured); w.Code != http.StatusOK {
		t.Fatalf("original delivery: status %d %s", w.Code, w.Body)
	}

	replay := func(edit func(h http.Header)) *http.Request {
		r := signedRequest(t, identified(orderPath, "5"), "5", body)
		r.Header.Set("Upstash-Signature", sig) // the captured signature, not a new one
		edit(r.Header)
		return r
	}
	cases := []struct {
		name   string
		edit   func(h http.Header)
		status int
	}{
		{"other X-Outbox-Id", func(h http.Header) { h.Set("X-Outbox-Id", "6") }, http.StatusUnauthorized},
		{"future X-Outbox-Id", func(h http.Header) { h.Set("X-Outbox-Id", "999999") }, http.StatusUnauthorized},
		{"X-Outbox-Id and X-Outbox-Generation both changed", func(h http.Header) {
			h.Set("X-Outbox-Id", "6")
			h.Set("X-Outbox-Generation", "1")
		}, http.StatusUnauthorized},
		{"as forwarded: Upstash-Forward-X-Outbox-Id", func(h http.Header) {
			h.Del("X-Outbox-Id")
			h.Set("Upstash-Forward-X-Outbox-Id", "6")
		}, http.StatusUnauthorized},
		{"id headers removed", func(h http.Header) {
			h.Del("X-Outbox-Id")
			h.Del("X-Outbox-Generation")
		}, http.StatusOK},
		{"other Upstash-Message-Id", func(h http.Header) { h.Set("Upstash-Message-Id", "msg_other") }, http.StatusOK},
	}
	for _, c := range cases {
		w := f.serve(replay(c.edit))
		if w.Code != c.status {
			t.Fatalf("%s: status %d %s, want %d", c.name, w.Code, w.Body, c.status)
		}
		if c.status == http.StatusOK && !contains(w.Body.String(), "duplicate") {
			t.Fatalf("%s: %s, want a duplicate", c.name, w.Body)
		}
	}
	if got := f.strings(t, `SELECT message_id FROM effects`); !slices.Equal(got, []string{"5"}) {
		t.Fatalf("handler ran for %v, want once for 5", got)
	}
	if got := f.strings(t, `SELECT message_id FROM processed_messages`); !slices.Equal(got, []string{"5"}) {
		t.Fatalf("processed_messages %v, want only 5", got)
	}
	if !contains(f.logs.String(), "contradict the signed URL") {
		t.Fatal("refusal not logged")
	}
}

// TestLegacyDeliveries: a delivery published before the identity moved into the URL (no
// outbox_id, the id only in the unsigned X-Outbox-Id) is processed while the legacy window
// is open and the claimed outbox row has the delivery's topic and payload. A replay of it
// under another id is refused unless that id's event has the same topic and payload
// (then it is that event's one delivery; its own delivery later is a duplicate); a future
// id is refused; after the window closes every legacy delivery is refused.
func TestLegacyDeliveries(t *testing.T) {
	t.Parallel()
	f := effectFixture(t)
	ctx := t.Context()
	enqueue := func(orderID string) (string, []byte) {
		p, _ := json.Marshal(map[string]any{"order_id": orderID, "amount_cents": 100, "currency": "EUR"})
		id, err := outbox.Enqueue(ctx, f.db.Pool, outbox.Event{Topic: "order.created", PartitionKey: "order:" + orderID, Payload: p})
		if err != nil {
			t.Fatal(err)
		}
		var text string // what the relay publishes: payload::text
		if err := f.db.Pool.QueryRow(ctx, `SELECT payload::text FROM outbox WHERE id = $1`, id).Scan(&text); err != nil {
			t.Fatal(err)
		}
		return id.String(), []byte(text)
	}
	a, bodyA := enqueue("o-a")
	b, bodyB := enqueue("o-b")
	same, bodySame := enqueue("o-a") // another event with exactly a's topic and payload
	legacy := func(id string, body []byte) *http.Request { return signedRequest(t, orderPath, id, body) }

	// A new database has no deliveries in flight: its window is closed from the start.
	if w := f.serve(legacy(a, bodyA)); w.Code != http.StatusUnauthorized {
		t.Fatalf("legacy delivery on a new database: status %d, want 401", w.Code)
	}
	outboxtest.Exec(t, f.db.Pool, `UPDATE legacy_identity SET accept_until = now() + interval '1 hour'`)
	if w := f.serve(legacy(a, bodyA)); w.Code != http.StatusOK {
		t.Fatalf("legacy delivery: status %d %s", w.Code, w.Body)
	}
	for _, c := range []struct{ name, id string }{
		{"another event's id", b},
		{"a future id", strconv.Itoa(1 << 30)},
		{"not a number", "abc"},
	} {
		if w := f.serve(legacy(c.id, bodyA)); w.Code == http.StatusOK {
			t.Fatalf("replay under %s: status %d, want refused", c.name, w.Code)
		}
	}
	if w := f.serve(legacy(same, bodyA)); w.Code != http.StatusOK {
		t.Fatalf("replay under an identical event's id: status %d", w.Code)
	}
	if w := f.serve(delivery(t, orderPath, same, bodySame)); w.Code != http.StatusOK || !contains(w.Body.String(), "duplicate") {
		t.Fatalf("that event's own delivery: status %d %s, want a duplicate", w.Code, w.Body)
	}
	if got, want := f.strings(t, `SELECT message_id FROM effects`), []string{a, same}; !slices.Equal(got, want) {
		t.Fatalf("effects %v, want %v", got, want)
	}
	if got, want := f.strings(t, `SELECT message_id FROM processed_messages`), []string{a, same}; !slices.Equal(got, want) {
		t.Fatalf("processed_messages %v, want %v (none for %s)", got, want, b)
	}

	outboxtest.Exec(t, f.db.Pool, `UPDATE legacy_identity SET accept_until = now()`)
	if w := f.serve(legacy(b, bodyB)); w.Code != http.StatusUnauthorized {
		t.Fatalf("legacy delivery after the window: status %d, want 401", w.Code)
	}
}
