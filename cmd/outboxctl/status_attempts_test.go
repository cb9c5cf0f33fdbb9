package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/internal/health"
	"github.com/outbox-relay/outbox-relay/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/pkg/postgres/pgtest"
	"github.com/outbox-relay/outbox-relay/pkg/qstash"
	"github.com/outbox-relay/outbox-relay/pkg/qstash/qstashtest"
	"github.com/outbox-relay/outbox-relay/pkg/webhook"
)

// TestStatusQStashAttempts runs deliveries through the local QStash server into the real
// webhook: one event succeeds at once, one on its third attempt, one fails all four and is
// recorded by dlq sync. status then reports 8 attempts for 2 delivered events.
func TestStatusQStashAttempts(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	qs := qstashtest.NewTestServer(t, qstashtest.Options{})

	// The handler fails the first "fail" attempts of an event ({"fail": n}).
	srv := httptest.NewUnstartedServer(nil)
	base := "http://" + srv.Listener.Addr().String()
	v, err := qstash.NewVerifier(qstash.VerifierConfig{CurrentSigningKey: qs.CurrentSigningKey, NextSigningKey: qs.NextSigningKey})
	if err != nil {
		t.Fatal(err)
	}
	wh, err := webhook.New(webhook.Config{
		Pool: db.Pool, Verifier: v, PublicBaseURL: base, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Handlers: webhook.Handlers{"order.created": func(_ context.Context, _ pgx.Tx, d webhook.Delivery) error {
			var p struct{ Fail int }
			if err := json.Unmarshal(d.Payload, &p); err != nil {
				return webhook.Permanent(err)
			}
			if d.Attempt < p.Fail {
				return errors.New("not yet")
			}
			return nil
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	srv.Config.Handler = wh
	srv.Start()
	t.Cleanup(srv.Close)

	var msgs []outbox.Message
	for _, fail := range []string{"0", "2", "99"} {
		ev := outbox.Event{Topic: "order.created", PartitionKey: "k" + fail, Payload: json.RawMessage(`{"fail":` + fail + `}`)}
		id, err := outbox.Enqueue(ctx, db.Pool, ev)
		if err != nil {
			t.Fatal(err)
		}
		msgs = append(msgs, outbox.Message{ID: id, Topic: ev.Topic, PartitionKey: ev.PartitionKey, Payload: ev.Payload, Attempt: 1})
	}
	p, err := qstash.NewPublisher(qstash.PublisherConfig{BaseURL: qs.URL, Token: qs.Token, DestinationBaseURL: base, Retries: 3})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range p.Publish(ctx, msgs) {
		if r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	waitDLQ(t, qs, 1)
	vars := map[string]string{"DATABASE_URL": db.URL, "QSTASH_URL": qs.URL, "QSTASH_TOKEN": qs.Token, "PUBLIC_BASE_URL": base}
	if code, out, stderr := runCLIEnv(t, vars, "dlq", "sync"); code != 0 || !strings.Contains(out, "1 recorded") {
		t.Fatalf("dlq sync: %d %s %s", code, out, stderr)
	}

	// Degraded (one dead letter) is beside the point here.
	code, m, stderr := statusJSON(t, db.URL, append(relaxed, "--max-dead-letters", "1")...)
	if code != 0 {
		t.Fatalf("status: %d %s", code, stderr)
	}
	raw, _ := json.Marshal(m["qstash_attempts"])
	var got health.AttemptsReport
	if err := json.Unmarshal(raw, &got); err != nil {
		t.Fatalf("qstash_attempts %s: %v", raw, err)
	}
	// Delivered: 1 + 3 attempts; given up: 4 attempts (3 retries).
	want := health.Attempts{Delivered: 2, DeliveryAttempts: 4, DeadLettered: 1, DeadLetterAttempts: 4, Total: 8, PerDelivered: 4}
	if got.LastHour != want || got.LastDay != want {
		t.Fatalf("qstash_attempts %+v, want %+v in both windows", got, want)
	}
	code, out, _ := runCLI(t, db.URL, append([]string{"status", "--max-dead-letters", "1"}, relaxed...)...)
	if code != 0 || !strings.Contains(out, "last hour  4.00 per delivered event: 8 attempts, 4 for 2 delivered, 4 for 1 given up") {
		t.Fatalf("text %d\n%s", code, out)
	}
}

// TestStatusAttemptsUnavailable: a schema without processed_messages.retried (before
// migration 0011) still gets its verdict; the attempts say why they are missing.
func TestStatusAttemptsUnavailable(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	mustExec(t, db, `ALTER TABLE processed_messages DROP COLUMN retried`)
	code, m, _ := statusJSON(t, db.URL, relaxed...)
	if code != 0 || m["status"] != "healthy" || m["qstash_attempts"] != nil {
		t.Fatalf("code %d %v", code, m)
	}
	code, out, _ := runCLI(t, db.URL, append([]string{"status"}, relaxed...)...)
	if code != 0 || !strings.Contains(out, "qstash attempts unavailable") {
		t.Fatalf("text %d\n%s", code, out)
	}
}
