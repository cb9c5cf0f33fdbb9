package migrations_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"

	"github.com/outbox-relay/outbox-relay/v3/migrations"
	"github.com/outbox-relay/outbox-relay/v3/pkg/deadletter"
	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash/qstashtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/relay"
)

// migrateTo applies the migrations up to version, as a database deployed before the later
// ones would have them.
func migrateTo(t *testing.T, pool *pgxpool.Pool, version int64) {
	t.Helper()
	upTo(t, pool, migrations.FS, version)
}

// upTo runs goose alone (no window handling, unlike postgres.Migrate) over fsys's
// migrations up to version.
func upTo(t *testing.T, pool *pgxpool.Pool, fsys fs.FS, version int64) {
	t.Helper()
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	p, err := goose.NewProvider(goose.DialectPostgres, db, fsys, goose.WithDisableGlobalRegistry(true))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.UpTo(t.Context(), version); err != nil {
		t.Fatalf("migrate to %d: %v", version, err)
	}
}

// deployed is a fresh schema migrated up to version, as a database deployed before the
// later migrations has it.
func deployed(t *testing.T, version int64) *pgtest.DB {
	t.Helper()
	db := pgtest.NewWithOptions(t, pgtest.Options{NoMigrate: true})
	migrateTo(t, db.Pool, version)
	return db
}

