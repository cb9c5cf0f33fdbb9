package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/v3/internal/health"
	"github.com/outbox-relay/outbox-relay/v3/internal/health/healthtest"
	"github.com/outbox-relay/outbox-relay/v3/internal/outboxstore"
	"github.com/outbox-relay/outbox-relay/v3/internal/testwait"
	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash/qstashtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/webhook"
)

func statusJSON(t *testing.T, url string, flags ...string) (int, map[string]any, string) {
	t.Helper()
	code, out, stderr := runCLI(t, url, append([]string{"status", "--json"}, flags...)...)
	var m map[string]any
	if err := json.Unmarshal([]byte(out), &m); err != nil {
		t.Fatalf("status --json printed no JSON (code %d): %v\n%s\n%s", code, err, out, stderr)
	}
	return code, m, stderr
}

// statusText runs status in text mode with flags and fails unless it exits with code and
// prints every one of want.
func statusText(t *testing.T, url string, flags []string, code int, want ...string) {
	t.Helper()
	got, out, _ := runCLI(t, url, append([]string{"status"}, flags...)...)
	for _, w := range want {
		if got != code || !strings.Contains(out, w) {
			t.Fatalf("text: exit %d, want %d and %q\n%s", got, code, w, out)
		}
	}
}

func field(m map[string]any, path ...string) any {
	var v any = m
	for _, p := range path {
		mm, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = mm[p]
	}
	return v
}

func mustExec(t *testing.T, db *pgtest.DB, sql string) {
	t.Helper()
	if _, err := db.Pool.Exec(context.Background(), sql); err != nil {
		t.Fatal(err)
	}
}

// relaxed keeps the shared server's other sessions (other tests) out of the verdict.
var relaxed = []string{"--max-transaction-age", "1h", "--max-xmin-age", "-1"}

func TestStatusHealthy(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	mustExec(t, db, `INSERT INTO outbox (topic, partition_key, payload, dispatched_at) SELECT 't', 'k', '{}', now() - interval '3 minutes' FROM generate_series(1, 7)`)
	mustExec(t, db, `INSERT INTO outbox (topic, partition_key, payload) VALUES ('t', 'k2', '{}')`) // young backlog
	code, m, stderr := statusJSON(t, db.URL, relaxed...)
	if code != 0 || m["status"] != "healthy" || m["exit_code"] != 0.0 || len(m["reasons"].([]any)) != 0 {
		t.Fatalf("code %d %v %s", code, m, stderr)
	}
	if field(m, "queue", "pending") != 1.0 || m["dispatched_last_hour"] != 7.0 || len(m["dispatched_per_minute"].([]any)) != 60 {
		t.Fatalf("report %v", m)
	}
	for _, k := range []string{"outbox_table", "processed_messages_table", "xmin_horizon", "dead_letters_unresolved", "checked_at"} {
		if _, ok := m[k]; !ok {
			t.Errorf("JSON lacks %s", k)
		}
	}
}

func TestStatusBacklogIsUnhealthy(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	mustExec(t, db, `INSERT INTO outbox (topic, partition_key, payload, created_at) VALUES ('t', 'k', '{}', now() - interval '20 minutes'), ('t', 'k', '{}', now())`)
	code, m, stderr := statusJSON(t, db.URL, relaxed...)
	if code != 1 || m["status"] != "unhealthy" || m["exit_code"] != 1.0 || field(m, "queue", "pending") != 2.0 {
		t.Fatalf("code %d %v", code, m)
	}
	if age := field(m, "queue", "oldest_pending_age_seconds").(float64); age < 1199 {
		t.Fatalf("oldest age %v", age)
	}
	if !strings.Contains(stderr, "unhealthy: oldest pending event") {
		t.Fatalf("stderr %q", stderr)
	}
	// The threshold is a flag: 30 minutes tolerates it.
	if code, m, _ := statusJSON(t, db.URL, append(relaxed, "--max-oldest-age", "30m")...); code != 0 {
		t.Fatalf("with --max-oldest-age 30m: %d %v", code, m["reasons"])
	}
	// Text mode says the same.
	statusText(t, db.URL, relaxed, 1, "outbox is UNHEALTHY", "pending         2", "reasons:")
}

func TestStatusStuckLeaseIsDegraded(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	mustExec(t, db, `INSERT INTO outbox (topic, partition_key, payload, attempts, lease_token, locked_until, available_at)
		VALUES ('t', 'k', '{}', 1, gen_random_uuid(), now() - interval '1 minute', now() - interval '1 minute')`)
	code, m, _ := statusJSON(t, db.URL, relaxed...)
	if code != 1 || m["status"] != "degraded" || field(m, "queue", "stuck_leases") != 1.0 {
		t.Fatalf("code %d %v", code, m)
	}
	if code, _, _ := statusJSON(t, db.URL, append(relaxed, "--max-stuck-leases", "1")...); code != 0 {
		t.Fatalf("tolerated stuck lease: code %d", code)
	}
}

