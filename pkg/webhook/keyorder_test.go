package webhook_test

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash"
	"github.com/outbox-relay/outbox-relay/v3/pkg/webhook"
)

// TestKeyOrderHoldsBehindAFailedEvent: a FIFO queue moved on after the key's previous
// event failed for good, before that failure put it back in the outbox. The next event's
// delivery is held (503 key_order, Retry-After, nothing written) while the previous one
// is dispatched and not applied here; it is applied once the previous one is applied or
// dead-lettered, when its delivery is not from a FIFO queue, when the previous one is of
// a topic this webhook does not handle, or was dispatched longer ago than the window.
func TestKeyOrderHoldsBehindAFailedEvent(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name  string
		prep  string // run on the previous event ($1)
		fifo  bool
		topic string // the previous event's topic
		held  bool
	}{
		{name: "previous failed, fifo", fifo: true, held: true},
		{name: "previous failed, publish ordering", fifo: false},
		{name: "previous applied", prep: `INSERT INTO processed_messages (consumer, message_id) VALUES ('webhook', $1)`, fifo: true},
		{name: "previous dead-lettered", prep: `UPDATE outbox SET dead_lettered_at = now() WHERE id = $1::bigint`, fifo: true},
		{name: "previous back in the outbox", prep: `UPDATE outbox SET dispatched_at = NULL WHERE id = $1::bigint`, fifo: true},
		{name: "previous long ago", prep: `UPDATE outbox SET dispatched_at = now() - interval '3 hours' WHERE id = $1::bigint`, fifo: true},
		{name: "previous of another consumer's topic", topic: "invoice.sent", fifo: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, func(cfg *webhook.Config) { cfg.SharesOutbox = true })
			ctx := t.Context()
			prevTopic := c.topic
			if prevTopic == "" {
				prevTopic = "order.created"
			}
			prev, err := outbox.Enqueue(ctx, f.db.Pool, outbox.Event{Topic: prevTopic, PartitionKey: "k", Payload: json.RawMessage(order("o-0"))})
			if err != nil {
				t.Fatal(err)
			}
			next, err := outbox.Enqueue(ctx, f.db.Pool, outbox.Event{Topic: "order.created", PartitionKey: "k", Payload: json.RawMessage(order("o-1"))})
			if err != nil {
				t.Fatal(err)
			}
			// An event of another key, failed: never holds this one.
			other, err := outbox.Enqueue(ctx, f.db.Pool, outbox.Event{Topic: "order.created", PartitionKey: "j", Payload: json.RawMessage(order("o-2"))})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.db.Pool.Exec(ctx, `UPDATE outbox SET dispatched_at = now() WHERE id = ANY($1::bigint[])`, []int64{int64(prev), int64(next), int64(other)}); err != nil {
				t.Fatal(err)
			}
			if c.prep != "" {
				if _, err := f.db.Pool.Exec(ctx, c.prep, prev.String()); err != nil {
					t.Fatal(err)
				}
			}
			deliver := func() *http.Request {
				r := signedRequest(t, "/events/order.created?outbox_id="+next.String()+"&generation=0", "", order("o-1"))
				if c.fifo {
					r.Header.Set(qstash.HeaderOrdering, qstash.OrderingFIFO)
				}
				return r
			}
			w := f.serve(deliver())
			if !c.held {
				if w.Code != http.StatusOK || !contains(w.Body.String(), "processed") {
					t.Fatalf("%d %s, want 200 processed", w.Code, w.Body)
				}
				return
			}
			if w.Code != http.StatusServiceUnavailable || !contains(w.Body.String(), "key_order") || w.Header().Get("Retry-After") != "5" {
				t.Fatalf("%d %s Retry-After %q, want 503 key_order, Retry-After 5", w.Code, w.Body, w.Header().Get("Retry-After"))
			}
			f.assertNothingWritten(t)
			// The previous event applied (its delivery came back and went through): the
			// retry is applied.
			if _, err := f.db.Pool.Exec(ctx, `INSERT INTO processed_messages (consumer, message_id) VALUES ('webhook', $1)`, prev.String()); err != nil {
				t.Fatal(err)
			}
			w = f.serve(deliver())
			if w.Code != http.StatusOK || !contains(w.Body.String(), "processed") {
				t.Fatalf("after the previous was applied: %d %s, want 200 processed", w.Code, w.Body)
			}
		})
	}
}