func exec(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) {
	t.Helper()
	if _, err := pool.Exec(t.Context(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// TestHeadersConstraintOnDeployedTable: a table migrated before the headers constraint
// holds 99 healthy rows and one whose headers a hand-written INSERT made {"x-n": 1} (plus a
// dispatched row with non-object headers). The constraint migration succeeds: the pending
// bad row is dead-lettered alone with an error quoting its headers, every bad row's headers
// are repaired to strings, the constraint is validated, and a drain publishes the 99.
// Before this migration that row made every claim fail after taking the lease.
func TestHeadersConstraintOnDeployedTable(t *testing.T) {
	t.Parallel()
	db := deployed(t, 5)
	ctx := t.Context()
	for i := range 99 {
		if i == 50 {
			exec(t, db.Pool, `INSERT INTO outbox (topic, partition_key, payload, headers) VALUES ('order.created', 'bad', '{"n":50}', '{"x-n": 1, "x-ok": "y"}')`)
		}
		exec(t, db.Pool, `INSERT INTO outbox (topic, partition_key, payload, headers) VALUES ('order.created', $1, '{}', '{"x-a": "b"}')`, fmt.Sprintf("k%d", i))
	}
	exec(t, db.Pool, `INSERT INTO outbox (topic, partition_key, payload, headers, dispatched_at) VALUES ('order.created', 'old', '{}', '[1]', now())`)

	if _, err := postgres.Migrate(ctx, db.Pool, nil); err != nil {
		t.Fatalf("migrate a table holding bad rows: %v", err)
	}
	var valid bool
	if err := db.Pool.QueryRow(ctx, `SELECT convalidated FROM pg_constraint WHERE conname = 'outbox_headers_strings' AND conrelid = 'outbox'::regclass`).Scan(&valid); err != nil || !valid {
		t.Fatalf("constraint validated %v (%v)", valid, err)
	}
	letters, err := deadletter.List(ctx, db.Pool, deadletter.Filter{})
	if err != nil || len(letters) != 1 {
		t.Fatalf("letters %+v %v, want the bad row's only", letters, err)
	}
	l := letters[0]
	if l.PartitionKey != "bad" || l.Source != deadletter.SourceRelay || !strings.Contains(l.Error, `{"x-n": 1, "x-ok": "y"}`) ||
		l.Headers["x-n"] != "1" || l.Headers["x-ok"] != "y" {
		t.Fatalf("letter %+v: want the bad row, its original headers in the error, repaired headers", l)
	}
	var headers string
	if err := db.Pool.QueryRow(ctx, `SELECT headers::text FROM outbox WHERE partition_key = 'old'`).Scan(&headers); err != nil || headers != "{}" {
		t.Fatalf("dispatched row's headers %s %v, want {}", headers, err)
	}

	// The relay now drains the 99 healthy rows; the dead-lettered one stays put.
	qs := qstashtest.NewServer(qstashtest.Options{})
	defer qs.Close()
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.Copy(io.Discard, r.Body) }))
	defer hook.Close()
	pub, err := qstash.NewPublisher(qstash.PublisherConfig{BaseURL: qs.URL, Token: qs.Token, DestinationBaseURL: hook.URL})
	if err != nil {
		t.Fatal(err)
	}
	r, err := relay.New(db.Pool, pub, relay.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	st, err := r.Drain(dctx)
	if err != nil || st.Dispatched != 99 {
		t.Fatalf("drain %+v %v, want 99 dispatched", st, err)
	}
	if n := db.Count(t, `SELECT count(*) FROM outbox WHERE dispatched_at IS NULL AND dead_lettered_at IS NULL`); n != 0 {
		t.Fatalf("%d rows still pending", n)
	}
}

// TestHeadersConstraintRefusesBadRows: on a migrated database a row whose headers are not
// an object of strings is refused by the constraint; Enqueue's rows always pass.
func TestHeadersConstraintRefusesBadRows(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := t.Context()
	for _, h := range []string{`{"x-n": 1}`, `{"x": null}`, `{"x": {"y": "z"}}`, `[]`, `"s"`, `null`} {
		_, err := db.Pool.Exec(ctx, `INSERT INTO outbox (topic, partition_key, payload, headers) VALUES ('t', 'k', '{}', $1::jsonb)`, h)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "23514" || pgErr.ConstraintName != "outbox_headers_strings" {
			t.Errorf("headers %s: %v, want a check violation of outbox_headers_strings", h, err)
		}
	}
	for _, h := range []map[string]string{nil, {}, {"X-Trace": "a", "X-Empty": ""}} {
		if _, err := outbox.Enqueue(ctx, db.Pool, outbox.Event{Topic: "t", PartitionKey: "k", Payload: json.RawMessage(`{}`), Headers: h}); err != nil {
			t.Errorf("Enqueue with headers %v: %v", h, err)
		}
	}
}

// TestFingerprintOnDeployedTable: letters written before migration 0010 get their
// fingerprint when it runs, the same one a letter of the same cause written after it gets;
// and processed_messages rows written before 0011 have no retry count.
func TestFingerprintOnDeployedTable(t *testing.T) {
	t.Parallel()
	db := deployed(t, 7)
	exec(t, db.Pool, `INSERT INTO dead_letters (source, topic, status_code, error) VALUES
		('delivery', 'a', 500, 'timeout after 3s on order 1'), ('delivery', 'a', 500, 'timeout after 9s on order 22'),
		('delivery', 'b', 500, 'timeout after 3s on order 1')`)
	exec(t, db.Pool, `INSERT INTO processed_messages (consumer, message_id) VALUES ('webhook', '1')`)
	if _, err := postgres.Migrate(t.Context(), db.Pool, nil); err != nil {
		t.Fatal(err)
	}
	exec(t, db.Pool, `INSERT INTO dead_letters (source, topic, status_code, error) VALUES ('delivery', 'a', 500, 'timeout after 1s on order 5')`)
	if n := db.Count(t, `SELECT count(DISTINCT fingerprint) FROM dead_letters`); n != 2 {
		t.Fatalf("%d fingerprints, want 2 (topic a before and after the migration, topic b)", n)
	}
	if n := db.Count(t, `SELECT count(*) FROM processed_messages WHERE retried IS NULL`); n != 1 {
		t.Fatalf("%d rows without a retry count, want 1", n)
	}
}

// TestOneOpenLetterOnDeployedTable: a table migrated before the open-letter index holds
// two open letters for one event (the relay's and the callback's) and two for another
// generation's redrive history. The migration keeps the oldest open letter per event
// generation, resolves the others as duplicates, and from then on a second open letter
// for the same generation is skipped (0015), the index refusing one that races past.
func TestOneOpenLetterOnDeployedTable(t *testing.T) {
	t.Parallel()
	db := deployed(t, 4)
	ctx := t.Context()
	exec(t, db.Pool, `INSERT INTO outbox (topic, partition_key, payload, dead_lettered_at, generation) VALUES ('t', 'a', '{}', now(), 0), ('t', 'b', '{}', now(), 2)`)
	exec(t, db.Pool, `INSERT INTO dead_letters (source, outbox_id, topic, error, resolved_at, resolution) VALUES
		('relay', 1, 't', 'first', NULL, NULL),
		('delivery', 1, 't', 'second', NULL, NULL),
		('relay', 2, 't', 'redriven earlier', now(), 'redriven'),
		('relay', 2, 't', 'current', NULL, NULL),
		('delivery', NULL, 't', 'unlinked one', NULL, NULL),
		('delivery', NULL, 't', 'unlinked two', NULL, NULL)`)
	if _, err := postgres.Migrate(ctx, db.Pool, nil); err != nil {
		t.Fatalf("migrate a table holding duplicate letters: %v", err)
	}
	rows, err := db.Pool.Query(ctx, `SELECT error, generation, coalesce(resolution, 'open') FROM dead_letters ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for rows.Next() {
		var e, res string
		var gen int
		if err := rows.Scan(&e, &gen, &res); err != nil {
			t.Fatal(err)
		}
		got = append(got, fmt.Sprintf("%s/%d/%s", e, gen, res))
	}
	want := []string{"first/0/open", "second/0/duplicate", "redriven earlier/0/redriven", "current/2/open", "unlinked one/0/open", "unlinked two/0/open"}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("letters %v, want %v", got, want)
	}
	// A second open letter for the generation is skipped (0015), whoever writes it.
	tag, err := db.Pool.Exec(ctx, `INSERT INTO dead_letters (source, outbox_id, topic, error, generation) VALUES ('relay', 2, 't', 'again', 2)`)
	if err != nil || tag.RowsAffected() != 0 {
		t.Fatalf("second open letter for one generation: %v, %d rows inserted, want it skipped", err, tag.RowsAffected())
	}
	// The index is still there for writers racing past the trigger's check.
	exec(t, db.Pool, `ALTER TABLE dead_letters DISABLE TRIGGER dead_letters_skip_second_open`)
	_, err = db.Pool.Exec(ctx, `INSERT INTO dead_letters (source, outbox_id, topic, error, generation) VALUES ('relay', 2, 't', 'again', 2)`)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "23505" {
		t.Fatalf("second open letter past the trigger: %v, want a unique violation", err)
	}
}
