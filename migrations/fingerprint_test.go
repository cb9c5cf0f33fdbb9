package migrations_test

import (
	"context"
	"testing"

	"github.com/outbox-relay/outbox-relay/pkg/postgres"
	"github.com/outbox-relay/outbox-relay/pkg/postgres/pgtest"
)

// TestFingerprintOnDeployedTable: letters written before migration 0010 get their
// fingerprint when it runs, the same one a letter of the same cause written after it gets;
// and processed_messages rows written before 0011 have no retry count.
func TestFingerprintOnDeployedTable(t *testing.T) {
	t.Parallel()
	db := pgtest.NewWithOptions(t, pgtest.Options{NoMigrate: true})
	migrateTo(t, db.Pool, 7)
	exec(t, db.Pool, `INSERT INTO dead_letters (source, topic, status_code, error) VALUES
		('delivery', 'a', 500, 'timeout after 3s on order 1'), ('delivery', 'a', 500, 'timeout after 9s on order 22'),
		('delivery', 'b', 500, 'timeout after 3s on order 1')`)
	exec(t, db.Pool, `INSERT INTO processed_messages (consumer, message_id) VALUES ('webhook', '1')`)
	if _, err := postgres.Migrate(context.Background(), db.Pool, nil); err != nil {
		t.Fatal(err)
	}
	exec(t, db.Pool, `INSERT INTO dead_letters (source, topic, status_code, error) VALUES ('delivery', 'a', 500, 'timeout after 1s on order 5')`)
	if n := count(t, db.Pool, `SELECT count(DISTINCT fingerprint) FROM dead_letters`); n != 2 {
		t.Fatalf("%d fingerprints, want 2 (topic a before and after the migration, topic b)", n)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM processed_messages WHERE retried IS NULL`); n != 1 {
		t.Fatalf("%d rows without a retry count, want 1", n)
	}
}