// TestKeyOrderPutsBackBehindAReopenedEvent: an earlier event of the key is pending again
// (a failure callback put it back under generation 1) when the next one is delivered from
// a FIFO queue, which can happen when a claim that still saw the earlier one dispatched
// took the next one. The delivery is acknowledged (200 superseded), nothing is applied,
// and its row is back in the outbox under a new generation, to go out after the earlier
// one; its next delivery is applied. A late commit (an earlier event pending at generation
// 0, never dispatched) holds nothing.
func TestKeyOrderPutsBackBehindAReopenedEvent(t *testing.T) {
	t.Parallel()
	for _, gen := range []int{1, 0} {
		f := newFixture(t, func(cfg *webhook.Config) { cfg.SharesOutbox = true })
		ctx := t.Context()
		prev, err := outbox.Enqueue(ctx, f.db.Pool, outbox.Event{Topic: "order.created", PartitionKey: "k", Payload: json.RawMessage(order("o-0"))})
		if err != nil {
			t.Fatal(err)
		}
		next, err := outbox.Enqueue(ctx, f.db.Pool, outbox.Event{Topic: "order.created", PartitionKey: "k", Payload: json.RawMessage(order("o-1"))})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.db.Pool.Exec(ctx, `UPDATE outbox SET dispatched_at = now() WHERE id = $1::bigint`, next.String()); err != nil {
			t.Fatal(err)
		}
		if _, err := f.db.Pool.Exec(ctx, `UPDATE outbox SET generation = $2 WHERE id = $1::bigint`, prev.String(), gen); err != nil {
			t.Fatal(err)
		}
		deliver := func(g string) *http.Request {
			r := signedRequest(t, "/events/order.created?outbox_id="+next.String()+"&generation="+g, "", order("o-1"))
			r.Header.Set(qstash.HeaderOrdering, qstash.OrderingFIFO)
			return r
		}
		w := f.serve(deliver("0"))
		if gen == 0 {
			if w.Code != http.StatusOK || !contains(w.Body.String(), "processed") {
				t.Fatalf("behind a late commit: %d %s, want 200 processed", w.Code, w.Body)
			}
			continue
		}
		if w.Code != http.StatusOK || !contains(w.Body.String(), "superseded") {
			t.Fatalf("%d %s, want 200 superseded", w.Code, w.Body)
		}
		f.assertNothingWritten(t)
		var g int
		var pending bool
		var lastErr string
		if err := f.db.Pool.QueryRow(ctx, `SELECT generation, dispatched_at IS NULL, last_error FROM outbox WHERE id = $1::bigint`, next.String()).Scan(&g, &pending, &lastErr); err != nil {
			t.Fatal(err)
		}
		if g != 1 || !pending || !contains(lastErr, "put back by the webhook") {
			t.Fatalf("row after the put-back: generation %d pending %v error %q, want 1, pending, put back", g, pending, lastErr)
		}
		// The earlier event delivered, this one comes again under generation 1.
		if _, err := f.db.Pool.Exec(ctx, `UPDATE outbox SET dispatched_at = now() WHERE id = ANY($1::bigint[])`, []string{prev.String(), next.String()}); err != nil {
			t.Fatal(err)
		}
		if _, err := f.db.Pool.Exec(ctx, `INSERT INTO processed_messages (consumer, message_id) VALUES ('webhook', $1)`, prev.String()); err != nil {
			t.Fatal(err)
		}
		if w := f.serve(deliver("1")); w.Code != http.StatusOK || !contains(w.Body.String(), "processed") {
			t.Fatalf("generation 1: %d %s, want 200 processed", w.Code, w.Body)
		}
	}
}

// TestKeyOrderTrustsTheSameBatch: an earlier event of the key that is pending again but
// leased under the delivery's own lease went out in the same batch, ahead of it in the
// FIFO queue (the delivery beat the relay's mark): the delivery is applied, not put back.
// Leased under another lease (republished after it), it is put back.
func TestKeyOrderTrustsTheSameBatch(t *testing.T) {
	t.Parallel()
	for _, same := range []bool{true, false} {
		f := newFixture(t, func(cfg *webhook.Config) { cfg.SharesOutbox = true })
		ctx := t.Context()
		prev, err := outbox.Enqueue(ctx, f.db.Pool, outbox.Event{Topic: "order.created", PartitionKey: "k", Payload: json.RawMessage(order("o-0"))})
		if err != nil {
			t.Fatal(err)
		}
		next, err := outbox.Enqueue(ctx, f.db.Pool, outbox.Event{Topic: "order.created", PartitionKey: "k", Payload: json.RawMessage(order("o-1"))})
		if err != nil {
			t.Fatal(err)
		}
		other := "22222222-2222-2222-2222-222222222222"
		if same {
			other = "11111111-1111-1111-1111-111111111111"
		}
		if _, err := f.db.Pool.Exec(ctx, `UPDATE outbox SET generation = 1, lease_token = $2::uuid WHERE id = $1::bigint`, prev.String(), other); err != nil {
			t.Fatal(err)
		}
		if _, err := f.db.Pool.Exec(ctx, `UPDATE outbox SET lease_token = '11111111-1111-1111-1111-111111111111' WHERE id = $1::bigint`, next.String()); err != nil {
			t.Fatal(err)
		}
		r := signedRequest(t, "/events/order.created?outbox_id="+next.String()+"&generation=0", "", order("o-1"))
		r.Header.Set(qstash.HeaderOrdering, qstash.OrderingFIFO)
		w := f.serve(r)
		want := "superseded"
		if same {
			want = "processed"
		}
		if w.Code != http.StatusOK || !contains(w.Body.String(), want) {
			t.Fatalf("same batch %v: %d %s, want 200 %s", same, w.Code, w.Body, want)
		}
	}
}
