package console_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/v3/cmd/outboxctl/internal/console"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
)

// Benchmark sizes: the 5M dispatched and 200k pending rows; -short for a quick look.
const (
	benchDispatched      = 5_000_000
	benchPending         = 200_000
	benchDeadLetters     = 20_000
	benchProcessed       = 1_000_000
	benchShortDispatched = 200_000
	benchShortPending    = 20_000
	benchShortDead       = 2_000
	benchShortProcessed  = 50_000
)

// fillStatements fill a schema fast with generate_series: dispatched rows spread over the
// last 7 days (the retention window), a pending backlog built up over the last 3 hours,
// dead-lettered rows with their letters (a tenth resolved), and dedupe records of three
// consumers. $1 is the count of each statement.
var fillStatements = []string{
	`INSERT INTO outbox (topic, partition_key, payload, created_at, available_at, dispatched_at, attempts)
SELECT 'order.created', 'customer-' || (g % 5000), jsonb_build_object('order_id', 'o-' || g, 'amount_cents', 1000 + g % 9000),
       t, t, t + interval '40 milliseconds', 1
FROM generate_series(1, $1::int) g, LATERAL (SELECT now() - interval '7 days' * (1 - g::float8 / $1::int) AS t) c`,
	`INSERT INTO outbox (topic, partition_key, payload, created_at, available_at)
SELECT CASE WHEN g % 3 = 0 THEN 'invoice.paid' ELSE 'order.created' END, 'customer-' || (g % 5000),
       jsonb_build_object('order_id', 'p-' || g), t, t
FROM generate_series(1, $1::int) g, LATERAL (SELECT now() - interval '3 hours' * (1 - g::float8 / $1::int) AS t) c`,
	`WITH o AS (
    INSERT INTO outbox (topic, partition_key, payload, headers, created_at, available_at, dead_lettered_at, attempts, last_error)
    SELECT CASE WHEN g % 4 = 0 THEN 'invoice.paid' ELSE 'order.created' END, 'customer-' || (g % 700),
           jsonb_build_object('order_id', 'd-' || g, 'amount_cents', 0),
           jsonb_build_object('traceparent', '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01'),
           t, t, t + interval '2 seconds', 3, 'amount_cents must be positive'
    FROM generate_series(1, $1::int) g, LATERAL (SELECT now() - interval '2 days' * (1 - g::float8 / $1::int) AS t) c
    RETURNING id, topic, partition_key, payload, headers, dead_lettered_at
)
INSERT INTO dead_letters (source, outbox_id, topic, partition_key, payload, headers, error, attempts, status_code,
                          qstash_message_id, created_at, resolved_at, resolution)
SELECT CASE WHEN id % 2 = 0 THEN 'delivery' ELSE 'relay' END, id, topic, partition_key, payload, headers,
       'handler rejected the event: amount_cents must be positive', 3, 489, 'msg_' || id, dead_lettered_at,
       CASE WHEN id % 10 = 0 THEN dead_lettered_at + interval '1 hour' END, CASE WHEN id % 10 = 0 THEN 'redriven' END
FROM o`,
	`INSERT INTO processed_messages (consumer, message_id, payload_hash, processed_at)
SELECT c.name, g::text, '\xabcd'::bytea, now() - interval '1 day' * (1 - g::float8 / $1::int)
FROM generate_series(1, $1::int) g, (VALUES ('billing'), ('emails'), ('search')) AS c(name)`,
}

