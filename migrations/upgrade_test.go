package migrations_test

import (
	"context"
	"testing"

	"github.com/outbox-relay/outbox-relay/examples/orders"
	"github.com/outbox-relay/outbox-relay/pkg/postgres"
	"github.com/outbox-relay/outbox-relay/pkg/postgres/pgtest"
)

// TestUpgradeFromTheFirstRelease: a database deployed at the first release's head (0004,
// which then created billing_charges) holding pending, dispatched and dead-lettered events,
// dedupe records, two open letters of one event and the example's charges upgrades to the
// current head in one run: nothing is lost, the example's table and rows stay, and the
// example's own schema step is a no-op on it.
func TestUpgradeFromTheFirstRelease(t *testing.T) {
	t.Parallel()
	db := pgtest.NewWithOptions(t, pgtest.Options{NoMigrate: true})
	ctx := context.Background()
	migrateTo(t, db.Pool, 4)
	// What 0004 created before the example moved to examples/orders.
	exec(t, db.Pool, `CREATE TABLE billing_charges (
	    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, order_id text NOT NULL UNIQUE,
	    amount_cents bigint NOT NULL CHECK (amount_cents > 0), currency text NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
	    outbox_id text NOT NULL, charged_at timestamptz NOT NULL DEFAULT now())`)
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
		if n := count(t, db.Pool, q); n != want {
			t.Errorf("%s = %d, want %d", q, n, want)
		}
	}
}