func TestStatusDeadLettersAreDegraded(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	mustExec(t, db, `INSERT INTO dead_letters (source, topic, error) VALUES ('relay', 'order.created', 'x'), ('delivery', 'order.created', 'y'), ('delivery', 'order.created', 'z')`)
	code, m, _ := statusJSON(t, db.URL, relaxed...)
	if code != 1 || m["dead_letters_unresolved_total"] != 3.0 {
		t.Fatalf("code %d %v", code, m)
	}
	groups := m["dead_letters_unresolved"].([]any)
	first := groups[0].(map[string]any)
	if len(groups) != 2 || first["source"] != "delivery" || first["topic"] != "order.created" || first["count"] != 2.0 {
		t.Fatalf("groups %v", groups)
	}
	statusText(t, db.URL, relaxed, 1, "3 unresolved (delivery order.created: 2, relay order.created: 1)")
}

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
		Pool: db.Pool, Verifier: v, PublicBaseURL: base, Logger: slog.New(slog.DiscardHandler),
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
	// A transient last failure of an event still in the outbox is rescheduled, not
	// dead-lettered (pkg/deadletter TestSyncReschedulesOutage); here the given-up event's row
	// is gone (retention), so the DLQ entry is all that is left of it: a dead letter.
	mustExec(t, db, `DELETE FROM outbox WHERE payload->>'fail' = '99'`)
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
	statusText(t, db.URL, append(relaxed, "--max-dead-letters", "1"), 0,
		"last hour  4.00 per delivered event: 8 attempts, 4 for 2 delivered, 4 for 1 given up")
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
	statusText(t, db.URL, relaxed, 0, "qstash attempts unavailable")
}

// TestStatusOpenTransaction holds a snapshot open on another connection: status names the
// transaction and degrades once it is older than --max-transaction-age.
func TestStatusOpenTransaction(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	opened := healthtest.HoldSnapshot(t, db, "status-test-holder").Began
	testwait.EventuallyNil(t, time.Until(opened.Add(15*time.Second)), func() error {
		code, m, _ := statusJSON(t, db.URL, "--max-transaction-age", "200ms", "--max-xmin-age", "-1")
		age, _ := field(m, "xmin_horizon", "oldest_transaction_age_seconds").(float64)
		// Other tests share the database: only a report naming the holder is about it.
		holder := field(m, "xmin_horizon", "oldest_transaction_application") == "status-test-holder"
		if code != 1 || !holder || age < 0.2 || field(m, "xmin_horizon", "open_transactions").(float64) < 1 {
			return fmt.Errorf("open transaction not reported: code %d %v", code, m["xmin_horizon"])
		}
		if !strings.Contains(strings.Join(toStrings(m["reasons"]), "\n"), "a transaction has been open for") {
			t.Fatalf("reasons %v", m["reasons"])
		}
		if time.Since(opened) < 200*time.Millisecond {
			t.Fatal("degraded before the transaction was old enough")
		}
		return nil
	})
}

func TestStatusUnreachableDatabase(t *testing.T) {
	t.Parallel()
	code, _, stderr := runCLI(t, "postgres://postgres@127.0.0.1:1/none?connect_timeout=1", "status")
	if code != 3 || !strings.Contains(stderr, "connect to database") {
		t.Fatalf("code %d stderr %q", code, stderr)
	}
}

func toStrings(v any) []string {
	var out []string
	for _, x := range v.([]any) {
		out = append(out, x.(string))
	}
	return out
}

func TestSparkline(t *testing.T) {
	t.Parallel()
	cases := map[string]struct {
		in   []int64
		want string
	}{
		"empty":  {nil, ""},
		"idle":   {[]int64{0, 0, 0}, "···"},
		"ramp":   {[]int64{0, 1, 2, 3, 4, 5, 6, 7, 8}, "·▁▂▃▄▅▆▇█"},
		"single": {[]int64{5}, "█"},
		"spike":  {[]int64{1, 1000, 1}, "▁█▁"},
	}
	for name, c := range cases {
		if got := sparkline(c.in); got != c.want {
			t.Errorf("%s: sparkline(%v) = %q, want %q", name, c.in, got, c.want)
		}
	}
}

// TestStatusConsumerOutage: an open consumer circuit (the failure callback opened it, the
// relay holds the topic's events) makes the outbox degraded, names the topic and the held
// events in text and JSON, and says that nothing is dead-lettered.
func TestStatusConsumerOutage(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	mustExec(t, db, `INSERT INTO outbox_circuits (topic, opened_at, failures, probe_failures, probe_at)
		VALUES ('order.created', now() - interval '7 minutes', 12, 3, now() + interval '40 seconds')`)
	mustExec(t, db, `INSERT INTO outbox (topic, partition_key, payload, available_at, last_error)
		SELECT 'order.created', 'k' || i, '{}', now() + interval '5 minutes', '`+outboxstore.HeldError+`' FROM generate_series(1, 4) i`)
	code, m, stderr := statusJSON(t, db.URL, relaxed...)
	circuits, _ := m["open_circuits"].([]any)
	if code != 1 || m["status"] != "degraded" || len(circuits) != 1 || m["held_events"] != 4.0 ||
		circuits[0].(map[string]any)["topic"] != "order.created" || circuits[0].(map[string]any)["probe_failures"] != 3.0 {
		t.Fatalf("code %d %v %s", code, m, stderr)
	}
	if !strings.Contains(stderr, "consumer of topic order.created is down") || !strings.Contains(stderr, "none dead-lettered") {
		t.Fatalf("stderr %q", stderr)
	}
	statusText(t, db.URL, relaxed, 1, "outbox is DEGRADED", "consumer down   order.created: circuit open 7m", "4 events held")
}