// BenchmarkPages fills a schema once and measures each page as the browser asks for it,
// through the console's handler (templates included), plus the redrive dry run. It also
// checks the console's own statements against the filled tables with EXPLAIN: none may
// scan the outbox sequentially.
func BenchmarkPages(b *testing.B) {
	ctx := context.Background()
	db := benchDB(b)
	var someEvent, someLetter int64
	if err := db.Pool.QueryRow(ctx, `SELECT min(id) + 12345 FROM outbox`).Scan(&someEvent); err != nil {
		b.Fatal(err)
	}
	if err := db.Pool.QueryRow(ctx, `SELECT max(id) FROM dead_letters WHERE resolved_at IS NULL`).Scan(&someLetter); err != nil {
		b.Fatal(err)
	}
	var someGroup string
	if err := db.Pool.QueryRow(ctx, `SELECT fingerprint FROM dead_letters WHERE id = $1`, someLetter).Scan(&someGroup); err != nil {
		b.Fatal(err)
	}
	explainConsoleQueries(b, db)

	srv, ts := serve(b, db, console.Config{AllowRedrive: true})
	c, tok := session(b, ts.URL, "/events")
	// The second page of a filter: its cursor from the first.
	_, first := get(b, c, ts.URL, "/dead-letters?topic=order.created")
	m := nextRE.FindStringSubmatch(first)
	if m == nil {
		b.Fatal("no second page")
	}
	secondPage := "/dead-letters?" + strings.ReplaceAll(m[1], "&amp;", "&")

	pages := []struct{ name, path string }{
		{"overview_3h", "/"},
		{"overview_1h", "/?range=1h"},
		{"overview_6h", "/?range=6h"},
		{"overview_24h", "/?range=24h"},
		{"overview_by_group", "/?dead=groups"},
		{"failure_groups", "/dead-letters/groups"},
		{"dead_letters_of_a_group", "/dead-letters?group=" + someGroup},
		{"dead_letters", "/dead-letters"},
		{"dead_letters_by_topic_key", "/dead-letters?topic=order.created&key=customer-7"},
		{"dead_letters_by_source_since", "/dead-letters?source=delivery&since=6h"},
		{"dead_letters_page_2", secondPage},
		{"dead_letters_with_resolved", "/dead-letters?resolved=1"},
		{"dead_letter", fmt.Sprintf("/dead-letters/%d", someLetter)},
		{"event", fmt.Sprintf("/events?id=%d", someEvent)},
	}
	for _, p := range pages {
		b.Run(p.name, func(b *testing.B) {
			// One visit first (not timed: b.Loop starts the timer), so the overview's
			// chart cache is warm as it is for an operator watching the page; the _cold
			// benchmarks below measure the first visit.
			get(b, c, ts.URL, p.path)
			for b.Loop() {
				if code, body := get(b, c, ts.URL, p.path); code != http.StatusOK {
					b.Fatalf("GET %s: %d %s", p.path, code, clip(body))
				}
			}
		})
	}
	// The overview as the first visitor after a start sees it: no chart bucket cached.
	for _, rg := range []string{"3h", "24h"} {
		b.Run("overview_"+rg+"_cold", func(b *testing.B) {
			for b.Loop() {
				console.ResetChartCache(srv)
				if code, body := get(b, c, ts.URL, "/?range="+rg); code != http.StatusOK {
					b.Fatalf("GET /?range=%s: %d %s", rg, code, clip(body))
				}
			}
		})
	}
	b.Run("redrive_dry_run_by_topic", func(b *testing.B) {
		form := url.Values{"csrf_token": {tok}, "scope": {"filter"}, "topic": {"invoice.paid"}}
		for b.Loop() {
			if code, _, _ := post(b, c, ts.URL, "/dead-letters/redrive", form, nil); code != http.StatusOK {
				b.Fatalf("dry run: %d", code)
			}
		}
	})
}

// benchDB returns a filled schema: the one CONSOLE_BENCH_URL points at (a connection
// string with search_path, filled before, to measure again without refilling), else a new
// one filled here.
func benchDB(b *testing.B) *pgtest.DB {
	b.Helper()
	ctx := context.Background()
	if u := os.Getenv("CONSOLE_BENCH_URL"); u != "" {
		pool, err := pgxpool.New(ctx, u)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(pool.Close)
		return &pgtest.DB{Pool: pool, URL: u}
	}
	db := pgtest.New(b)
	sizes := []int{benchDispatched, benchPending, benchDeadLetters, benchProcessed / 3}
	if testing.Short() {
		sizes = []int{benchShortDispatched, benchShortPending, benchShortDead, benchShortProcessed / 3}
	}
	began := time.Now()
	for i, q := range fillStatements {
		if _, err := db.Pool.Exec(ctx, q, sizes[i]); err != nil {
			b.Fatalf("fill %d: %v", i, err)
		}
	}
	for _, table := range []string{"outbox", "dead_letters", "processed_messages"} {
		if _, err := db.Pool.Exec(ctx, "VACUUM ANALYZE "+table); err != nil {
			b.Fatalf("vacuum %s: %v", table, err)
		}
	}
	b.Logf("filled %d dispatched, %d pending, %d dead-lettered (with letters), %d dedupe records in %s",
		sizes[0], sizes[1], sizes[2], sizes[3]*3, time.Since(began).Round(time.Second))
	return db
}

