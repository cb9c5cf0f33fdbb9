package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/relay"
	"github.com/outbox-relay/outbox-relay/v3/pkg/retention"
)

func seedRetention(t *testing.T, db *pgtest.DB) {
	t.Helper()
	mustExec(t, db, `INSERT INTO outbox (topic, partition_key, payload, dispatched_at) SELECT 't', 'k', '{}', now() - interval '10 days' FROM generate_series(1, 30)`)
	mustExec(t, db, `INSERT INTO outbox (topic, partition_key, payload, dispatched_at) SELECT 't', 'k', '{}', now() - interval '1 day' FROM generate_series(1, 5)`)
	mustExec(t, db, `INSERT INTO outbox (topic, partition_key, payload, created_at) VALUES ('t', 'k', '{}', now() - interval '30 days')`)
	mustExec(t, db, `INSERT INTO processed_messages (consumer, message_id, processed_at) SELECT 'c', g::text, now() - interval '20 days' FROM generate_series(1, 4) g`)
}

func TestRetentionRunCLI(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	seedRetention(t, db)

	code, out, stderr := runCLI(t, db.URL, "retention", "run", "--dry-run", "--json")
	var plan map[string]any
	if code != 0 || json.Unmarshal([]byte(out), &plan) != nil || plan["outbox_deleted"] != 30.0 || plan["processed_deleted"] != 4.0 || plan["dry_run"] != true {
		t.Fatalf("dry run: %d %s %s", code, out, stderr)
	}
	var n int
	if err := db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM outbox`).Scan(&n); err != nil || n != 36 {
		t.Fatalf("dry run deleted rows: %d left", n)
	}

	// --outbox-retention 12h also takes the 1-day-old rows; batches of 8 are bounded.
	code, out, stderr = runCLI(t, db.URL, "retention", "run", "--outbox-retention", "12h", "--delete-batch", "8")
	if code != 0 || !strings.Contains(out, "deleted 35 outbox rows (older than 12h0m0s) and 4 processed_messages rows") || !strings.Contains(out, "complete") {
		t.Fatalf("run: %d %q %s", code, out, stderr)
	}
	if err := db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM outbox`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("%d rows left, want the pending one", n)
	}

	// Run with the relay Lambda's environment, whose token is an SSM parameter: retention
	// never publishes, so it reads no parameter (there is no AWS here) and runs.
	code, out, stderr = runCLIEnv(t, map[string]string{"DATABASE_URL": db.URL, "QSTASH_TOKEN_PARAM": "/outbox-relay/qstash/token"},
		"retention", "run", "--dry-run")
	if code != 0 || !strings.Contains(out, "would delete 0 outbox rows") {
		t.Fatalf("with QSTASH_TOKEN_PARAM: %d %q %s", code, out, stderr)
	}
}

func TestRetentionRefusesShortDedupeTTL(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	seedRetention(t, db)
	code, _, stderr := runCLI(t, db.URL, "retention", "run", "--dedupe-ttl", "2h")
	if code != 2 || !strings.Contains(stderr, "DEDUPE_TTL: retention config DedupeTTL: 2h0m0s") || !strings.Contains(stderr, "retry horizon "+retention.Horizon(relay.Config{}, 3).Round(time.Second).String()) {
		t.Fatalf("code %d stderr %s", code, stderr)
	}
	var n int
	if err := db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM processed_messages`).Scan(&n); err != nil || n != 4 {
		t.Fatalf("refused run deleted dedupe records: %d left", n)
	}
	if code, _, stderr := runCLI(t, db.URL, "retention", "run", "--outbox-retention", "soon"); code != 2 || !strings.Contains(stderr, "OUTBOX_RETENTION") {
		t.Fatalf("bad duration: %d %s", code, stderr)
	}
	if code, _, _ := runCLI(t, db.URL, "retention"); code != 2 {
		t.Fatalf("no subcommand: %d", code)
	}
}
