package migrations_test

import (
	"fmt"
	"io/fs"
	"os"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/pressly/goose/v3"

	"github.com/outbox-relay/outbox-relay/v3/internal/logtest"
	"github.com/outbox-relay/outbox-relay/v3/migrations"

	"github.com/outbox-relay/outbox-relay/v3/examples/orders"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
)

// TestUpgradeFromTheFirstRelease: a database deployed at the first release's head (0004,
// which then created billing_charges) holding pending, dispatched and dead-lettered events,
// dedupe records, two open letters of one event and the example's charges upgrades to the
// current head in one run: nothing is lost, the example's table and rows stay, and the
// example's own schema step is a no-op on it.
func TestUpgradeFromTheFirstRelease(t *testing.T) {
	t.Parallel()
	db := deployed(t, 4)
	ctx := t.Context()
	// What 0004 created before the example moved to examples/orders: the released file,
	// which the window's migrations also had.
	exec(t, db.Pool, readSQL(t, "window", "0004_billing_charges"))
	exec(t, db.Pool, `INSERT INTO outbox (topic, partition_key, payload, headers) SELECT 'order.created', 'k' || (g % 10), jsonb_build_object('n', g), '{"x-a": "b"}' FROM generate_series(1, 200) g`)
	exec(t, db.Pool, `UPDATE outbox SET dispatched_at = now() WHERE id <= 100`)
	exec(t, db.Pool, `UPDATE outbox SET dead_lettered_at = now() WHERE id = 150`)
	exec(t, db.Pool, `INSERT INTO dead_letters (source, outbox_id, topic, error) VALUES ('relay', 150, 'order.created', 'boom'), ('delivery', 150, 'order.created', 'boom 2')`)
	exec(t, db.Pool, `INSERT INTO processed_messages (consumer, message_id, payload_hash) SELECT 'webhook', g::text, '\x00' FROM generate_series(1, 100) g`)
	exec(t, db.Pool, `INSERT INTO billing_charges (order_id, amount_cents, currency, outbox_id) VALUES ('o-1', 100, 'EUR', '1')`)

	if _, err := postgres.Migrate(ctx, db.Pool, nil); err != nil {
		t.Fatalf("upgrade from 0004: %v", err)
	}
	if err := orders.Migrate(ctx, db.Pool); err != nil {
		t.Fatalf("the example's schema on an upgraded database: %v", err)
	}
	for q, want := range map[string]int{
		`SELECT count(*) FROM outbox`:                                                          200,
		`SELECT count(*) FROM outbox WHERE dispatched_at IS NOT NULL`:                          100,
		`SELECT count(*) FROM outbox WHERE dispatched_at IS NULL AND dead_lettered_at IS NULL`: 99,
		`SELECT count(*) FROM processed_messages`:                                              100,
		`SELECT count(*) FROM billing_charges`:                                                 1,
		`SELECT count(*) FROM dead_letters WHERE outbox_id = 150`:                              2,
		`SELECT count(*) FROM dead_letters WHERE outbox_id = 150 AND resolved_at IS NULL`:      1,
	} {
		if n := db.Count(t, q); n != want {
			t.Errorf("%s = %d, want %d", q, n, want)
		}
	}
}

// windowDB is a fresh schema migrated as a database was between 07:39 and 08:05 UTC on
// 2026-12-03: the migrations of 6d217bb, which were 1-4, 10 (with the error_pattern column
// 09b9554 dropped), 11 and the first 12 (dead_letters.generation). testdata/window holds
// those that differ from today's files (git show 6d217bb:migrations/<file>); 0001-0003
// and 0011 are today's.
func windowDB(t *testing.T) *pgtest.DB {
	t.Helper()
	db := pgtest.NewWithOptions(t, pgtest.Options{NoMigrate: true})
	window := fstest.MapFS{}
	for _, dir := range []fs.FS{migrations.FS, os.DirFS("testdata/window")} {
		entries, err := fs.Glob(dir, "*.sql")
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range entries {
			if v := name[:4]; dir == migrations.FS && v != "0001" && v != "0002" && v != "0003" && v != "0011" {
				continue
			}
			b, err := fs.ReadFile(dir, name)
			if err != nil {
				t.Fatal(err)
			}
			window[name] = &fstest.MapFile{Data: b}
		}
	}
	upTo(t, db.Pool, window, goose.MaxVersion)
	return db
}

// TestUpgradeFromTheWindow: a database migrated in the Dec 3 window holds 12 (as the
// generation column) but not 5, 6, 7, which goose alone refuses ("detected 3 missing
// (out-of-order) migrations"). Migrate applies 5, 6, 7 late, then 13: the open-letter index
// (duplicates resolved), the headers constraint, the legacy window (open: the outbox has
// rows) and the fillfactor.
func TestUpgradeFromTheWindow(t *testing.T) {
	t.Parallel()
	db := windowDB(t)
	ctx := t.Context()
	exec(t, db.Pool, `INSERT INTO outbox (topic, partition_key, payload, dead_lettered_at) VALUES ('t', 'a', '{}', now()), ('t', 'b', '{}', NULL)`)
	exec(t, db.Pool, `INSERT INTO dead_letters (source, outbox_id, topic, error) VALUES ('relay', 1, 't', 'one'), ('delivery', 1, 't', 'two')`)

	logger, logs := logtest.New()
	applied, err := postgres.Migrate(ctx, db.Pool, logger)
	if err != nil {
		t.Fatalf("upgrade from the window: %v", err)
	}
	if fmt.Sprint(applied) != "[5 6 7 13 14 15 16 17 18 20 21 22]" {
		t.Fatalf("applied %v, want [5 6 7 13 14 15 16 17 18 20 21 22]", applied)
	}
	if !strings.Contains(logs.String(), `"versions":[5,6,7]`) {
		t.Errorf("no log line names the versions applied late: %s", logs)
	}
	for q, want := range map[string]int{
		`SELECT count(*) FROM dead_letters WHERE outbox_id = 1 AND resolved_at IS NULL`:                                                  1,
		`SELECT count(*) FROM pg_indexes WHERE indexname = 'dead_letters_one_open_idx' AND schemaname = current_schema()`:                1,
		`SELECT count(*) FROM pg_constraint WHERE conname = 'outbox_headers_strings' AND conrelid = 'outbox'::regclass AND convalidated`: 1,
		`SELECT count(*) FROM legacy_identity WHERE accept_until > now()`:                                                                1,
		`SELECT count(*) FROM pg_class WHERE oid = 'outbox'::regclass AND reloptions @> '{fillfactor=50}'`:                               1,
	} {
		if n := db.Count(t, q); n != want {
			t.Errorf("%s = %d, want %d", q, n, want)
		}
	}
	if again, err := postgres.Migrate(ctx, db.Pool, nil); err != nil || len(again) != 0 {
		t.Fatalf("second run: %v %v, want nothing to do", again, err)
	}
}

// TestUnknownGapIsRefused: a version missing below the database's highest one that is not
// one of the window's is not applied late; the error names it.
func TestUnknownGapIsRefused(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	exec(t, db.Pool, `DELETE FROM goose_db_version WHERE version_id = 11`)
	_, err := postgres.Migrate(t.Context(), db.Pool, nil)
	if err == nil || !strings.Contains(err.Error(), "versions [11] are missing") {
		t.Fatalf("migrate with 11 missing: %v, want an error naming 11", err)
	}
}