// explainConsoleQueries fails when one of the console's page statements reads the outbox
// with a sequential scan (EXPLAIN of the statement as the console runs it: an unnamed
// statement planned with its parameters).
func explainConsoleQueries(b *testing.B, db *pgtest.DB) {
	b.Helper()
	ctx := context.Background()
	start := time.Now().Add(-3 * time.Hour)
	checks := []struct {
		name string
		sql  string
		args []any
	}{
		{"chart pending", console.QChartPending, []any{start, time.Minute}},
		{"chart dispatched", console.QChartDispatched, []any{start, time.Minute}},
		{"open letters", console.QOpenLetterIDs, []any{"order.created", nil, nil, nil, nil, nil, nil, nil, 51}},
		{"open letters page 2", console.QOpenLetterIDs, []any{nil, nil, nil, nil, nil, nil, time.Now().Add(-time.Hour), int64(1 << 40), 51}},
		{"all letters", console.QAllLetterIDs, []any{nil, "customer-7", nil, nil, nil, nil, nil, nil, 51}},
		{"group letters", console.QOpenLetterIDs, []any{nil, nil, nil, nil, nil, "0123456789abcdef", nil, nil, 51}},
		{"event", console.QEvent, []any{int64(12345)}},
		{"dedupe", console.QDedupe, []any{"12345"}},
		{"event letters", console.QEventLetterIDs, []any{int64(12345)}},
	}
	for _, c := range checks {
		var plan string
		rows, err := db.Pool.Query(ctx, "EXPLAIN (FORMAT JSON) "+c.sql, c.args...)
		if err != nil {
			b.Fatalf("explain %s: %v", c.name, err)
		}
		for rows.Next() {
			var doc []map[string]any
			if err := rows.Scan(&doc); err != nil {
				b.Fatal(err)
			}
			j, _ := json.Marshal(doc)
			plan = string(j)
		}
		rows.Close()
		if seqScanOn(plan, "outbox") {
			b.Fatalf("%s scans the outbox sequentially: %s", c.name, plan)
		}
		b.Logf("plan %s: %s", c.name, planSummary(plan))
	}
}

// seqScanOn reports whether a JSON plan has a Seq Scan node on relation.
func seqScanOn(plan, relation string) bool {
	for _, part := range strings.Split(plan, `"Node Type":"Seq Scan"`)[1:] {
		end := strings.Index(part, `"Node Type"`)
		if end < 0 {
			end = len(part)
		}
		if strings.Contains(part[:end], `"Relation Name":"`+relation+`"`) {
			return true
		}
	}
	return false
}

// planSummary lists a JSON plan's scan nodes with their index, for the benchmark's log.
func planSummary(plan string) string {
	var out []string
	for _, part := range strings.Split(plan, `"Node Type":"`)[1:] {
		node := part[:strings.Index(part, `"`)]
		if !strings.Contains(node, "Scan") {
			continue
		}
		desc := node
		if i := strings.Index(part, `"Index Name":"`); i >= 0 && (!strings.Contains(part, `"Node Type"`) || i < strings.Index(part, `"Node Type"`)) {
			rest := part[i+len(`"Index Name":"`):]
			desc += " " + rest[:strings.Index(rest, `"`)]
		} else if i := strings.Index(part, `"Relation Name":"`); i >= 0 {
			rest := part[i+len(`"Relation Name":"`):]
			desc += " " + rest[:strings.Index(rest, `"`)]
		}
		out = append(out, desc)
	}
	return strings.Join(out, ", ")
}
