package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/pkg/deadletter"
	"github.com/outbox-relay/outbox-relay/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/pkg/postgres/pgtest"
)

func runCLI(t *testing.T, url string, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	e := env{stdout: &out, stderr: &errb, getenv: func(k string) string {
		if k == "DATABASE_URL" {
			return url
		}
		return ""
	}}
	code := run(context.Background(), e, args)
	return code, out.String(), errb.String()
}

// seedLetter enqueues an event, marks it dispatched and records a delivery failure for it.
func seedLetter(t *testing.T, db *pgtest.DB, topic, key, msgID string) (letterID, outboxID int64) {
	t.Helper()
	ctx := context.Background()
	id, err := outbox.Enqueue(ctx, db.Pool, outbox.Event{Topic: topic, PartitionKey: key, Payload: json.RawMessage(`{"order_id":"o-1"}`)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `UPDATE outbox SET dispatched_at = now() WHERE id = $1`, id); err != nil {
		t.Fatal(err)
	}
	r, err := deadletter.Record(ctx, db.Pool, deadletter.DeliveryFailure{
		QStashMessageID: msgID, Status: 489, MaxRetries: 3, ResponseBody: []byte(`{"error":"rejected"}`),
		OutboxID: int64(id), SourceBody: []byte(`{"order_id":"o-1"}`),
	})
	if err != nil {
		t.Fatal(err)
	}
	return r.LetterID, int64(id)
}

func TestDLQListShowRedrive(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	l1, o1 := seedLetter(t, db, "order.created", "order:1", "m1")
	l2, _ := seedLetter(t, db, "invoice.paid", "order:2", "m2")
	s1, s2 := strconv.FormatInt(l1, 10), strconv.FormatInt(l2, 10)

	code, out, stderr := runCLI(t, db.URL, "dlq", "list")
	if code != 0 || !strings.Contains(out, "order.created") || !strings.Contains(out, "invoice.paid") || !strings.Contains(out, "HTTP 489") {
		t.Fatalf("list: code %d\n%s%s", code, out, stderr)
	}
	code, out, _ = runCLI(t, db.URL, "dlq", "list", "--topic", "invoice.paid", "--json")
	var letters []deadletter.Letter
	if code != 0 || json.Unmarshal([]byte(out), &letters) != nil || len(letters) != 1 || letters[0].ID != l2 {
		t.Fatalf("list --topic --json: code %d %s", code, out)
	}
	code, out, _ = runCLI(t, db.URL, "dlq", "list", "--since", time.Now().Add(time.Hour).Format(time.RFC3339))
	if code != 0 || !strings.Contains(out, "no dead letters") {
		t.Fatalf("list --since future: %d %s", code, out)
	}

	code, out, _ = runCLI(t, db.URL, "dlq", "show", s1)
	if code != 0 || !strings.Contains(out, `"order_id": "o-1"`) || !strings.Contains(out, "partition key:   order:1") {
		t.Fatalf("show: %d\n%s", code, out)
	}
	if code, _, stderr = runCLI(t, db.URL, "dlq", "show", "999999"); code != 1 || !strings.Contains(stderr, "does not exist") {
		t.Fatalf("show unknown: %d %s", code, stderr)
	}

	// Refuses to redrive without a selection.
	if code, _, stderr = runCLI(t, db.URL, "dlq", "redrive"); code != 2 || !strings.Contains(stderr, "--all") {
		t.Fatalf("redrive without selection: %d %s", code, stderr)
	}
	// Dry run: says what it would do, changes nothing. Flags after ids work.
	code, out, _ = runCLI(t, db.URL, "dlq", "redrive", s1, "--dry-run")
	if code != 0 || !strings.Contains(out, "would reset outbox row") {
		t.Fatalf("dry run: %d %s", code, out)
	}
	var gen int
	if err := db.Pool.QueryRow(context.Background(), `SELECT generation FROM outbox WHERE id = $1`, o1).Scan(&gen); err != nil || gen != 0 {
		t.Fatalf("dry run changed the row: generation %d %v", gen, err)
	}

	code, out, _ = runCLI(t, db.URL, "dlq", "redrive", s1)
	if code != 0 || !strings.Contains(out, "reset to pending (generation 1)") {
		t.Fatalf("redrive: %d %s", code, out)
	}
	code, out, _ = runCLI(t, db.URL, "dlq", "redrive", s1)
	if code != 0 || !strings.Contains(out, "letter "+s1+": already resolved, nothing to do") {
		t.Fatalf("redrive again: %d %s", code, out)
	}
	// Missing ids make the exit status 1 but do not stop the rest.
	code, out, _ = runCLI(t, db.URL, "dlq", "redrive", "--json", s2, "999999")
	var res deadletter.RedriveResult
	if code != 1 || json.Unmarshal([]byte(out), &res) != nil || len(res.Redriven) != 1 || len(res.NotFound) != 1 {
		t.Fatalf("redrive with unknown id: %d %s", code, out)
	}
	code, out, _ = runCLI(t, db.URL, "dlq", "list")
	if code != 0 || !strings.Contains(out, "no dead letters") {
		t.Fatalf("list after redrive: %d %s", code, out)
	}
	code, out, _ = runCLI(t, db.URL, "dlq", "list", "--all")
	if code != 0 || strings.Count(out, "(redriven)") != 2 {
		t.Fatalf("list --all: %d %s", code, out)
	}
}

func TestDLQArgumentErrors(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"dlq"}, {"dlq", "frob"}, {"dlq", "show"}, {"dlq", "show", "x"}, {"dlq", "redrive", "abc"},
		{"dlq", "list", "--since", "yesterday"}, {"dlq", "list", "7"},
	} {
		if code, _, _ := runCLI(t, "postgres://unused", args...); code != 2 {
			t.Errorf("%v: exit %d, want 2", args, code)
		}
	}
}

func TestParseTime(t *testing.T) {
	t.Parallel()
	now := time.Date(2030, 5, 1, 12, 0, 0, 0, time.UTC)
	for in, want := range map[string]time.Time{
		"":                     {},
		"2030-04-01T00:00:00Z": time.Date(2030, 4, 1, 0, 0, 0, 0, time.UTC),
		"2030-04-02":           time.Date(2030, 4, 2, 0, 0, 0, 0, time.UTC),
		"90m":                  now.Add(-90 * time.Minute),
	} {
		got, err := parseTime(in, now)
		if err != nil || !got.Equal(want) {
			t.Errorf("parseTime(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	if _, err := parseTime("-5m", now); err == nil {
		t.Error("negative duration accepted")
	}
}
